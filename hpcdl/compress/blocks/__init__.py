"""The block-kernel layer shared by the ``sz`` and ``int`` codecs: one engine, three backends.

A tensor is cut into 32-element blocks; each block is predicted and bit-packed at its own width
(docs/format.md). This package owns everything both codecs share:

- ``stream.py``: the payload layout and its validation; ``params.py``: the quantizer parameters;
- ``protocol.py``: :class:`~hpcdl.compress.blocks.protocol.BlockKernels`, the coarse operations every backend
  implements (encode, decode, pack/unpack codes, checksum);
- the backends: ``reference.py`` (plain PyTorch, the specification), ``host.py`` (the C++ library built by
  setup.py, through ctypes) and ``cuda.py`` (the same kernel source on a GPU, through cupy);
- ``codec.py``: :class:`~hpcdl.compress.blocks.codec.BlockCodec`, the base of ``sz`` and ``int`` that owns the
  raw flag and fallback, the payload checksum and the header checks.

:func:`backend_module` picks the backend for a device.
"""

from __future__ import annotations

import warnings

import torch

from hpcdl.compress.blocks import host, reference
from hpcdl.compress.blocks.protocol import BlockKernels

BACKENDS = ("auto", "reference", "host", "cuda")
_warned_no_host = False


def backend_module(backend: str, device: torch.device) -> BlockKernels:
    """The kernel implementation for ``backend`` on ``device``; "auto" picks cuda on a GPU, else host (the
    reference, with one warning, when the host library is not built)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown sz backend {backend!r}; use one of {list(BACKENDS)}")
    if backend == "auto":
        backend = "cuda" if device.type == "cuda" else "host" if device.type == "cpu" else "reference"
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"the cuda backend takes CUDA tensors, got a tensor on {device}")
        from hpcdl.compress.blocks import cuda

        return cuda
    if backend == "host":
        if device.type != "cpu":
            raise ValueError(f"the host backend takes CPU tensors, got a tensor on {device}")
        if host.AVAILABLE:
            return host
        global _warned_no_host
        if not _warned_no_host:
            _warned_no_host = True
            warnings.warn("hpcdl's host kernel library is not built (pip install -e . builds it); "
                          "sz runs the slow PyTorch reference", RuntimeWarning, stacklevel=3)
    return reference
