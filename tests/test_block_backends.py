"""The block-kernel layer's seams: every backend implements the protocol, the ctypes bindings match the C
header, and a host library built from other sources is refused when it loads.

- hpcdl.compress.blocks.protocol.BlockKernels names the operations sz and int call; each backend module
  (reference, host, cuda) must have each of them with the same parameters (mypy checks the types where
  ``backend_module`` returns the modules).
- kernels/host_api.h declares the exported C functions once; host.PROTOTYPES (what ctypes passes) must
  match those declarations, type for type.
- host.py checks hpcdl_host_abi_version() and hpcdl_host_part_blocks() of the library it loads.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import setuptools

from hpcdl.compress.blocks import cuda, host, reference
from hpcdl.compress.blocks.protocol import BlockKernels

from conftest import require

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
BACKEND_MODULES = {"reference": reference, "host": host, "cuda": cuda}


# ---------------------------------------------------------------- the Python protocol


def protocol_operations() -> dict[str, list[str]]:
    """Each operation of BlockKernels -> its parameter names (without ``self``)."""
    return {name: list(inspect.signature(member).parameters)[1:]
            for name, member in vars(BlockKernels).items() if inspect.isfunction(member) and not name.startswith("_")}


def protocol_mismatches(module) -> list[str]:
    """What ``module`` lacks of BlockKernels: missing operations, or operations with other parameters."""
    problems = []
    for name, parameters in protocol_operations().items():
        function = getattr(module, name, None)
        if not callable(function):
            problems.append(f"no {name}")
        elif list(inspect.signature(function).parameters) != parameters:
            problems.append(f"{name}{inspect.signature(function)} takes other parameters than {parameters}")
    return problems


def test_the_protocol_has_the_coarse_operations():
    assert set(protocol_operations()) == {"sz_encode", "sz_stats", "sz_decode", "block_headers", "pack", "unpack",
                                         "checksum"}


@pytest.mark.parametrize("name", sorted(BACKEND_MODULES))
def test_every_backend_module_implements_the_protocol(name):
    assert not protocol_mismatches(BACKEND_MODULES[name])


def test_the_protocol_check_finds_a_missing_or_different_operation():
    lacking = SimpleNamespace(**{name: getattr(reference, name) for name in protocol_operations() if name != "pack"})
    assert protocol_mismatches(lacking) == ["no pack"]
    different = SimpleNamespace(**{name: getattr(reference, name) for name in protocol_operations()})
    different.unpack = lambda headers, offsets, words: None
    assert [problem.split("(")[0] for problem in protocol_mismatches(different)] == ["unpack"]


# ---------------------------------------------------------------- the C interface, declared once

_C_TYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong,
            "double": ctypes.c_double, "const char*": ctypes.c_char_p, "void": None}


def _ctype(declaration: str) -> type | None:
    """The ctypes type of a C type, or of a parameter declaration ("const int* q"): any other pointer is void*."""
    text = re.sub(r"\s*\*\s*", "* ", declaration.strip()).strip()
    if text.endswith("*") or "* " in text:
        base = text.split("*")[0].strip()
        return ctypes.c_char_p if base == "const char" else ctypes.c_void_p
    words = text.split()
    type_words = words if " ".join(words) in _C_TYPES else words[:-1]  # drop the parameter's name
    return _C_TYPES[" ".join(type_words)]


def header_prototypes(text: str) -> dict[str, tuple[type | None, list[type | None]]]:
    """name -> (restype, argtypes) of every declaration in the ``extern "C" { ... }`` block of a header."""
    block = text.split('extern "C" {', 1)[1].split("}  // extern", 1)[0]
    code = re.sub(r"//[^\n]*", "", block)
    prototypes = {}
    for declaration in code.split(";"):
        declaration = " ".join(declaration.split())
        if not declaration:
            continue
        match = re.fullmatch(r"(.+?)\b(hpcdl_\w+)\((.*)\)", declaration)
        assert match, f"not a function declaration: {declaration!r}"
        result, name, parameters = match.groups()
        arguments = [] if parameters.strip() in ("", "void") else [_ctype(p) for p in parameters.split(",")]
        prototypes[name] = (_ctype(result), arguments)
    return prototypes


def prototype_mismatches(declared: dict, bound: dict) -> list[str]:
    problems = [f"{name} is declared in kernels/host_api.h but host.py does not bind it" for name in declared
                if name not in bound]
    problems += [f"host.py binds {name}, which kernels/host_api.h does not declare" for name in bound
                 if name not in declared]
    for name in declared.keys() & bound.keys():
        if declared[name] != (bound[name][0], list(bound[name][1])):
            problems.append(f"{name}: the header says {declared[name]}, host.py says {bound[name]}")
    return problems


def test_the_ctypes_prototypes_match_the_header():
    declared = header_prototypes((KERNELS / "host_api.h").read_text())
    assert "hpcdl_host_abi_version" in declared and len(declared) == 17
    assert not prototype_mismatches(declared, host.PROTOTYPES)


def test_a_changed_argument_list_fails_the_header_check():
    text = (KERNELS / "host_api.h").read_text()
    changed = text.replace("void hpcdl_pack(const int* q, long long n,", "void hpcdl_pack(const int* q, int n,")
    assert changed != text
    (problem,) = prototype_mismatches(header_prototypes(changed), host.PROTOTYPES)
    assert problem.startswith("hpcdl_pack:")
    added = text.replace("}  // extern", "int hpcdl_new(void);\n}  // extern")
    assert prototype_mismatches(header_prototypes(added), host.PROTOTYPES) == [
        "hpcdl_new is declared in kernels/host_api.h but host.py does not bind it"]


def test_the_loaded_library_reports_this_abi():
    require(host.AVAILABLE, "the host kernel library hpcdl/_kernels_host*.so is not built (pip install -e .)")
    assert host.LIBRARY.hpcdl_host_abi_version() == host.ABI_VERSION
    assert host.LIBRARY.hpcdl_host_part_blocks() == host.PART_BLOCKS


# ---------------------------------------------------------------- refusing a library built from other sources


@pytest.fixture(scope="module")
def kernel_objects(tmp_path_factory) -> list[Path]:
    """kernels/host.cpp compiled (unoptimised, for speed) once per build of setup.py's HOST_ISAS."""
    require(shutil.which("g++") is not None, "g++ is not installed")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(setuptools, "setup", lambda **options: None)  # read setup.py's flags without building
        build = runpy.run_path(str(ROOT / "setup.py"))
    directory = tmp_path_factory.mktemp("host_objects")
    objects = []
    for isa, flags in build["HOST_ISAS"].items():
        target = directory / f"{isa}.o"
        subprocess.run(["g++", "-O0", "-fPIC", "-fopenmp", "-c", f"-DHPCDL_HOST_ISA={isa}", *flags, f"-I{KERNELS}",
                        str(KERNELS / "host.cpp"), "-o", str(target)], check=True, capture_output=True, timeout=300)
        objects.append(target)
    return objects


def _import_sz_with(library: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPCDL_HOST_LIBRARY": str(library),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", "import hpcdl.compress.sz"], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("define,refusal", [
    ("HPCDL_HOST_ABI_VERSION=999", "has ABI version 999, this hpcdl needs 4"),
    ("HPCDL_PART_BLOCKS=4096", "cuts streams into parts of 4096 blocks, this hpcdl expects 8192"),
])
def test_a_library_built_from_other_sources_is_refused(kernel_objects, tmp_path, define, refusal):
    library = tmp_path / "other.so"
    subprocess.run(["g++", "-O0", "-fPIC", "-shared", "-fopenmp", f"-D{define}", f"-I{KERNELS}",
                    str(KERNELS / "host_dispatch.cpp"), *map(str, kernel_objects), "-o", str(library)],
                   check=True, capture_output=True, timeout=120)
    run = _import_sz_with(library)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and refusal in last and "pip install -e ." in last, run.stderr[-2000:]


def test_a_library_without_the_abi_functions_is_refused(tmp_path):
    """A library built before the ABI check existed (or not this library at all) lacks the functions."""
    require(shutil.which("g++") is not None, "g++ is not installed")
    source = tmp_path / "old.cpp"
    source.write_text('extern "C" int hpcdl_checksum_old(void) { return 0; }\n')
    library = tmp_path / "old.so"
    subprocess.run(["g++", "-fPIC", "-shared", str(source), "-o", str(library)], check=True, capture_output=True)
    run = _import_sz_with(library)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode != 0 and "has no function hpcdl_host_abi_version" in last and "rebuild" in last, last


# ---------------------------------------------------------------- forcing the reference


FORCED_REFERENCE = """
import torch
from hpcdl.compress import get_codec
from hpcdl.compress.blocks import backend_module
x = torch.nn.functional.gelu(torch.randn(4097, generator=torch.Generator().manual_seed(3)))
indices = torch.arange(-300, 300, 7, dtype=torch.int64)
print(backend_module("auto", x.device).__name__)
print(get_codec({"id": "sz", "mode": "rel", "bound": 1e-2}).encode(x).to_bytes().hex())
print(get_codec({"id": "int"}).encode(indices).to_bytes().hex())
print(get_codec({"id": "sz", "mode": "rel", "bound": 1e-2}).encode_with(x, "host").to_bytes().hex())
print(get_codec({"id": "int"}).encode_with(indices, "host").to_bytes().hex())
"""


def _run_with_backend(value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPCDL_BLOCK_BACKEND": value,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", FORCED_REFERENCE], capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_environment_variable_forces_the_reference_with_the_host_bytes_or_fails_clearly():
    """HPCDL_BLOCK_BACKEND=reference: sz and int encode CPU tensors with the reference (their default
    "auto" backend), to the bytes the host library writes; an unknown value names the choices."""
    require(host.AVAILABLE, "the host kernel library is not built")
    run = _run_with_backend("reference")
    assert run.returncode == 0, run.stderr[-2000:]
    name, sz_auto, int_auto, sz_host, int_host = run.stdout.split()
    assert name == "hpcdl.compress.blocks.reference"
    assert sz_auto == sz_host and int_auto == int_host
    assert _run_with_backend("host").stdout.split()[0] == "hpcdl.compress.blocks.host"
    wrong = _run_with_backend("cuda")
    last = wrong.stderr.strip().splitlines()[-1]
    assert wrong.returncode != 0 and last.startswith("hpcdl.compress.errors.CodecError: HPCDL_BLOCK_BACKEND='cuda'"), \
        wrong.stderr[-2000:]
    assert "use one of ['host', 'reference']" in last
