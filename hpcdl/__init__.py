"""hpcdl: data-parallel training with error-bounded lossy compression of activations.

The public facade: ``hpcdl.compressed``, ``hpcdl.Policy`` and ``hpcdl.memory``, each imported on first
use (see docs/architecture.md for where everything else lives). Autograd's saved activations are kept
compressed inside the ``with`` block and decompressed in backward:

>>> import torch, hpcdl
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
>>> policy = hpcdl.Policy.default()   # sz rel 1e-3; or Policy.static({"id": "sz", "mode": "rel", "bound": 1e-2})
>>> with hpcdl.compressed(model, policy) as session:
...     loss = model(torch.randn(128, 256)).square().mean()
>>> loss.backward()
>>> session.stats.packed_bytes < session.stats.original_bytes
True
>>> model[0].weight.grad.shape
torch.Size([256, 256])
"""

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
