"""Writing climate snapshots as CF-1.8 netCDF4 files (dimensions time/lat/lon, zlib-compressed).

Fields are packed to int16 with per-file ``scale_factor``/``add_offset`` (the CF packing
convention, undone by every CF reader), quantised to 12 bits: the step is 1/4094 of the field's
range in that file (about 0.01 K of temperature, 0.01 m/s of wind), well below what the model
resolves. Finer steps cost size, not information anyone uses: zlib cannot squeeze the noise
of the low bits, and a 12-bit sample is half the size of a 16-bit one.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np

from hpcdl.data import io_thread

from .labels import CLASS_NAMES

#: Channel order of the data set, with CF metadata (``standard_name`` where the CF table has one).
CHANNELS: dict[str, dict[str, str]] = {
    "vorticity": {"units": "s-1", "standard_name": "atmosphere_relative_vorticity",
                  "long_name": "low-level relative vorticity (lower layer)"},
    "height": {"units": "m", "standard_name": "geopotential_height_anomaly",
               "long_name": "low-level geopotential height anomaly (lower layer; sea-level pressure analogue)"},
    "u": {"units": "m s-1", "standard_name": "eastward_wind", "long_name": "upper-layer eastward wind"},
    "v": {"units": "m s-1", "standard_name": "northward_wind", "long_name": "upper-layer northward wind"},
    "temperature": {"units": "K", "standard_name": "air_temperature",
                    "long_name": "mid-level temperature (from the layer thickness)"},
    "moisture": {"units": "kg kg-1", "standard_name": "specific_humidity",
                 "long_name": "moisture tracer advected by the upper-layer flow"},
}
LABEL_VARIABLE = "labels"
PACKED_MAX = 2047  # 12-bit packing range in int16; the default int16 fill value (-32767) stays out of it


def coordinates(ny: int, nx: int, ly_m: float, lx_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Nominal latitude/longitude of the beta-plane grid: the domain centred at 45N, mapped linearly."""
    metres_per_degree = 111_195.0
    lat = 45.0 + ((np.arange(ny) + 0.5) * ly_m / ny - ly_m / 2) / metres_per_degree
    lon = (np.arange(nx) + 0.5) * lx_m / nx / (metres_per_degree * np.cos(np.deg2rad(45.0)))
    return lat, lon


def write_netcdf(path: Path, fields: np.ndarray, labels: np.ndarray, times_days: np.ndarray, lat: np.ndarray,
                 lon: np.ndarray, attributes: dict[str, str]) -> None:
    """Write ``fields`` (T, C, H, W) float and ``labels`` (T, H, W) uint8 at ``times_days`` to ``path``.

    The writing runs in hpcdl's I/O owner thread (``hpcdl.data.io_thread``), like every netCDF/HDF5 call
    of hpcdl: the library is not thread-safe, and a loader of this process may be reading meanwhile.
    """
    t, c, h, w = fields.shape
    if c != len(CHANNELS) or labels.shape != (t, h, w) or lat.shape != (h,) or lon.shape != (w,):
        raise ValueError(f"inconsistent shapes: fields {fields.shape}, labels {labels.shape}, "
                         f"lat {lat.shape}, lon {lon.shape}, channels {list(CHANNELS)}")
    io_thread.call(_write_netcdf, path, fields, labels, times_days, lat, lon, attributes)


def _write_netcdf(path: Path, fields: np.ndarray, labels: np.ndarray, times_days: np.ndarray, lat: np.ndarray,
                  lon: np.ndarray, attributes: dict[str, str]) -> None:
    _, _, h, w = fields.shape
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.setncatts({"Conventions": "CF-1.8", **attributes})
        nc.createDimension("time", None)
        nc.createDimension("lat", h)
        nc.createDimension("lon", w)
        time = nc.createVariable("time", "f8", ("time",))
        time.setncatts({"units": "days since 2000-01-01 00:00:00", "calendar": "proleptic_gregorian",
                        "standard_name": "time", "long_name": "model time", "axis": "T"})
        time[:] = times_days
        for name, values, units, axis in (("lat", lat, "degrees_north", "Y"), ("lon", lon, "degrees_east", "X")):
            var = nc.createVariable(name, "f8", (name,))
            var.setncatts({"units": units, "standard_name": "latitude" if axis == "Y" else "longitude",
                           "long_name": f"nominal {'latitude' if axis == 'Y' else 'longitude'} of the beta-plane",
                           "axis": axis})
            var[:] = values
        for index, (name, meta) in enumerate(CHANNELS.items()):
            data = fields[:, index].astype(np.float64)
            low, high = float(data.min()), float(data.max())
            scale = (high - low) / (2 * PACKED_MAX) if high > low else 1.0
            offset = (high + low) / 2
            var = nc.createVariable(name, "i2", ("time", "lat", "lon"), zlib=True, complevel=4, shuffle=True,
                                    chunksizes=(1, h, w))
            var.setncatts({**meta, "scale_factor": np.float32(scale), "add_offset": np.float32(offset)})
            var.set_auto_maskandscale(False)
            var[:] = np.clip(np.round((data - np.float32(offset)) / np.float32(scale)), -PACKED_MAX, PACKED_MAX).astype(np.int16)
        var = nc.createVariable(LABEL_VARIABLE, "u1", ("time", "lat", "lon"), zlib=True, complevel=4, shuffle=True,
                                chunksizes=(1, h, w))
        var.setncatts({"long_name": "TECA-like per-pixel event class",
                       "flag_values": np.arange(len(CLASS_NAMES), dtype=np.uint8),
                       "flag_meanings": " ".join(CLASS_NAMES)})
        var[:] = labels
