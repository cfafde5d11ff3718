"""Climate data set generator: two-layer QG turbulence, moisture tracer, TECA-like labels, netCDF4."""

from .generate import ClimateSettings, generate_climate, simulate
from .labels import CLASS_NAMES, LabelParams, label_snapshot
from .moisture import MoistureParams
from .qg import QGParams, TwoLayerQG

__all__ = ["ClimateSettings", "generate_climate", "simulate", "CLASS_NAMES", "LabelParams", "label_snapshot",
           "MoistureParams", "QGParams", "TwoLayerQG"]
