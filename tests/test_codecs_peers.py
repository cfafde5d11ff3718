"""Peer codecs ``sz3`` (pysz) and ``zfp`` (zfpy): same contract, and the behaviour docs/codecs.md documents."""

import importlib.util
import json
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.compress import CodecError, Packed, check_bound, get_codec

from conftest import require

PEERS = {"sz3": "pysz", "zfp": "zfpy"}


@pytest.fixture(autouse=True)
def peers_installed():
    missing = [package for package in PEERS.values() if importlib.util.find_spec(package) is None]
    require(not missing, f"peer packages missing: {missing} (pip install 'hpcdl[peers]')")


def smooth_field(shape, seed=0, dtype=torch.float32):
    """A smooth random field (cumulative sums of noise), like the activations the peers are compared on."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for dim in range(x.dim()):
        x = x.cumsum(dim)
    return x.to(dtype)


@pytest.mark.parametrize("codec_id", list(PEERS))
@pytest.mark.parametrize("mode", ["abs", "rel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bound_holds_on_finite_smooth_data(codec_id, mode, dtype):
    x = smooth_field((2, 3, 16, 20), dtype=dtype)
    codec = get_codec({"id": codec_id, "mode": mode, "bound": 1e-2})
    packed = codec.encode(x)
    y = codec.decode(Packed.from_bytes(packed.to_bytes()))
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    report = check_bound(x, y, mode, 1e-2)
    assert report.bound_violations == 0 and report.nonfinite_mismatches == 0
    assert packed.nbytes == len(packed.to_bytes()) - 4


@pytest.mark.parametrize("codec_id", list(PEERS))
def test_smooth_fields_compress(codec_id):
    x = smooth_field((64, 128)) / 100
    packed = get_codec({"id": codec_id, "mode": "rel", "bound": 1e-2}).encode(x)
    assert packed.nbytes * 2 < x.numel() * x.element_size()


@given(
    codec_id=st.sampled_from(list(PEERS)),
    shape=st.lists(st.integers(0, 6), max_size=6),
    bound=st.sampled_from([1e-1, 1e-2, 1e-3]),
    seed=st.integers(0, 2**31),
)
def test_property_any_shape_within_bound(codec_id, shape, bound, seed):
    x = smooth_field(shape, seed) if shape else torch.tensor(float(seed % 7))
    codec = get_codec({"id": codec_id, "mode": "rel", "bound": bound})
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape
    assert check_bound(x, y, "rel", bound).bound_violations == 0


def relu_like():
    x = smooth_field((64, 64), seed=3)
    return torch.where(x > x.median(), x - x.median(), torch.zeros_like(x)) - 0.001 * (x < x.median() - 5)


@pytest.mark.parametrize("codec_id", list(PEERS))
def test_documented_zero_and_sign_are_not_preserved(codec_id):
    x = relu_like()
    codec = get_codec({"id": codec_id, "mode": "rel", "bound": 1e-2})
    report = check_bound(x, codec.decode(codec.encode(x)), "rel", 1e-2)
    assert report.bound_violations == 0
    assert report.zero_mismatches > 0, f"{codec_id} now keeps zeros exactly: update docs/codecs.md"
    assert report.sign_flips > 0, f"{codec_id} now keeps signs: update docs/codecs.md"


def test_sz3_returns_nan_and_inf_exactly():
    x = smooth_field((40, 40))
    x[3, 4], x[10, 10], x[20, 30] = float("nan"), float("inf"), -float("inf")
    codec = get_codec({"id": "sz3", "mode": "abs", "bound": 1e-2})
    report = check_bound(x, codec.decode(codec.encode(x)), "abs", 1e-2)
    assert report.nonfinite_mismatches == 0 and report.bound_violations == 0


def test_zfp_loses_nan_and_inf_and_their_block_neighbours():
    x = smooth_field((40, 40))
    x[3, 4], x[10, 10] = float("nan"), float("inf")
    codec = get_codec({"id": "zfp", "mode": "abs", "bound": 1e-2})
    y = codec.decode(codec.encode(x))
    report = check_bound(x, y, "abs", 1e-2)
    assert report.nonfinite_mismatches == 2, "documented: zfp returns NaN/Inf as finite numbers"
    assert report.bound_violations > 0, "documented: finite values in a block with NaN/Inf leave the bound"


@pytest.mark.parametrize("codec_id", list(PEERS))
def test_config_round_trip_and_flags(codec_id):
    codec = get_codec({"id": codec_id, "mode": "abs", "bound": 0.5})
    assert get_codec(json.loads(json.dumps(codec.get_config()))) == codec
    assert codec.error_bounded and not codec.lossless and codec.modes == ("abs", "rel")
    assert get_codec({"id": codec_id}) == get_codec({"id": codec_id, "mode": "rel", "bound": 1e-2})


@pytest.mark.parametrize("codec_id", list(PEERS))
@pytest.mark.parametrize(
    "options, message",
    [({"mode": "pw_rel"}, "has no mode 'pw_rel'"), ({"bound": 0}, "finite number > 0"), ({"bits": 2}, "bad options")],
)
def test_bad_options(codec_id, options, message):
    with pytest.raises(ValueError, match=message):
        get_codec({"id": codec_id, **options})


@pytest.mark.parametrize("codec_id", list(PEERS))
def test_cpu_only_and_float_only(codec_id):
    codec = get_codec({"id": codec_id})
    with pytest.raises(ValueError, match="CPU tensors only"):
        codec.encode(torch.empty(4, device="meta"))
    with pytest.raises(TypeError, match="cannot encode dtype"):
        codec.encode(torch.zeros(4, dtype=torch.float16))


@pytest.mark.parametrize("codec_id", list(PEERS))
def test_missing_package_is_named(codec_id, monkeypatch):
    monkeypatch.setitem(sys.modules, PEERS[codec_id], None)
    with pytest.raises(ImportError, match=f"pip install {PEERS[codec_id]}"):
        get_codec({"id": codec_id})


@pytest.mark.parametrize("codec_id", list(PEERS))
def test_corrupted_and_truncated_streams_never_reach_the_library(codec_id):
    codec = get_codec({"id": codec_id, "mode": "rel", "bound": 1e-3})
    packed = codec.encode(smooth_field((30, 30)))
    with pytest.raises(CodecError, match="the header says"):
        codec.decode(Packed(packed.header, packed.data[:-1]))
    flipped = packed.data.clone()
    flipped[len(flipped) // 2] ^= 0xFF
    with pytest.raises(CodecError, match="checksum"):
        codec.decode(Packed(packed.header, flipped))
    with pytest.raises(CodecError, match="truncated"):
        codec.decode(Packed(packed.header[:-5], packed.data))
    other = "zfp" if codec_id == "sz3" else "sz3"
    with pytest.raises(CodecError, match=f"made by codec '{codec_id}'"):
        get_codec({"id": other}).decode(packed)


def _forged(codec_id: str, packed: Packed, data: torch.Tensor) -> Packed:
    """``data`` under a header whose length and payload checksum match it: the library itself gets the bytes."""
    from hpcdl.compress.checksum import payload_checksum
    from hpcdl.compress.header import read_header, write_header

    header = read_header(packed.header, codec_id, "dQ")
    return Packed(write_header(codec_id, header.dtype, header.shape, "dQ", header.fields[0], data.numel(),
                               checksum=payload_checksum(data)), data)


def test_sz3_library_index_error_becomes_a_codec_error(monkeypatch):
    """pysz reports some malformed streams as IndexError; decode names it inside a CodecError."""
    codec = get_codec({"id": "sz3", "mode": "abs", "bound": 1e-3})
    packed = codec.encode(smooth_field((30, 30)))

    def index_error(*_args):
        raise IndexError("SZ3 Huffman: payload length does not match its codes")

    from types import SimpleNamespace

    monkeypatch.setattr(codec, "library", SimpleNamespace(sz=SimpleNamespace(decompress=index_error)))
    with pytest.raises(CodecError, match="sz3 could not decode the stream: IndexError: SZ3 Huffman") as caught:
        codec.decode(packed)
    assert isinstance(caught.value.__cause__, IndexError)


def test_sz3_corrupted_library_bytes_with_a_valid_checksum_are_codec_errors():
    """Byte changes that the hpcdl checksum was forged to accept reach pysz itself: every one decodes or is a
    CodecError (about a third of them are pysz's IndexError), never another exception type."""
    codec = get_codec({"id": "sz3", "mode": "abs", "bound": 1e-3})
    packed = codec.encode(smooth_field((30, 30)))
    generator = torch.Generator().manual_seed(0)
    causes = set()
    for _ in range(40):
        data = packed.data.clone()
        data[torch.randint(len(data), (1,), generator=generator)] = torch.randint(256, (1,), generator=generator,
                                                                                  dtype=torch.uint8)
        try:
            codec.decode(_forged("sz3", packed, data))
        except CodecError as err:
            causes.add(type(err.__cause__))
    assert IndexError in causes, causes
