"""The data-parallel trainer: configs, the training loop, checkpoints, optimizers.

>>> from hpcdl.train import load_config, run_training
>>> config = load_config("hep-jets", overrides=["train.epochs=3"])
>>> result = run_training(config)
>>> result.activation_ratio, result.epochs[-1]["val_metric"]
"""

from hpcdl.train.config import ConfigError, load_config, shipped_configs
from hpcdl.train.trainer import RunResult, run_training

__all__ = ["ConfigError", "RunResult", "load_config", "run_training", "shipped_configs"]
