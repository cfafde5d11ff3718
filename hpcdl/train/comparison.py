"""The activation methods that the demo and the training benchmark compare, as trainer config overrides.

One definition for both (they sit side by side above the trainer and do not import each other):
the uncompressed baseline and the SZ codec at a relative bound of 1e-2.
"""

from __future__ import annotations

COMPARED_METHODS: dict[str, list[str]] = {
    "baseline": ["compression.method=none"],
    "sz rel 1e-2": ["compression.method=codec", "compression.codec={id: sz, mode: rel, bound: 1.0e-2}"],
}
