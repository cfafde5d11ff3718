"""Golden streams (tests/fixtures/, written by make_fixtures.py): stream formats do not change by accident.

Every implementation (sz and int: each backend) must produce the stored bytes
from the stored input, and decode the stored stream to the stored output, bit
for bit.
"""

import json
from pathlib import Path

import pytest
import torch

from hpcdl.compress import Packed, get_codec
from hpcdl.compress.intcodec import IntCodec
from hpcdl.compress.sz import Sz, host

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASES = json.loads((FIXTURES / "cases.json").read_text())
BACKENDS = ["reference"] + (["host"] if host.AVAILABLE else [])


def _load(name: str, suffix: str) -> torch.Tensor:
    return get_codec({"id": "raw"}).decode(Packed.from_bytes((FIXTURES / f"{name}.{suffix}").read_bytes()))


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


BLOCK_CASES = sorted(name for name in CASES if CASES[name]["id"] in ("sz", "int"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BLOCK_CASES)
def test_golden_stream(name, backend):
    config = CASES[name]
    codec = get_codec(config)
    stream = (FIXTURES / f"{name}.stream").read_bytes()
    original, expected = _load(name, "input"), _load(name, "decoded")
    assert codec.encode_with(original, backend).to_bytes() == stream
    decoded = (Sz.decode_with if isinstance(codec, Sz) else IntCodec().decode_with)(Packed.from_bytes(stream), backend)
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    assert _bits(decoded) == _bits(expected)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(BLOCK_CASES)))
def test_golden_stream_of_other_codecs(name):
    codec = get_codec(CASES[name])
    stream = (FIXTURES / f"{name}.stream").read_bytes()
    original, expected = _load(name, "input"), _load(name, "decoded")
    assert codec.encode(original).to_bytes() == stream
    decoded = codec.decode(Packed.from_bytes(stream))
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    assert _bits(decoded) == _bits(expected)


def test_fixtures_cover_every_codec_without_optional_packages():
    assert {config["id"] for config in CASES.values()} == {"sz", "int", "quant", "cast", "bitmask", "raw"}


def test_fixtures_cover_every_block_predictor():
    """The golden streams hold blocks of all four predictors (zigzag, unsigned, Lorenzo, sparse) and a raw fallback."""
    from hpcdl.compress import intcodec, sz
    from hpcdl.compress.header import read_header
    from hpcdl.compress.sz.stream import block_count

    predictors, raw_streams = set(), 0
    for name in BLOCK_CASES:
        packed = Packed.from_bytes((FIXTURES / f"{name}.stream").read_bytes())
        is_sz = packed.codec_id == "sz"
        fields = read_header(packed.header, packed.codec_id, sz.FIELDS if is_sz else intcodec.FIELDS).fields
        if fields[1 if is_sz else 0] & 1:  # the raw-fallback flag: the payload is the tensor's bytes
            raw_streams += 1
            continue
        blocks = block_count(_load(name, "input").numel() * (2 if name.startswith("int_i64") else 1))
        predictors |= {int(h) >> 6 for h in packed.data[:blocks]}
    assert predictors == {0, 1, 2, 3} and raw_streams >= 1
