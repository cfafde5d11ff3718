"""A two-layer quasi-geostrophic (QG) model on a doubly periodic beta-plane, pseudo-spectral, in PyTorch.

This is the classic Phillips model of baroclinic instability (the same equations as ``pyqg``'s
``QGModel``): an imposed vertical shear ``U1 - U2`` between the two layers is baroclinically
unstable, eddies grow, saturate and equilibrate against bottom (Ekman) drag and a small-scale
spectral filter. The equilibrated flow is geostrophic turbulence with jets, closed cyclonic and
anticyclonic vortices and sharp fronts — mid-latitude weather in miniature.

For each layer ``i`` (1 = upper, 2 = lower), with streamfunction ``psi_i`` and potential vorticity

    q1 = lap(psi1) + F1 (psi2 - psi1),   q2 = lap(psi2) + F2 (psi1 - psi2),
    F1 = 1 / (rd^2 (1 + delta)),          F2 = delta F1,   delta = H1 / H2,

the model integrates

    dq_i/dt + J(psi_i, q_i) + U_i dq_i/dx + Qy_i dpsi_i/dx = -[i == 2] r_ek lap(psi2) + filter,
    Qy1 = beta + F1 (U1 - U2),   Qy2 = beta - F2 (U1 - U2),

plus Newtonian cooling of the eddy thickness (time ``thermal_damping_s``), which with the drag
keeps eddy winds at atmospheric magnitudes (without it the doubly periodic model's eddies grow to
many times the imposed shear). A moisture-like tracer (see ``moisture.py``) rides on the
upper-layer flow. Time stepping is third-order Adams–Bashforth with the exponential spectral
filter of Arbic & Flierl (2003), as in pyqg. Everything is deterministic for a given seed on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .moisture import MoistureParams, advance_moisture

GRAVITY = 9.81  # m/s^2


@dataclass(frozen=True)
class QGParams:
    """Physical and numerical settings of the two-layer model (SI units)."""

    ny: int = 96  # grid points in y ("latitude")
    nx: int = 144  # grid points in x ("longitude")
    ly_m: float = 8.0e6  # domain size in y, m
    lx_m: float = 1.2e7  # domain size in x, m
    rd_m: float = 3.0e5  # first baroclinic deformation radius, m
    delta: float = 1.0  # H1 / H2
    u1: float = 9.0  # upper-layer imposed zonal wind, m/s
    u2: float = 0.0  # lower-layer imposed zonal wind, m/s
    beta: float = 2.4e-11  # meridional gradient of the Coriolis parameter, 1/(m s)
    f0: float = 1.0e-4  # Coriolis parameter at the domain centre, 1/s
    r_ek: float = 1.0 / (2 * 86400.0)  # bottom (Ekman) drag rate, 1/s
    thermal_damping_s: float = 3 * 86400.0  # Newtonian relaxation time of the eddy thickness (temperature)
    dt_s: float = 400.0  # time step, s (AB3 needs max|u| k_max dt < ~0.7)
    filter_factor: float = 23.6  # strength of the small-scale exponential filter

    def to_dict(self) -> dict:
        return asdict(self)


class TwoLayerQG:
    """State and time stepping of the two-layer QG model plus a moisture tracer.

    The prognostic state is ``qh`` (2, ny, nx//2+1) complex, the spectral PV anomaly of both
    layers, and ``moisture`` (ny, nx), the grid-point humidity.
    """

    def __init__(self, params: QGParams, moisture: MoistureParams, seed: int) -> None:
        if params.nx % 2 or params.ny % 2:
            raise ValueError(f"grid must have even sizes, got ny={params.ny}, nx={params.nx}")
        self.p = params
        self.m = moisture
        dtype = torch.float64
        self.dx = params.lx_m / params.nx
        self.dy = params.ly_m / params.ny
        k = 2 * math.pi * torch.fft.rfftfreq(params.nx, d=self.dx, dtype=dtype)
        l = 2 * math.pi * torch.fft.fftfreq(  # noqa: E741  (k, l: x and y wavenumbers, the QG notation)
            params.ny, d=self.dy, dtype=dtype)
        self.ik = (1j * k)[None, :]
        self.il = (1j * l)[:, None]
        self.wv2 = k[None, :] ** 2 + l[:, None] ** 2
        self.f1 = 1.0 / (params.rd_m**2 * (1.0 + params.delta))
        self.f2 = params.delta * self.f1
        shear = params.u1 - params.u2
        self.qy = torch.tensor([params.beta + self.f1 * shear, params.beta - self.f2 * shear], dtype=dtype)
        self.u_mean = torch.tensor([params.u1, params.u2], dtype=dtype)
        # Inverse of the PV-streamfunction operator, per wavenumber (the mean mode is set to 0).
        a11 = -self.wv2 - self.f1
        a22 = -self.wv2 - self.f2
        det = a11 * a22 - self.f1 * self.f2
        det[0, 0] = 1.0
        self.inv = torch.stack([torch.stack([a22, -self.f1 * torch.ones_like(a22)]),
                                torch.stack([-self.f2 * torch.ones_like(a22), a11])]) / det
        self.inv[:, :, 0, 0] = 0.0
        kstar = torch.sqrt((k[None, :] * self.dx) ** 2 + (l[:, None] * self.dy) ** 2)
        cutoff = 0.65 * math.pi
        self.filter = torch.where(kstar > cutoff, torch.exp(-params.filter_factor * (kstar - cutoff) ** 4),
                                  torch.ones_like(kstar))
        self.y = (torch.arange(params.ny, dtype=dtype) + 0.5) * self.dy  # cell centres, m
        gen = torch.Generator().manual_seed(seed)
        # Initial eddies: random PV at the scales of the deformation radius, weak enough to grow linearly.
        noise = torch.fft.rfft2(torch.randn(2, params.ny, params.nx, generator=gen, dtype=dtype))
        scale = torch.exp(-((self.wv2.sqrt() * params.rd_m - 1.0) ** 2))
        noise = noise * scale / torch.fft.irfft2(noise * scale, s=(params.ny, params.nx)).std()
        self.qh = noise * 6e-6 * self.filter
        self._history: list[torch.Tensor] = []
        self.moisture = moisture.target(moisture.reference_temperature_k + self.temperature_anomaly(
            self.streamfunction_h()))
        self.time_s = 0.0

    def _ifft(self, xh: torch.Tensor) -> torch.Tensor:
        return torch.fft.irfft2(xh, s=(self.p.ny, self.p.nx))

    def streamfunction_h(self) -> torch.Tensor:
        """Spectral streamfunction of both layers, (2, ny, nx//2+1)."""
        q1, q2 = self.qh[0], self.qh[1]
        return torch.stack([self.inv[0, 0] * q1 + self.inv[0, 1] * q2,
                            self.inv[1, 0] * q1 + self.inv[1, 1] * q2])

    def _tendency(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """PV tendency, spectral streamfunction, and the upper-layer eddy winds (for the moisture)."""
        ph = self.streamfunction_h()
        u = self._ifft(-self.il * ph)
        v = self._ifft(self.ik * ph)
        q = self._ifft(self.qh)
        # Flux form of the Jacobian: J(psi, q) = d(uq)/dx + d(vq)/dy (the flow is non-divergent).
        jac = self.ik * torch.fft.rfft2(u * q) + self.il * torch.fft.rfft2(v * q)
        dqh = -jac - self.ik * self.u_mean[:, None, None] * self.qh - self.ik * self.qy[:, None, None] * ph
        dqh[1] = dqh[1] + self.p.r_ek * self.wv2 * ph[1]
        # Newtonian cooling relaxes the eddy thickness (psi1 - psi2) to zero: damps eddy potential energy.
        thickness = ph[0] - ph[1]
        dqh[0] = dqh[0] + self.f1 * thickness / self.p.thermal_damping_s
        dqh[1] = dqh[1] - self.f2 * thickness / self.p.thermal_damping_s
        return dqh, ph, u[0], v[0]

    def temperature_anomaly(self, ph: torch.Tensor) -> torch.Tensor:
        """Mid-level temperature anomaly (K) from the thickness between the layers (thermal wind).

        The interface displacement is ``eta = f0 (psi2 - psi1) / g'``; with a mean lapse rate the
        temperature anomaly is proportional to ``psi1 - psi2``. The constant maps the imposed shear
        to a meridional gradient of ``temperature_gradient_k_per_1000km`` K per 1000 km.
        """
        shear = self.p.u1 - self.p.u2
        scale = self.m.temperature_gradient_k_per_1000km / 1.0e6 / shear
        thickness = self._ifft(ph[0] - ph[1])
        # Total thickness psi1 - psi2 = anomaly - shear * y: warm at small y (the "equator").
        return scale * (thickness - shear * (self.y[:, None] - self.p.ly_m / 2))

    def step(self) -> None:
        """Advance one time step (AB3 for the PV, starting with Euler and AB2; semi-Lagrangian moisture)."""
        dqh, ph, u, v = self._tendency()
        temperature = self.m.reference_temperature_k + self.temperature_anomaly(ph)
        self.moisture = advance_moisture(self.m, self.moisture, u + self.p.u1, v, temperature, self.p.dt_s,
                                         self.dx, self.dy)
        self._history.insert(0, dqh)
        del self._history[3:]
        coefs = {1: (1.0,), 2: (1.5, -0.5), 3: (23 / 12, -16 / 12, 5 / 12)}[len(self._history)]
        increment = sum(c * h for c, h in zip(coefs, self._history))
        self.qh = (self.qh + self.p.dt_s * increment) * self.filter
        self.time_s += self.p.dt_s

    def fields(self) -> dict[str, torch.Tensor]:
        """Grid-point diagnostics of the current state, each (ny, nx) float64, in SI units.

        Low-level fields (vorticity, height) come from the lower layer, which has no imposed mean
        wind, like the surface; the winds are the upper ("jet-level") layer's, which also carries the
        moisture.
        """
        ph = self.streamfunction_h()
        psi_lower = self._ifft(ph[1]) - self.p.u2 * (self.y[:, None] - self.p.ly_m / 2)
        return {
            "vorticity": self._ifft(-self.wv2 * ph[1]),
            "height": self.p.f0 * psi_lower / GRAVITY,  # geostrophic height anomaly, m
            "u": self._ifft(-self.il * ph[0]) + self.p.u1,
            "v": self._ifft(self.ik * ph[0]),
            "temperature": self.m.reference_temperature_k + self.temperature_anomaly(ph),
            "moisture": self.moisture.clone(),
        }

    def is_finite(self) -> bool:
        return bool(torch.isfinite(self.qh).all() and torch.isfinite(self.moisture).all())
