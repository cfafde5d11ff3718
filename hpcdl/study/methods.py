"""Moved: method specs live in :mod:`hpcdl.train.method_spec`, below the study and the benchmarks that both parse them.

This alias stays for one release.
"""

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
