"""``hpcdl batch-size``: the largest per-device batch that fits a memory budget, uncompressed and compressed."""

from __future__ import annotations

import sys

from hpcdl.cli import thread_count


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "batch-size",
        help="largest batch whose measured step peak fits a budget, without and with compression",
        description="Search measured training-step peaks (doubling from --start, then bisection) for the largest per-device "
        "batch within --budget, for the uncompressed baseline and for --policy, and print both with the "
        "activation ratio and the peak ratio at the baseline's batch.",
    )
    parser.add_argument("--model", required=True,
                        help="an hpcdl.models name (see `hpcdl models`) or module:function returning an nn.Module")
    parser.add_argument("--scale", default="small", help="model scale (default: small)")
    parser.add_argument("--batch-fn", default=None,
                        help="module:function(batch_size, generator) -> (x, y); needed for a module:function model")
    parser.add_argument("--budget", required=True, help="memory budget per device, e.g. 2GiB or 512MiB")
    parser.add_argument("--policy", default=None,
                        help="method spec, e.g. sz:rel=1e-2, quant:bits=2, raw (default: hpcdl's default policy, "
                             "hpcdl.runtime.policy.DEFAULT_POLICY_SPEC)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--threshold", type=int, default=None, help="bytes below which saved tensors stay as they are")
    parser.add_argument("--start", type=int, default=1,
                        help="first batch to try; the search steps away from it by 1, 2, 4, ... (default: 1, doubling)")
    parser.add_argument("--limit", type=int, default=1 << 16, help="largest batch to try (default: 65536)")
    parser.add_argument("--threads", type=thread_count, default=None, help="torch threads in the measuring process")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from hpcdl import memory
    from hpcdl.runtime.policy import DEFAULT_POLICY_SPEC, policy_from_spec
    from hpcdl.runtime.session import DEFAULT_THRESHOLD
    from hpcdl.units import human_bytes

    policy = args.policy or DEFAULT_POLICY_SPEC
    policy_from_spec(policy)  # refuse a bad spec before minutes of baseline measurements
    workload = memory.Workload.of(args.model, scale=args.scale, batch=args.batch_fn)
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold

    def learning(report) -> str:
        """The peak of the method's learning steps (an adaptive policy's probes), where it has any."""
        peak = report.info.get("learning_peak_bytes")
        return f", its learning steps (probes) {human_bytes(peak)}" if peak else ""

    def show(batch_size, report):
        print(f"    batch {batch_size:>6}: peak {human_bytes(report.peak_bytes)}{learning(report)}", file=sys.stderr,
              flush=True)

    with memory.MeasuringProcess(args.threads) as process:
        options = dict(device=args.device, start=args.start, limit=args.limit, threshold=threshold, on_probe=show,
                       process=process)
        baseline = memory.search_batch(workload, None, args.budget, **options)
        compressed = memory.search_batch(workload, policy, args.budget, **options)
        same_batch = memory.peak(memory.TrainStep(workload, baseline.batch_size, policy, args.device, threshold),
                                 process=process)
    print(f"model {workload.describe()}, budget {human_bytes(baseline.budget_bytes)} per device ({args.device})")
    for label, found in (("baseline", baseline), (compressed.policy, compressed)):
        limit_note = f" (the --limit {args.limit}; more may fit)" if found.hit_limit else ""
        print(f"  {label:<16} max batch {found.batch_size:>6}{limit_note}   measured peak {human_bytes(found.peak_bytes)}"
              f"{learning(found.report)}")
    print(f"  batch gain       {compressed.batch_size / baseline.batch_size:.2f}x")
    print(f"  at batch {baseline.batch_size}: peak {human_bytes(baseline.peak_bytes)} -> "
          f"{human_bytes(same_batch.peak_bytes)} (peak ratio {baseline.peak_bytes / max(same_batch.peak_bytes, 1):.2f}x), "
          f"activation ratio {same_batch.activation_ratio:.2f}x")
    return 0
