"""Random data sets, for memory and speed runs where accuracy is not measured.

Two kinds, one mechanism (:class:`SeededDataset`): :class:`RandomDataset` of ImageNet and DeepCAM
shapes by name (``random-imagenet``...), and :class:`SyntheticDataset` of a zoo model's own input
(``data.dataset: synthetic``, drawn by ``ModelFamily.example_batch``). Every item is drawn from a
generator seeded by (seed, index), so the data are reproducible, every rank and epoch sees the same
sample at the same index, and any item can be read in any order without storing anything. Labels
are random: a model can only memorise them. ``info["random"]`` is True and ``info["note"]`` says
that accuracy on these data means nothing; callers should say so wherever they report numbers.
"""

from __future__ import annotations

import torch

#: name -> (task, num_classes, per-sample input shape)
RANDOM_DATASETS: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "random-imagenet": ("classification", 1000, (3, 224, 224)),
    "random-cifar": ("classification", 10, (3, 32, 32)),
    "random-deepcam": ("segmentation", 3, (16, 768, 1152)),
    "random-deepcam-small": ("segmentation", 3, (16, 96, 144)),
}


class SeededDataset(torch.utils.data.Dataset):
    """``length`` items, item ``i`` drawn by :meth:`draw` from a generator seeded by (seed, i)."""

    length: int
    seed: int

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, item: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= item < self.length:
            raise IndexError(f"item {item} out of range for {self.length} samples")
        return self.draw(torch.Generator().manual_seed(self.seed * 1_000_003 + item))

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class RandomDataset(SeededDataset):
    """``length`` random (x, y) pairs: x standard normal float32, y uniform classes (int64)."""

    def __init__(self, name: str, task: str, num_classes: int, shape: tuple[int, ...], length: int, seed: int) -> None:
        if length < 1:
            raise ValueError(f"length must be at least 1, got {length}")
        self.shape, self.length, self.seed, self.num_classes = tuple(shape), length, seed, num_classes
        self.segmentation = task == "segmentation"
        self.info = {"task": task, "num_classes": num_classes, "input_shape": self.shape,
                     "class_names": [f"class_{i}" for i in range(num_classes)], "source": name, "kind": "random",
                     "name": name, "split": "all", "num_samples": length, "random": True,
                     "note": f"random data of {name.removeprefix('random-')} shape: for memory and speed runs only; "
                             "accuracy on it is meaningless"}

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.shape, generator=generator)
        y_shape = self.shape[1:] if self.segmentation else ()
        return x, torch.randint(self.num_classes, y_shape, generator=generator)


class SyntheticDataset(SeededDataset):
    """``size`` random samples of zoo model ``model_family``'s input at ``scale`` (``data.dataset: synthetic``)."""

    def __init__(self, model_family, scale: str, size: int, seed: int):
        if size < 1:
            raise ValueError(f"a synthetic dataset needs at least 1 sample, got {size}")
        self.model_family, self.scale, self.length, self.seed = model_family, scale, size, seed
        source = f"synthetic:{model_family.name}:{scale}"
        self.info = {"task": model_family.task, "num_classes": model_family.num_classes,
                     "input_shape": model_family.input_shape(scale),
                     "class_names": None, "source": source, "random": True,
                     "note": f"random {source} samples: for memory and speed runs only; accuracy on it is meaningless"}

    @property
    def size(self) -> int:
        return self.length

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.model_family.example_batch(self.scale, 1, generator)
        return x[0], y[0]


def random_dataset(name: str, length: int = 1024, seed: int = 0, shape: tuple[int, ...] | None = None):
    """A RandomDataset by name; ``shape`` overrides the per-sample input shape (e.g. a smaller DeepCAM)."""
    if name not in RANDOM_DATASETS:
        raise ValueError(f"unknown random data set {name!r}; choose from {sorted(RANDOM_DATASETS)}")
    task, num_classes, default_shape = RANDOM_DATASETS[name]
    return RandomDataset(name, task, num_classes, tuple(shape or default_shape), length, seed)
