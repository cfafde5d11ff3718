"""The codec contract itself: registry, Packed, headers, error bounds, verification."""

import json

import pytest
import torch

from hpcdl.compress import (
    Codec,
    CodecError,
    ErrorBound,
    Packed,
    UnknownCodecError,
    check_bound,
    get_codec,
    register_codec,
)
from hpcdl.compress.header import read_header, write_header


def test_unknown_codec_names_known_ids():
    with pytest.raises(UnknownCodecError, match="known ids:.*raw.*sz"):
        get_codec({"id": "lz4-nope"})


def test_config_without_id_and_non_dict_are_refused():
    with pytest.raises(ValueError, match="no 'id'"):
        get_codec({"mode": "rel"})
    with pytest.raises(TypeError, match="a codec config is a dict"):
        get_codec("sz")


def test_get_codec_does_not_mutate_config():
    config = {"id": "raw"}
    get_codec(config)
    assert config == {"id": "raw"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5, 2)])
def test_raw_round_trip(dtype, shape):
    codec = get_codec({"id": "raw"})
    x = (torch.randn(shape) * 10).to(dtype)
    packed = codec.encode(x)
    y = codec.decode(packed)
    assert y.shape == x.shape and y.dtype == x.dtype and torch.equal(x, y)
    assert packed.nbytes == len(packed.header) + x.numel() * x.element_size()
    assert torch.equal(codec.decode(Packed.from_bytes(packed.to_bytes())), x)


def test_raw_takes_non_contiguous_views():
    codec = get_codec({"id": "raw"})
    x = torch.randn(6, 8)[1::2, ::3]
    assert torch.equal(codec.decode(codec.encode(x)), x)


def test_config_round_trips_through_json():
    codec = get_codec({"id": "raw"})
    assert get_codec(json.loads(json.dumps(codec.get_config()))) == codec


def test_register_codec_refuses_silent_replacement():
    class Other(Codec):
        codec_id = "raw"
        modes = ("lossless",)
        dtypes = frozenset({torch.float32})

        def get_config(self):
            return {"id": "raw"}

        def _encode(self, tensor):
            raise NotImplementedError

        def _decode(self, packed):
            raise NotImplementedError

    with pytest.raises(ValueError, match="already registered"):
        register_codec(Other)


@pytest.mark.parametrize("cut", [0, 3, 5, 9, 20])
def test_truncated_header_is_a_clear_error(cut):
    blob = write_header("raw", torch.float32, (2, 3), "dq", 1.5, 7, checksum=0)
    with pytest.raises(CodecError):
        read_header(blob[:cut], "raw", "dq")


def test_wrong_codec_is_named():
    blob = write_header("sz", torch.float32, (2, 3), checksum=0)
    with pytest.raises(CodecError, match="made by codec 'sz'"):
        read_header(blob, "raw")


def test_raw_payload_length_is_validated():
    codec = get_codec({"id": "raw"})
    packed = codec.encode(torch.randn(10))
    with pytest.raises(CodecError, match="expected 40"):
        codec.decode(Packed(packed.header, packed.data[:-1]))


def test_truncated_packed_bytes():
    with pytest.raises(CodecError):
        Packed.from_bytes(b"\x10\x00")
    with pytest.raises(CodecError, match="truncated"):
        Packed.from_bytes(b"\xff\x00\x00\x00abc")


@pytest.mark.parametrize("bound", [0, -1e-3, float("nan"), float("inf")])
def test_bad_bounds(bound):
    with pytest.raises(ValueError, match="finite number > 0"):
        ErrorBound("abs", bound)


def test_bad_mode():
    with pytest.raises(ValueError, match="use one of"):
        ErrorBound("psnr", 1e-2)


def test_check_bound_catches_each_rule():
    x = torch.tensor([1.0, -1.0, 0.0, float("nan"), float("inf"), 0.5])
    assert check_bound(x, x.clone(), "abs", 1e-3).ok
    assert check_bound(x, x + torch.tensor([0, 0, 0, 0, 0, 0.1]), "abs", 1e-3).bound_violations == 1
    assert check_bound(x, torch.tensor([1.0, 0.0, 0.0, float("nan"), float("inf"), 0.5]), "abs", 2.0).sign_flips == 1
    assert check_bound(x, torch.tensor([1.0, -1.0, 1e-9, float("nan"), float("inf"), 0.5]), "abs", 1.0).zero_mismatches == 1
    assert check_bound(x, torch.tensor([1.0, -1.0, 0.0, 0.0, float("inf"), 0.5]), "abs", 1.0).nonfinite_mismatches == 1
    rel = check_bound(torch.tensor([0.0, 10.0]), torch.tensor([0.0, 10.5]), "rel", 0.1)
    assert rel.ok and rel.max_error_over_bound == pytest.approx(0.5)


# One example tensor per codec config: every registered stream format is checked by the tests below.
STREAM_CASES = [
    ({"id": "raw"}, torch.randn(3, 7)),
    ({"id": "bitmask"}, torch.randn(37) > 0),
    ({"id": "cast", "dtype": "bf16"}, torch.randn(5, 9)),
    ({"id": "cast", "dtype": "fp8_e4m3"}, torch.randn(29)),
    ({"id": "quant", "bits": 2, "group_size": 16, "seed": 1}, torch.randn(101)),
    ({"id": "quant", "bits": 8, "scale_dtype": "fp16", "seed": 1}, torch.randn(3, 50, dtype=torch.float64)),
    ({"id": "int"}, torch.arange(77, dtype=torch.int64) * 3),
    ({"id": "levels"}, (torch.randn(83) > 0) * 2.5),
    ({"id": "window", "input": [9, 7], "kernel": [2, 2], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1]},
     torch.nn.functional.max_pool2d(torch.randn(2, 9, 7), 2, return_indices=True)[1]),
    ({"id": "sz", "mode": "rel", "bound": 1e-2}, torch.randn(90)),
    ({"id": "sz", "mode": "rel", "bound": 1e-2, "entropy": "zstd"}, torch.relu(torch.randn(300))),
    ({"id": "sz", "mode": "abs", "bound": 1e-2, "channels": 1}, torch.randn(3, 5, 20) * torch.logspace(-2, 1, 5)[:, None]),
]


@pytest.mark.parametrize("config,tensor", STREAM_CASES, ids=lambda v: v.get("id") if isinstance(v, dict) else "")
def test_every_changed_payload_byte_is_a_codec_error(config, tensor):
    """Every codec's stream carries the payload checksum: no flipped bit anywhere decodes silently."""
    codec = get_codec(config)
    packed = codec.encode(tensor)
    for position in range(packed.data.numel()):
        for flip in (0x01, 0x80):
            changed = packed.data.clone()
            changed[position] ^= flip
            with pytest.raises(CodecError, match="checksum"):
                codec.decode(Packed(packed.header, changed))


@pytest.mark.parametrize("config,tensor", STREAM_CASES, ids=lambda v: v.get("id") if isinstance(v, dict) else "")
def test_every_changed_header_byte_is_a_codec_error(config, tensor):
    codec = get_codec(config)
    packed = codec.encode(tensor)
    for position in range(len(packed.header)):
        changed = bytearray(packed.header)
        changed[position] ^= 0x10
        with pytest.raises(CodecError):
            codec.decode(Packed(bytes(changed), packed.data))


@pytest.mark.parametrize("offset", [1, 3, 4])
@pytest.mark.parametrize("config,tensor", STREAM_CASES, ids=lambda v: v.get("id") if isinstance(v, dict) else "")
def test_payload_at_an_unaligned_address_decodes(config, tensor, offset):
    """A valid stream whose payload sits at an odd offset of a foreign buffer decodes to the same values."""
    codec = get_codec(config)
    packed = codec.encode(tensor)
    buffer = torch.zeros(packed.data.numel() + offset, dtype=torch.uint8)
    buffer[offset:] = packed.data
    shifted = Packed(packed.header, buffer[offset:])
    assert shifted.data.data_ptr() % 8 != 0
    expected = codec.decode(packed)
    restored = codec.decode(shifted)
    assert restored.dtype == expected.dtype and torch.equal(restored.view(-1).view(torch.uint8),
                                                            expected.view(-1).view(torch.uint8))


def test_version_1_streams_are_refused_with_the_reason():
    blob = bytearray(get_codec({"id": "raw"}).encode(torch.randn(4)).header)
    blob[4] = 1
    with pytest.raises(CodecError, match="version 1 streams.*re-encoded"):
        get_codec({"id": "raw"}).decode(Packed(bytes(blob), torch.zeros(16, dtype=torch.uint8)))
