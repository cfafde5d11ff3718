"""The ``quant`` codec (per-group k-bit stochastic rounding) and the bit packing it shares with ``bitmask``."""

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.compress import CodecError, Packed, get_codec
from hpcdl.compress.bitpack import pack_bits, packed_length, unpack_bits
from hpcdl.compress.header import read_header, write_header

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def group_steps(x: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Per-element step (max - min of its group) / (2**bits - 1), computed independently of the codec."""
    flat = x.reshape(-1).double()
    steps = torch.empty_like(flat)
    for start in range(0, flat.numel(), group_size):
        group = flat[start : start + group_size]
        steps[start : start + group_size] = (group.max() - group.min()) / (2**bits - 1)
    return steps


def allowed_error(x: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """One step of each element's group, plus fp32 rounding of the stored statistics and the cast to x's dtype."""
    flat = x.reshape(-1).double()
    group_absmax = torch.empty_like(flat)
    for start in range(0, flat.numel(), group_size):
        group_absmax[start : start + group_size] = flat[start : start + group_size].abs().max()
    return group_steps(x, bits, group_size) * (1 + 1e-5) + group_absmax * 2**-22 + flat.abs() * torch.finfo(x.dtype).eps


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", FLOATS)
def test_error_is_within_one_step_of_its_group(bits, dtype):
    x = (torch.randn(3, 100, generator=torch.Generator().manual_seed(bits)) * 5).to(dtype)
    codec = get_codec({"id": "quant", "bits": bits, "group_size": 64, "seed": 0})
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    error = (y.double() - x.double()).abs().reshape(-1)
    assert bool((error <= allowed_error(x, bits, 64)).all())


def test_stochastic_rounding_is_unbiased():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    codec = get_codec({"id": "quant", "bits": 2, "group_size": 256, "seed": 7})
    repeats = 800
    mean = torch.stack([codec.decode(codec.encode(x)) for _ in range(repeats)]).double().mean(0)
    # each decode's variance is at most step**2 / 4, so the mean's standard error is at most step / (2 sqrt(n))
    standard_error = group_steps(x, 2, 256) / (2 * math.sqrt(repeats))
    assert bool(((mean - x.double()).abs() <= 6 * standard_error).all())
    # deterministic rounding would be off by up to half a step; this test sees far less
    assert float((mean - x.double()).abs().mean()) < float(group_steps(x, 2, 256).mean()) / 20


def test_seed_makes_encodes_reproducible():
    x = torch.randn(500)
    first, second = (get_codec({"id": "quant", "bits": 4, "seed": 3}) for _ in range(2))
    assert torch.equal(first.encode(x).data, second.encode(x).data)
    assert not torch.equal(first.encode(x).data, get_codec({"id": "quant", "bits": 4, "seed": 4}).encode(x).data)
    assert not torch.equal(first.encode(x).data, first.encode(x).data), "each encode draws fresh noise"


def test_restarting_the_random_stream_forgets_the_encodes_before_it():
    """What a resumed run needs: at a step, a codec that encoded for many steps before and one built just now
    draw the same noise (the runtime restarts every codec's stream at every step, Policy.watch)."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    used, fresh = (get_codec({"id": "quant", "bits": 2, "seed": 0}) for _ in range(2))
    for step in range(3):
        used.restart_random(step)
        used.encode(x)
    used.restart_random(3)
    fresh.restart_random(3)
    assert torch.equal(used.encode(x).data, fresh.encode(x).data)
    used.restart_random(3)
    fresh.restart_random(4)
    assert not torch.equal(used.encode(x).data, fresh.encode(x).data), "another step draws other noise"


@pytest.mark.parametrize("scale_dtype, stat_bytes", [("fp32", 4), ("fp16", 2)])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_nbytes_counts_header_statistics_and_codes(scale_dtype, stat_bytes, bits):
    x = torch.randn(1001)
    packed = get_codec({"id": "quant", "bits": bits, "group_size": 256, "scale_dtype": scale_dtype}).encode(x)
    groups = math.ceil(1001 / 256)
    assert packed.nbytes == len(packed.header) + 2 * groups * stat_bytes + math.ceil(1001 * bits / 8)
    assert packed.nbytes == len(packed.to_bytes()) - 4


def test_fp16_statistics_cover_every_group():
    x = torch.randn(4096) * 300 + 17.3
    codec = get_codec({"id": "quant", "bits": 1, "group_size": 128, "scale_dtype": "fp16", "seed": 0})
    packed = codec.encode(x)
    groups = 4096 // 128
    lo = packed.data[: groups * 2].view(torch.float16).double()
    step = packed.data[groups * 2 : groups * 4].view(torch.float16).double()
    grouped = x.double().reshape(groups, 128)
    assert bool((lo <= grouped.min(1).values).all()) and bool((lo + step >= grouped.max(1).values).all())


def test_fp16_statistics_refuse_values_beyond_fp16():
    with pytest.raises(ValueError, match="scale_dtype='fp32'"):
        get_codec({"id": "quant", "scale_dtype": "fp16"}).encode(torch.tensor([1e6, 0.0]))


def test_constant_groups_come_back_exactly():
    x = torch.full((3, 300), -2.75)
    codec = get_codec({"id": "quant", "bits": 2})
    assert torch.equal(codec.decode(codec.encode(x)), x)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (2, 0, 3), (5, 7)])
def test_any_shape(shape):
    x = torch.randn(shape)
    codec = get_codec({"id": "quant", "bits": 8, "group_size": 4})
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and bool(((y - x).abs().reshape(-1) <= allowed_error(x, 8, 4)).all())


def test_non_contiguous_input():
    x = torch.randn(40, 30)[::3, 1::2]
    codec = get_codec({"id": "quant", "bits": 8, "group_size": 16})
    y = codec.decode(codec.encode(x))
    assert bool(((y - x).abs().reshape(-1) <= allowed_error(x.contiguous(), 8, 16)).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_are_refused(bad):
    with pytest.raises(ValueError, match="cannot encode NaN or Inf"):
        get_codec({"id": "quant"}).encode(torch.tensor([1.0, bad, 2.0]))


@given(
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=3),
    bits=st.sampled_from([1, 2, 4, 8]),
    group_size=st.integers(1, 70),
    dtype=st.sampled_from(FLOATS),
    scale=st.floats(1e-6, 1e6),
    seed=st.integers(0, 2**31),
)
def test_property_error_within_step(shape, bits, group_size, dtype, scale, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    x = x.clamp(-torch.finfo(dtype).max / 4, torch.finfo(dtype).max / 4).to(dtype)
    codec = get_codec({"id": "quant", "bits": bits, "group_size": group_size, "seed": seed})
    packed = Packed.from_bytes(codec.encode(x).to_bytes())
    y = codec.decode(packed)
    assert y.shape == x.shape and y.dtype == x.dtype
    if x.numel():
        error = (y.double() - x.double()).abs().reshape(-1)
        assert bool((error <= allowed_error(x, bits, group_size)).all())


@pytest.mark.parametrize(
    "config",
    [
        {"id": "quant", "bits": 2, "group_size": 256},
        {"id": "quant", "bits": 8, "group_size": 32, "scale_dtype": "fp16", "seed": 11},
        {"id": "quant", "bits": 1, "mode": "bits"},
    ],
)
def test_config_round_trips_through_json(config):
    codec = get_codec(config)
    assert get_codec(json.loads(json.dumps(codec.get_config()))) == codec
    assert not codec.error_bounded and not codec.lossless and codec.modes == ("bits",)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"bits": 3}, "bits must be one of"),
        ({"bits": True}, "bits must be one of"),
        ({"group_size": 0}, "group_size must be"),
        ({"group_size": 2.5}, "group_size must be"),
        ({"scale_dtype": "bf16"}, "scale_dtype must be one of"),
        ({"seed": -1}, "seed must be"),
        ({"mode": "rel"}, "has no mode 'rel'"),
        ({"bound": 1e-2}, "bad options"),
    ],
)
def test_bad_options_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        get_codec({"id": "quant", **config})


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_non_float_dtypes_are_refused(dtype):
    with pytest.raises(TypeError, match="cannot encode dtype"):
        get_codec({"id": "quant"}).encode(torch.zeros(4, dtype=dtype))


def test_truncated_and_corrupted_streams_raise_codec_error():
    codec = get_codec({"id": "quant", "bits": 4})
    packed = codec.encode(torch.randn(300))
    with pytest.raises(CodecError, match="expected"):
        codec.decode(Packed(packed.header, packed.data[:-1]))
    with pytest.raises(CodecError, match="truncated"):
        codec.decode(Packed(packed.header[:-3], packed.data))
    header = read_header(packed.header, "quant", "BQB")
    bad_bits = write_header("quant", header.dtype, header.shape, "BQB", 3, *header.fields[1:], checksum=header.checksum)
    with pytest.raises(CodecError, match="corrupted"):
        codec.decode(Packed(bad_bits, packed.data))
    huge = write_header("quant", header.dtype, (2**40,), "BQB", *header.fields, checksum=header.checksum)
    with pytest.raises(CodecError, match="expected"):
        codec.decode(Packed(huge, packed.data))
    with pytest.raises(CodecError, match="made by codec 'raw'"):
        codec.decode(get_codec({"id": "raw"}).encode(torch.randn(3)))


@given(bits=st.sampled_from([1, 2, 4, 8]), values=st.lists(st.integers(0, 255), max_size=50))
def test_bit_packing_round_trips(bits, values):
    codes = torch.tensor(values, dtype=torch.uint8) & ((1 << bits) - 1)
    packed = pack_bits(codes, bits)
    assert packed.numel() == packed_length(len(values), bits)
    assert torch.equal(unpack_bits(packed, bits, len(values)), codes)


def test_bit_packing_puts_the_first_value_in_the_low_bits():
    assert pack_bits(torch.tensor([1, 0, 1], dtype=torch.uint8), 1).tolist() == [0b101]
    assert pack_bits(torch.tensor([3, 0, 2, 1, 1], dtype=torch.uint8), 2).tolist() == [0b01100011, 0b01]
    with pytest.raises(ValueError, match="bits per value"):
        pack_bits(torch.zeros(3, dtype=torch.uint8), 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_stay_on_the_gpu_within_one_step():
    x = torch.randn(4, 1000, device="cuda") * 3
    codec = get_codec({"id": "quant", "bits": 4, "group_size": 128, "seed": 5})
    packed = codec.encode(x)
    y = codec.decode(packed)
    assert packed.device.type == "cuda" and y.device == x.device
    assert bool(((y - x).abs().reshape(-1).cpu() <= allowed_error(x.cpu(), 4, 128)).all())
    assert torch.equal(codec.decode(Packed(packed.header, packed.data.cpu())).cuda(), y)
