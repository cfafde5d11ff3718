"""Per-particle input features of the HEP constituent lists, shared by the generator (for the
normalisation statistics in the manifest) and the loader (for the model input)."""

from __future__ import annotations

import numpy as np

#: Feature columns of a constituent input row; "mask" is 1 for a particle and 0 for padding.
CONSTITUENT_FEATURES = ("delta_eta", "delta_phi", "log_pt", "log_energy", "mask")
NORMALISED_FEATURES = CONSTITUENT_FEATURES[:4]


def wrap_phi(phi: np.ndarray) -> np.ndarray:
    """Angle difference wrapped to [-pi, pi)."""
    return (phi + np.pi) % (2 * np.pi) - np.pi


def constituent_features(constituents: np.ndarray, count: int, jet_eta: float, jet_phi: float) -> np.ndarray:
    """(N, 5) float32 rows (delta_eta, delta_phi, log pT, log E, mask) from (N, 4) rows (pT, eta, phi, E).

    Positions are relative to the jet axis, so the features do not depend on where the jet points;
    padding rows (beyond ``count``) are all zero.
    """
    out = np.zeros((constituents.shape[0], len(CONSTITUENT_FEATURES)), dtype=np.float32)
    real = constituents[:count].astype(np.float64)
    out[:count, 0] = real[:, 1] - jet_eta
    out[:count, 1] = wrap_phi(real[:, 2] - jet_phi)
    out[:count, 2] = np.log(np.maximum(real[:, 0], 1e-6))
    out[:count, 3] = np.log(np.maximum(real[:, 3], 1e-6))
    out[:count, 4] = 1.0
    return out


#: The ``units`` attribute of each dataset of a HEP jets file (hpcdl's generator and importers write
#: them; the loader refuses other units). Constituent rows are (pT, eta, phi, E); pseudorapidity and
#: pT fractions are dimensionless ("1"), angles in radians, momenta and energies in GeV.
HEP_UNITS = {"images": "1", "constituents": "GeV 1 rad GeV", "jet_pt": "GeV", "jet_eta": "1", "jet_phi": "rad",
             "jet_mass": "GeV"}
