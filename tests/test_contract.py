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
    blob = write_header("raw", torch.float32, (2, 3), "dq", 1.5, 7)
    with pytest.raises(CodecError):
        read_header(blob[:cut], "raw", "dq")


def test_wrong_codec_is_named():
    blob = write_header("sz", torch.float32, (2, 3))
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
