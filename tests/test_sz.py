"""The ``sz`` codec: the error-bound guarantee, the three implementations' identical bytes, and bad input.

Property-based over dtypes, shapes, modes, bounds and values (NaN, +-Inf, -0.0,
subnormals, huge ranges, random bit patterns). The guarantee is judged by
hpcdl.compress.check_bound, the one definition the whole project uses.
"""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from hpcdl.compress import CodecError, Packed, check_bound, get_codec
from hpcdl.compress.sz import decode_with, encode_with, host
from hpcdl.compress.sz import reference as sz_reference

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
MODES = ["abs", "rel", "pw_rel"]

requires_host = pytest.mark.skipif(not host.AVAILABLE, reason="host kernel library not built (pip install -e .)")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal including NaN payloads and the sign of zero."""
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.reshape(-1).view(int_type), b.reshape(-1).view(int_type))


def _assert_guarantee(x: torch.Tensor, y: torch.Tensor, mode: str, bound: float) -> None:
    report = check_bound(x, y, mode, bound)
    assert report.ok, report
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    nonfinite = ~torch.isfinite(flat_x)
    assert _same_bits(flat_x[nonfinite], flat_y[nonfinite])  # NaN and +-Inf come back exactly
    zero = flat_x == 0
    assert torch.equal(torch.signbit(flat_x[zero]), torch.signbit(flat_y[zero]))  # 0.0 and -0.0 come back exactly


def _round_trip(x: torch.Tensor, mode: str, bound: float) -> Packed:
    """Encode with the host kernels and the reference, require identical bytes, decode both ways, check the bound."""
    packed = encode_with("host" if host.AVAILABLE else "reference", x, mode, bound)
    expected = encode_with("reference", x, mode, bound)
    assert packed.header == expected.header
    assert torch.equal(packed.data, expected.data)
    restored = get_codec({"id": "sz", "mode": mode, "bound": bound}).decode(packed)
    assert restored.shape == x.shape and restored.dtype == x.dtype and restored.device == x.device
    assert _same_bits(restored, decode_with("reference", packed))
    _assert_guarantee(x, restored, mode, bound)
    return packed


finite_or_special = st.floats(width=32, allow_subnormal=True) | st.sampled_from(
    [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-30, 1e-45, 3.4e38]
)
bounds = st.sampled_from([1e-1, 1e-2, 1e-3, 1e-5, 0.3, 2.0**-7])


@given(
    values=arrays(np.float32, array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40), elements=finite_or_special),
    dtype=st.sampled_from(FLOATS),
    mode=st.sampled_from(MODES),
    bound=bounds,
)
def test_guarantee_and_identical_bytes_on_arbitrary_values(values, dtype, mode, bound):
    x = torch.tensor(values, dtype=torch.float32).to(dtype)
    _round_trip(x, mode, 0.5 if mode == "pw_rel" and bound >= 1 else bound)


@given(
    bits=arrays(np.int32, st.integers(0, 300), elements=st.integers(-(2**31), 2**31 - 1)),
    dtype=st.sampled_from(FLOATS),
    mode=st.sampled_from(MODES),
    bound=bounds,
)
def test_random_bit_patterns(bits, dtype, mode, bound):
    raw = torch.tensor(bits.tolist(), dtype=torch.int32)
    x = raw.view(torch.float32) if dtype == torch.float32 else raw.view(torch.int16).view(dtype) \
        if dtype in (torch.float16, torch.bfloat16) else raw[: raw.numel() // 2 * 2].view(torch.float64)
    _round_trip(x, mode, bound)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode,bound", [("rel", 1e-2), ("pw_rel", 1e-3), ("abs", 100.0)])
def test_every_16_bit_pattern(dtype, mode, bound):
    """All 65536 float16/bfloat16 values: exercises the kernels' own float conversions against torch's."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    _round_trip(x, mode, bound)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bound", [1e-1, 1e-2, 1e-3])
def test_activation_like_tensors(dtype, mode, bound):
    generator = torch.Generator().manual_seed(0)
    relu = torch.relu(torch.randn(4, 8, 24, 24, generator=generator))
    gelu = torch.nn.functional.gelu(torch.randn(3000, generator=generator) * 3)
    for x in (relu.to(dtype), gelu.to(dtype)):
        packed = _round_trip(x, mode, bound)
        if mode == "rel" and bound >= 1e-2 and dtype == torch.float32:
            assert packed.nbytes < x.numel() * x.element_size() / 3  # it does compress


@pytest.mark.parametrize("dtype,mode", [(torch.float32, "rel"), (torch.bfloat16, "pw_rel")])
def test_tensors_of_several_encoder_parts(dtype, mode):
    """The host encoder cuts tensors into parts of 2^18 elements: parts' words and outliers join in order."""
    generator = torch.Generator().manual_seed(1)
    x = torch.relu(torch.randn(2 * 2**18 + 4129, generator=generator)).to(dtype)
    specials = torch.tensor([math.nan, math.inf, -0.0, 1e30], dtype=dtype)
    where = torch.tensor([5, 2**18 - 1, 2**18 + 7, 2 * 2**18 + 4128])
    x[where] = specials
    packed = _round_trip(x, mode, 1e-2)
    assert get_codec({"id": "sz", "mode": mode, "bound": 1e-2}).decode(packed)[where].isnan().sum() == 1


@pytest.mark.parametrize("shape", [(), (0,), (0, 5), (1,), (31,), (32,), (33,), (1000, 3)])
def test_shapes(shape):
    x = torch.randn(shape)
    assert _round_trip(x, "rel", 1e-2).nbytes > 0


def test_non_contiguous_input():
    base = torch.randn(40, 50)
    for view in (base.t(), base[::3, 1::2], base.expand(2, 40, 50)[1]):
        restored = get_codec({"id": "sz", "mode": "abs", "bound": 1e-3}).decode(
            get_codec({"id": "sz", "mode": "abs", "bound": 1e-3}).encode(view))
        _assert_guarantee(view, restored, "abs", 1e-3)


@pytest.mark.parametrize("value", [0.0, 0.5, -3.0, 1e-40])
def test_constant_tensors_are_exact(value):
    """rel of a constant tensor is a zero bound: every element must come back exactly, with no division by zero."""
    x = torch.full((100,), value)
    codec = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2})
    packed = codec.encode(x)
    assert _same_bits(codec.decode(packed), x)
    if value == 0.0:
        assert packed.data.numel() <= 8  # four all-zero blocks: 4 header bytes, padded to 8


def test_huge_range_and_subnormals():
    x = torch.tensor([1e30, 1e-30, -1e30, -1e-30, 1e-45, -1e-45, 1.1754942e-38, 0.0, 3.0] * 10)
    for mode, bound in [("abs", 1e-3), ("rel", 1e-3), ("pw_rel", 1e-3)]:
        _round_trip(x, mode, bound)


@pytest.mark.parametrize("mode,bound", [("rel", 1e-2), ("rel", 0.5), ("abs", 1e308)])
def test_a_bin_width_past_float64_keeps_every_value(mode, bound):
    """float64 values whose range (or an abs bound whose bin width 2 eb) overflows float64: eb is 0, every
    nonzero an outlier, and the stream decodes to the tensor itself (it once carried eb = inf and was refused)."""
    x = torch.tensor([1e308, -1e308, 1.0, 0.0, -0.0, 3e-320, math.nan, -2.5] * 130, dtype=torch.float64)
    packed = _round_trip(x, mode, bound)
    assert _same_bits(get_codec({"id": "sz", "mode": mode, "bound": bound}).decode(packed), x)


def test_relu_mask_survives():
    x = torch.relu(torch.randn(10000)) - 0.001
    restored = get_codec({"id": "sz", "mode": "rel", "bound": 1e-1}).decode(
        get_codec({"id": "sz", "mode": "rel", "bound": 1e-1}).encode(x))
    assert torch.equal(x > 0, restored > 0) and torch.equal(x < 0, restored < 0)


def test_raw_fallback_bounds_the_size():
    """Incompressible data (random bits at a tiny bound) is stored raw: never more than raw + header + 7 bytes."""
    x = torch.randint(-(2**31), 2**31 - 1, (1000,), dtype=torch.int32).view(torch.float32)
    packed = _round_trip(x, "pw_rel", 1e-7)
    assert packed.data.numel() <= x.numel() * 4 + 7


@pytest.mark.parametrize("mode", MODES)
def test_config_round_trips_through_json(mode):
    codec = get_codec({"id": "sz", "mode": mode, "bound": 1e-3})
    assert get_codec(json.loads(json.dumps(codec.get_config()))) == codec
    assert codec.get_config() == {"id": "sz", "mode": mode, "bound": 1e-3}


@pytest.mark.parametrize("bound", [0, -1e-3, float("nan"), float("inf")])
def test_bad_bound(bound):
    with pytest.raises(ValueError, match="finite number > 0"):
        get_codec({"id": "sz", "mode": "rel", "bound": bound})


def test_bad_mode_and_options():
    with pytest.raises(ValueError, match="modes are"):
        get_codec({"id": "sz", "mode": "psnr", "bound": 1e-2})
    with pytest.raises(ValueError, match="bad options"):
        get_codec({"id": "sz", "mode": "rel", "bound": 1e-2, "backend": "host"})


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.uint8])
def test_wrong_dtype(dtype):
    with pytest.raises(TypeError, match="cannot encode dtype"):
        get_codec({"id": "sz"}).encode(torch.zeros(4, dtype=dtype))


def test_packed_of_another_codec():
    packed = get_codec({"id": "raw"}).encode(torch.randn(10))
    with pytest.raises(CodecError, match="made by codec 'raw'"):
        get_codec({"id": "sz"}).decode(packed)
    with pytest.raises(TypeError, match="decodes a Packed"):
        get_codec({"id": "sz"}).decode(b"abc")


def _corruptions(blob: bytes, rng: np.random.Generator, count: int):
    for _ in range(count):
        position = int(rng.integers(0, len(blob)))
        changed = bytearray(blob)
        changed[position] ^= int(rng.integers(1, 256))
        yield bytes(changed)
    for cut in sorted({0, 3, 4, 10, len(blob) // 2, len(blob) - 8, len(blob) - 1}):
        yield blob[:cut]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_corrupted_or_truncated_streams_raise(dtype, mode):
    """Any changed or missing byte of header or payload raises CodecError (header CRC, payload checksum, lengths)."""
    x = torch.relu(torch.randn(700)).to(dtype)
    x[5] = float("nan")
    codec = get_codec({"id": "sz", "mode": mode, "bound": 1e-2})
    blob = codec.encode(x).to_bytes()
    for bad in _corruptions(blob, np.random.default_rng(0), 60):
        with pytest.raises(CodecError):
            codec.decode(Packed.from_bytes(bad))


def test_forged_payload_is_validated_before_the_kernels():
    """A payload with a valid checksum but impossible block headers or outlier indices is refused, not decoded."""
    from hpcdl.compress.header import read_header, write_header
    from hpcdl.compress.sz import FIELDS, Sz

    x = torch.tensor([1.0, float("nan"), 3.0] * 20)
    packed = Sz("abs", 0.1).encode(x)
    header = read_header(packed.header, "sz", FIELDS)
    for offset, value in [(0, 33), (0, 0xE1), (64, 200)]:  # 33 words (twice), an outlier index past the end
        data = packed.data.clone()
        data[offset] = value
        forged = Packed(write_header("sz", header.dtype, header.shape, FIELDS, *header.fields,
                                     checksum=sz_reference.checksum(data)), data)
        with pytest.raises(CodecError):
            Sz("abs", 0.1).decode(forged)


def test_missing_host_library_falls_back_to_the_reference_with_one_warning(monkeypatch):
    import hpcdl.compress.blocks as blocks  # the backend choice (and its one warning) moved there from sz

    monkeypatch.setattr(blocks.host, "AVAILABLE", False)
    monkeypatch.setattr(blocks, "_warned_no_host", False)
    x = torch.randn(100)
    with pytest.warns(RuntimeWarning, match="not built"):
        packed = get_codec({"id": "sz"}).encode(x)
    get_codec({"id": "sz"}).decode(packed)  # no second warning (warnings are errors here)
    assert torch.equal(packed.data, encode_with("reference", x, "rel", 1e-2).data)


def test_backend_choice_is_checked():
    with pytest.raises(ValueError, match="unknown sz backend"):
        encode_with("gpu", torch.randn(3), "rel", 1e-2)
    with pytest.raises(ValueError, match="takes CUDA tensors"):
        encode_with("cuda", torch.randn(3), "rel", 1e-2)


def test_packed_over_an_unaligned_buffer_decodes():
    """A Packed whose payload starts at an odd address (a view into a foreign buffer) still decodes correctly."""
    x = torch.relu(torch.randn(500))
    packed = get_codec({"id": "sz", "mode": "abs", "bound": 1e-3}).encode(x)
    shifted = torch.zeros(packed.data.numel() + 1, dtype=torch.uint8)
    shifted[1:] = packed.data
    unaligned = Packed(packed.header, shifted[1:])
    assert unaligned.data.data_ptr() % 8 != 0
    assert _same_bits(get_codec({"id": "sz", "mode": "abs", "bound": 1e-3}).decode(unaligned),
                      get_codec({"id": "sz", "mode": "abs", "bound": 1e-3}).decode(packed))
