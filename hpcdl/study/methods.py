"""Moved: method specs live in :mod:`hpcdl.train.method_spec`, below the study and the benchmarks that both parse them.

This alias warns (FutureWarning) on import and goes in the release after 0.1.0; import from
:mod:`hpcdl.train.method_spec` (or :mod:`hpcdl.study`, which re-exports ``Method``, ``parse_method`` and
``parse_methods``) instead.
"""

import warnings

from hpcdl.train.method_spec import (
    CODEC_CONFIG_KEYS,
    TRAINER_METHODS,
    Method,
    MethodSpecError,
    parse_method,
    parse_methods,
    yaml_scalar,
)

__all__ = ["CODEC_CONFIG_KEYS", "TRAINER_METHODS", "Method", "MethodSpecError", "parse_method", "parse_methods",
           "yaml_scalar"]

warnings.warn("hpcdl.study.methods is deprecated and goes in the release after 0.1.0: "
              "import from hpcdl.train.method_spec instead", FutureWarning, stacklevel=2)
