"""The host kernel library's instruction-set builds: every build this CPU runs gives the reference's bytes, the
library picks the best one an older CPU runs (emulated by qemu-user), and HPCDL_HOST_ISA forces one."""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcdl.compress.blocks import reference as reference_kernels
from hpcdl.compress.blocks.stream import word_offsets
from hpcdl.compress.codes import CODE_BITS, MAX_ZIGZAG
from hpcdl.compress.intcodec import IntCodec
from hpcdl.compress.sz import Sz, decode_with, encode_with, host

from conftest import require

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("host_kernels_driver.py")
X86_64 = platform.machine().lower() in ("x86_64", "amd64")

requires_host = pytest.mark.skipif(not host.AVAILABLE, reason="host kernel library not built (pip install -e .)")


def _library() -> str:
    return host.LIBRARY._name


@pytest.fixture
def restore_isa():
    active = host.active_isa()
    yield
    host.select_isa(active)


def _activation_like(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """GELU outputs of a wide range with NaN, +-Inf, +-0.0 and huge and tiny values sprinkled in."""
    generator = torch.Generator().manual_seed(numel)
    x = torch.nn.functional.gelu(torch.randn(numel, generator=generator) * 4)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e30, 1e-30])
    x[::97] = specials.repeat(numel // 97 // len(specials) + 1)[: len(x[::97])]
    return x.to(dtype)


def _relu_like(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """ReLU of _activation_like with a share of nonzero elements rising from 2% to 98% along the tensor."""
    generator = torch.Generator().manual_seed(numel)
    kept = torch.rand(numel, generator=generator) < torch.linspace(0.02, 0.98, numel)
    return (torch.relu(_activation_like(torch.float32, numel)) * kept).to(dtype)


@requires_host
def test_the_library_has_a_build_per_instruction_set_and_runs_the_best():
    expected = ["avx512", "avx2", "baseline"] if X86_64 else ["baseline"]
    assert host.built_isas() == expected
    runnable = host.runnable_isas()
    assert runnable[-1] == "baseline" and set(runnable) <= set(expected)
    assert host.active_isa() == runnable[0] or os.environ.get(host.ISA_VARIABLE)


@requires_host
@pytest.mark.parametrize("isa", host.runnable_isas() or ["baseline"])
def test_every_build_this_cpu_runs_gives_the_reference_bytes(isa, restore_isa):
    host.select_isa(isa)
    assert host.active_isa() == isa
    cases = [(_activation_like(dtype, 20_011), (("abs", 1e-2), ("rel", 1e-3), ("pw_rel", 1e-2)))
             for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
    # ReLU-like blocks from nearly empty to nearly full: sparse blocks of every lane mask, compacted and expanded
    # by the vector paths
    cases += [(_relu_like(dtype, 40_009), (("abs", 1e-2), ("rel", 1e-1), ("pw_rel", 1e-2)))
              for dtype in (torch.float32, torch.float16)]
    for x, settings in cases:
        for mode, bound in settings:
            packed, expected = encode_with("host", x, mode, bound), encode_with("reference", x, mode, bound)
            assert packed.header == expected.header and torch.equal(packed.data, expected.data), (x.dtype, mode)
            restored, reference = decode_with("host", packed), decode_with("reference", packed)
            assert torch.equal(restored.view(torch.uint8), reference.view(torch.uint8)), (x.dtype, mode)
    several_parts = _activation_like(torch.float32, 2**18 + 4099)  # the encoder's parts join in order
    assert torch.equal(encode_with("host", several_parts, "rel", 1e-2).data,
                       encode_with("reference", several_parts, "rel", 1e-2).data)
    # the entropy stage's codes layouts: every width's body and the blocks rebuilt from it
    stream = encode_with("host", torch.randn(50_001, generator=torch.Generator().manual_seed(2)) * 40, "abs", 0.5)
    _, _, _, layout = Sz.read_stream_header(stream.header)
    headers, words = layout.headers(stream.data), layout.words(stream.data)
    offsets, _ = word_offsets(headers)
    for bits in CODE_BITS:
        body, escapes = host.codes_encode(headers, offsets, words, layout.numel, bits)
        expected_body, expected_escapes = reference_kernels.codes_encode(headers, offsets, words, layout.numel, bits)
        assert torch.equal(body, expected_body) and torch.equal(escapes, expected_escapes), bits
        rebuilt_headers, rebuilt_words = torch.zeros_like(headers), torch.zeros_like(words)
        assert host.codes_decode(body, layout.numel, bits, escapes, MAX_ZIGZAG, rebuilt_headers, rebuilt_words) == 0
        assert torch.equal(rebuilt_headers, headers) and torch.equal(rebuilt_words, words), bits
    codes = torch.randint(-(2**31), 2**31 - 1, (9_001,), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    codes[::3] = torch.arange(0, 9_001, 3) % 200
    codec = IntCodec()
    packed = codec.encode_with(codes, "host")
    expected = codec.encode_with(codes, "reference")
    assert packed.header == expected.header and torch.equal(packed.data, expected.data)
    assert torch.equal(codec.decode_with(packed, "host"), codes)


@requires_host
def test_selecting_a_build_the_library_lacks_is_refused_and_changes_nothing(restore_isa):
    active = host.active_isa()
    with pytest.raises(ValueError, match=r"no 'avx3' build; use one of \['"):
        host.select_isa("avx3")
    assert host.active_isa() == active


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env})


@requires_host
def test_the_environment_variable_forces_a_build_or_fails_clearly():
    forced = _run_python("from hpcdl.compress.sz import host; print(host.active_isa())", HPCDL_HOST_ISA="baseline")
    assert forced.returncode == 0 and forced.stdout.split() == ["baseline"], forced.stderr
    wrong = _run_python("import hpcdl.compress.sz", HPCDL_HOST_ISA="sse9")
    assert wrong.returncode != 0
    assert "ValueError: HPCDL_HOST_ISA=sse9: the host kernel library has no 'sse9' build" in wrong.stderr


@requires_host
def test_each_build_keeps_its_code_to_itself():
    """No weak (shared) definitions: the linker would keep one copy, maybe AVX-512 code, for every build."""
    require(shutil.which("nm") is not None, "nm (binutils) is not installed")
    symbols = subprocess.run(["nm", _library()], capture_output=True, text=True, check=True).stdout.splitlines()
    weak_definitions = [line for line in symbols if line.split()[-2:-1] in (["W"], ["V"]) and len(line.split()) == 3]
    assert weak_definitions == []


def _driver(*command: str, isa: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*command, sys.executable, "-S", str(DRIVER), _library(), *([isa] if isa else [])],
                          check=False, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})


def _qemu() -> str:
    qemu = shutil.which("qemu-x86_64") or shutil.which("qemu-x86_64-static")
    require(qemu is not None, "qemu-user is not installed (apt-get install qemu-user; tools/setup.sh --test does)")
    return qemu


@requires_host
@pytest.mark.skipif(not X86_64, reason="the emulated CPUs are x86-64 ones")
@pytest.mark.parametrize("cpu,isa", [("EPYC-Milan", "avx2"), ("Haswell", "avx2"), ("Westmere", "baseline"),
                                     ("qemu64", "baseline")])
def test_older_cpus_load_the_library_and_run_the_best_build_they_can(cpu, isa):
    """Under qemu-user as a CPU without AVX-512 (Perlmutter's AMD Milan, Haswell) or without AVX2 (Westmere, qemu64):
    no SIGILL, the expected build, the bytes of the native run."""
    native = _driver()
    assert native.returncode == 0, native.stderr
    emulated = _driver(_qemu(), "-cpu", cpu)
    assert emulated.returncode == 0, emulated.stderr
    emulated_isa, emulated_digest = emulated.stdout.split()
    assert emulated_isa == isa
    assert emulated_digest == native.stdout.split()[1]


@requires_host
@pytest.mark.skipif(not X86_64, reason="the emulated CPUs are x86-64 ones")
def test_a_build_the_cpu_cannot_run_is_refused():
    refused = _driver(_qemu(), "-cpu", "Westmere", isa="avx2")
    assert refused.returncode != 0 and "cannot select 'avx2': status -2" in refused.stderr
