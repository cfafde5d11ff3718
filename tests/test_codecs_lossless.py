"""The ``bitmask`` codec (exact, 1 bit per bool) and the ``cast`` codec (narrow float types, not error-bounded)."""

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.compress import CodecError, Packed, get_codec
from hpcdl.compress.checksum import payload_checksum
from hpcdl.compress.header import DTYPE_CODES, write_header

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
TARGETS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}


# --- bitmask -----------------------------------------------------------------------------------------------------

@given(shape=st.lists(st.integers(0, 11), max_size=4), seed=st.integers(0, 2**31))
def test_bitmask_round_trip_is_exact_at_one_bit_per_element(shape, seed):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5
    codec = get_codec({"id": "bitmask"})
    packed = codec.encode(mask)
    assert packed.data.numel() == math.ceil(mask.numel() / 8)
    assert packed.nbytes == len(packed.header) + math.ceil(mask.numel() / 8)
    restored = codec.decode(Packed.from_bytes(packed.to_bytes()))
    assert restored.dtype == torch.bool and torch.equal(restored, mask)


def test_bitmask_takes_non_contiguous_views_and_0d():
    codec = get_codec({"id": "bitmask"})
    view = (torch.randn(9, 10) > 0)[::2, 1::3]
    assert torch.equal(codec.decode(codec.encode(view)), view)
    scalar = torch.tensor(True)
    assert torch.equal(codec.decode(codec.encode(scalar)), scalar)


def test_bitmask_contract():
    codec = get_codec({"id": "bitmask"})
    assert codec.lossless and get_codec(json.loads(json.dumps(codec.get_config()))) == codec
    with pytest.raises(TypeError, match="cannot encode dtype"):
        codec.encode(torch.zeros(3))
    with pytest.raises(ValueError, match="bad options"):
        get_codec({"id": "bitmask", "bits": 2})
    packed = codec.encode(torch.ones(17, dtype=torch.bool))
    with pytest.raises(CodecError, match="expected 3"):
        codec.decode(Packed(packed.header, packed.data[:-1]))
    with pytest.raises(CodecError, match="only writes torch.bool"):
        codec.decode(Packed(write_header("bitmask", torch.float32, (17,), checksum=payload_checksum(packed.data)),
                            packed.data))
    with pytest.raises(CodecError, match="made by codec 'raw'"):
        codec.decode(get_codec({"id": "raw"}).encode(torch.ones(3, dtype=torch.bool)))


# --- cast --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("dtype", FLOATS)
def test_cast_round_trip_has_the_target_types_rounding(target, dtype):
    narrow = TARGETS[target]
    x = (torch.randn(4, 33, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    x = x[x.abs() > 2 * torch.finfo(narrow).smallest_normal]  # normal numbers in the target: relative error holds
    codec = get_codec({"id": "cast", "dtype": target})
    packed = codec.encode(x)
    assert packed.nbytes == len(packed.header) + x.numel() * narrow.itemsize
    y = codec.decode(Packed.from_bytes(packed.to_bytes()))
    assert y.dtype == x.dtype and y.shape == x.shape
    relative = ((y.double() - x.double()).abs() / x.double().abs()).max()
    assert float(relative) <= torch.finfo(narrow).eps / 2 + torch.finfo(dtype).eps
    assert torch.equal(y, x.to(narrow).to(dtype)), "cast is round-to-nearest into the target and exact back"


@pytest.mark.parametrize("target, largest", [("bf16", torch.finfo(torch.bfloat16).max), ("fp16", 65504.0), ("fp8_e4m3", 448.0)])
def test_cast_saturates_finite_overflow(target, largest):
    codec = get_codec({"id": "cast", "dtype": target})
    x = torch.tensor([3.4e38, -3.4e38, 1e6, -1e6, 0.5], dtype=torch.float32)
    y = codec.decode(codec.encode(x))
    assert bool(torch.isfinite(y).all())
    assert y[0] == largest and y[1] == -largest
    assert y[2] == min(1e6, largest) or y[2] == torch.tensor(1e6).to(TARGETS[target]).float()
    assert y[4] == 0.5


@pytest.mark.parametrize("target, source, largest", [("fp16", torch.bfloat16, 65504.0), ("fp8_e4m3", torch.float16, 448.0)])
def test_cast_saturates_from_narrow_sources(target, source, largest):
    codec = get_codec({"id": "cast", "dtype": target})
    y = codec.decode(codec.encode(torch.tensor([60000.0, 65000.0, -1e4], dtype=source)))
    assert bool(torch.isfinite(y).all()) and y.abs().max() <= largest


@pytest.mark.parametrize("target", ["bf16", "fp16"])
def test_cast_keeps_nan_and_inf_where_the_target_has_them(target):
    codec = get_codec({"id": "cast", "dtype": target})
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0])
    y = codec.decode(codec.encode(x))
    assert torch.isnan(y[0]) and y[1] == float("inf") and y[2] == -float("inf")
    assert y[3] == 0 and not torch.signbit(y[3]) and torch.signbit(y[4])


def test_cast_to_fp8_keeps_nan_and_refuses_inf():
    codec = get_codec({"id": "cast", "dtype": "fp8_e4m3"})
    assert torch.isnan(codec.decode(codec.encode(torch.tensor([float("nan"), 1.0])))[0])
    with pytest.raises(ValueError, match="fp8 e4m3 has no Inf"):
        codec.encode(torch.tensor([1.0, float("inf")]))


def test_cast_flushes_values_below_the_targets_subnormals():
    codec = get_codec({"id": "cast", "dtype": "fp16"})
    y = codec.decode(codec.encode(torch.tensor([1e-10, -1e-10])))
    assert y.tolist() == [0.0, 0.0], "documented: tiny values lose their sign, cast is not error-bounded"
    assert not codec.error_bounded and not codec.lossless


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (2, 3, 4)])
def test_cast_any_shape_and_independent_result(shape):
    codec = get_codec({"id": "cast", "dtype": "bf16"})
    x = torch.randn(shape, dtype=torch.bfloat16)
    packed = codec.encode(x)
    y = codec.decode(packed)
    assert torch.equal(y, x)
    if y.numel():
        y.reshape(-1)[0] = 123.0
        assert torch.equal(codec.decode(packed), x), "decoded tensor must not alias the packed bytes"


def test_cast_non_contiguous_input():
    codec = get_codec({"id": "cast", "dtype": "fp16"})
    x = torch.randn(8, 9)[1::2, ::4]
    assert torch.equal(codec.decode(codec.encode(x)), x.half().float())


@pytest.mark.parametrize("target", list(TARGETS))
def test_cast_config_round_trips_through_json(target):
    codec = get_codec({"id": "cast", "dtype": target})
    assert get_codec(json.loads(json.dumps(codec.get_config()))) == codec
    assert get_codec({"id": "cast", "dtype": target, "mode": "dtype"}) == codec


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"dtype": "fp32"}, ValueError, "no target dtype 'fp32'"),
        ({"dtype": "fp8"}, ValueError, "use one of"),
        ({"mode": "rel"}, ValueError, "has no mode 'rel'"),
        ({"bound": 0.1}, ValueError, "bad options"),
    ],
)
def test_cast_bad_options(options, error, message):
    with pytest.raises(error, match=message):
        get_codec({"id": "cast", **options})


def test_cast_refuses_non_float_input():
    with pytest.raises(TypeError, match="cannot encode dtype"):
        get_codec({"id": "cast"}).encode(torch.arange(4))


def test_cast_validates_streams():
    codec = get_codec({"id": "cast", "dtype": "fp16"})
    packed = codec.encode(torch.randn(5))
    with pytest.raises(CodecError, match="expected 10"):
        codec.decode(Packed(packed.header, packed.data[:-2]))
    checksum = payload_checksum(packed.data)
    with pytest.raises(CodecError, match="not one of"):
        codec.decode(Packed(write_header("cast", torch.float32, (5,), "B", DTYPE_CODES[torch.int16], checksum=checksum),
                            packed.data))
    with pytest.raises(CodecError, match="never encodes"):
        codec.decode(Packed(write_header("cast", torch.int16, (5,), "B", DTYPE_CODES[torch.float16], checksum=checksum),
                            packed.data))
    with pytest.raises(CodecError, match="fields"):
        codec.decode(Packed(write_header("cast", torch.float32, (5,), checksum=checksum), packed.data))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("config", [{"id": "bitmask"}, {"id": "cast", "dtype": "bf16"}, {"id": "cast", "dtype": "fp8_e4m3"}])
def test_cuda_bytes_equal_cpu_bytes(config):
    codec = get_codec(config)
    x = torch.randn(3, 1001) > 0 if config["id"] == "bitmask" else torch.randn(3, 1001) * 100
    on_gpu = codec.encode(x.cuda())
    assert on_gpu.device.type == "cuda" and torch.equal(on_gpu.data.cpu(), codec.encode(x).data)
    assert torch.equal(codec.decode(on_gpu).cpu(), codec.decode(codec.encode(x)))
