"""Validation sums give the same metrics as hpcdl.metrics on the whole set, and add across ranks."""

from __future__ import annotations

import pytest
import torch

from hpcdl import metrics
from hpcdl.train.evaluate import ValidationSums


def _split_and_sum(task, classes, logits, target):
    """Two 'ranks' each summing half of the set, then their sums added, as allreduce_mean * size does."""
    halves = []
    for part in (slice(0, len(target) // 2), slice(len(target) // 2, None)):
        sums = ValidationSums(task, classes)
        sums.update(logits[part], target[part], mean_loss=1.0)
        halves.append(sums)
    totals = {key: halves[0].sums[key] + halves[1].sums[key] for key in halves[0].sums}
    return halves[0].metrics(totals)["val_metric"]


def test_binned_auc_matches_exact_auc():
    generator = torch.Generator().manual_seed(0)
    target = torch.randint(2, (500,), generator=generator)
    logits = torch.randn(500, 2, generator=generator) + torch.stack([torch.zeros(500), target * 1.5], dim=1)
    exact = metrics.roc_auc(torch.softmax(logits, 1)[:, 1], target)
    assert _split_and_sum("classification", 2, logits, target) == pytest.approx(exact, abs=2e-3)


def test_mean_iou_and_accuracy_match_whole_set():
    generator = torch.Generator().manual_seed(1)
    logits, target = torch.randn(6, 3, 8, 8, generator=generator), torch.randint(3, (6, 8, 8), generator=generator)
    assert _split_and_sum("segmentation", 3, logits, target) == pytest.approx(metrics.mean_iou(logits, target, 3))
    logits, target = torch.randn(40, 5, generator=generator), torch.randint(5, (40,), generator=generator)
    assert _split_and_sum("classification", 5, logits, target) == pytest.approx(metrics.accuracy(logits, target))


def test_empty_validation_set_is_an_error():
    with pytest.raises(ValueError, match="validation set is empty"):
        ValidationSums("classification", 5).metrics()
