"""hpcdl: data-parallel training with error-bounded lossy compression of activations."""

__version__ = "0.1.0"
