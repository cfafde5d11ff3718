"""Builds the host library of the sz/int block kernels: hpcdl/_kernels_host*.so.

kernels/host.cpp (with kernels/sz_block.cuh, the same block functions the CUDA
kernels use) is compiled by the system C++ compiler once per instruction set of
HOST_ISAS, and linked with kernels/host_dispatch.cpp into one plain shared
library that hpcdl/compress/blocks/host.py loads with ctypes; when it loads, the
library picks the best build the CPU runs (AVX-512, AVX2 or the baseline), so
a library built on any x86-64 machine runs on every other. It needs neither
torch nor CUDA at build time, so it builds inside pip's isolated build
environment. The CUDA sources are copied into the package (hpcdl/kernels/) so
an installed hpcdl can compile them at run time on a GPU.
"""

import os
import platform
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

KERNELS = Path("kernels")


class BuildPyWithKernels(build_py):
    """Copy kernels/*.cu and *.cuh into the built package as hpcdl/kernels/."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "hpcdl" / "kernels"
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted(KERNELS.glob("*.cu*")):
            shutil.copy2(source, target / source.name)


# -ffp-contract=off: no FMA contraction, so results match the reference and the GPU bit for bit.
# -fno-math-errno -fno-trapping-math: let branch-free element loops vectorize (IEEE results are unchanged).
COMMON_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]

# The builds of kernels/host.cpp in the library, by HPCDL_HOST_ISA: the flags of each. Explicit -m flags rather than
# -march=x86-64-v3/v4, so older compilers build them too; kernels/host_dispatch.cpp runs a build only on a CPU with
# every feature its flags enable, and kernels/host.cpp refuses to compile a build whose flags miss its vector paths.
# Other architectures get the baseline build alone, for the compiler's default target.
if platform.machine().lower() in ("x86_64", "amd64"):
    AVX2_FLAGS = ["-march=x86-64", "-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mpopcnt"]
    HOST_ISAS = {
        "baseline": ["-march=x86-64"],
        "avx2": AVX2_FLAGS,
        "avx512": AVX2_FLAGS + ["-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl"],
    }
else:
    HOST_ISAS = {"baseline": []}


class BuildExtPerIsa(build_ext):
    """Compile kernels/host.cpp once per entry of HOST_ISAS and link the objects into the host library."""

    def build_extension(self, ext):
        if ext.name == host_kernels.name and self._stale(ext):
            ext.extra_objects = []
            for isa, flags in HOST_ISAS.items():
                ext.extra_objects += self.compiler.compile(
                    [str(KERNELS / "host.cpp")],
                    output_dir=os.path.join(self.build_temp, isa),
                    macros=[("HPCDL_HOST_ISA", isa)],
                    include_dirs=[str(KERNELS)],
                    extra_postargs=COMMON_FLAGS + flags,
                    depends=ext.depends,
                )
        super().build_extension(ext)  # skips the link itself when the library is newer than every source

    def _stale(self, ext) -> bool:
        target = Path(self.get_ext_fullpath(ext.name))
        if self.force or not target.exists():
            return True
        return max(Path(source).stat().st_mtime for source in [*ext.sources, *ext.depends]) > target.stat().st_mtime


host_kernels = Extension(
    "hpcdl._kernels_host",
    sources=[str(KERNELS / "host_dispatch.cpp")],
    include_dirs=[str(KERNELS)],
    depends=[str(KERNELS / name) for name in ("host.cpp", "sz_block.cuh", "host_api.h")],
    language="c++",
    extra_compile_args=COMMON_FLAGS + HOST_ISAS["baseline"],
    extra_link_args=["-fopenmp"],
)

setup(ext_modules=[host_kernels], cmdclass={"build_py": BuildPyWithKernels, "build_ext": BuildExtPerIsa})
