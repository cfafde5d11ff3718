"""Moved: :class:`SyntheticDataset` lives in :mod:`hpcdl.data.synthetic` with the other random data sets.

This alias stays for one release.
"""

from hpcdl.data.synthetic import SyntheticDataset

__all__ = ["SyntheticDataset"]
