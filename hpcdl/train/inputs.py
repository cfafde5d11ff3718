"""What a config trains on: its (train, val) data sets and the model options the data imply.

Public so that the trainer and the study (which measures the run's own model on the run's own
samples) build both the same way.
"""

from __future__ import annotations


def datasets(config: dict, family):
    """(train, val) datasets: a named/path dataset, or synthetic batches of the model's input shape."""
    data = config["data"]
    name = data["dataset"] or family.default_dataset
    if name is None:
        raise ValueError(f"model {family.name!r} has no default dataset; set data.dataset to a dataset name or path, "
                         "or to 'synthetic' for random batches (memory and speed only)")
    from hpcdl.data import RANDOM_DATASETS, load_dataset

    if name == "synthetic" or name in RANDOM_DATASETS:
        # Random data has no split: the validation set is drawn from the next seed.
        size, seed = data["synthetic_samples"], config["train"]["seed"]
        val_size = max(1, int(size * data["val_fraction"]))
        if name == "synthetic":
            from hpcdl.data.synthetic import SyntheticDataset

            scale = config["model"]["scale"]
            return SyntheticDataset(family, scale, size, seed), SyntheticDataset(family, scale, val_size, seed + 1)
        return load_dataset(name, length=size, seed=seed), load_dataset(name, length=val_size, seed=seed + 1)
    options = {"val_fraction": data["val_fraction"]}
    if data["features"] is not None:
        options["features"] = data["features"]
    return (load_dataset(name, split="train", **options), load_dataset(name, split="val", **options))


def model_options(config: dict, family, train_set) -> dict:
    """Constructor overrides: the configured ones, plus the data's channel count for the climate model."""
    options = dict(config["model"]["options"])
    info = getattr(train_set, "info", None) or {}
    shape = info.get("input_shape")
    if shape and family.task == "segmentation" and "in_channels" not in options:
        options["in_channels"] = int(shape[0])
    return options
