"""The CUDA backend without a GPU: kernels/sz_cuda.cu built for the host under an emulation of the CUDA grid and
warp primitives (tests/gpu_emulation/), and hpcdl/compress/blocks/cuda.py run unchanged on it through a stand-in
``cupy`` with CPU tensors as device memory.

- its streams are byte for byte the host library's, across dtypes, modes, sizes around the warp, tile and host
  part boundaries, special values and random bit patterns; decoding gives the host's bits;
- CTAs start in shuffled orders and interleave at every warp primitive and look-back spin, and the bytes do
  not depend on the order;
- corrupted and forged streams raise CodecError;
- the unbiased format's statistics (sz_stats, the slack chosen on a sample, the means) computed on the device
  give the host's parameters, whichever slack the tensor needs;
- an encode reads the device once (the summary) and a decode once (its verdict), with 3 and 1 launches;
- the same emulation built with AddressSanitizer and UBSan reports nothing.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hpcdl.compress.blocks.codec as block_codec
from hpcdl.compress import CodecError
from hpcdl.compress.base import Packed
from hpcdl.compress.blocks import cuda, host
from hpcdl.compress.blocks.stream import Layout
from hpcdl.compress.checksum import payload_checksum
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.sz import FIELDS, Sz

from conftest import require

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu_emulation"))
import emulation  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
MODES = [("abs", 1e-2), ("rel", 1e-2), ("pw_rel", 1e-2)]
SIZES = [0, 1, 31, 32, 33, 1023, 1024, 1025, 3 * 1024 + 7]


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    require(subprocess.run(["which", "g++"], capture_output=True).returncode == 0, "g++ is not installed")
    return emulation.build(tmp_path_factory.mktemp("emulation"))


@pytest.fixture
def standin(library, monkeypatch):
    """cuda.py on the emulated kernels; the codecs' "cuda" backend is the module, whatever the device."""
    cupy = emulation.CupyStandIn(library, seed=1)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    cuda._module.cache_clear()
    original = block_codec.backend_module
    monkeypatch.setattr(block_codec, "backend_module", lambda name, device: cuda if name == "cuda" else original(name, device))
    yield cupy
    cuda._module.cache_clear()


def sample(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Smooth values, a ReLU stretch, zeros and the special values the format keeps exactly."""
    g = torch.Generator().manual_seed(seed)
    x = torch.cumsum(torch.randn(n, generator=g), 0) * 0.1 + torch.randn(n, generator=g) * 0.01
    if n > 200:
        x[100:180] = torch.relu(x[100:180])
        x[180:200] = 0
    x = x.to(dtype)
    specials = [math.nan, math.inf, -math.inf, -0.0, torch.finfo(dtype).tiny / 4, -torch.finfo(dtype).max]
    for i, value in enumerate(specials):
        if 7 * i + 3 < n:
            x[7 * i + 3] = value
    return x


def random_bits(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Every bit pattern of the dtype equally likely (NaN payloads, subnormals, huge values)."""
    g = torch.Generator().manual_seed(seed)
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    bits = torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64) * 3
    return bits.to(width).view(dtype) if dtype.itemsize < 8 else bits.view(dtype)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_like_host(x: torch.Tensor, mode: str, bound: float) -> None:
    codec = Sz(mode, bound)
    on_host, on_device = codec.encode_with(x, "host"), codec.encode_with(x, "cuda")
    assert on_device.header == on_host.header
    assert torch.equal(on_device.data, on_host.data)
    assert torch.equal(bits_of(Sz.decode_with(on_device, "cuda")), bits_of(Sz.decode_with(on_host, "host")))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode,bound", MODES)
def test_streams_are_the_host_streams(standin, dtype, mode, bound):
    for n in SIZES:
        assert_like_host(sample(n, dtype, seed=n), mode, bound)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_bit_patterns_are_the_host_streams(standin, dtype):
    for mode, bound in MODES + [("abs", 1e-30), ("rel", 0.5)]:
        assert_like_host(random_bits(2 * 1024 + 33, dtype), mode, bound)


def test_a_bin_width_past_float64_is_the_host_stream(standin):
    """rel over float64 values whose range overflows (eb 0 on both, every nonzero an outlier)."""
    x = torch.tensor([1e308, -1e308, 1.0, 0.0, -2.5, math.nan] * 700, dtype=torch.float64)
    for mode, bound in [("rel", 1e-2), ("abs", 1e308)]:
        assert_like_host(x, mode, bound)
        assert torch.equal(bits_of(Sz.decode_with(Sz(mode, bound).encode_with(x, "cuda"), "cuda")), bits_of(x))


def test_constant_and_special_only_tensors(standin):
    """rel of a constant tensor (eb = 0: all outliers, the raw fallback), all-NaN, all-zero, one Inf."""
    for x in (torch.full((100,), 3.0), torch.full((100,), math.nan), torch.zeros(5000), torch.tensor([math.inf]),
              torch.tensor([-0.0, 1.0, 0.0])):
        for mode, bound in MODES:
            assert_like_host(x, mode, bound)


@pytest.mark.parametrize("n", [8191 * 32 - 1, 8191 * 32 + 1], ids=["part-1", "part+1"])
def test_host_part_boundaries(standin, n):
    """Around the host library's part of 8192 blocks (and 256 tiles of the GPU)."""
    assert_like_host(sample(n, torch.float32, seed=3), "rel", 1e-3)


def test_bytes_do_not_depend_on_the_cta_order(standin):
    x = sample(9 * 1024 + 5, torch.float16, seed=5)
    reference = Sz("rel", 1e-2).encode_with(x, "host")
    for seed in (0, 2, 99):
        standin.seed = seed
        packed = Sz("rel", 1e-2).encode_with(x, "cuda")
        assert packed.header == reference.header and torch.equal(packed.data, reference.data)


def test_many_tiles_in_flight_give_the_host_bytes(tmp_path_factory, monkeypatch):
    """40 CTAs in flight, so that a tile's look-back window meets many predecessors that have published only
    their aggregate (3 in flight rarely does): encode and decode as the host, several CTA orders."""
    many = emulation.CupyStandIn(emulation.build(tmp_path_factory.mktemp("many"), resident_ctas=40), seed=1)
    monkeypatch.setitem(sys.modules, "cupy", many)
    cuda._module.cache_clear()
    original = block_codec.backend_module
    monkeypatch.setattr(block_codec, "backend_module", lambda name, device: cuda if name == "cuda" else original(name, device))
    try:
        for seed, (mode, bound) in zip((0, 7, 99), (("rel", 1e-2), ("abs", 1e-3), ("pw_rel", 1e-2))):
            many.seed = seed
            assert_like_host(sample(200 * 1024 + 77, torch.float32, seed=seed), mode, bound)
    finally:
        cuda._module.cache_clear()


def activations(n: int, seed: int) -> dict[str, torch.Tensor]:
    """The kinds of tensors the unbiased format was measured on (docs/format.md, section 5)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g) * 2
    return {"relu": torch.relu(z), "gelu": torch.nn.functional.gelu(z),
            "softmax": torch.softmax(z[: n // 196 * 196].view(-1, 196), dim=1).reshape(-1)}


@pytest.mark.parametrize("mode,bound", [("rel", 1e-1), ("rel", 1e-2), ("abs", 0.05), ("pw_rel", 1e-1), ("rel", 0.5)])
def test_unbiased_parameters_are_the_host_parameters(standin, mode, bound):
    """Coarse bounds and GELU's negative side need bigger slacks: the device chooses the host's, on the whole
    tensor and (past 4096 blocks) on a strided sample, and computes the same means."""
    for n in (5000, 200_000):
        for x in activations(n, seed=n).values():
            for dtype in (torch.float32, torch.bfloat16):
                assert_like_host(x.to(dtype), mode, bound)


def test_device_stats_are_the_host_stats(standin):
    from hpcdl.compress.blocks.params import SzParams

    x = activations(7000, seed=4)["gelu"]
    for mode, bound in MODES:
        params = SzParams.for_tensor(mode, bound, x, host.sz_stats)
        assert cuda.sz_stats(x, params) == host.sz_stats(x, params)


def _forged(packed: Packed, data: torch.Tensor) -> Packed:
    """``packed`` with payload ``data`` and a header whose checksum matches it."""
    header = read_header(packed.header, "sz", FIELDS)
    blob = write_header("sz", header.dtype, header.shape, FIELDS, *header.fields, checksum=payload_checksum(data))
    return Packed(blob, data)


def test_corrupted_and_forged_streams_raise(standin):
    x = sample(3000, torch.float32)
    packed = Sz("abs", 1e-3).encode_with(x, "cuda")
    assert packed.data.numel() > 0
    flipped = packed.data.clone()
    flipped[packed.data.numel() // 2] ^= 4
    with pytest.raises(CodecError, match="checksum"):
        Sz.decode_with(Packed(packed.header, flipped), "cuda")
    wide = packed.data.clone()
    wide[0] = 40  # a block of 40 words
    with pytest.raises(CodecError, match="more than 32 words"):
        Sz.decode_with(_forged(packed, wide), "cuda")
    fewer = packed.data.clone()
    fewer[1] = (int(fewer[1]) & 0xC0) | max(0, (int(fewer[1]) & 63) - 1)
    with pytest.raises(CodecError, match="add up"):
        Sz.decode_with(_forged(packed, fewer), "cuda")
    with_outliers = Sz("abs", 1e-3).encode_with(sample(3000, torch.float32, seed=2), "cuda")
    header = read_header(with_outliers.header, "sz", FIELDS)
    assert header.fields[-1] >= 2  # outliers
    indices_at = Layout(3000, header.fields[-2], header.fields[-1], 4).indices_at
    swapped = with_outliers.data.clone()
    swapped[indices_at : indices_at + 4] = torch.tensor([255, 255, 0, 0], dtype=torch.uint8)  # the first index
    with pytest.raises(CodecError, match="outlier indices"):
        Sz.decode_with(_forged(with_outliers, swapped), "cuda")


class _Ops(TorchDispatchMode):
    """Counts the torch operations (views included) and those that run device work (not views or metadata)."""

    METADATA = ("view", "slice", "detach", "alias", "as_strided", "reshape", "_reshape_alias", "empty", "lift_fresh")

    def __init__(self):
        super().__init__()
        self.count, self.work = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        if not any(func.__name__.startswith(prefix) for prefix in self.METADATA):
            self.work.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["abs", "rel", "pw_rel"])
def test_one_device_read_per_encode_and_per_decode(standin, monkeypatch, mode):
    """Every way a tensor's value reaches Python is counted: the encode reads its summary once, the decode its
    verdict once. The launches and torch operations per call are what docs/gpu.md's cost model counts."""
    reads = []
    for name in ("tolist", "item", "cpu", "__int__", "__float__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    x = sample(5000, torch.float32)
    x[x.abs() > 1e30] = 1.0  # no -max, whose range leaves only outliers and the raw fallback
    codec = Sz(mode, 1e-2)
    standin.launches.clear()
    with _Ops() as ops:
        packed = codec.encode_with(x, "cuda")
    encode_reads, encode_launches, encode_ops, encode_work = len(reads), list(standin.launches), ops.count, ops.work
    reads.clear(), standin.launches.clear()
    with _Ops() as ops:
        Sz.decode_with(packed, "cuda")
    decode_ops, decode_work = ops.count, ops.work
    assert encode_reads == 1 and len(reads) == 1, (encode_reads, reads)
    assert encode_launches == ["hpcdl_sz_prepass_f32", "hpcdl_sz_encode_f32", "hpcdl_sz_assemble"]
    assert standin.launches == ["hpcdl_sz_decode_f32"]
    print(f"{mode}: encode {encode_ops} torch ops ({encode_work} run device work), {len(encode_launches)} launches; "
          f"decode {decode_ops} torch ops ({decode_work}), 1 launch")
    # device work besides the kernels: one fill of the summary and tile status, and the one read
    assert encode_work == ["zero_", "_local_scalar_dense"] or len(encode_work) <= 3, encode_work
    assert len(decode_work) <= 3, decode_work
    reads.clear()
    fallback = Sz("rel", 1e-2).encode_with(torch.full((3000,), 3.0), "cuda")  # eb 0: all outliers
    assert len(fallback.data) == 3000 * 4 and len(reads) == 2  # the raw fallback's checksum is one more read


SANITIZED_CHILD = """
import sys, math, torch
sys.path.insert(0, {emulation_dir!r})
import emulation
from pathlib import Path
sys.modules["cupy"] = emulation.CupyStandIn(Path({library!r}), seed=3)
import hpcdl.compress.blocks.codec as block_codec
from hpcdl.compress.blocks import cuda
from hpcdl.compress import CodecError
from hpcdl.compress.base import Packed
from hpcdl.compress.sz import Sz
original = block_codec.backend_module
block_codec.backend_module = lambda name, device: cuda if name == "cuda" else original(name, device)
g = torch.Generator().manual_seed(0)
cases = 0
for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
    for mode in ("abs", "rel", "pw_rel"):
        for n in (1, 33, 2100):
            x = (torch.randn(n, generator=g) * 3).to(dtype)
            x[::17] = math.nan
            packed = Sz(mode, 1e-2).encode_with(x, "cuda")
            host = Sz(mode, 1e-2).encode_with(x, "host")
            assert packed.header == host.header and torch.equal(packed.data, host.data)
            Sz.decode_with(packed, "cuda")
            broken = packed.data.clone()
            if broken.numel():
                broken[0] = 63
                try:
                    Sz.decode_with(Packed(packed.header, broken), "cuda")
                except CodecError:
                    pass
            cases += 1
print(cases, "cases")
"""


def test_emulated_kernels_have_no_sanitizer_reports(tmp_path):
    probe = tmp_path / "probe.cpp"
    probe.write_text("int main() { return 0; }\n")
    works = subprocess.run(["g++", "-fsanitize=address,undefined", str(probe), "-o", str(tmp_path / "probe")],
                           capture_output=True).returncode == 0
    require(works, "g++ with AddressSanitizer/UBSan support is not installed")
    library = emulation.build(tmp_path, sanitize=True)
    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=86",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    child = SANITIZED_CHILD.format(emulation_dir=str(Path(emulation.__file__).parent), library=str(library))
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=600)
    reports = [line for line in run.stderr.splitlines() if "Sanitizer" in line or "runtime error" in line]
    assert run.returncode == 0 and not reports, f"exit {run.returncode}\n{run.stderr[-6000:]}"
    assert "36 cases" in run.stdout


def test_every_kernel_of_the_source_is_launchable(library):
    """The emulation's table (HPCDL_KERNELS in kernels/sz_cuda.cu) lists every extern "C" kernel cuda.py calls."""
    import ctypes
    import re

    lib = ctypes.CDLL(str(library))
    lib.hpcdl_emu_kernel.restype = ctypes.c_char_p
    names, i = set(), 0
    while (name := lib.hpcdl_emu_kernel(i)) is not None:
        names.add(name.decode())
        i += 1
    called = set(re.findall(r'"(hpcdl_[a-z_0-9]+)', (ROOT / "hpcdl/compress/blocks/cuda.py").read_text()))
    called |= {f"hpcdl_sz_{kind}_{suffix}" for kind in ("prepass", "stats", "encode", "decode")
               for suffix in ("f32", "f16", "bf16", "f64")}
    called = {name for name in called if not name.endswith("_")}
    assert called <= names, called - names
    assert host.AVAILABLE
