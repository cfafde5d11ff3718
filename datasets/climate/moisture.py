"""The moisture-like tracer of the climate generator: carried by the upper-layer flow, evaporated
towards a target relative humidity and condensed ("rained out") above saturation.

Saturation follows Clausius–Clapeyron (about 7 % more per kelvin), so air moved poleward cools,
saturates and loses moisture, while air drawn from the warm side stays moist: the moist, narrow
filaments that form along the fronts of growing eddies are this model's atmospheric rivers.

Condensation makes sharp moisture edges that a spectral scheme would ring on (negative humidity,
then blow-up), so the tracer is a grid-point field advanced by semi-Lagrangian advection with
bilinear interpolation: unconditionally stable, and monotone, so humidity stays within the range
it had. The domain is periodic in x; in y the field is held at its edge values (the temperature
background, hence the humidity, is not periodic in y).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class MoistureParams:
    """Thermodynamic settings of the tracer (SI units; temperature in K, humidity in kg/kg)."""

    reference_temperature_k: float = 283.0  # temperature at the domain centre
    temperature_gradient_k_per_1000km: float = 6.0  # background equator-to-pole gradient
    saturation_at_reference: float = 0.009  # saturation humidity at the reference temperature
    clausius_clapeyron_per_k: float = 0.07  # relative increase of saturation per kelvin
    target_relative_humidity: float = 0.75  # evaporation relaxes towards this
    evaporation_time_s: float = 2.0 * 86400.0
    condensation_time_s: float = 6.0 * 3600.0

    def to_dict(self) -> dict:
        return asdict(self)

    def saturation(self, temperature_k: torch.Tensor) -> torch.Tensor:
        return self.saturation_at_reference * torch.exp(
            self.clausius_clapeyron_per_k * (temperature_k - self.reference_temperature_k))

    def target(self, temperature_k: torch.Tensor) -> torch.Tensor:
        return self.target_relative_humidity * self.saturation(temperature_k)


def semi_lagrangian(field: torch.Tensor, u: torch.Tensor, v: torch.Tensor, dt: float, dx: float,
                    dy: float) -> torch.Tensor:
    """``field`` (ny, nx) carried for ``dt`` by the winds ``u``, ``v`` (m/s): value at each departure point."""
    ny, nx = field.shape
    rows = torch.arange(ny, dtype=field.dtype)[:, None] - v * dt / dy
    cols = torch.arange(nx, dtype=field.dtype)[None, :] - u * dt / dx
    rows = rows.clamp(0, ny - 1)
    r0 = rows.floor().clamp(max=ny - 2).long()
    c0 = cols.floor().long()
    wr = rows - r0
    wc = cols - c0
    r1 = r0 + 1
    c0, c1 = c0 % nx, (c0 + 1) % nx
    return ((1 - wr) * ((1 - wc) * field[r0, c0] + wc * field[r0, c1])
            + wr * ((1 - wc) * field[r1, c0] + wc * field[r1, c1]))


def advance_moisture(params: MoistureParams, moisture: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                     temperature_k: torch.Tensor, dt: float, dx: float, dy: float) -> torch.Tensor:
    """One step: advect, then evaporate towards the target humidity and condense above saturation."""
    carried = semi_lagrangian(moisture, u, v, dt, dx, dy)
    saturation = params.saturation(temperature_k)
    evaporation = torch.clamp(params.target_relative_humidity * saturation - carried, min=0) / params.evaporation_time_s
    condensation = torch.clamp(carried - saturation, min=0) / params.condensation_time_s
    return carried + dt * (evaporation - condensation)
