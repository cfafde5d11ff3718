"""The stream fuzzing campaign over every registered codec, run as a child process by tests/test_stream_fuzz.py.

    python tests/stream_fuzz.py SECONDS_PER_CODEC PROGRESS_FILE  ->  JSON counts on stdout

For each codec config below, a few tensors are encoded; then, until the codec's time is up, the serialized
stream (``Packed.to_bytes()``) is changed in one of five ways and decoded:

- ``flip``: 1 to 3 bits flipped anywhere; ``overwrite``: a run of 1 to 8 bytes overwritten with random ones;
- ``truncate``: cut at a random length; ``extend``: 1 to 16 random bytes appended;
- ``header``: random bytes of the header's dtype, shape and codec fields replaced (a shape entry, one time in
  three, by a huge value), with the header CRC recomputed, so that the codec's own field validation, not
  the CRC, has to refuse it.

Each case ends in one of: ``clear`` (CodecError), ``same`` (decoded bit-identical to the intact stream's
result), ``forged`` (``header`` only: a CRC-valid header that describes another tensor decoded without
error, which is not corruption), ``silent`` (decoded to anything else without an error: silent corruption)
or ``crash`` (any other exception). A segfault or abort kills this process, and the test names the case from
PROGRESS_FILE. The process's address space is limited, so an allocation sized from an unvalidated header
fails with a crash count instead of succeeding quietly.
"""

from __future__ import annotations

import json
import random
import resource
import struct
import sys
import time
import traceback
import zlib
from collections import Counter

import torch

from hpcdl.compress import CodecError, Packed, get_codec, known_codec_ids

# Configs per registered codec id; the test fails when a registered codec has none (so none is forgotten).
CONFIGS = {
    "raw": [{"id": "raw"}],
    "bitmask": [{"id": "bitmask"}],
    "cast": [{"id": "cast", "dtype": "bf16"}, {"id": "cast", "dtype": "fp16"}, {"id": "cast", "dtype": "fp8_e4m3"}],
    "quant": [{"id": "quant", "bits": 2, "group_size": 32, "seed": 0}, {"id": "quant", "bits": 8, "seed": 0},
              {"id": "quant", "bits": 4, "group_size": 7, "scale_dtype": "fp16", "seed": 0}],
    "int": [{"id": "int"}],
    "levels": [{"id": "levels"}],
    "window": [{"id": "window", "input": [12, 10], "kernel": [3, 3], "stride": [2, 2], "padding": [1, 1],
                "dilation": [1, 1]}],
    "sz": [{"id": "sz", "mode": "abs", "bound": 1e-2}, {"id": "sz", "mode": "rel", "bound": 1e-3},
           {"id": "sz", "mode": "pw_rel", "bound": 1e-2},
           {"id": "sz", "mode": "rel", "bound": 1e-2, "entropy": "zstd"},
           {"id": "sz", "mode": "abs", "bound": 1e-2, "channels": 1},
           {"id": "sz", "mode": "abs", "bound": 1e-2, "channels": 1, "entropy": "zstd"}],
    "sz3": [{"id": "sz3", "mode": "rel", "bound": 1e-3}],
    "zfp": [{"id": "zfp", "mode": "abs", "bound": 1e-3}],
}
KINDS = ("flip", "overwrite", "truncate", "extend", "header")
OUTCOMES = ("clear", "same", "forged", "silent", "crash")
ADDRESS_SPACE_HEADROOM = 2 * 2**30  # bytes of address space above what the warmed-up process holds


def tensors_for(codec) -> list[torch.Tensor]:
    """Small tensors of each dtype the codec takes (float32/float64/bf16, int64/uint8, bool), some with zeros."""
    generator = torch.Generator().manual_seed(0)
    if codec.codec_id == "window":  # max-pool indices of its geometry: nothing else encodes
        x = torch.randn(2, 3, 12, 10, generator=generator)
        return [torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True)[1]]
    smooth = torch.cumsum(torch.randn(6, 40, generator=generator), 1)
    candidates = [
        torch.relu(smooth), smooth.to(torch.float64), smooth.to(torch.bfloat16),
        torch.randint(0, 300, (3, 50), generator=generator) // 7,
        torch.randint(0, 255, (77,), generator=generator, dtype=torch.uint8),
        torch.randn(5, 13, generator=generator) > 0,
    ]
    return [t for t in candidates if t.dtype in codec.dtypes]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def forge_header(blob: bytes, rng: random.Random) -> bytes:
    """``blob`` with random dtype/shape/field bytes of its header and the header's CRC-32 made valid again."""
    (header_len,) = struct.unpack("<I", blob[:4])
    header = bytearray(blob[4 : 4 + header_len])
    body_start = 4 + 2 + header[5]  # after magic, version, id length and id: dtype, ndim, shape, fields...
    body_end = len(header) - 12  # ... up to the payload checksum and the CRC
    ndim = header[body_start + 1]
    if ndim and rng.random() < 1 / 3:
        at = body_start + 2 + 8 * rng.randrange(ndim)
        header[at : at + 8] = struct.pack("<q", rng.choice([2**31, 2**40, 2**61, 2**62 - 1, -1]))
    else:
        for _ in range(rng.randint(1, 4)):
            header[rng.randrange(body_start, body_end)] = rng.randrange(256)
    header[-4:] = bytes(4)
    header[-4:] = struct.pack("<I", zlib.crc32(bytes(header)))
    return blob[:4] + bytes(header) + blob[4 + header_len :]


def mutate(blob: bytes, kind: str, rng: random.Random) -> bytes:
    data = bytearray(blob)
    if kind == "flip":
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "overwrite":
        start = rng.randrange(len(data))
        for at in range(start, min(len(data), start + rng.randint(1, 8))):
            data[at] = rng.randrange(256)
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    elif kind == "extend":
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    else:
        return forge_header(blob, rng)
    return bytes(data)


def limit_address_space() -> None:
    with open("/proc/self/status") as lines:
        size = next(int(line.split()[1]) * 1024 for line in lines if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (size + ADDRESS_SPACE_HEADROOM, resource.RLIM_INFINITY))


def campaign(seconds: float, progress_path: str) -> dict:
    rng = random.Random(20261129)
    missing = sorted(set(known_codec_ids()) - set(CONFIGS))
    if missing:
        raise SystemExit(f"no fuzz configs for registered codec(s) {missing}: add them to CONFIGS")
    streams = {}
    for codec_id in known_codec_ids():
        for config in CONFIGS[codec_id]:
            codec = get_codec(config)
            for tensor in tensors_for(codec):
                blob = codec.encode(tensor).to_bytes()
                streams.setdefault(codec_id, []).append((codec, blob, codec.decode(Packed.from_bytes(blob))))
    limit_address_space()
    counts = {codec_id: {kind: Counter() for kind in KINDS} for codec_id in streams}
    examples = []
    with open(progress_path, "w", buffering=1) as progress:
        for codec_id, cases in streams.items():
            deadline = time.monotonic() + seconds
            case = 0
            while time.monotonic() < deadline:
                codec, blob, expected = cases[case % len(cases)]
                kind = KINDS[case % len(KINDS)]
                bad = mutate(blob, kind, rng)
                progress.seek(0)  # the file holds the case being decoded, and nothing else
                progress.write(f"{codec_id} {codec.get_config()} {kind} case {case}: {bad.hex()}\n")
                progress.truncate()
                outcome = decode_outcome(codec, bad, expected, kind, examples)
                counts[codec_id][kind][outcome] += 1
                case += 1
    return {"counts": {c: {k: dict(v) for k, v in kinds.items()} for c, kinds in counts.items()},
            "examples": examples[:20]}


def decode_outcome(codec, bad: bytes, expected: torch.Tensor, kind: str, examples: list) -> str:
    try:
        restored = codec.decode(Packed.from_bytes(bad))
    except CodecError:
        return "clear"
    except Exception:  # noqa: BLE001 - every other exception is what the campaign counts as a crash
        examples.append(f"{codec.get_config()} {kind}: {traceback.format_exc(limit=-3)}")
        return "crash"
    if same_bits(restored, expected):
        return "same"
    if kind == "header":
        return "forged"
    examples.append(f"{codec.get_config()} {kind}: decoded {tuple(restored.shape)} {restored.dtype} silently "
                    f"from {bad.hex()}")
    return "silent"


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(campaign(float(sys.argv[1]), sys.argv[2])))
