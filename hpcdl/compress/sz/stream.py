"""Old name of :mod:`hpcdl.compress.blocks.stream` (the block engine moved there), kept for one release.

Importing it gives the very same module object, so state set through either name (e.g. a test's
monkeypatch) is seen through both.
"""

import sys

from hpcdl.compress.blocks import stream

sys.modules[__name__] = stream
