"""Builds the host library of the sz/int block kernels: hpcdl/_kernels_host*.so.

kernels/host.cpp (with kernels/sz_block.cuh, the same block functions the CUDA
kernels use) is compiled by the system C++ compiler as a plain shared library
that hpcdl/compress/sz/host.py loads with ctypes. It needs neither torch nor
CUDA at build time, so it builds inside pip's isolated build environment. The
CUDA sources are copied into the package (hpcdl/kernels/) so an installed hpcdl
can compile them at run time on a GPU.
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
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
host_kernels = Extension(
    "hpcdl._kernels_host",
    sources=[str(KERNELS / "host.cpp")],
    include_dirs=[str(KERNELS)],
    depends=[str(KERNELS / "sz_block.cuh")],
    language="c++",
    extra_compile_args=["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"],
    extra_link_args=["-fopenmp"],
)

setup(ext_modules=[host_kernels], cmdclass={"build_py": BuildPyWithKernels})
