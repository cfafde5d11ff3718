"""Where the committed samples live: package data of ``hpcdl_datasets`` (the ``datasets/`` folder)."""

from __future__ import annotations

from pathlib import Path

from .errors import MissingFileError

#: Committed sample name -> folder under ``hpcdl_datasets/samples``.
SAMPLE_NAMES = ("climate-sample", "hep-sample")


def sample_path(name: str) -> Path:
    """Folder of a committed sample, found through ``importlib.resources`` (installed or editable)."""
    if name not in SAMPLE_NAMES:
        raise ValueError(f"unknown sample {name!r}; committed samples are {SAMPLE_NAMES}")
    from importlib.resources import files

    try:
        root = Path(str(files("hpcdl_datasets") / "samples"))
    except ModuleNotFoundError:  # running from a source tree without `pip install -e .`
        root = Path(__file__).resolve().parents[2] / "datasets" / "samples"
    path = root / name.removesuffix("-sample")
    if not (path / "manifest.json").is_file():
        raise MissingFileError(path, f"the committed sample {name!r} is missing; reinstall hpcdl "
                                     "(`pip install -e .`) from a complete checkout")
    return path
