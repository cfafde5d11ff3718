"""The lossless zstd stage over any codec's stream (``"entropy": "zstd"`` in a codec config)."""

import struct

import pytest
import torch
import torch.nn.functional as F

from hpcdl.compress import CodecError, Packed, check_bound, get_codec
from hpcdl.compress.checksum import payload_checksum
from hpcdl.compress.entropy import EntropyStage, with_stage
from hpcdl.compress.header import read_header, write_header
from hpcdl.runtime.adaptive import AdaptiveController, AdaptiveOptions
from hpcdl.runtime.policy import PolicySpecError, SavedTensorInfo, config_from_spec, policy_from_spec
from hpcdl.runtime.trials import trial

SOFTMAX = torch.softmax(torch.randn(8, 196, 196, generator=torch.Generator().manual_seed(0)) * 3, -1)


def test_the_config_key_wraps_any_codec_and_round_trips_through_its_config():
    config = config_from_spec("sz:rel=1e-2,entropy=zstd")
    assert config == {"id": "sz", "mode": "rel", "bound": 0.01, "entropy": "zstd"}
    codec = get_codec(config)
    assert isinstance(codec, EntropyStage) and codec.get_config() == config and get_codec(codec.get_config()) == codec
    assert codec.error_bounded and not codec.lossless and codec.dtypes == get_codec({"id": "sz", "mode": "rel",
                                                                                     "bound": 0.01}).dtypes


def test_sz_keeps_its_bound_and_the_stage_shrinks_a_softmax_more_than_twice():
    plain = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2})
    staged = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2, "entropy": "zstd"})
    packed = staged.encode(SOFTMAX)
    restored = staged.decode(packed)
    assert check_bound(SOFTMAX, restored, "rel", 1e-2).ok
    assert torch.equal(restored, plain.decode(plain.encode(SOFTMAX)))  # lossless over sz's own stream
    assert plain.encode(SOFTMAX).nbytes / packed.nbytes > 2
    assert torch.equal(staged.decode(Packed.from_bytes(packed.to_bytes())), restored)


@pytest.mark.parametrize("config,tensor", [
    ({"id": "int"}, torch.randint(0, 9, (5000,))),
    ({"id": "window", "input": [16, 16], "kernel": [2, 2], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1]},
     F.max_pool2d(torch.randn(2, 3, 16, 16), 2, return_indices=True)[1]),
    ({"id": "levels"}, (torch.randn(3000) > 0) * 2.0),
    ({"id": "bitmask"}, torch.randn(3000) > 1),
    ({"id": "raw"}, torch.randn(3, 5)),
    ({"id": "cast", "dtype": "bf16"}, torch.randn(4000)),
])
def test_exact_codecs_stay_exact_behind_the_stage(config, tensor):
    codec = get_codec({**config, "entropy": "zstd"})
    restored = codec.decode(codec.encode(tensor))
    expected = get_codec(config).decode(get_codec(config).encode(tensor))
    assert restored.dtype == tensor.dtype and torch.equal(restored, expected)


def test_the_inner_codecs_own_stream_decodes_as_a_device_tensors_does():
    """On a CUDA tensor the stage does not run: the stream is the inner codec's own, and the staged codec decodes
    it (tested here with a host stream, the path is the same)."""
    plain = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2})
    staged = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2, "entropy": "zstd"})
    assert torch.equal(staged.decode(plain.encode(SOFTMAX[:2])), plain.decode(plain.encode(SOFTMAX[:2])))
    with pytest.raises(CodecError):
        staged.decode(get_codec({"id": "raw"}).encode(SOFTMAX[:2]))


def test_a_stream_zstd_cannot_shrink_is_stored_as_it_is():
    noise = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    codec = get_codec({"id": "raw", "entropy": "zstd"})
    packed = codec.encode(noise.view(torch.float32))
    assert read_header(packed.header, "entropy", "B").fields == (0,)
    assert torch.equal(codec.decode(packed).view(torch.uint8), noise)


def _forged(packed: Packed, data: bytes, compressed: int) -> Packed:
    header = read_header(packed.header, "entropy", "B")
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return Packed(write_header("entropy", header.dtype, header.shape, "B", compressed,
                               checksum=payload_checksum(payload)), payload)


def test_forged_streams_are_codec_errors_not_allocations_or_crashes():
    import zstandard

    codec = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2, "entropy": "zstd"})
    packed = codec.encode(SOFTMAX[:1])
    huge = zstandard.ZstdCompressor().compress(bytes(64 * SOFTMAX[:1].nbytes))  # declares far more than can be
    unknown_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100)
    other = get_codec({"id": "raw"}).encode(SOFTMAX[:1]).to_bytes()  # another codec's stream
    short = struct.pack("<I", 10**6) + b"abc"  # an inner header running past the stream
    cases = [(huge, 1, "declares"), (unknown_size, 1, "declares"), (b"not zstd at all", 1, "not a zstd frame"),
             (other, 0, "holds a 'raw' stream"), (short, 0, "runs past")]
    for data, compressed, message in cases:
        with pytest.raises(CodecError, match=message):
            codec.decode(_forged(packed, data, compressed))


def test_bad_stages_are_refused():
    with pytest.raises(ValueError, match="not one of"):
        get_codec({"id": "sz", "mode": "rel", "bound": 1e-2, "entropy": "lzma"})
    with pytest.raises(ValueError, match="one entropy stage"):
        EntropyStage(get_codec({"id": "raw", "entropy": "zstd"}))
    assert with_stage(None, "zstd") is None and with_stage({"id": "raw"}, "none") == {"id": "raw"}


def test_adaptive_adds_the_stage_to_what_it_chooses_and_measures_with_it():
    assert AdaptiveOptions().entropy == "zstd"
    assert policy_from_spec("adaptive:entropy=none").controller.options.entropy == "none"
    with pytest.raises(PolicySpecError, match="entropy is one of none, zstd"):
        policy_from_spec("adaptive:entropy=lz4")
    controller = AdaptiveController()
    info = SavedTensorInfo("block", "activation", (4, 4), torch.float32, 0)
    assert controller.choose(info)["entropy"] == "zstd"  # the default policy until the first probe
    assert "entropy" not in AdaptiveController(AdaptiveOptions(entropy="none")).choose(info)
    quant = {"id": "quant", "bits": 2, "seed": 0}
    with_zstd, without = (trial(quant, SOFTMAX, get_codec, 0, stage) for stage in ("zstd", "none"))
    assert with_zstd.codec == quant and with_zstd.mse == without.mse and with_zstd.nbytes < without.nbytes


def test_actnn_baseline_has_no_entropy_stage():
    assert policy_from_spec("actnn:bits=2").controller.options.entropy == "none"
