"""The one base class of every error hpcdl raises on purpose, at the bottom layer so every layer can use it.

``except hpcdl.errors.HpcdlError`` catches any of them; each also keeps the builtin base it always had
(``ConfigError`` is still a ``ValueError``), so code that caught the builtin keeps working.
``exit_code`` is what the ``hpcdl`` command exits with when the error ends a command: 2 for input the
user gave (a config, a value, a file: like argparse's own usage errors), 1 for a run that started
correctly and then failed.

The classes, by layer (see docs/architecture.md); ``tests/test_errors.py`` fails when a class defined in
hpcdl is missing here or does not derive from :class:`HpcdlError`:

- compress: ``CodecError``, ``UnknownCodecError`` (:mod:`hpcdl.compress.errors`)
- data: ``DataError`` and its ``MissingFileError``, ``TruncatedFileError``, ``MalformedFileError``,
  ``ShapeError``, ``ValueRangeError`` (and its ``LabelRangeError``), ``NonFiniteError``, ``ChecksumError``
  (:mod:`hpcdl.data.errors`)
- memory: ``MeasuringProcessError`` (:mod:`hpcdl.memory.process`; exit code 1: a measuring process killed or
  crashed)
- models: ``ModelError``, ``ModelOptionError`` (:mod:`hpcdl.models.registry`)
- runtime: ``PolicySpecError`` (:mod:`hpcdl.runtime.policy`); ``VerificationError``, ``ReleasedError``,
  ``SavedTensorModifiedError`` (:mod:`hpcdl.runtime.session`), ``RecomputationError``
  (:mod:`hpcdl.runtime.recompute`); exit code 1: they happen during a run
- train: ``ConfigError`` (:mod:`hpcdl.train.config`), ``CheckpointError`` (:mod:`hpcdl.train.checkpoint`),
  ``MethodSpecError`` (:mod:`hpcdl.train.method_spec`: the method specs the study and the benchmarks parse)
- slurm: ``SlurmError`` (:mod:`hpcdl.slurm.errors`)
- bench: ``MemoryBenchError`` (:mod:`hpcdl.bench.memory`), ``GradientBenchError`` (:mod:`hpcdl.bench.gradients`)
- study: ``MatchedBitsError`` (:mod:`hpcdl.study.targets`)

>>> from hpcdl.compress import CodecError
>>> issubclass(CodecError, HpcdlError) and issubclass(CodecError, ValueError)
True
"""

from __future__ import annotations


class HpcdlError(Exception):
    """Base of every error hpcdl raises on purpose; ``exit_code`` is the ``hpcdl`` command's exit status for it."""

    exit_code = 2


class HpcdlRunError(HpcdlError):
    """A run that started from valid input failed on the way (exit code 1, not 2)."""

    exit_code = 1
