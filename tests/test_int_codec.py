"""The lossless ``int`` codec: exact round trips, reference == host bytes, compression of indices, bad input."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from hpcdl.compress import CodecError, Packed, get_codec
from hpcdl.compress.intcodec import IntCodec
from hpcdl.compress.sz import host

INTS = [np.uint8, np.int8, np.int16, np.int32, np.int64]


def _round_trip(x: torch.Tensor) -> Packed:
    codec = IntCodec()
    packed = codec.encode_with(x, "host" if host.AVAILABLE else "reference")
    expected = codec.encode_with(x, "reference")
    assert packed.header == expected.header and torch.equal(packed.data, expected.data)
    for restored in (codec.decode(packed), codec.decode_with(packed, "reference"),
                     codec.decode(Packed.from_bytes(packed.to_bytes()))):
        assert restored.dtype == x.dtype and restored.shape == x.shape and torch.equal(restored, x)
    return packed


@given(st.sampled_from(INTS).flatmap(
    lambda dtype: arrays(dtype, array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40))))
def test_any_integers_round_trip_exactly(values):
    _round_trip(torch.tensor(values))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_extremes_and_wrapping_deltas(dtype):
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, info.max, 0, info.max, info.min, -1 if info.min < 0 else 1] * 11, dtype=dtype)
    _round_trip(x)
    _round_trip(torch.randint(info.min, info.max, (1000,), dtype=dtype))


def test_int64_beyond_32_bits():
    x = torch.tensor([2**62, -(2**62), 2**40 + 7, -(2**33), 5, 2**63 - 1, -(2**63)] * 9, dtype=torch.int64)
    _round_trip(x)


def test_max_pool_indices_compress():
    _, indices = torch.nn.functional.max_pool2d(torch.randn(4, 8, 32, 32), 2, return_indices=True)
    packed = _round_trip(indices)
    assert packed.nbytes * 4 < indices.numel() * 8


def test_non_contiguous_and_zero_dims():
    x = torch.arange(600, dtype=torch.int64).reshape(20, 30)
    _round_trip(x.t())
    _round_trip(x[::2, 3:17:4])
    _round_trip(torch.empty(0, 3, dtype=torch.int32))
    _round_trip(torch.tensor(-5, dtype=torch.int16))


def test_incompressible_data_is_stored_raw():
    x = torch.randint(-(2**31), 2**31 - 1, (4096,), dtype=torch.int32)
    packed = _round_trip(x)
    assert packed.data.numel() <= x.numel() * 4 + 7


def test_config_and_bad_input():
    codec = get_codec({"id": "int"})
    assert get_codec(json.loads(json.dumps(codec.get_config()))) == codec
    with pytest.raises(TypeError, match="cannot encode dtype"):
        codec.encode(torch.randn(3))
    with pytest.raises(ValueError, match="bad options"):
        get_codec({"id": "int", "bits": 3})
    with pytest.raises(CodecError, match="made by codec 'sz'"):
        codec.decode(get_codec({"id": "sz"}).encode(torch.randn(3)))


def test_corrupted_or_truncated_streams_raise():
    codec = get_codec({"id": "int"})
    blob = codec.encode(torch.arange(900, dtype=torch.int64) // 3).to_bytes()
    rng = np.random.default_rng(0)
    for _ in range(60):
        bad = bytearray(blob)
        bad[int(rng.integers(0, len(blob)))] ^= int(rng.integers(1, 256))
        with pytest.raises(CodecError):
            codec.decode(Packed.from_bytes(bytes(bad)))
    for cut in (0, 5, len(blob) // 2, len(blob) - 1):
        with pytest.raises(CodecError):
            codec.decode(Packed.from_bytes(blob[:cut]))


_PEAK_SCRIPT = """
import sys, torch
from hpcdl.compress import get_codec

def status(field):
    with open('/proc/self/status') as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field))

config, dtype, numel = eval(sys.argv[1]), getattr(torch, sys.argv[2]), int(sys.argv[3])
codec = get_codec(config)
packed = codec.encode(torch.zeros(numel, dtype=dtype))
codec.decode(packed)  # warm-up: one-time allocations of the libraries are not the decode's
with open('/proc/self/clear_refs', 'w') as refs:
    refs.write('5')  # resets the peak resident set (VmHWM) to the current one
before = status('VmRSS')
out = codec.decode(packed)
print((status('VmHWM') - before) / (out.numel() * out.element_size()))
"""


@pytest.mark.parametrize("config,dtype", [({"id": "int"}, "int64"), ({"id": "int"}, "uint8"),
                                          ({"id": "sz", "mode": "abs", "bound": 0.1}, "float32")])
def test_decode_transient_is_a_small_multiple_of_the_output(config, dtype):
    """Decoding an all-zero stream (the smallest payload, so the output dominates) peaks near the output's size.
    Measured in a fresh process whose freed tensors go back to the system (as hpcdl.memory measures CPU peaks)."""
    import os
    import subprocess
    import sys

    from hpcdl.memory.allocator import child_env

    env = {**os.environ, **child_env(), "OMP_NUM_THREADS": "1"}
    numel = 2**25 // torch.empty(0, dtype=getattr(torch, dtype)).element_size()  # a 32 MiB output
    result = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, repr(config), dtype, str(numel)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ratio = float(result.stdout)
    assert ratio < 1.5, f"decoding {config} {dtype} peaked at {ratio:.2f}x its output"
