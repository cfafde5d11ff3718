"""``hpcdl models``: every model with its parameter count, input shape and measured activation bytes per sample."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    models = subparsers.add_parser(
        "models", help="list the model zoo with parameters, input shape and activation memory per sample",
        description="List every model at each scale with its parameter count, per-sample input shape and the bytes "
                    "autograd saves for backward per sample, measured by running one training step at batch 1 and "
                    "batch 2 (the difference is the per-sample cost). By default the steps run on fake tensors "
                    "(PyTorch's FakeTensorMode: the CPU kernels' shapes, no data, no compute), so even the full "
                    "DeepCAM input is measured in seconds; --device cpu runs real steps.")
    models.add_argument("--scale", action="append", metavar="SCALE",
                        help="only this scale (tiny, small, full); repeat for several (default: all)")
    models.add_argument("--model", action="append", metavar="NAME",
                        help="only this model; repeat for several (default: all)")
    models.add_argument("--device", default="fake",
                        help="where to run the measuring steps: fake (default), cpu, or cuda")
    models.add_argument("--json", action="store_true", help="print one JSON object per model and scale")
    models.set_defaults(handler=_models)


def _models(args: argparse.Namespace) -> int:
    from hpcdl.models import family, names
    from hpcdl.models.footprint import measure

    selected = args.model or names()
    for name in selected:
        family(name)  # unknown names fail here, before any measuring
    scales = args.scale
    if scales:
        known = sorted({s for name in selected for s in family(name).scales})
        unknown = sorted(set(scales) - set(known))
        if unknown:
            raise ValueError(f"unknown scale {', '.join(unknown)}; the selected models have scales {', '.join(known)}")
    rows = []
    for name in selected:
        for scale in family(name).scales:
            if scales and scale not in scales:
                continue
            footprint = measure(name, scale, args.device)
            row = {"model": name, "task": family(name).task, "scale": scale, "parameters": footprint.parameters,
                   "input_shape": list(footprint.input_shape),
                   "activation_bytes_per_sample": footprint.activation_bytes_per_sample,
                   "saved_bytes_per_sample": footprint.saved_bytes_per_sample, "device": footprint.device}
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                if not rows:
                    print(_HEADER, flush=True)
                print(_format(row), flush=True)
            rows.append(row)
    if not args.json:
        print(f"\nactivations: distinct storages autograd saves for backward per sample; saved: summed over every "
              f"save (a tensor saved twice counts twice); measured on device '{args.device}'.")
    return 0


_HEADER = (f"{'model':<22} {'task':<14} {'scale':<6} {'parameters':>12} {'input shape':<16} "
           f"{'activations':>12} {'saved':>12}")


def _format(row: dict) -> str:
    shape = "x".join(str(n) for n in row["input_shape"])
    return (f"{row['model']:<22} {row['task']:<14} {row['scale']:<6} {row['parameters']:>12,} {shape:<16} "
            f"{_bytes(row['activation_bytes_per_sample']):>12} {_bytes(row['saved_bytes_per_sample']):>12}")


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
