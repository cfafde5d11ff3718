"""The host emulation of the CUDA kernels: build kernels/sz_cuda.cu with g++ under cuda_emulation.h, and a
stand-in ``cupy`` module that launches its kernels through ctypes, with torch CPU tensors as device memory.

hpcdl/compress/blocks/cuda.py runs unchanged on it: ``RawModule(...).get_function(name)((grid,), (threads,), args)``
becomes ``hpcdl_emu_launch(name, grid, threads, args)``; ``cuda.Device`` and ``cuda.ExternalStream`` are context
managers that do nothing (``ExternalStream`` warns that it is deprecated, as cupy 14 does). Every launch is
recorded in ``CupyStandIn.launches``.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import types
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "cuda_emulation.h", HERE / "emulated_kernels.cpp", *sorted(KERNELS.glob("*.cu*"))]
FLAGS = ["-std=c++17", "-fPIC", "-shared", "-ffp-contract=off", "-fno-strict-aliasing", "-march=x86-64",
         "-Wall", "-Wno-unused-function", "-Werror", "-I", str(KERNELS), "-I", str(HERE)]
SANITIZE = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-DHPCDL_EMU_UCONTEXT"]


def build(directory: Path, sanitize: bool = False, resident_ctas: int = 3) -> Path:
    """The emulated kernel library in ``directory`` (rebuilt when a source changed), running ``resident_ctas``
    CTAs at a time."""
    flags = FLAGS + (SANITIZE if sanitize else ["-O2"]) + [f"-DHPCDL_EMU_RESIDENT_CTAS={resident_ctas}"]
    digest = hashlib.sha256(" ".join(flags).encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    target = directory / f"emulated_kernels_{digest.hexdigest()[:16]}.so"
    if not target.exists():
        command = ["g++", *flags, str(HERE / "emulated_kernels.cpp"), "-o", str(target)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}\n{result.stdout}{result.stderr}")
    return target


def _c_value(value):
    if isinstance(value, np.uint64):
        return ctypes.c_uint64(int(value))
    if isinstance(value, np.int64):
        return ctypes.c_int64(int(value))
    if isinstance(value, np.int32):
        return ctypes.c_int32(int(value))
    if isinstance(value, np.float64):
        return ctypes.c_double(float(value))
    raise TypeError(f"the cupy stand-in passes numpy scalars only, got {type(value).__name__}")


class CupyStandIn(types.ModuleType):
    """A ``cupy`` module for hpcdl/compress/blocks/cuda.py that runs the emulated kernels."""

    def __init__(self, library_path: Path, seed: int = 1):
        super().__init__("cupy")
        library = ctypes.CDLL(str(library_path))
        library.hpcdl_emu_launch.restype = ctypes.c_int
        library.hpcdl_emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint,
                                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_ulonglong]
        self.library, self.seed, self.launches = library, seed, []
        standin = self

        class Function:
            def __init__(self, name: str):
                self.name = name

            def __call__(self, grid, block, args):
                standin.launches.append(self.name)
                values = [_c_value(a) for a in args]
                pointers = (ctypes.c_void_p * max(1, len(values)))(
                    *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
                if library.hpcdl_emu_launch(self.name.encode(), grid[0], block[0], pointers, standin.seed) != 0:
                    raise RuntimeError(f"the emulated library has no kernel {self.name}")

        class RawModule:
            def __init__(self, code: str, options=()):
                self.code, self.options = code, options

            def get_function(self, name: str):
                return Function(name)

        class _Context:
            def __init__(self, *args):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class _ExternalStream(_Context):
            def __init__(self, *args):
                warnings.warn("ExternalStream is deprecated. Use Stream.from_external() instead to interoperate "
                              "with external streams that implement the CUDA stream protocol.", DeprecationWarning,
                              stacklevel=2)  # as cupy 14 does

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(Device=_Context, ExternalStream=_ExternalStream)
