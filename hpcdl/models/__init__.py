"""The model zoo: climate segmentation, HEP taggers, and the standard CNNs and transformers to compare with.

``get(name, scale="small", **kw)`` builds a model, ``spec(name)`` describes it
(:class:`ModelSpec`), ``names()`` lists them. Every model is called as ``model(x)``.
"""

from hpcdl.models import catalog as _catalog  # noqa: F401  (registers the built-in models)
from hpcdl.models.registry import ModelError, ModelOptionError, ModelSpec, Scale, get, names, register, spec

__all__ = ["ModelError", "ModelOptionError", "ModelSpec", "Scale", "get", "names", "register", "spec"]
