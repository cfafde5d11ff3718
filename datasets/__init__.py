"""hpcdl_datasets: generators of hpcdl's climate and HEP data sets, and their committed samples.

- ``hpcdl_datasets.climate``: a two-layer quasi-geostrophic model (PyTorch, spectral) spun up to
  turbulence, with a moisture tracer and TECA-like cyclone / atmospheric-river labels, written as
  CF-1.8 netCDF4; and a converter to DeepCAM's HDF5 layout.
- ``hpcdl_datasets.hep``: Pythia 8 + FastJet W-vs-QCD jets as jet images and constituent lists in
  HDF5 (needs ``pythia8mc``; everything else imports without it).
- ``samples/``: small committed samples of both, read by ``hpcdl.data.load_dataset``.

See ``README.md`` next to this file for origin, physics, sizes and how to regenerate.
"""
