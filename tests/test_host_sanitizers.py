"""The host kernel library under AddressSanitizer and UBSan: the library setup.py builds (every per-ISA build of
kernels/host.cpp and the dispatcher), compiled with -fsanitize=address,undefined (errors fatal), loaded through HPCDL_HOST_LIBRARY in a child Python that preloads
gcc's libasan, round-trips sz and int streams and decodes forged ones (valid checksums over impossible block
headers and words, which reach the kernels' own validation) with no sanitizer report."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import require

ROOT = Path(__file__).resolve().parents[1]
# Added to setup.py's own flags (setuptools appends CFLAGS and LDFLAGS), so the sanitized library is built by the
# one definition of the build.
SANITIZE = "-g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"

CHILD = r"""
import os, torch
from hpcdl.compress import CodecError, Packed, get_codec
from hpcdl.compress.checksum import payload_checksum
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.intcodec import FIELDS as INT_FIELDS, IntCodec
from hpcdl.compress.sz import FIELDS as SZ_FIELDS, Sz, host

assert host.LIBRARY._name == os.environ["HPCDL_HOST_LIBRARY"], host.LIBRARY._name
generator = torch.Generator().manual_seed(0)
floats = torch.relu(torch.randn(300_001, generator=generator))  # more than one part of 8192 blocks
floats[::997] = float("nan")
floats[5::1001] = 3e38
cases = [(Sz("rel", 1e-2), floats)] + [(Sz(mode, 1e-2), floats[:5000].to(dtype)) for mode in ("abs", "rel", "pw_rel")
                                       for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
cases += [(Sz("abs", 1e-3), torch.randn(n, generator=generator)) for n in (0, 1, 31, 33, 1025)]
cases += [(IntCodec(), torch.randint(-9, 2**40, (n,), generator=generator) // d) for n in (0, 7, 40_000) for d in (1, 2**30)]
cases += [(IntCodec(), torch.randint(0, 255, (4099,), generator=generator, dtype=torch.uint8))]
forged = refused = 0
for codec, x in cases:
    packed = codec.encode_with(x, "host")
    restored = codec.decode_with(packed, "host")
    assert restored.shape == x.shape and restored.dtype == x.dtype
    if isinstance(codec, IntCodec):
        assert torch.equal(restored, x)
    fields = SZ_FIELDS if isinstance(codec, Sz) else INT_FIELDS
    header = read_header(packed.header, packed.codec_id, fields)
    for trial in range(40 if 0 < packed.data.numel() < 10**5 else 0):
        data = packed.data.clone()
        spots = torch.randint(0, data.numel(), (1 + trial % 4,), generator=generator)
        data[spots] = torch.randint(0, 256, spots.shape, generator=generator, dtype=torch.uint8)
        bad = Packed(write_header(packed.codec_id, header.dtype, header.shape, fields, *header.fields,
                                  checksum=payload_checksum(data)), data)
        forged += 1
        try:
            codec.decode_with(bad, "host")
        except CodecError:
            refused += 1
print(f"{len(cases)} round trips, {forged} forged streams decoded ({refused} refused)")
"""


def _build(tmp_path: Path) -> Path:
    probe = tmp_path / "probe.cpp"
    probe.write_text("int main() { return 0; }\n")
    try:
        works = subprocess.run(["g++", "-fsanitize=address,undefined", str(probe), "-o", str(tmp_path / "probe")],
                               capture_output=True).returncode == 0
    except FileNotFoundError:
        works = False
    require(works, "g++ with AddressSanitizer/UBSan support is not installed")
    env = {**os.environ, "CFLAGS": SANITIZE, "LDFLAGS": "-fsanitize=address,undefined"}
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--force", "--build-lib",
                            str(tmp_path / "lib"), "--build-temp", str(tmp_path / "obj")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (library,) = (tmp_path / "lib" / "hpcdl").glob("_kernels_host*.so")
    return library


def test_host_kernels_have_no_sanitizer_reports(tmp_path):
    library = _build(tmp_path)
    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "HPCDL_HOST_LIBRARY": str(library), "LD_PRELOAD": libasan, "OMP_NUM_THREADS": "2",
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=86",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    reports = [line for line in run.stderr.splitlines() if "Sanitizer" in line or "runtime error" in line]
    assert run.returncode == 0 and not reports, f"exit {run.returncode}\n{run.stderr[-6000:]}"
    assert "round trips" in run.stdout
