"""The entropy stage's codes layouts (hpcdl/compress/codes.py): a block stream's codes repacked whole for zstd."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from hpcdl.compress import CodecError, Packed, get_codec
from hpcdl.compress.blocks import host, reference
from hpcdl.compress.blocks.stream import word_offsets
from hpcdl.compress.checksum import payload_checksum
from hpcdl.compress.codes import CODE_BITS, MAX_ZIGZAG, code_bits
from hpcdl.compress.entropy import STORED, ZSTD_CODES, ZSTD_STREAM
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.nested import header_prefix, inner_packed

GENERATOR = torch.Generator().manual_seed(0)
NORMAL = torch.randn(8, 16, 24, 24, generator=GENERATOR)
TENSORS = {
    "relu": F.relu(NORMAL),
    "gelu": F.gelu(NORMAL),
    "softmax": torch.softmax(3 * NORMAL.view(-1, 144), dim=-1),
    "normal": NORMAL,
    "specials": torch.tensor([1.0, float("nan"), -0.0, float("inf"), -3.0, 0.0, float("-inf"), 2.5] * 517),
    "odd length": NORMAL.reshape(-1)[:1001],
    "one": torch.tensor([0.7]),
    "empty": torch.empty(0, 3),
}


def _layout(packed: Packed) -> int:
    return read_header(packed.header, "entropy", "B").fields[0]


def _staged(rel: float) -> tuple:
    inner = get_codec({"id": "sz", "mode": "rel", "bound": rel})
    return inner, get_codec({"id": "sz", "mode": "rel", "bound": rel, "entropy": "zstd"})


@pytest.mark.parametrize("name", TENSORS)
@pytest.mark.parametrize("rel", [1e-1, 1e-2, 1e-3, 1e-6])
def test_the_stage_decodes_what_the_inner_codec_decodes_bit_for_bit(name, rel):
    tensor = TENSORS[name]
    inner, staged = _staged(rel)
    expected = inner.decode(inner.encode(tensor))
    restored = staged.decode(staged.encode(tensor))
    assert restored.shape == tensor.shape and restored.dtype == tensor.dtype
    assert torch.equal(restored.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_round_trip_through_the_codes(dtype):
    tensor = TENSORS["gelu"].to(dtype)
    inner, staged = _staged(1e-2)
    packed = staged.encode(tensor)
    assert _layout(packed) in ZSTD_CODES.values()
    assert torch.equal(staged.decode(packed), inner.decode(inner.encode(tensor)))


def test_coarse_bounds_take_the_codes_and_fine_ones_the_stream():
    """The width is the fewest bits whose escapes are at most 5% of the codes; codes wider than 8 bits keep zstd
    over the stream's bit planes."""
    _, staged = _staged(1e-1)
    assert _layout(staged.encode(TENSORS["relu"])) in (ZSTD_CODES[2], ZSTD_CODES[4])
    _, fine = _staged(1e-4)
    assert _layout(fine.encode(TENSORS["normal"])) == ZSTD_STREAM
    raw_fallback = torch.randn(4096, generator=GENERATOR) * torch.logspace(-30, 30, 4096)
    assert _layout(get_codec({"id": "sz", "mode": "pw_rel", "bound": 1e-7, "entropy": "zstd"})
                   .encode(raw_fallback)) in (STORED, ZSTD_STREAM)


def test_the_codes_are_smaller_than_zstd_over_the_bit_planes_on_activations():
    """What the layout is for (measured: docs/codecs.md#entropy); a generous margin, not a benchmark."""
    import zstandard

    for name in ("relu", "gelu", "softmax"):
        inner, staged = _staged(1e-1)
        stream = inner.encode(TENSORS[name])
        planes = len(zstandard.ZstdCompressor(level=1).compress(
            torch.cat([header_prefix(stream.header), stream.data]).numpy()))
        assert staged.encode(TENSORS[name]).nbytes < planes, name


def _random_stream(numel: int, spread: float, seed: int) -> Packed:
    """An sz stream whose codes are spread out enough to need escapes at every width."""
    values = torch.randn(numel, generator=torch.Generator().manual_seed(seed)) * spread
    return get_codec({"id": "sz", "mode": "abs", "bound": 0.5}).encode(values)


@pytest.mark.skipif(not host.AVAILABLE, reason="the host kernel library is not built")
@pytest.mark.parametrize("bits", CODE_BITS)
@pytest.mark.parametrize("numel,spread", [(7, 0.3), (31, 3.0), (4097, 2.0), (50_001, 40.0), (3000, 1e4)])
def test_host_and_reference_write_the_same_bytes_and_rebuild_the_same_blocks(bits, numel, spread):
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.5})
    stream = _random_stream(numel, spread, seed=numel)
    _, counts, _, layout = codec.read_stream_header(stream.header)
    assert counts.flags == 0  # a stream of codes, not the raw fallback (whose payload has none)
    headers, words = layout.headers(stream.data), layout.words(stream.data)
    offsets, _ = word_offsets(headers)
    packed, escapes = host.codes_encode(headers, offsets, words, numel, bits)
    expected_packed, expected_escapes = reference.codes_encode(headers, offsets, words, numel, bits)
    assert torch.equal(packed, expected_packed) and torch.equal(escapes, expected_escapes)
    counts = host.codes_escapes(headers, offsets, words, numel)  # the width choice's count, without encoding
    assert torch.equal(counts, reference.codes_escapes(headers, offsets, words, numel))
    assert int(counts[CODE_BITS.index(bits)]) == escapes.numel()
    for backend in (host, reference):
        rebuilt_headers = torch.zeros_like(headers)
        rebuilt_words = torch.zeros_like(words)
        assert backend.codes_decode(packed, numel, bits, escapes, MAX_ZIGZAG, rebuilt_headers, rebuilt_words) == 0
        assert torch.equal(rebuilt_headers, headers) and torch.equal(rebuilt_words, words)


@pytest.mark.skipif(not host.AVAILABLE, reason="the host kernel library is not built")
def test_host_and_reference_refuse_the_same_broken_bodies():
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.5})
    stream = _random_stream(1000, 40.0, seed=3)
    _, _, _, layout = codec.read_stream_header(stream.header)
    headers, words = layout.headers(stream.data), layout.words(stream.data)
    offsets, _ = word_offsets(headers)
    packed, escapes = reference.codes_encode(headers, offsets, words, 1000, 4)
    assert escapes.numel() > 2
    cases = {
        "an escape missing": (packed, escapes[:-1], words.numel(), -1),
        "an escape left over": (packed, torch.cat([escapes, escapes[:1]]), words.numel(), -1),
        "an escape out of range": (packed, torch.cat([escapes[:-1], torch.tensor([MAX_ZIGZAG], dtype=torch.int32)]),
                                   words.numel(), -1),
        "a negative escape": (packed, torch.cat([escapes[:-1], torch.tensor([-5], dtype=torch.int32)]),
                              words.numel(), -1),
        "too few words": (packed, escapes, words.numel() - 1, -3),
        "too many words": (packed, escapes, words.numel() + 1, -3),
    }
    odd = _random_stream(999, 1.0, seed=4)  # 999 codes at 2 per byte: the last byte's high half is padding
    _, _, _, odd_layout = codec.read_stream_header(odd.header)
    odd_headers, odd_words = odd_layout.headers(odd.data), odd_layout.words(odd.data)
    odd_packed, odd_escapes = reference.codes_encode(odd_headers, word_offsets(odd_headers)[0], odd_words, 999, 4)
    padded_last = odd_packed.clone()
    padded_last[-1] |= 0x10
    for backend in (host, reference):
        for name, (body, extra, n_words, status) in cases.items():
            out_words = torch.zeros(n_words, dtype=torch.int32)
            assert backend.codes_decode(body, 1000, 4, extra, MAX_ZIGZAG, torch.zeros_like(headers), out_words) \
                == status, (backend.__name__, name)
        assert backend.codes_decode(padded_last, 999, 4, odd_escapes, MAX_ZIGZAG, torch.zeros_like(odd_headers),
                                    torch.zeros_like(odd_words)) == -2


def _forged_body(packed: Packed, body: bytes, layout: int) -> Packed:
    """An entropy stream of ``packed``'s tensor whose inner stream is ``packed``'s inner header and ``body``,
    compressed and checksummed as the stage would: only the body can be wrong."""
    import zstandard

    header = read_header(packed.header, "entropy", "B")
    inner = _inner(packed)
    content = torch.cat([header_prefix(inner.header), torch.frombuffer(bytearray(body), dtype=torch.uint8)])
    data = torch.frombuffer(bytearray(zstandard.ZstdCompressor().compress(content.numpy())), dtype=torch.uint8)
    return Packed(write_header("entropy", header.dtype, header.shape, "B", layout,
                               checksum=payload_checksum(data)), data)


def _inner(packed: Packed) -> Packed:
    import zstandard

    return inner_packed(torch.frombuffer(bytearray(zstandard.ZstdDecompressor().decompress(packed.data.numpy())),
                                         dtype=torch.uint8), 1 << 30, "entropy")


def test_no_changed_body_crashes_or_decodes_silently_wrong():
    """Bodies changed in every way the stream fuzzer changes streams, behind a valid frame and checksum: each
    decodes to a CodecError or to the intact result (a change the rebuilt stream's checksum cannot see), never
    to another tensor or an exception of another kind."""
    tensor = torch.cat([TENSORS["gelu"].reshape(-1)[:6000], TENSORS["specials"][:40]])
    _, staged = _staged(3e-2)
    packed = staged.encode(tensor)
    layout = _layout(packed)
    assert layout in ZSTD_CODES.values()
    intact = staged.decode(packed)
    body = bytes(_inner(packed).data.numpy().tobytes())
    rng = random.Random(0)
    outcomes = {"clear": 0, "same": 0}
    for case in range(400):
        changed = bytearray(body)
        kind = case % 4
        if kind == 0:
            at = rng.randrange(len(changed))
            changed[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            at = rng.randrange(len(changed))
            changed[at:at + 4] = bytes(rng.randrange(256) for _ in range(4))
        elif kind == 2:
            changed = changed[:rng.randrange(len(changed))]
        else:
            changed += bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 4, 8])))
        try:
            restored = staged.decode(_forged_body(packed, bytes(changed), layout))
        except CodecError:
            outcomes["clear"] += 1
            continue
        assert torch.equal(restored.view(torch.int32), intact.view(torch.int32)), case
        outcomes["same"] += 1
    assert outcomes["clear"] > 300


def test_a_forged_inner_header_cannot_make_decoding_allocate_without_bound():
    """The rebuilt payload is sized from the inner header: one declaring far more words than its codes' raw
    bytes is refused before anything is allocated."""
    tensor = TENSORS["relu"]
    _, staged = _staged(1e-1)
    packed = staged.encode(tensor)
    inner = _inner(packed)
    header = read_header(inner.header, "sz", "BBBBdddddddQQ")
    fields = (*header.fields[:-2], 2**40, header.fields[-1])  # 4 TiB of words
    forged = write_header("sz", header.dtype, header.shape, "BBBBdddddddQQ", *fields, checksum=header.checksum)
    content = torch.cat([header_prefix(forged), inner.data])
    import zstandard

    data = torch.frombuffer(bytearray(zstandard.ZstdCompressor().compress(content.numpy())), dtype=torch.uint8)
    outer = read_header(packed.header, "entropy", "B")
    with pytest.raises(CodecError, match="more than their raw bytes"):
        staged.decode(Packed(write_header("entropy", outer.dtype, outer.shape, "B", outer.fields[0],
                                          checksum=payload_checksum(data)), data))


def test_a_codes_layout_over_an_inner_stream_without_codes_is_refused():
    _, staged = _staged(1e-1)
    packed = staged.encode(TENSORS["relu"])
    raw = get_codec({"id": "raw", "entropy": "zstd"})
    raw_packed = raw.encode(TENSORS["relu"])
    with pytest.raises(CodecError):
        raw.decode(Packed(write_header("entropy", torch.float32, TENSORS["relu"].shape, "B", ZSTD_CODES[4],
                                       checksum=payload_checksum(raw_packed.data)), raw_packed.data))
    with pytest.raises(CodecError, match="impossible fields"):
        header = read_header(packed.header, "entropy", "B")
        staged.decode(Packed(write_header("entropy", header.dtype, header.shape, "B", 9,
                                          checksum=payload_checksum(packed.data)), packed.data))


def test_int_streams_whose_codes_may_pass_sz_range_keep_zstd_over_the_stream():
    """``int``'s codes are any int32 (rare huge values among small ones would escape past sz's code range): its
    streams are compressed as they are, and round trip."""
    values = torch.randint(0, 9, (100_000,), dtype=torch.int32, generator=GENERATOR)
    values[::40], values[1::40] = 2**31 - 5, -(2**31) + 3
    codec = get_codec({"id": "int", "entropy": "zstd"})
    packed = codec.encode(values)
    assert _layout(packed) == ZSTD_STREAM
    assert torch.equal(codec.decode(packed), values)


def test_the_width_follows_the_escapes_of_a_sample():
    codec = get_codec({"id": "sz", "mode": "abs", "bound": 0.5})
    for spread, bits in ((0.2, 2), (2.0, 4), (30.0, 8), (1e5, None)):
        stream = _random_stream(100_000, spread, seed=7)
        _, _, _, layout = codec.read_stream_header(stream.header)
        assert code_bits(stream.data, layout) == bits, spread
