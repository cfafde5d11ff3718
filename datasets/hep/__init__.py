"""HEP data set generator: Pythia 8 W -> qq vs QCD jets, FastJet anti-kt R = 0.8, images and constituents.

Importing this package does not need Pythia; ``generate_hep`` raises an ImportError that says how
to install ``pythia8mc`` when it is missing. ``import_jetnet`` and ``import_top_tagging`` convert
public jet data sets (JetNet, the top-tagging reference data set) into the same layout.
"""

from .generate import CLASS_NAMES, HEPSettings, generate_hep, import_pythia
from .importers import import_jetnet, import_top_tagging
from .preprocess import JetParticles, centred_coordinates, constituent_array, jet_image, particles_of

__all__ = ["CLASS_NAMES", "HEPSettings", "generate_hep", "import_pythia", "import_jetnet", "import_top_tagging", "JetParticles", "centred_coordinates",
           "constituent_array", "jet_image", "particles_of"]
