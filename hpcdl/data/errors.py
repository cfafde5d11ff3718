"""Errors raised by the data loaders and generators.

Every error names the file and says what is wrong with it, so a user staging data on a parallel
file system can tell a missing file from a truncated copy, a file of the wrong layout, a variable
of the wrong shape or dtype, corrupt labels, or NaN/Inf inputs. All are ``ValueError`` (``MissingFileError`` is also a
``FileNotFoundError``), which the CLI reports as a clean error message.
"""

from __future__ import annotations

from pathlib import Path

from hpcdl.errors import HpcdlError


class DataError(HpcdlError, ValueError):
    """A data file or manifest cannot be used; ``path`` is the offending file."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class MissingFileError(DataError, FileNotFoundError):
    """A file that the manifest or the caller names does not exist."""

    def __str__(self) -> str:  # FileNotFoundError would otherwise format its (errno, strerror) args
        return f"{self.path}: {self.problem}"


class TruncatedFileError(DataError):
    """A file is shorter than the manifest records, or the reader hit its end early."""


class MalformedFileError(DataError):
    """A file is not of the expected format or lacks a variable or attribute that it must have."""


class ShapeError(DataError):
    """A variable has a shape or dtype other than the data set declares."""


class ValueRangeError(DataError):
    """A value lies outside the range its meaning allows (a particle count above the maximum, ...)."""


class LabelRangeError(ValueRangeError):
    """A label lies outside ``[0, num_classes)``."""


class NonFiniteError(DataError):
    """An input value of a sample is NaN or infinite."""


class ChecksumError(DataError):
    """A file's sha256 differs from the one recorded in the manifest."""
