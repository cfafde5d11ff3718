"""The ``channels`` stage: an inner codec's bound per channel, in units of a power of two near each channel's spread.

Checked element-wise: the bound ``b * 2^k_c`` holds on every channel, zeros, signs, NaN and Inf survive, the
scale stays within sqrt(2) of ``sqrt(var_c + EPS)``, and no value overflows where it was finite; the session
names a batch norm's input's channel dim whatever its memory format; an arena holds such a member to its
tightest channel's bound.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hpcdl.compress import CodecError, Packed, channels, get_codec
from hpcdl.compress.channels import EPS, ChannelScale, channel_exponents, channel_units, with_channels
from hpcdl.compress.checksum import payload_checksum
from hpcdl.compress.entropy import EntropyStage
from hpcdl.compress.header import read_header, write_header
from hpcdl.runtime import Policy, SavedTensorInfo, compressed
from hpcdl.runtime.arena import member_codec
from hpcdl.runtime.policy import Controller


def _spread_channels(shape=(4, 16, 12, 12), seed=0) -> torch.Tensor:
    """Channels whose spreads run from 1e-3 to 1e2, with offsets, ReLU zeros and both signs."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-3, 2, shape[1]).view(1, -1, *([1] * (len(shape) - 2)))
    x = torch.randn(shape, generator=generator) * scales + 0.5 * scales
    return torch.where(torch.rand(shape, generator=generator) < 0.3, torch.zeros(()), x)


def _per_channel_bound(x: torch.Tensor, bound: float, dim: int) -> torch.Tensor:
    shape = [1] * x.dim()
    shape[dim] = -1
    return bound * torch.pow(2.0, channel_exponents(x, dim).double()).view(shape)


@pytest.mark.parametrize("inner", [{"id": "sz", "mode": "abs", "bound": 0.05},
                                   {"id": "sz", "mode": "abs", "bound": 0.05, "entropy": "zstd"}],
                         ids=["sz", "sz+zstd"])
@pytest.mark.parametrize("dim", [1, 3], ids=["channels-first", "channels-last"])
def test_the_bound_holds_per_channel_in_units_of_its_spread(inner, dim):
    x = _spread_channels()
    if dim == 3:
        x = x.permute(0, 2, 3, 1).contiguous()  # what the session encodes for a channels-last batch-norm input
    codec = get_codec(with_channels(inner, dim))
    restored = codec.decode(codec.encode(x))
    error = (restored.double() - x.double()).abs()
    assert bool((error <= _per_channel_bound(x, 0.05, dim)).all())
    assert torch.equal(restored == 0, x == 0) and torch.equal(torch.sign(restored), torch.sign(x))
    # the scales are powers of two within sqrt(2) of batch norm's sqrt(var + eps)
    others = [d for d in range(4) if d != dim]
    sigma = torch.sqrt(x.double().var(dim=others, correction=0) + EPS)
    ratio = torch.pow(2.0, channel_exponents(x, dim).double()) / sigma
    assert bool((ratio >= 2 ** -0.5 - 1e-9).all() and (ratio <= 2 ** 0.5 + 1e-9).all())
    # a uniform bound at the largest channel's scale would not hold the small channels: the stage is what does
    assert float(error.amax()) > 0.05 * 2 ** float(channel_exponents(x, dim).min())


def test_the_same_bytes_give_a_per_channel_error_where_a_uniform_bound_crushes_small_channels():
    """At about the same packed size, a uniform abs bound leaves the smallest channels' errors far above their
    spread; the per-channel bound holds every channel to the same fraction of its own."""
    x = _spread_channels(shape=(8, 16, 16, 16))
    staged = get_codec({"id": "sz", "mode": "abs", "bound": 0.1, "channels": 1})
    packed = staged.encode(x)
    uniform_bound = next(b for b in (10.0 ** (-k / 8) for k in range(-16, 80))
                         if get_codec({"id": "sz", "mode": "abs", "bound": b}).encode(x).nbytes >= packed.nbytes)
    uniform = get_codec({"id": "sz", "mode": "abs", "bound": uniform_bound})
    sigma = x.var(dim=(0, 2, 3), correction=0).add(EPS).sqrt().view(1, -1, 1, 1)
    staged_error = ((staged.decode(packed) - x).abs() / sigma).amax(dim=(0, 2, 3))
    uniform_error = ((uniform.decode(uniform.encode(x)) - x).abs() / sigma).amax(dim=(0, 2, 3))
    assert float(staged_error.max()) <= 0.1 * math.sqrt(2)
    assert float(uniform_error.max()) > 10 * float(staged_error.max())


def test_nonfinite_values_survive_and_their_channel_is_scaled_by_its_finite_values():
    x = _spread_channels(shape=(2, 4, 8, 8))
    x[0, 1, 0, 0], x[1, 1, 3, 3], x[0, 2, 5, 5] = float("nan"), float("inf"), float("-inf")
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.02, "channels": 1})
    restored = codec.decode(codec.encode(x))
    finite = torch.isfinite(x)
    assert torch.equal(torch.isnan(restored), torch.isnan(x)) and torch.equal(restored[~finite & ~torch.isnan(x)],
                                                                              x[~finite & ~torch.isnan(x)])
    error = torch.where(finite, (restored.double() - x.double()).abs(), 0.0)
    assert bool((error <= _per_channel_bound(x, 0.02, 1)).all())
    for channel in (1, 2):  # k from the channel's finite values alone
        values = x[:, channel][torch.isfinite(x[:, channel])].double()
        expected = round(0.5 * math.log2(float(values.var(correction=0)) + EPS))
        assert int(channel_exponents(x, 1)[channel]) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_large_offsets_with_small_spreads_never_overflow(dtype):
    """A channel of tiny spread around a huge value would overflow if scaled up by 1 / spread: the exponent is
    raised until every finite value stays finite, and the bound still holds."""
    huge = {torch.float16: 3e4, torch.bfloat16: 1e37, torch.float32: 1e37, torch.float64: 1e300}[dtype]
    x = torch.stack([torch.full((6, 5), huge, dtype=dtype), (torch.randn(6, 5) * 1e-3).to(dtype)], dim=1)  # (6, 2, 5)
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.1, "channels": 1})
    scaled, exponents = channel_units(x, 1)
    assert bool(torch.isfinite(scaled).all())
    restored = codec.decode(codec.encode(x))
    assert bool(torch.isfinite(restored).all())
    bound = 0.1 * torch.pow(2.0, exponents.double()).view(1, -1, 1)
    assert bool(((restored.double() - x.double()).abs() <= bound).all())


def test_config_round_trip_spec_and_stage_order():
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.05, "channels": 1, "entropy": "zstd"})
    assert codec.get_config() == {"id": "sz", "mode": "abs", "bound": 0.05, "channels": 1, "entropy": "zstd"}
    # channels outside: the entropy stage sees each chunk's sz stream, whose codes it compresses
    assert isinstance(codec, ChannelScale) and isinstance(codec.inner, EntropyStage)
    assert get_codec(codec.get_config()) == codec
    assert with_channels(None, 1) is None and with_channels({"id": "raw"}, None) == {"id": "raw"}
    for bad in (-1, 256, 1.5, True, "1"):
        with pytest.raises(ValueError, match="channels"):
            get_codec({"id": "sz", "mode": "abs", "bound": 0.05, "channels": bad})
    with pytest.raises(ValueError, match="not two"):
        ChannelScale(get_codec({"id": "sz", "mode": "abs", "bound": 0.05, "channels": 1}), 1)


def test_a_device_tensors_chunks_hold_the_inner_stream_the_entropy_stage_left_as_it_is(monkeypatch):
    """On a CUDA tensor the entropy stage under the channels stage leaves sz's stream as it is; the channels
    stage decodes it (it once refused it as 'sz' where it expected 'entropy', failing every batch norm's backward
    on a GPU). The device path is the stage's encode of a non-CPU tensor, imitated here on the CPU."""
    monkeypatch.setattr(EntropyStage, "_encode", lambda self, tensor: self.inner.encode(tensor))
    codec = get_codec(with_channels({"id": "sz", "mode": "abs", "bound": 0.05, "entropy": "zstd"}, 1))
    x = _spread_channels()
    restored = codec.decode(codec.encode(x))
    assert bool(((restored - x).abs() <= _per_channel_bound(x, 0.05, 1)).all())
    with pytest.raises(CodecError, match="holds a 'sz' stream, its inner codec 'entropy' decodes \\['entropy', 'quant'\\]"):
        get_codec(with_channels({"id": "quant", "bits": 2, "entropy": "zstd"}, 1)).decode(codec.encode(x))


def test_a_stream_decoded_with_another_dim_or_with_forged_exponents_is_refused():
    x = _spread_channels(shape=(2, 4, 6, 6))
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.05, "channels": 1})
    packed = codec.encode(x)
    with pytest.raises(CodecError, match="dim"):
        get_codec({"id": "sz", "mode": "abs", "bound": 0.05, "channels": 2}).decode(packed)
    with pytest.raises(CodecError, match="checksum"):
        changed = packed.data.clone()
        changed[0] ^= 0x40
        codec.decode(Packed(packed.header, changed))


@pytest.mark.parametrize("dim", [1, 3], ids=["channels-first", "channels-last"])
def test_a_large_tensor_is_scaled_and_encoded_in_chunks_of_samples_with_the_bound_kept(monkeypatch, dim):
    """Over CHUNK_BYTES the scaled copy exists a chunk of samples at a time (the inner codec never sees more),
    and the decoded tensor keeps what the unchunked stream does: the bound per channel, zeros and signs."""
    x = _spread_channels(shape=(7, 16, 12, 12), seed=3)
    if dim == 3:
        x = x.permute(0, 2, 3, 1).contiguous()
    sample_bytes = x[0].numel() * x.element_size()
    monkeypatch.setattr(channels, "CHUNK_BYTES", 2 * sample_bytes)
    codec = get_codec(with_channels({"id": "sz", "mode": "abs", "bound": 0.05}, dim))
    seen: list[int] = []
    encode = codec.inner.encode
    monkeypatch.setattr(codec.inner, "encode", lambda tensor: (seen.append(tensor.shape[0]), encode(tensor))[1])
    packed = codec.encode(x)
    assert seen == [2, 2, 2, 1]  # 7 samples, 2 a chunk
    restored = codec.decode(packed)
    error = (restored.double() - x.double()).abs()
    assert bool((error <= _per_channel_bound(x, 0.05, dim)).all())
    assert torch.equal(restored == 0, x == 0) and torch.equal(torch.sign(restored), torch.sign(x))
    monkeypatch.setattr(channels, "CHUNK_BYTES", 1 << 40)
    codec.encode(x)
    assert seen[4:] == [7]  # under CHUNK_BYTES: one stream


def test_a_chunked_stream_with_forged_chunking_or_lengths_is_refused(monkeypatch):
    x = _spread_channels(shape=(5, 4, 8, 8))
    monkeypatch.setattr(channels, "CHUNK_BYTES", x[0].numel() * x.element_size())
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.05, "channels": 1})
    packed = codec.encode(x)
    header = read_header(packed.header, "channels", "BQ")
    assert header.fields == (1, 1)
    forged = write_header("channels", x.dtype, x.shape, "BQ", 1, 2, checksum=header.checksum)
    with pytest.raises(CodecError, match="chunk"):  # 2 samples a chunk: 3 chunk lengths, not the 5 written
        codec.decode(Packed(forged, packed.data))
    forged = write_header("channels", x.dtype, x.shape, "BQ", 1, 5, checksum=header.checksum)
    with pytest.raises(CodecError, match="chunks of 5 samples"):
        codec.decode(Packed(forged, packed.data))
    lengths_at = 8  # 4 exponents padded to 8 bytes, then the u64 lengths
    changed = packed.data.clone()
    changed[lengths_at] ^= 0x08
    forged = write_header("channels", x.dtype, x.shape, "BQ", 1, 1, checksum=payload_checksum(changed))
    with pytest.raises(CodecError, match="chunk lengths"):
        codec.decode(Packed(forged, changed))


def test_the_session_names_the_channel_dim_of_a_batch_norms_input_in_any_memory_format():
    seen: list[SavedTensorInfo] = []

    class Recording(Controller):
        def choose(self, info):
            seen.append(info)
            return None

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 1))
    for memory_format, dim in ((torch.contiguous_format, 1), (torch.channels_last, 3)):
        seen.clear()
        x = torch.randn(2, 3, 16, 16).to(memory_format=memory_format)
        model.to(memory_format=memory_format)
        with compressed(model, Policy(Recording()), threshold=0):
            model(x).sum().backward()
        by_module = {(info.module, info.shape): info.channels for info in seen}
        assert by_module[("1", (2, 8, 14, 14))] == dim  # the batch norm's input, as the codec will see it
        assert all(channels is None for (module, _), channels in by_module.items() if module != "1")


def test_an_arena_member_is_held_to_its_tightest_channels_bound():
    x = _spread_channels(shape=(2, 4, 4, 4))
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.05, "channels": 1})
    member = member_codec(codec, x, get_codec)
    assert member is not None and "channels" not in member.get_config()
    assert member.get_config()["bound"] == pytest.approx(0.05 * 2.0 ** int(channel_exponents(x, 1).min()))
    assert member_codec(get_codec({"id": "sz", "mode": "rel", "bound": 0.05, "channels": 1}), x, get_codec) is None
