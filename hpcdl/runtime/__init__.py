"""Compressed activations in training: the saved-tensor session, policies, and what they saved.

Use::

    policy = hpcdl.Policy.default()    # or hpcdl.Policy.static({"id": "sz", "mode": "rel", "bound": 1e-2}), ...
    with hpcdl.compressed(model, policy) as session:
        loss = loss_fn(model(x), y)
    loss.backward()
    print(session.stats.table())

(:mod:`hpcdl`'s own docstring holds the same example as a doctest that runs.)
"""

from hpcdl.runtime.adaptive import AdaptiveController, AdaptiveOptions
from hpcdl.runtime.policy import (
    Controller,
    GradStat,
    PerModuleController,
    Policy,
    PolicySpecError,
    SavedTensorInfo,
    StaticController,
    config_from_spec,
    policy_from_spec,
    spec_from_config,
)
from hpcdl.runtime.session import (
    DEFAULT_THRESHOLD,
    CompressionFallbackWarning,
    ReleasedError,
    SavedTensorModifiedError,
    Session,
    VerificationError,
    compressed,
)
from hpcdl.runtime.stats import Row, Stats

__all__ = [
    "AdaptiveController",
    "AdaptiveOptions",
    "CompressionFallbackWarning",
    "Controller",
    "DEFAULT_THRESHOLD",
    "GradStat",
    "PerModuleController",
    "Policy",
    "PolicySpecError",
    "ReleasedError",
    "Row",
    "SavedTensorInfo",
    "SavedTensorModifiedError",
    "Session",
    "StaticController",
    "Stats",
    "VerificationError",
    "compressed",
    "config_from_spec",
    "policy_from_spec",
    "spec_from_config",
]
