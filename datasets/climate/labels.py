"""Per-pixel labels from a TECA-like heuristic, the way DeepCAM's labels were made from CAM5 output.

Classes: 0 background, 1 cyclone, 2 atmospheric-river-like band ("AR").

Cyclones (after TECA's tropical/extratropical cyclone detectors): a candidate is a local maximum of
low-level cyclonic relative vorticity above ``vorticity_min`` (no stronger maximum within
``search_radius_km``). TECA then demands a closed contour of sea-level pressure around the centre;
here the low-level geopotential height plays the role of pressure: from the height minimum near
the candidate, the region with height below ``minimum + closed_contour_m`` (connected to the
minimum) must stay inside a disk of ``max_radius_km``. If it does, that region is the cyclone's
footprint; if it leaks out of the disk the vortex is not closed and is rejected.

ARs (after TECA's IVT-threshold detectors): the meridional moisture transport ``|q v|`` above
``transport_min`` forms connected regions (8-connected, periodic in longitude); a region is an AR
if its length along its principal axis is at least ``min_length_km`` and its length/width ratio
(width = area / length) is at least ``min_aspect``. Cyclone pixels take precedence over AR pixels.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

BACKGROUND, CYCLONE, AR = 0, 1, 2
CLASS_NAMES = ("background", "cyclone", "atmospheric_river")


@dataclass(frozen=True)
class LabelParams:
    """Thresholds of the heuristic (SI units, distances in km)."""

    vorticity_min: float = 1.2e-5  # 1/s, low-level cyclonic relative vorticity
    search_radius_km: float = 400.0  # a candidate is the strongest maximum within this radius
    closed_contour_m: float = 8.0  # height rise that must enclose the centre (TECA: 2 hPa of SLP)
    max_radius_km: float = 1000.0  # the closed contour must lie within this radius
    transport_min: float = 0.12  # (kg/kg)(m/s), |q v| threshold (TECA: IVT 250 kg/m/s); ~90th percentile
    min_length_km: float = 1500.0
    min_aspect: float = 2.0

    def to_dict(self) -> dict:
        return asdict(self)


def connected_components(mask: np.ndarray, periodic_x: bool) -> list[np.ndarray]:
    """8-connected components of a 2-D boolean mask, each as an (n, 2) array of (row, col) indices."""
    ny, nx = mask.shape
    seen = np.zeros_like(mask, dtype=bool)
    components = []
    for start in zip(*np.nonzero(mask)):
        if seen[start]:
            continue
        seen[start] = True
        queue, members = deque([start]), []
        while queue:
            row, col = queue.popleft()
            members.append((row, col))
            for dr in (-1, 0, 1):
                r = row + dr
                if r < 0 or r >= ny:
                    continue
                for dc in (-1, 0, 1):
                    c = col + dc
                    if periodic_x:
                        c %= nx
                    elif c < 0 or c >= nx:
                        continue
                    if mask[r, c] and not seen[r, c]:
                        seen[r, c] = True
                        queue.append((r, c))
        components.append(np.array(members))
    return components


def _local_maxima(field: np.ndarray, radius: int, minimum: float) -> list[tuple[int, int]]:
    """Pixels above ``minimum`` that are the largest value within ``radius`` pixels (periodic in x)."""
    ny, _ = field.shape
    padded = np.pad(field, ((radius, radius), (0, 0)), constant_values=-np.inf)
    padded = np.concatenate([padded[:, -radius:], padded, padded[:, :radius]], axis=1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (2 * radius + 1, 2 * radius + 1))
    is_max = (field >= windows.max(axis=(2, 3))) & (field > minimum)
    return [(int(r), int(c)) for r, c in zip(*np.nonzero(is_max))]


def _cyclone_footprint(height: np.ndarray, centre: tuple[int, int], radius_px: int, rise: float,
                       search_px: int) -> np.ndarray | None:
    """Pixels of the closed height depression around ``centre``, or None if it is not closed."""
    ny, nx = height.shape
    rows = np.arange(centre[0] - radius_px, centre[0] + radius_px + 1)
    cols = np.arange(centre[1] - radius_px, centre[1] + radius_px + 1) % nx
    valid_rows = (rows >= 0) & (rows < ny)
    patch = np.full((rows.size, cols.size), np.inf)
    patch[valid_rows] = height[rows[valid_rows]][:, cols]
    dr, dc = np.meshgrid(np.arange(-radius_px, radius_px + 1), np.arange(-radius_px, radius_px + 1), indexing="ij")
    distance = np.hypot(dr, dc)
    near = distance <= search_px
    minimum_at = np.unravel_index(np.argmin(np.where(near, patch, np.inf)), patch.shape)
    inside = (patch < patch[minimum_at] + rise) & (distance < radius_px)
    for component in connected_components(inside, periodic_x=False):
        if not any((component == np.array(minimum_at)).all(axis=1)):
            continue
        if distance[component[:, 0], component[:, 1]].max() >= radius_px - 1:
            return None  # the contour leaks out of the disk: not a closed vortex
        return np.stack([rows[component[:, 0]], cols[component[:, 1]]], axis=1)
    return None


def _unwrap_columns(cols: np.ndarray, nx: int) -> np.ndarray:
    """Column indices shifted so that a region crossing the periodic seam is contiguous."""
    angle = 2 * np.pi * cols / nx
    centre = np.angle(np.exp(1j * angle).mean()) * nx / (2 * np.pi)
    return (cols - centre + nx / 2) % nx


def _length_and_width_px(component: np.ndarray, nx: int) -> tuple[float, float]:
    coords = np.stack([component[:, 0].astype(float), _unwrap_columns(component[:, 1], nx)], axis=1)
    coords -= coords.mean(axis=0)
    if len(coords) < 2:
        return 1.0, 1.0
    _, vectors = np.linalg.eigh(coords.T @ coords)
    along = coords @ vectors[:, -1]
    length = float(along.max() - along.min()) + 1.0
    return length, len(component) / length


def label_snapshot(vorticity: np.ndarray, height: np.ndarray, moisture: np.ndarray, u: np.ndarray, v: np.ndarray,
                   dx_km: float, params: LabelParams) -> np.ndarray:
    """(ny, nx) uint8 labels of one snapshot; all fields (ny, nx) with x periodic, grid spacing ``dx_km``."""
    ny, nx = vorticity.shape
    labels = np.zeros((ny, nx), dtype=np.uint8)
    transport = np.abs(moisture * v)  # meridional: the mean zonal wind would flag the whole moist side
    for component in connected_components(transport > params.transport_min, periodic_x=True):
        length, width = _length_and_width_px(component, nx)
        if length * dx_km >= params.min_length_km and length / width >= params.min_aspect:
            labels[component[:, 0], component[:, 1]] = AR
    search_px = max(1, round(params.search_radius_km / dx_km))
    radius_px = max(2, round(params.max_radius_km / dx_km))
    for centre in _local_maxima(vorticity, search_px, params.vorticity_min):
        footprint = _cyclone_footprint(height, centre, radius_px, params.closed_contour_m, search_px)
        if footprint is not None:
            labels[footprint[:, 0], footprint[:, 1]] = CYCLONE
    return labels
