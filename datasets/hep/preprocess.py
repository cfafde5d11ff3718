"""Jet preprocessing: jet images and constituent lists from a jet's particles.

Jet images follow the standard recipe (de Oliveira et al., "Jet-images — deep learning edition",
JHEP 07 (2016) 069): in (eta, phi) relative to the jet,

1. translate so that the pT-weighted centroid is at the origin;
2. rotate so that the principal axis of the pT-weighted second-moment tensor points along +eta
   (the two-prong axis of a W jet);
3. flip (parity) so that along each axis the positive half holds more pT than the negative
   half — the harder prong to the right, more radiation above;
4. pixelate on a ``size x size`` grid spanning ``[-R, R]`` in both directions, each pixel holding
   the pT fraction of the jet that falls in it (particles outside the grid are dropped).

These symmetries do not change the physics, so a classifier does not have to learn them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcdl.data.features import wrap_phi


@dataclass(frozen=True)
class JetParticles:
    """A jet's constituents: pT (GeV), eta, phi, energy (GeV), each (n,); and the jet's axis."""

    pt: np.ndarray
    eta: np.ndarray
    phi: np.ndarray
    energy: np.ndarray
    jet_eta: float
    jet_phi: float


def centred_coordinates(jet: JetParticles) -> np.ndarray:
    """(n, 2) (eta, phi) of the particles after translation, rotation and flips (steps 1-3)."""
    weights = jet.pt / jet.pt.sum()
    coords = np.stack([jet.eta - jet.jet_eta, wrap_phi(jet.phi - jet.jet_phi)], axis=1)
    coords = coords - weights @ coords
    if len(coords) > 1:
        inertia = (coords * weights[:, None]).T @ coords
        _, vectors = np.linalg.eigh(inertia)
        major = vectors[:, -1]
        cos, sin = major
        rotation = np.array([[cos, sin], [-sin, cos]])  # maps the major axis onto +eta
        coords = coords @ rotation.T
    balance = weights @ np.sign(coords)  # pT fraction right minus left (eta), above minus below (phi)
    coords = coords * np.where(balance < 0, -1.0, 1.0)
    return coords


def jet_image(jet: JetParticles, size: int = 32, radius: float = 0.8) -> np.ndarray:
    """(size, size) float32 image of pT fractions; rows are phi (up = +phi), columns eta."""
    coords = centred_coordinates(jet)
    image, _, _ = np.histogram2d(coords[:, 1], coords[:, 0], bins=size, range=[[-radius, radius], [-radius, radius]],
                                 weights=jet.pt / jet.pt.sum())
    return image.astype(np.float32)


def constituent_array(jet: JetParticles, max_particles: int = 64) -> tuple[np.ndarray, int]:
    """((max_particles, 4) float32 rows (pT, eta, phi, E) sorted by falling pT, zero padded; count kept)."""
    order = np.argsort(-jet.pt, kind="stable")[:max_particles]
    rows = np.zeros((max_particles, 4), dtype=np.float32)
    rows[: len(order)] = np.stack([jet.pt, jet.eta, jet.phi, jet.energy], axis=1)[order]
    return rows, len(order)


def particles_of(pseudojet) -> JetParticles:
    """The constituents of a FastJet ``PseudoJet`` as a ``JetParticles``."""
    parts = pseudojet.constituents()
    values = np.array([[p.pt(), p.eta(), p.phi_std(), p.e()] for p in parts], dtype=np.float64)
    return JetParticles(pt=values[:, 0], eta=values[:, 1], phi=values[:, 2], energy=values[:, 3],
                        jet_eta=pseudojet.eta(), jet_phi=pseudojet.phi_std())
