"""``hpcdl export RUN_DIR_OR_CHECKPOINT --out model.pt``: the trained weights as a plain model state dict."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    export = subparsers.add_parser(
        "export", help="write a run's trained weights as a plain model state dict",
        description="Write the model weights of a checkpoint (or of the newest good checkpoint of a run "
                    "directory) as a plain state dict: `model.load_state_dict(torch.load(OUT, weights_only=True))`.")
    export.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT",
                        help="a run directory (its newest checkpoint that verifies) or a checkpoint file")
    export.add_argument("--out", required=True, help="file to write, e.g. model.pt")
    export.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from hpcdl.train.checkpoint import export_model

    path, step = export_model(args.source, args.out)
    print(f"wrote the model of {path} (step {step}) to {args.out}")
    return 0
