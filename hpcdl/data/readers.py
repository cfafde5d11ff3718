"""Lazy per-sample readers of the data set formats: climate netCDF4, HEP HDF5, DeepCAM HDF5.

A reader validates every file's metadata when it is made (variables present, shapes and dtypes as
the manifest declares: cheap, no data read) and then reads one sample per ``read(index)`` call,
never a whole file. File handles are opened on first use and cached per process: a handle
inherited through ``fork`` (a DataLoader worker, an MPI launcher) is never reused, because
HDF5/netCDF handles are not fork-safe; the child opens its own. Within a process, all library
calls go through one lock: the HDF5 library under h5py and netCDF4 is not built thread-safe, and a
prefetch thread may read the training set while the main thread reads the validation set (HDF5
serialises its calls anyway, so the lock costs no parallelism).
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from pathlib import Path

import numpy as np

from .errors import DataError, LabelRangeError, MalformedFileError, ShapeError, TruncatedFileError

_LIBRARY_LOCK = threading.RLock()


def _open_error(path: Path, err: Exception, kind: str) -> DataError:
    """Map a library's open failure to a named error: truncation if the library says so, else malformed."""
    text = str(err)
    if "truncated" in text.lower():
        return TruncatedFileError(path, f"is truncated ({text})")
    return MalformedFileError(path, f"cannot be read as {kind} ({text})")


class FileReader:
    """Common part: file list, global index -> (file, row), per-process handle cache, label checks."""

    kind = "file"

    def __init__(self, paths: list[Path], counts: list[int], num_classes: int) -> None:
        self.paths = [Path(p) for p in paths]
        self.counts = [int(c) for c in counts]
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.num_classes = num_classes
        self._handles: dict[int, object] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        file_index = bisect_right(self.starts, index) - 1
        return file_index, index - int(self.starts[file_index])

    def handle(self, file_index: int):
        if os.getpid() != self._pid:  # forked: drop the parent's handles without closing them
            self._handles = {}
            self._pid = os.getpid()
        if file_index not in self._handles:
            self._handles[file_index] = self.open(self.paths[file_index])
        return self._handles[file_index]

    def open(self, path: Path):
        raise NotImplementedError

    def check_labels(self, labels: np.ndarray, file_index: int, row: int) -> None:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= self.num_classes:
            bad = low if low < 0 else high
            raise LabelRangeError(self.paths[file_index], f"sample {row} has label {bad} outside "
                                                          f"[0, {self.num_classes})")

    def read_checked(self, index: int, read_row) -> tuple[np.ndarray, np.ndarray]:
        """Call ``read_row(handle, row)``; turn a library failure mid-file into a named error."""
        file_index, row = self.locate(index)
        try:
            with _LIBRARY_LOCK:
                x, y = read_row(self.handle(file_index), row)
        except (OSError, RuntimeError) as err:
            raise _open_error(self.paths[file_index], err, self.kind) from None
        self.check_labels(np.asarray(y), file_index, row)
        return x, y

    def close(self) -> None:
        if os.getpid() == self._pid:
            for handle in self._handles.values():
                handle.close()
        self._handles = {}


class ClimateNetCDFReader(FileReader):
    """Climate snapshots: variables ``channels`` and ``labels``, each (time, lat, lon), in netCDF4 files."""

    kind = "netCDF4"

    def __init__(self, paths, counts, num_classes, channels: list[str], height: int, width: int,
                 label_variable: str = "labels") -> None:
        super().__init__(paths, counts, num_classes)
        self.channels = list(channels)
        self.label_variable = label_variable
        self.shape = (height, width)
        for path, count in zip(self.paths, self.counts):
            with self.open(path) as nc:
                for name in [*self.channels, label_variable]:
                    if name not in nc.variables:
                        raise MalformedFileError(path, f"has no variable {name!r} (has {sorted(nc.variables)})")
                    var = nc.variables[name]
                    if var.dimensions != ("time", "lat", "lon"):
                        raise ShapeError(path, f"variable {name!r} has dimensions {var.dimensions}, "
                                               "expected ('time', 'lat', 'lon')")
                    if var.shape != (count, height, width):
                        raise ShapeError(path, f"variable {name!r} has shape {var.shape}, "
                                               f"expected {(count, height, width)}")

    def open(self, path: Path):
        import netCDF4

        try:
            nc = netCDF4.Dataset(path, "r")
        except OSError as err:
            raise _open_error(path, err, self.kind) from None
        nc.set_auto_mask(False)  # packed int16 data has no missing values; unpacking stays on
        return nc

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        def row_of(nc, row):
            x = np.stack([np.asarray(nc.variables[name][row], dtype=np.float32) for name in self.channels])
            return x, np.asarray(nc.variables[self.label_variable][row], dtype=np.int64)

        return self.read_checked(index, row_of)


#: Per-dataset cache of decompressed HDF5 chunks (h5py's rdcc). HDF5's default, 1 MiB, cannot hold
#: even one chunk of 256 jet images (exactly 1 MiB), so every image read decompressed a whole chunk;
#: with room for a few dozen chunks, a shuffled epoch decompresses each chunk about once.
CHUNK_CACHE_BYTES = 64 * 2**20
CHUNK_CACHE_SLOTS = 10007  # a prime well above the number of chunks that fit, as HDF5 advises


class OpenHDF5File:
    """An open ``h5py.File`` that keeps the dataset objects it hands out open.

    HDF5's chunk cache belongs to an open dataset object: ``file[name]`` per read would open a new
    one with an empty cache and decompress a whole chunk for every row.
    """

    def __init__(self, file) -> None:
        self.file = file
        self._datasets: dict[str, object] = {}

    def __getitem__(self, name: str):
        if name not in self._datasets:
            self._datasets[name] = self.file[name]
        return self._datasets[name]

    def __contains__(self, name: str) -> bool:
        return name in self.file

    def __iter__(self):
        return iter(self.file)

    def __enter__(self) -> OpenHDF5File:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._datasets = {}
        self.file.close()


class HDF5Reader(FileReader):
    """Rows of named HDF5 datasets with a common first axis; per sample, only ``fields`` are read.

    ``expected`` maps every dataset the files must have to its row shape (all validated on open);
    ``fields`` (default: all of them) are the ones ``read_fields`` returns, plus ``y_field``.
    """

    kind = "HDF5"

    def __init__(self, paths, counts, num_classes, expected: dict[str, tuple], y_field: str,
                 fields: list[str] | None = None) -> None:
        super().__init__(paths, counts, num_classes)
        self.y_field = y_field
        wanted = list(expected) if fields is None else list(fields)
        unknown = sorted(set(wanted) - set(expected))
        if unknown:
            raise ValueError(f"fields {unknown} are not among the expected datasets {sorted(expected)}")
        self.fields = wanted if y_field in wanted else [*wanted, y_field]
        for path, count in zip(self.paths, self.counts):
            with self.open(path) as h5:
                for name, row_shape in expected.items():
                    if name not in h5:
                        raise MalformedFileError(path, f"has no dataset {name!r} (has {sorted(h5)})")
                    if h5[name].shape != (count, *row_shape):
                        raise ShapeError(path, f"dataset {name!r} has shape {h5[name].shape}, "
                                               f"expected {(count, *row_shape)}")

    def open(self, path: Path):
        import h5py

        try:
            file = h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES, rdcc_nslots=CHUNK_CACHE_SLOTS)
        except OSError as err:
            raise _open_error(path, err, self.kind) from None
        return OpenHDF5File(file)

    def read_fields(self, index: int) -> dict[str, np.ndarray]:
        def row_of(h5, row):
            values = {name: h5[name][row] for name in self.fields}
            return values, values[self.y_field]

        return self.read_checked(index, row_of)[0]


class DeepCAMReader(FileReader):
    """DeepCAM's staged layout: one ``data-*.h5`` per sample with ``climate/data`` (H, W, C) and
    ``climate/labels`` (H, W), or one file with ``data`` (N, H, W, C) and ``labels`` (N, H, W)."""

    kind = "HDF5"

    def __init__(self, paths, counts, num_classes, height: int, width: int, channels: int) -> None:
        super().__init__(paths, counts, num_classes)
        for path, count in zip(self.paths, self.counts):
            with self.open(path) as h5:
                data_key, label_key = self._keys(path, h5)
                prefix = () if data_key.startswith("climate/") else (count,)
                if h5[data_key].shape != (*prefix, height, width, channels):
                    raise ShapeError(path, f"dataset {data_key!r} has shape {h5[data_key].shape}, "
                                           f"expected {(*prefix, height, width, channels)}")
                if h5[label_key].shape != (*prefix, height, width):
                    raise ShapeError(path, f"dataset {label_key!r} has shape {h5[label_key].shape}, "
                                           f"expected {(*prefix, height, width)}")

    @staticmethod
    def _keys(path: Path, h5) -> tuple[str, str]:
        for keys in (("climate/data", "climate/labels"), ("data", "labels")):
            if all(key in h5 for key in keys):
                return keys
        raise MalformedFileError(path, "has neither climate/data + climate/labels nor data + labels")

    open = HDF5Reader.open

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        def row_of(h5, row):
            data_key, label_key = self._keys(self.paths[self.locate(index)[0]], h5)
            if data_key.startswith("climate/"):
                return h5[data_key][...], h5[label_key][...]
            return h5[data_key][row], h5[label_key][row]

        x, y = self.read_checked(index, row_of)
        return np.ascontiguousarray(np.moveaxis(x, -1, 0), dtype=np.float32), np.asarray(y, dtype=np.int64)
