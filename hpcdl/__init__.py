"""hpcdl: data-parallel training with error-bounded lossy compression of activations."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Imported on first use so that `import hpcdl` (and `hpcdl --help`) does not load torch.
_LAZY = {
    "compressed": ("hpcdl.runtime", "compressed"),
    "Policy": ("hpcdl.runtime", "Policy"),
    "memory": ("hpcdl.memory", None),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'hpcdl' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
