"""First contact with a CUDA machine: does sz on the GPU give the host's bytes, keep its bound, refuse corrupted
streams, respect streams and memory, and how fast is it? Runs in a few minutes on one GPU.

    python tools/gpu_check.py [--out gpu_check] [--quick]

Writes gpu_check/report.json and gpu_check/report.md. Exit status: 0 every check passed, 1 a check failed,
3 no CUDA device (or no cupy). The checks (docs/gpu.md):

- identity: encode on the GPU = encode on the host, byte for byte, for float32/float16/bfloat16/float64, abs/rel/
  pw_rel, sizes around the warp, tile and host part boundaries, special values and random bit patterns; decode
  on the GPU = decode on the host, bit for bit;
- bound: hpcdl.compress.check_bound on GPU round trips;
- corrupt: a flipped payload byte and forged block headers raise CodecError;
- large: a float16 tensor of 2^31 + 33 elements (int64 outlier indices) round-trips like the host (skipped with
  too little memory);
- streams: an encode queued on a side stream behind a slow kernel gives the same bytes as on an idle device;
- memory: memory_allocated is back to its baseline after encode/decode, and does not grow over 200 calls;
- speed: GB/s of encode and decode next to a device copy, a bfloat16 cast and aminmax on 256 MiB (a smooth
  tensor and a ReLU of noise); per-call latency at 64 KiB, 1 MiB and 16 MiB; one training step's
  max_memory_allocated and time with and without the saved activations compressed;
- syncs: the synchronising torch calls of one encode and one decode (torch.cuda.set_sync_debug_mode);
- deepcam_step: the climate DeepLabv3+ at DeepCAM's full input (16x768x1152): step time and
  max_memory_allocated in fp32 and under bf16 autocast, without compression, with sz rel 1e-2 and with the
  adaptive policy (issue 12's target: sz at most 10 % slower than the bf16 autocast step).

The report is rewritten after every check, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NO_DEVICE = 3
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
MODES = (("abs", 1e-2), ("rel", 1e-2), ("rel", 1e-4), ("pw_rel", 1e-2))
SIZES = (0, 1, 31, 32, 33, 1023, 1024, 1025, 8191 * 32 - 1, 8191 * 32 + 1, 3_000_017)


def _sample(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.cumsum(torch.randn(n, generator=g), 0) * 0.05 + torch.randn(n, generator=g) * 0.01
    if n > 400:
        x[100:300] = torch.relu(x[100:300])
    x = x.to(dtype)
    for i, value in enumerate((math.nan, math.inf, -math.inf, -0.0, torch.finfo(dtype).tiny / 4)):
        if 11 * i + 5 < n:
            x[11 * i + 5] = value
    return x


def _random_bits(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64) * 3
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    return bits.to(width).view(dtype) if dtype.itemsize < 8 else bits.view(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_identity(quick: bool) -> dict:
    from hpcdl.compress.sz import Sz

    cases, mismatches, details = 0, [], []
    sizes = SIZES[:-1] if quick else SIZES
    for dtype in DTYPES:
        for mode, bound in MODES:
            for n in sizes:
                for kind, x in (("sample", _sample(n, dtype, n)), ("random bits", _random_bits(n, dtype, n))):
                    case = f"{dtype} {mode} {bound} n={n} {kind}"
                    cases += 1
                    try:
                        codec = Sz(mode, bound)
                        on_host, on_gpu = codec.encode_with(x, "host"), codec.encode_with(x.cuda(), "cuda")
                        same = on_gpu.header == on_host.header and torch.equal(on_gpu.data.cpu(), on_host.data)
                        decoded = Sz.decode_with(on_gpu, "cuda").cpu()
                        same = same and torch.equal(_bits(decoded), _bits(Sz.decode_with(on_host, "host")))
                    except Exception as err:  # one case's error is reported with the others, not instead of them
                        mismatches.append(f"{case}: {type(err).__name__}: {err}")
                        continue
                    if not same:
                        mismatches.append(case)
                        if len(details) < 5:
                            details.append({"case": case, **_difference(x, on_host, on_gpu)})
    return {"ok": not mismatches, "cases": cases, "mismatches": mismatches[:20], "first_differences": details}


def _difference(x: torch.Tensor, on_host, on_gpu) -> dict:
    """Where a GPU stream differs from the host's: header fields, payload bytes, whether each side decodes the
    other's stream, and how many subnormals the input holds (the kind of value a flush-to-zero mode changes)."""
    from hpcdl.compress.header import read_header
    from hpcdl.compress.sz import FIELDS, Sz

    host_data, gpu_data = on_host.data, on_gpu.data.cpu()
    common = min(host_data.numel(), gpu_data.numel())
    differing = (host_data[:common] != gpu_data[:common]).nonzero().flatten()
    result = {"host_fields": read_header(on_host.header, "sz", FIELDS).fields,
              "gpu_fields": read_header(on_gpu.header, "sz", FIELDS).fields,
              "payload_bytes": [host_data.numel(), gpu_data.numel()], "differing_bytes": int(differing.numel()),
              "first_differing_byte": int(differing[0]) if differing.numel() else None}
    finite = x[torch.isfinite(x)].abs()
    result["subnormals"] = int(((finite > 0) & (finite < torch.finfo(x.dtype).tiny)).sum())
    for name, packed, backend in (("host_decodes_gpu_stream", on_gpu, "host"), ("gpu_decodes_host_stream", on_host, "cuda")):
        try:
            Sz.decode_with(packed, backend)
            result[name] = True
        except Exception as err:
            result[name] = f"{type(err).__name__}: {err}"
    return result


def check_bound() -> dict:
    from hpcdl.compress import check_bound as bound_report
    from hpcdl.compress.sz import Sz

    failures = []
    for dtype in DTYPES:
        for mode, bound in MODES:
            x = _sample(1_000_003, dtype, 7).cuda()
            report = bound_report(x, Sz(mode, bound).decode(Sz(mode, bound).encode(x)), mode, bound)
            if not report.ok:
                failures.append(f"{dtype} {mode} {bound}: {report}")
    return {"ok": not failures, "failures": failures}


def check_corrupt() -> dict:
    from hpcdl.compress import CodecError
    from hpcdl.compress.base import Packed
    from hpcdl.compress.checksum import payload_checksum
    from hpcdl.compress.header import read_header, write_header
    from hpcdl.compress.sz import FIELDS, Sz

    packed = Sz("abs", 1e-3).encode(_sample(100_000, torch.float32, 1).cuda())
    flipped = packed.data.clone()
    flipped[flipped.numel() // 2] ^= 1
    forged = packed.data.clone()
    forged[0] = 40
    header = read_header(packed.header, "sz", FIELDS)
    forged_header = write_header("sz", header.dtype, header.shape, FIELDS, *header.fields,
                                 checksum=payload_checksum(forged.cpu()))
    refused = []
    for name, stream in (("flipped byte", Packed(packed.header, flipped)), ("forged header", Packed(forged_header, forged))):
        try:
            Sz.decode_with(stream, "cuda")
        except CodecError:
            refused.append(name)
    return {"ok": len(refused) == 2, "refused": refused}


def check_large() -> dict:
    from hpcdl.compress.sz import Sz

    n = 2**31 + 33
    free, _ = torch.cuda.mem_get_info()
    if free < 6 * 2 * n:
        return {"ok": True, "skipped": f"needs ~{12 * n / 2**30:.0f} GiB free, {free / 2**30:.0f} GiB free"}
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    x[n - 1] = math.nan  # an outlier past 2^31: int64 indices
    codec = Sz("rel", 1e-2)
    packed = codec.encode(x)
    restored = Sz.decode_with(packed, "cuda")
    eb, worst = packed_eb(packed), 0.0
    for start in range(0, n - 1, 2**28):  # float64 errors a slice at a time
        end = min(n - 1, start + 2**28)
        worst = max(worst, float((restored[start:end].double() - x[start:end].double()).abs().max()))
    ok = bool(torch.isnan(restored[n - 1])) and worst <= eb
    del x, restored
    return {"ok": ok, "elements": n, "payload_bytes": packed.data.numel()}


def packed_eb(packed) -> float:
    from hpcdl.compress.header import read_header
    from hpcdl.compress.sz import FIELDS

    return read_header(packed.header, "sz", FIELDS).fields[5]


def check_streams() -> dict:
    from hpcdl.compress.sz import Sz

    x = _sample(4_000_000, torch.float32, 3).cuda()
    idle = Sz("rel", 1e-3).encode(x)
    side = torch.cuda.Stream()
    y = torch.empty_like(x)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # a slow kernel (~0.1 s) ahead of the copy and the encode
        y.copy_(x)
        busy = Sz("rel", 1e-3).encode(y)
        restored = Sz.decode_with(busy, "cuda")
    torch.cuda.synchronize()
    same = busy.header == idle.header and torch.equal(busy.data, idle.data)
    return {"ok": same and torch.equal(_bits(restored), _bits(Sz.decode_with(idle, "cuda")))}


def check_memory() -> dict:
    from hpcdl.compress.sz import Sz

    x = _sample(8_000_000, torch.float32, 4).cuda()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    packed = Sz("rel", 1e-2).encode(x)
    after_encode = torch.cuda.memory_allocated() - packed.data.numel()
    del packed
    first = torch.cuda.memory_allocated()
    for _ in range(200):
        Sz.decode_with(Sz("rel", 1e-2).encode(x), "cuda")
    torch.cuda.synchronize()
    last = torch.cuda.memory_allocated()
    return {"ok": after_encode <= baseline + 4096 and last == first == baseline,
            "baseline": baseline, "after_encode_minus_payload": after_encode, "after_200_calls": last}


def _time(function, repeat: int = 10) -> float:
    function()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        function()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def _throughput(x: torch.Tensor, mode: str, bound: float) -> dict:
    """GB/s of input bytes for one codec setting on ``x``, and its ratio."""
    from hpcdl.compress.sz import Sz

    codec = Sz(mode, bound)
    packed = codec.encode(x)
    size = x.numel() * x.element_size() / 1e9
    return {"ratio": x.numel() * x.element_size() / packed.nbytes,
            "encode_GBps": size / _time(lambda: codec.encode(x)),
            "decode_GBps": size / _time(lambda: Sz.decode_with(packed, "cuda"))}


def measure_speed() -> dict:
    """Encode/decode GB/s on 256 MiB of float32 (counting input bytes), next to what a copy, a cast and a
    reduction of the same tensor take, and the per-call latency of small tensors."""
    from hpcdl.compress.sz import Sz

    n = 256 * 2**20 // 4
    x = torch.cumsum(torch.randn(n, device="cuda"), 0) * 0.01
    relu_noise = torch.relu(torch.randn(n, device="cuda"))
    codec = Sz("rel", 1e-2)
    size = x.numel() * 4 / 1e9
    result = {
        "bytes": x.numel() * 4,
        "smooth": {f"{mode} {bound:g}": _throughput(x, mode, bound)
                   for mode, bound in (("rel", 1e-2), ("rel", 1e-1), ("abs", 1e-3), ("pw_rel", 1e-2))},
        "relu_noise": {f"{mode} {bound:g}": _throughput(relu_noise, mode, bound)
                       for mode, bound in (("rel", 1e-2), ("rel", 1e-1))},
        "copy_GBps": size / _time(lambda: x.clone()),
        "bf16_cast_GBps": size / _time(lambda: x.to(torch.bfloat16)),
        "aminmax_GBps": size / _time(lambda: torch.aminmax(x)),
        "latency_us": {},
    }
    for nbytes in (64 * 2**10, 2**20, 16 * 2**20):
        small = x[: nbytes // 4].clone()
        small_packed = codec.encode(small)
        result["latency_us"][f"{nbytes // 1024} KiB"] = {
            "encode": 1e6 * _time(lambda s=small: codec.encode(s), 50),
            "decode": 1e6 * _time(lambda p=small_packed: Sz.decode_with(p, "cuda"), 50)}
    return result


def measure_training_step() -> dict:
    from hpcdl.compress.sz import Sz

    model = torch.nn.Sequential(*[layer for _ in range(6) for layer in (torch.nn.Conv2d(64, 64, 3, padding=1),
                                                                         torch.nn.BatchNorm2d(64), torch.nn.ReLU())])
    model = model.cuda()
    x = torch.randn(32, 64, 64, 64, device="cuda")
    codec = Sz("rel", 1e-2)

    def step(compress: bool) -> None:
        if compress:
            with torch.autograd.graph.saved_tensors_hooks(
                    lambda t: codec.encode(t) if t.is_floating_point() and t.numel() > 4096 else t,
                    lambda p: Sz.decode_with(p, "cuda") if not isinstance(p, torch.Tensor) else p):
                loss = model(x).square().mean()
        else:
            loss = model(x).square().mean()
        loss.backward()

    result = {}
    for compress in (False, True):
        step(compress)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        seconds = _time(lambda c=compress: step(c), 3)
        result["compressed" if compress else "plain"] = {"seconds": seconds,
                                                           "max_memory_allocated": torch.cuda.max_memory_allocated()}
    return result


def measure_kernels() -> dict:
    """Each sz kernel's registers, local memory (spills) and static shared memory as loaded, and the device time
    of each kernel in an encode and a decode of 256 MiB of float32 at rel 1e-2 (torch.profiler, CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    from hpcdl.compress.blocks import cuda as backend
    from hpcdl.compress.sz import Sz

    _, module = backend._module()
    attributes = {}
    for suffix in ("f32", "bf16"):
        for kind in ("prepass", "encode", "decode"):
            name = f"hpcdl_sz_{kind}_{suffix}"
            try:
                found = module.get_function(name).attributes
                attributes[name] = {key: found[key] for key in ("num_regs", "local_size_bytes", "shared_size_bytes")}
            except Exception as err:  # an attribute cupy does not expose is reported, not fatal
                attributes[name] = f"{type(err).__name__}: {err}"
    x = torch.cumsum(torch.randn(64 * 2**20, device="cuda"), 0) * 0.01
    codec = Sz("rel", 1e-2)
    packed = codec.encode(x)
    Sz.decode_with(packed, "cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(5):
            Sz.decode_with(codec.encode(x), "cuda")
        torch.cuda.synchronize()
    kernels = {}
    for event in trace.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if event.count and total:
            kernels[event.key[:80]] = {"calls": event.count, "us_per_call": total / event.count}
    return {"attributes": attributes, "device_time_256MiB": kernels}


def measure_syncs() -> dict:
    """How many synchronising torch calls one encode and one decode make (the design: one each)."""
    import warnings

    from hpcdl.compress.sz import Sz

    x = _sample(1_000_000, torch.float32, 5).cuda()
    codec = Sz("rel", 1e-2)
    packed = codec.encode(x)
    torch.cuda.synchronize()
    counts = {}
    for name, call in (("encode", lambda: codec.encode(x)), ("decode", lambda: Sz.decode_with(packed, "cuda"))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                call()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts[name] = sum("synchroniz" in str(w.message) for w in caught)
    return counts


def measure_deepcam_step(device: str = "cuda", scale: str = "full", batch: int = 2, steps: int = 3) -> dict:
    """Step time (mean of ``steps`` after two warm-ups; the adaptive policy after its first decisions) and
    max_memory_allocated of the climate DeepLabv3+ at ``scale`` under each activation setting."""
    import hpcdl
    from hpcdl.memory import Workload

    cuda = torch.device(device).type == "cuda"
    model, x, y, loss_fn = Workload("deeplabv3p-climate", scale).build(batch, seed=0)
    model, x, y = model.to(device), x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    settings = {"fp32": (None, False), "bf16 autocast": (None, True), "sz rel 1e-2": ("sz:rel=1e-2", False),
                "sz rel 1e-2, bf16 autocast": ("sz:rel=1e-2", True), "adaptive": ("adaptive", False)}
    result: dict = {"model": "deeplabv3p-climate", "scale": scale, "input": list(x.shape), "batch": batch}
    for name, (spec, autocast) in settings.items():
        policy = hpcdl.Policy.adaptive() if spec == "adaptive" else spec

        def step(policy=policy, autocast=autocast) -> float:
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
                if policy is None:
                    loss = loss_fn(model(x), y)
                else:
                    with hpcdl.compressed(model, policy):
                        loss = loss_fn(model(x), y)
            loss.backward()
            if isinstance(policy, hpcdl.Policy):
                policy.record_gradients(model)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss.detach())

        warmups = 6 if spec == "adaptive" else 2
        for _ in range(warmups):
            step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        result[name] = {"seconds": (time.perf_counter() - start) / steps,
                        "max_memory_allocated": torch.cuda.max_memory_allocated() if cuda else None}
    base = result["bf16 autocast"]["seconds"]
    for name in settings:
        result[name]["vs_bf16_autocast"] = result[name]["seconds"] / base
    return result


CHECKS = {"identity": check_identity, "bound": check_bound, "corrupt": check_corrupt, "large": check_large,
          "streams": check_streams, "memory": check_memory}
MEASUREMENTS = {"syncs": measure_syncs, "kernels": measure_kernels, "speed": measure_speed, "training_step": measure_training_step,
                "deepcam_step": measure_deepcam_step}


def device_available() -> str | None:
    """Why this machine cannot run the check, or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cupy is not installed: pip install 'hpcdl[cuda12]' or 'hpcdl[cuda13]' (torch.version.cuda)"
    return None


def write_report(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [f"# GPU check: {report['verdict']}", "", f"device: {report.get('device', '-')}", ""]
    for name, result in report.get("checks", {}).items():
        lines.append(f"- {name}: {'pass' if result.get('ok') else 'FAIL'} {json.dumps(result, default=str)[:300]}")
    for name, result in report.get("measurements", {}).items():
        lines += ["", f"## {name}", "", "```", json.dumps(result, indent=2, default=str), "```"]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check"))
    parser.add_argument("--quick", action="store_true", help="skip the 3M-element identity cases")
    parser.add_argument("--only", default="", help="comma-separated checks and measurements to run (default all)")
    args = parser.parse_args(argv)
    only = {name for name in args.only.split(",") if name}
    unknown = only - set(CHECKS) - set(MEASUREMENTS)
    if unknown:
        parser.error(f"--only names {sorted(unknown)}; the checks and measurements are "
                     f"{', '.join([*CHECKS, *MEASUREMENTS])}")
    missing = device_available()
    if missing:
        write_report(args.out, {"verdict": "no device", "reason": missing})
        print(f"gpu_check: {missing}")
        return NO_DEVICE
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                    "checks": {}, "measurements": {}}
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            report["checks"][name] = check(args.quick) if name == "identity" else check()
        except Exception:  # a crash is a failed check, reported with its traceback
            report["checks"][name] = {"ok": False, "error": traceback.format_exc()}
        report["checks"][name]["seconds"] = time.perf_counter() - start
        print(f"{name}: {'pass' if report['checks'][name]['ok'] else 'FAIL'}", flush=True)
        write_report(args.out, {**report, "verdict": "incomplete"})
    for name, measure in MEASUREMENTS.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            report["measurements"][name] = measure()
        except Exception:
            report["measurements"][name] = {"error": traceback.format_exc()}
        print(f"{name}: {time.perf_counter() - start:.1f} s", json.dumps(report["measurements"][name], default=str),
              flush=True)
        write_report(args.out, {**report, "verdict": "incomplete"})
    passed = all(result["ok"] for result in report["checks"].values())
    report["verdict"] = "pass" if passed else "FAIL"
    write_report(args.out, report)
    print(f"gpu_check: {report['verdict']}; report in {args.out}/report.md")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
