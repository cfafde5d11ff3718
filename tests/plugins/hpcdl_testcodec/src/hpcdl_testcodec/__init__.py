"""``negate``: a lossless codec that stores each element with its sign flipped.

A stand-in for a third-party codec: it lives outside hpcdl, is not imported by anything, and is found
only through the ``hpcdl.codecs`` entry point its distribution declares. Flipping the sign is exact
for every float (NaN payloads and infinities included), and the stream carries hpcdl's header and
payload checksum like every built-in codec.

``delay_s`` (default 0) sleeps that long in every encode: a throttle that makes a training run take
wall-clock time on any machine without changing a single value (the time-limit requeue test of
tests/test_train_slurm.py needs a job still running when Slurm's warning signal comes).
"""

from __future__ import annotations

import time

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header


class Negate(Codec):
    codec_id = "negate"
    modes = ("lossless",)
    dtypes = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
    lossless = True

    def __init__(self, delay_s: float = 0.0) -> None:
        if not (isinstance(delay_s, (int, float)) and delay_s >= 0):
            raise CodecError(f"negate delay_s must be a number of seconds >= 0, got {delay_s!r}")
        self.delay_s = float(delay_s)

    def get_config(self) -> dict:
        return {"id": self.codec_id, **({"delay_s": self.delay_s} if self.delay_s else {})}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        if self.delay_s:
            time.sleep(self.delay_s)
        flat = tensor.detach().contiguous().reshape(-1).neg()
        data = flat.view(torch.uint8).clone() if flat.numel() else torch.empty(0, dtype=torch.uint8, device=flat.device)
        return Packed(write_header(self.codec_id, tensor.dtype, tensor.shape, checksum=payload_checksum(data)), data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id)
        expected = header.numel * header.dtype.itemsize
        if packed.data.numel() != expected:
            raise CodecError(f"negate payload has {packed.data.numel()} bytes, expected {expected} for "
                             f"{header.shape} {header.dtype}")
        data = verified_payload(packed.data, header)
        if expected == 0:
            return torch.empty(header.shape, dtype=header.dtype, device=packed.device)
        return data.view(header.dtype).neg().reshape(header.shape)
