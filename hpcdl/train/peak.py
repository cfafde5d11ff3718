"""Moved: :class:`PeakMemory` lives in :mod:`hpcdl.memory.peak`, with the single-step measurement it shares.

This alias stays for one release.
"""

from hpcdl.memory.peak import PeakMemory

__all__ = ["PeakMemory"]
