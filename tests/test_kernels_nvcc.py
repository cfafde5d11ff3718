"""Every CUDA kernel source compiles with nvcc for the GPUs we target, and the host build of the same code exists.

CI has nvcc but no GPU: a kernel that does not compile must fail CI here, not on
a cluster. The flags are those cuda.py gives cupy (--fmad=false, C++14).
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from hpcdl.compress.sz import host

from conftest import require

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", sorted(path.name for path in KERNELS.glob("*.cu")))
def test_cuda_kernels_compile(source, arch, tmp_path):
    require(shutil.which("nvcc") is not None, "nvcc is not installed")
    command = ["nvcc", "-c", f"-arch={arch}", "--fmad=false", "--std=c++14", "-Werror", "all-warnings",
               "-I", str(KERNELS), str(KERNELS / source), "-o", str(tmp_path / "kernel.o")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}{result.stderr}"
    assert (tmp_path / "kernel.o").stat().st_size > 0


@pytest.mark.parametrize("source", sorted(path.name for path in KERNELS.glob("*.cu")))
def test_no_instruction_flushes_subnormals_under_cupys_ftz_flag(source, tmp_path):
    """cupy compiles every kernel with -ftz=true; the kernels' float32 arithmetic must keep subnormals as the host
    does (PTX without .ftz), or a tensor holding one encodes to other bytes on a GPU (seen on an H200)."""
    require(shutil.which("nvcc") is not None, "nvcc is not installed")
    ptx = tmp_path / "kernel.ptx"
    command = ["nvcc", "-ptx", "-arch=sm_90", "-ftz=true", "--fmad=false", "--std=c++14", "-I", str(KERNELS),
               str(KERNELS / source), "-o", str(ptx)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}{result.stderr}"
    flushing = sorted({line.split()[0] for line in ptx.read_text().splitlines() if ".ftz" in line})
    assert not flushing, f"instructions that flush subnormals to zero under -ftz=true: {flushing}"


def test_host_kernel_library_is_built():
    """pip install builds hpcdl/_kernels_host*.so; without it sz falls back to the slow reference."""
    require(host.AVAILABLE, "the host kernel library hpcdl/_kernels_host*.so is not built (pip install -e .)")
