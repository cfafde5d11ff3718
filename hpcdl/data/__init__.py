"""Data: lazy netCDF4/HDF5 loaders of the climate and HEP data sets, sharded across ranks.

- ``load_dataset(name_or_path, split="train"|"val"|"all", features=..., ...)``: a Dataset of
  (x, y) items with ``.info``; names "climate-sample" and "hep-sample" are the committed samples,
  "random-imagenet"/"random-deepcam"/... random data for memory and speed runs.
- ``ShardedLoader(dataset, batch_size, rank, world_size, seed, ...)``: rank r's batches, a
  deterministic per-epoch shuffle, background prefetch, exact mid-epoch resume.
- ``read_manifest``/``verify_checksums``: the manifest written next to every generated data set.
- errors: ``DataError`` and its named kinds, each naming the file and the problem.
"""

from .datasets import load_dataset, split_indices
from .errors import (
                     ChecksumError,
                     DataError,
                     LabelRangeError,
                     MalformedFileError,
                     MissingFileError,
                     NonFiniteError,
                     ShapeError,
                     TruncatedFileError,
                     ValueRangeError,
)
from .manifest import Manifest, read_manifest, verify_checksums
from .samples import SAMPLE_NAMES
from .sharded import ShardedLoader
from .synthetic import RANDOM_DATASETS

__all__ = [
    "load_dataset", "split_indices", "ShardedLoader", "Manifest", "read_manifest", "verify_checksums",
    "SAMPLE_NAMES", "RANDOM_DATASETS", "DataError", "MissingFileError", "TruncatedFileError", "MalformedFileError",
    "ShapeError", "LabelRangeError", "ValueRangeError", "NonFiniteError", "ChecksumError",
]
