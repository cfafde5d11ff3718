"""Random samples of a model's input shape, for models without a data set (memory and speed runs only).

Sample ``i`` is drawn from a generator seeded by (seed, i), so every rank and
every epoch sees the same sample at the same index. Labels are random: a model
can only memorise them, and its validation metric means nothing.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class SyntheticDataset(Dataset):
    def __init__(self, spec, scale: str, size: int, seed: int):
        if size < 1:
            raise ValueError(f"a synthetic dataset needs at least 1 sample, got {size}")
        self.spec, self.scale, self.size, self.seed = spec, scale, size, seed
        self.info = {"task": spec.task, "num_classes": spec.num_classes, "input_shape": spec.input_shape(scale),
                     "class_names": None, "source": f"synthetic:{spec.name}:{scale}"}

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        if not 0 <= index < self.size:
            raise IndexError(f"sample {index} out of range for a synthetic dataset of {self.size}")
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x, y = self.spec.example_batch(self.scale, 1, generator)
        return x[0], y[0]
