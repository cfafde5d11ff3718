"""The final summary ``hpcdl train`` prints: what ran, what it measured, where it wrote."""

from __future__ import annotations

from hpcdl.units import human_bytes

__all__ = ["format_summary", "human_bytes"]


def format_summary(result) -> str:
    """A few aligned lines from a :class:`hpcdl.train.RunResult`."""
    last = result.epochs[-1] if result.epochs else {}
    peak_kind = "GPU max allocated" if result.peak_memory_kind == "cuda_max_allocated" else "CPU peak RSS delta"
    rows = [
        ("model", f"{result.config['model']['name']} ({result.config['model']['scale']})"),
        ("activations", result.method),
        ("ranks x per-device batch", f"{result.world_size} x {result.per_device_batch} = {result.batch_size}"),
        ("steps", f"{result.steps}" + (f" (resumed at {result.resumed_from_step})"
                                       if result.resumed_from_step is not None else "")),
        ("final train loss", f"{last.get('train_loss', float('nan')):.4f}"),
        (f"final val {result.metric_name}", f"{last.get('val_metric', float('nan')):.4f}"),
        ("activation ratio", f"{result.activation_ratio:.2f}x ({human_bytes(result.activation_original_bytes)} "
                             f"-> {human_bytes(result.activation_packed_bytes)} over all steps)"
         if result.activation_packed_bytes else "n/a (not compressed)"),
        (f"peak memory ({peak_kind})", human_bytes(result.peak_memory_bytes)),
        ("throughput", f"{result.samples_per_s:.1f} samples/s (median step {result.median_step_time_s * 1e3:.1f} ms)"),
        ("wall time", f"{result.wall_time_s:.1f} s"),
        ("run directory", result.run_dir),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)
