"""The model zoo: climate segmentation, HEP taggers, and the standard CNNs and transformers to compare with.

``get(name, scale="small", **kw)`` builds a model, ``family(name)`` describes it at all its scales
(:class:`ModelFamily`; ``spec`` and ``ModelSpec`` are their old names), ``names()`` lists them. Every model is called as ``model(x)``.
"""

from hpcdl.models import catalog as _catalog  # noqa: F401  (registers the built-in models)
from hpcdl.models.registry import (
    ModelError,
    ModelFamily,
    ModelOptionError,
    ModelSpec,
    Scale,
    family,
    get,
    names,
    register,
    spec,
)

__all__ = ["ModelError", "ModelFamily", "ModelOptionError", "ModelSpec", "Scale", "family", "get", "names",
           "register", "spec"]
