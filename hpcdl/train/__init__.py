"""The data-parallel trainer: configs, the training loop, checkpoints, optimizers.

>>> from hpcdl.train import load_config, run_training
>>> config = load_config("hep-jets", overrides=["train.epochs=3"])
>>> result = run_training(config)
>>> result.activation_ratio, result.epochs[-1]["val_metric"]
"""

from __future__ import annotations

import importlib

# Imported on first use, so that `hpcdl train` can hold its stop signals (hpcdl.train.signals) before it
# loads torch: a time-limit warning during those seconds must not kill a rank.
_LAZY = {
    "ConfigError": "hpcdl.train.config",
    "load_config": "hpcdl.train.config",
    "shipped_configs": "hpcdl.train.config",
    "RunResult": "hpcdl.train.trainer",
    "run_training": "hpcdl.train.trainer",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'hpcdl.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
