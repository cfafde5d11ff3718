"""Lazy per-sample readers of the data set formats: climate netCDF4, HEP HDF5, DeepCAM HDF5.

A reader validates every file's metadata when it is made (variables present, shapes and dtypes as
the manifest declares: cheap, no data read) and then reads one sample per ``read(index)`` call,
never a whole file, and checks it (labels in range, input values finite).

Every HDF5/netCDF call — the metadata checks, opening, reading, closing — runs in the process's
one I/O owner thread (NOTE [ HDF5 I/O owner ] in ``io_thread``): the libraries are not
thread-safe, and a prefetch thread may read the training set while the main thread reads the
validation set. A reader holds only keys of its open handles; they are opened on first use,
closed by :meth:`FileReader.close` or, when the reader is garbage-collected, by its finalizer
(which only posts the close to the owner). A forked child opens its own handles. Any failure of
the library while reading a file becomes a named :class:`DataError` of that file.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

import numpy as np

from . import io_thread
from .errors import DataError, LabelRangeError, MalformedFileError, NonFiniteError, ShapeError, TruncatedFileError

#: numpy dtype kinds a variable may have, by what it holds.
FLOAT, INTEGER = "f", "iu"
_KIND_NAMES = {FLOAT: "a floating-point dtype", INTEGER: "an integer dtype"}


def library_error(path: Path, err: Exception, kind: str, row: int | None = None) -> DataError:
    """A library's failure on ``path`` as a named error: truncation if the library says so, else malformed."""
    text = str(err) if isinstance(err, (OSError, RuntimeError)) else f"{type(err).__name__}: {err}"
    what = "" if row is None else f"sample {row} "
    if "truncated" in text.lower():
        return TruncatedFileError(path, f"{what}cannot be read: the file is truncated ({text})")
    return MalformedFileError(path, f"{what}cannot be read as {kind} ({text})")


def check_dtype(path: Path, what: str, dtype, kind: str) -> None:
    """Raise ``ShapeError`` unless ``dtype`` is of ``kind`` (FLOAT or INTEGER)."""
    if np.dtype(dtype).kind not in kind:
        raise ShapeError(path, f"{what} has dtype {np.dtype(dtype)}, expected {_KIND_NAMES[kind]}")


def check_units(path: Path, name: str, dataset, expected: str | None) -> None:
    """Raise unless HDF5 ``dataset`` declares ``units`` equal to ``expected`` (nothing to check when None).

    A wrong unit (MeV where the features take logs of GeV) would shift every input silently, so it is a
    ``ShapeError``; a dataset without the attribute is a ``MalformedFileError``, because its units are
    unknown. Every file hpcdl writes carries them (the committed ``hep-sample`` too, since they were
    added to it in place), so there is no legacy case to read on trust.
    """
    if expected is None:
        return
    if "units" not in dataset.attrs:
        raise MalformedFileError(path, f"dataset {name!r} has no 'units' attribute, expected {expected!r}; if its "
                                       f"values are in those units, set it (h5py: h5[{name!r}].attrs['units'] = "
                                       f"{expected!r}), else convert or re-import the data")
    found = dataset.attrs["units"]
    found = found.decode() if isinstance(found, bytes) else str(found)
    if found != expected:
        raise ShapeError(path, f"dataset {name!r} has units {found!r}, expected {expected!r}; convert the values "
                               "(or re-import the data) to those units")


def check_finite(path: Path, row: int, name: str, values: np.ndarray) -> None:
    """Raise ``NonFiniteError`` if floating-point ``values`` (sample ``row``'s ``name``) hold NaN or Inf."""
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return
    finite = np.isfinite(values)
    if not finite.all():
        raise NonFiniteError(path, f"sample {row} has {finite.size - int(finite.sum())} non-finite value(s) "
                                   f"(NaN or Inf) in {name!r}; repair or drop that sample")


class FileReader:
    """Common part: file list, global index -> (file, row), the handles in the I/O owner, checks."""

    kind = "file"

    def __init__(self, paths: list[Path], counts: list[int], num_classes: int) -> None:
        self.paths = [Path(p) for p in paths]
        self.counts = [int(c) for c in counts]
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.num_classes = num_classes
        self._keys: dict[int, int] = {}  # file index -> handle key in the owner's table; owner thread only
        io_thread.finalizer(self, self._keys)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        file_index = bisect_right(self.starts, index) - 1
        return file_index, index - int(self.starts[file_index])

    def where(self, index: int) -> tuple[Path, int]:
        """The file and the row in it of global sample ``index``, for error messages."""
        file_index, row = self.locate(index)
        return self.paths[file_index], row

    def open(self, path: Path):
        """Open ``path`` (runs in the owner thread); a library failure raises a named error."""
        raise NotImplementedError

    def check_file(self, path: Path, handle, count: int) -> None:
        """Validate one open file's metadata against the declared layout (runs in the owner thread)."""
        raise NotImplementedError

    def validate(self) -> None:
        """Check every file's metadata; each file is opened and closed again in the owner."""
        io_thread.call(self._validate_in_owner)

    def _validate_in_owner(self) -> None:
        for path, count in zip(self.paths, self.counts):
            key = io_thread.open_handle(self.open, path)
            try:
                self._mapped(path, None, self.check_file, path, io_thread.get_handle(key), count)
            finally:
                io_thread.close_handles([key])

    def on_file(self, file_index: int, fn, *args, row: int | None = None):
        """``fn(handle, *args)`` in the owner with this reader's handle of file ``file_index`` (opened on
        first use); a library failure becomes a named error of that file (and sample ``row``)."""
        return io_thread.call(self._on_file_in_owner, file_index, fn, args, row)

    def _on_file_in_owner(self, file_index: int, fn, args: tuple, row: int | None):
        path = self.paths[file_index]
        handle = io_thread.get_handle(self._keys.get(file_index))
        if handle is None:  # first use, or a key inherited through fork: open our own
            self._keys[file_index] = io_thread.open_handle(self.open, path)
            handle = io_thread.get_handle(self._keys[file_index])
        return self._mapped(path, row, fn, handle, *args)

    def _mapped(self, path: Path, row: int | None, fn, *args):
        try:
            return fn(*args)
        except DataError:
            raise
        except Exception as err:  # the library failed on this file: corrupt metadata or data
            error = library_error(path, err, self.kind, row)
        raise error  # outside the except block, so the library's exception is not chained to it

    def read_many(self, indices) -> list:
        """Samples ``indices``, read in one hand-over to the owner thread, then checked here."""
        located = [self.locate(int(index)) for index in indices]
        raws = io_thread.call(self._read_in_owner, located)
        return [self.finish(self.paths[file_index], row, raw) for (file_index, row), raw in zip(located, raws)]

    def _read_in_owner(self, located: list[tuple[int, int]]) -> list:
        return [self._on_file_in_owner(file_index, self.read_row, (self.paths[file_index], row), row)
                for file_index, row in located]

    def read(self, index: int):
        """Sample ``index`` (one hand-over to the owner thread); see :meth:`read_many`."""
        return self.read_many([index])[0]

    def read_row(self, handle, path: Path, row: int):
        """Row ``row`` of an open file, as the library returns it (runs in the owner thread)."""
        raise NotImplementedError

    def finish(self, path: Path, row: int, raw):
        """Check a row read from ``path`` (labels in range, inputs finite) and convert it to the sample."""
        raise NotImplementedError

    def check_labels(self, labels, path: Path, row: int) -> None:
        labels = np.asarray(labels)
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= self.num_classes:
            bad = low if low < 0 else high
            raise LabelRangeError(path, f"sample {row} has label {bad} outside [0, {self.num_classes})")

    def close(self) -> None:
        """Close this reader's open files (reading again reopens them)."""
        if self._keys:
            io_thread.call(io_thread.close_keys, self._keys)


class ClimateNetCDFReader(FileReader):
    """Climate snapshots: variables ``channels`` and ``labels``, each (time, lat, lon), in netCDF4 files.

    Channels are floating point, or integers packed the CF way (with a ``scale_factor``, unpacked on
    read); labels are integers.
    """

    kind = "netCDF4"

    def __init__(self, paths, counts, num_classes, channels: list[str], height: int, width: int,
                 label_variable: str = "labels") -> None:
        super().__init__(paths, counts, num_classes)
        self.channels = list(channels)
        self.label_variable = label_variable
        self.shape = (height, width)
        self.validate()

    def check_file(self, path: Path, nc, count: int) -> None:
        height, width = self.shape
        for name in [*self.channels, self.label_variable]:
            if name not in nc.variables:
                raise MalformedFileError(path, f"has no variable {name!r} (has {sorted(nc.variables)})")
            var = nc.variables[name]
            if var.dimensions != ("time", "lat", "lon"):
                raise ShapeError(path, f"variable {name!r} has dimensions {var.dimensions}, "
                                       "expected ('time', 'lat', 'lon')")
            if var.shape != (count, height, width):
                raise ShapeError(path, f"variable {name!r} has shape {var.shape}, "
                                       f"expected {(count, height, width)}")
            if name == self.label_variable:
                check_dtype(path, f"variable {name!r}", var.dtype, INTEGER)
            elif np.dtype(var.dtype).kind in INTEGER and "scale_factor" not in var.ncattrs():
                raise ShapeError(path, f"variable {name!r} has dtype {var.dtype} without a scale_factor, expected "
                                       "a floating-point dtype or integers packed with scale_factor/add_offset")
            else:
                check_dtype(path, f"variable {name!r}", var.dtype, FLOAT + INTEGER)

    def open(self, path: Path):
        import netCDF4

        try:
            nc = netCDF4.Dataset(path, "r")
        except Exception as err:
            error = library_error(path, err, self.kind)
        else:
            nc.set_auto_mask(False)  # packed int16 data has no missing values; unpacking stays on
            return nc
        raise error

    def read_row(self, nc, path: Path, row: int) -> tuple[np.ndarray, np.ndarray]:
        x = np.stack([np.asarray(nc.variables[name][row], dtype=np.float32) for name in self.channels])
        return x, np.asarray(nc.variables[self.label_variable][row], dtype=np.int64)

    def finish(self, path: Path, row: int, raw) -> tuple[np.ndarray, np.ndarray]:
        x, y = raw
        self.check_labels(y, path, row)
        if not np.isfinite(x).all():
            for name, channel in zip(self.channels, x):
                check_finite(path, row, name, channel)
        return x, y


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

    def close(self) -> None:
        self._datasets = {}
        self.file.close()


def open_hdf5(path: Path) -> OpenHDF5File:
    """Open ``path`` read-only with the chunk cache above (owner thread); failures are named errors."""
    import h5py

    try:
        file = h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES, rdcc_nslots=CHUNK_CACHE_SLOTS)
    except Exception as err:
        error = library_error(path, err, "HDF5")
    else:
        return OpenHDF5File(file)
    raise error


class HDF5Reader(FileReader):
    """Rows of named HDF5 datasets with a common first axis; per sample, only ``fields`` are read.

    ``expected`` maps every dataset the files must have to its row shape and dtype kind (FLOAT or
    INTEGER; all validated on open); ``fields`` (default: all of them) are the ones ``read_fields``
    returns, plus ``y_field``. Floating-point fields are checked for NaN/Inf on every read.
    ``units`` maps a dataset to the ``units`` attribute it must have (:func:`check_units`).
    """

    kind = "HDF5"

    def __init__(self, paths, counts, num_classes, expected: dict[str, tuple[tuple, str]], y_field: str,
                 fields: list[str] | None = None, units: dict[str, str] | None = None) -> None:
        super().__init__(paths, counts, num_classes)
        self.y_field = y_field
        self.expected = dict(expected)
        self.units = dict(units or {})
        wanted = list(expected) if fields is None else list(fields)
        unknown = sorted(set(wanted) - set(expected))
        if unknown:
            raise ValueError(f"fields {unknown} are not among the expected datasets {sorted(expected)}")
        self.fields = wanted if y_field in wanted else [*wanted, y_field]
        self.validate()

    def check_file(self, path: Path, h5, count: int) -> None:
        for name, (row_shape, kind) in self.expected.items():
            if name not in h5:
                raise MalformedFileError(path, f"has no dataset {name!r} (has {sorted(h5)})")
            if h5[name].shape != (count, *row_shape):
                raise ShapeError(path, f"dataset {name!r} has shape {h5[name].shape}, "
                                       f"expected {(count, *row_shape)}")
            check_dtype(path, f"dataset {name!r}", h5[name].dtype, kind)
            check_units(path, name, h5[name], self.units.get(name))

    open = staticmethod(open_hdf5)

    def read_row(self, h5, path: Path, row: int) -> dict[str, np.ndarray]:
        return {name: h5[name][row] for name in self.fields}

    def finish(self, path: Path, row: int, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.check_labels(raw[self.y_field], path, row)
        for name, value in raw.items():
            check_finite(path, row, name, value)
        return raw


class DeepCAMReader(FileReader):
    """DeepCAM's layouts: one ``*.h5`` per sample with ``climate/data`` (H, W, C) and
    ``climate/labels_0`` (H, W) (the MLPerf HPC reference; ``climate/labels`` is accepted too), or
    one file with ``data`` (N, H, W, C) and ``labels`` (N, H, W).

    ``channel_indices`` selects channels of the last axis, in the given order, as the reference's
    ``channels`` option does (default: all). Labels may be stored as floats, as the reference casts
    them to int64; a float label that is not a whole number is refused.
    """

    kind = "HDF5"
    LABEL_KEYS = (("climate/data", "climate/labels_0"), ("climate/data", "climate/labels"), ("data", "labels"))

    def __init__(self, paths, counts, num_classes, height: int, width: int, channels: int,
                 channel_indices: list[int] | None = None) -> None:
        super().__init__(paths, counts, num_classes)
        self.layout = (height, width, channels)
        self.channel_indices = None if channel_indices is None else [int(c) for c in channel_indices]
        self.validate()

    def check_file(self, path: Path, h5, count: int) -> None:
        height, width, channels = self.layout
        data_key, label_key = self._keys_of(path, h5)
        prefix = () if data_key.startswith("climate/") else (count,)
        if h5[data_key].shape != (*prefix, height, width, channels):
            raise ShapeError(path, f"dataset {data_key!r} has shape {h5[data_key].shape}, "
                                   f"expected {(*prefix, height, width, channels)}")
        if h5[label_key].shape != (*prefix, height, width):
            raise ShapeError(path, f"dataset {label_key!r} has shape {h5[label_key].shape}, "
                                   f"expected {(*prefix, height, width)}")
        check_dtype(path, f"dataset {data_key!r}", h5[data_key].dtype, FLOAT)
        check_dtype(path, f"dataset {label_key!r}", h5[label_key].dtype, INTEGER + FLOAT)

    @classmethod
    def _keys_of(cls, path: Path, h5) -> tuple[str, str]:
        for keys in cls.LABEL_KEYS:
            if all(key in h5 for key in keys):
                return keys
        raise MalformedFileError(path, "has none of " + ", ".join(" + ".join(keys) for keys in cls.LABEL_KEYS))

    open = staticmethod(open_hdf5)

    def read_row(self, h5, path: Path, row: int) -> tuple[np.ndarray, np.ndarray]:
        data_key, label_key = self._keys_of(path, h5)
        if data_key.startswith("climate/"):
            return h5[data_key][...], h5[label_key][...]
        return h5[data_key][row], h5[label_key][row]

    def finish(self, path: Path, row: int, raw) -> tuple[np.ndarray, np.ndarray]:
        x, y = raw
        if self.channel_indices is not None:
            x = x[..., self.channel_indices]
        y = np.asarray(y)
        if y.dtype.kind == "f":
            check_finite(path, row, "labels", y)
            if not np.array_equal(y, np.round(y)):
                raise LabelRangeError(path, f"sample {row} has labels that are not whole numbers")
        self.check_labels(y, path, row)
        check_finite(path, row, "data", x)
        return np.ascontiguousarray(np.moveaxis(x, -1, 0), dtype=np.float32), y.astype(np.int64)
