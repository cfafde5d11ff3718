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

:func:`backend_module` picks the backend for a device. ``HPCDL_BLOCK_BACKEND=reference`` makes "auto" pick the
PyTorch reference for CPU tensors instead of the host library, for the whole process (``HPCDL_HOST_ISA`` chooses
among the host library's builds instead): to check a result against the specification without changing code.
"""

from __future__ import annotations

import os
import warnings

import torch

from hpcdl.compress.blocks import host, reference
from hpcdl.compress.blocks.protocol import BlockKernels
from hpcdl.compress.errors import CodecError

BACKENDS = ("auto", "reference", "host", "cuda")
BACKEND_VARIABLE = "HPCDL_BLOCK_BACKEND"
CPU_AUTO_CHOICES = ("host", "reference")  # what "auto" may run on CPU tensors; host (the default) falls back itself
_warned_no_host = False


def _cpu_auto_backend() -> str:
    """The backend "auto" runs on CPU tensors: ``HPCDL_BLOCK_BACKEND`` if set, else host."""
    value = os.environ.get(BACKEND_VARIABLE) or "host"
    if value not in CPU_AUTO_CHOICES:
        raise CodecError(f"{BACKEND_VARIABLE}={value!r} is not a backend it can force; use one of "
                         f"{list(CPU_AUTO_CHOICES)} (or unset it for host); HPCDL_HOST_ISA picks a host build")
    return value


CPU_AUTO_BACKEND = _cpu_auto_backend()


def backend_module(backend: str, device: torch.device) -> BlockKernels:
    """The kernel implementation for ``backend`` on ``device``; "auto" picks cuda on a GPU, on the CPU host (the
    reference, with one warning, when the host library is not built) or what ``HPCDL_BLOCK_BACKEND`` names."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown sz backend {backend!r}; use one of {list(BACKENDS)}")
    if backend == "auto":
        backend = "cuda" if device.type == "cuda" else CPU_AUTO_BACKEND if device.type == "cpu" else "reference"
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
