"""hpcdl.metrics against hand-computed values and brute-force definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.metrics import accuracy, confusion_matrix, iou_per_class, mean_iou, roc_auc


def pairwise_auc(scores, labels):
    """The definition: P(score of a random positive > score of a random negative), ties count 1/2."""
    positives = [s for s, label in zip(scores, labels) if label == 1]
    negatives = [s for s, label in zip(scores, labels) if label == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(positives, negatives))
    return wins / (len(positives) * len(negatives))


def test_roc_auc_known_values():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert roc_auc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 1])) == 1.0
    assert roc_auc([3.0, 2.0, 1.0], [0, 1, 1]) == 0.0
    assert roc_auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1)), min_size=2, max_size=40))
def test_roc_auc_equals_the_pairwise_definition_with_ties(pairs):
    scores = [float(s) for s, _ in pairs]
    labels = [label for _, label in pairs]
    if len(set(labels)) < 2:
        with pytest.raises(ValueError, match="needs both classes"):
            roc_auc(scores, labels)
        return
    assert roc_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels))


def test_roc_auc_rejects_bad_input():
    with pytest.raises(ValueError, match="one score per label"):
        roc_auc([0.1, 0.2], [0, 1, 1])
    with pytest.raises(ValueError, match="must be 0 or 1"):
        roc_auc([0.1, 0.2, 0.3], [0, 1, 2])
    with pytest.raises(ValueError, match="NaN or infinity"):
        roc_auc([0.1, float("nan")], [0, 1])


def test_accuracy_from_logits_labels_and_token_logits():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 1.0], [0.1, 0.2]])
    assert accuracy(logits, torch.tensor([0, 1, 1, 1])) == 0.75
    assert accuracy(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 0])) == pytest.approx(2 / 3)
    segmentation = torch.zeros(1, 3, 2, 2)
    segmentation[0, 2] = 1.0
    assert accuracy(segmentation, torch.tensor([[[2, 2], [0, 2]]])) == 0.75
    tokens = torch.nn.functional.one_hot(torch.tensor([[1, 4, 2]]), 5).float()
    assert accuracy(tokens, torch.tensor([[1, 4, 3]]), class_dim=-1) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="pass the class dimension"):
        accuracy(tokens, torch.tensor([[1, 4, 3]]))
    with pytest.raises(ValueError, match="one extra class dimension"):
        accuracy(torch.zeros(2, 3, 4, 5), torch.zeros(2, dtype=torch.long))


def test_mean_iou_by_hand():
    target = torch.tensor([[0, 0, 1, 1], [0, 0, 2, 2]])
    predicted = torch.tensor([[0, 1, 1, 1], [0, 0, 2, 0]])
    # class 0: TP 3, FP 1, FN 1 -> 3/5; class 1: TP 2, FP 1 -> 2/3; class 2: TP 1, FN 1 -> 1/2
    ious = iou_per_class(predicted, target, 3)
    torch.testing.assert_close(ious, torch.tensor([3 / 5, 2 / 3, 1 / 2], dtype=torch.float64))
    assert mean_iou(predicted, target, 3) == pytest.approx((3 / 5 + 2 / 3 + 1 / 2) / 3)
    # a class absent from both prediction and target is left out, not counted as 0 or 1
    assert np.isnan(iou_per_class(predicted, target, 4)[3].item())
    assert mean_iou(predicted, target, 4) == pytest.approx(mean_iou(predicted, target, 3))
    logits = torch.nn.functional.one_hot(predicted, 3).permute(2, 0, 1).unsqueeze(0).float()
    assert mean_iou(logits, target.unsqueeze(0), 3) == pytest.approx(mean_iou(predicted, target, 3))


def test_confusion_matrix_rows_are_truth_and_ranges_are_checked():
    matrix = confusion_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]), 2)
    assert matrix.tolist() == [[1, 1], [0, 1]]
    with pytest.raises(ValueError, match=r"target class ids must lie in \[0, 2\)"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0, 2]), 2)


def test_deepcam_iou_matches_torchmetrics_with_absent_classes_scoring_one():
    from conftest import require

    try:
        from torchmetrics.functional.segmentation import mean_iou as torchmetrics_mean_iou
    except ImportError:
        torchmetrics_mean_iou = None
    require(torchmetrics_mean_iou is not None, "torchmetrics (pip install torchmetrics==1.9.0)")
    from hpcdl.metrics import deepcam_iou, deepcam_iou_per_sample

    generator = torch.Generator().manual_seed(0)
    target = torch.randint(0, 3, (6, 8, 8), generator=generator)
    target[0] = 0  # classes 1 and 2 absent from sample 0's target...
    logits = torch.randn(6, 3, 8, 8, generator=generator)
    logits[0, 0] += 100  # ...and from its prediction: they score 1
    per_class = torchmetrics_mean_iou(logits.argmax(1), target, num_classes=3, input_format="index", per_class=True)
    expected = torch.where(per_class < 0, torch.ones_like(per_class), per_class).double()  # torchmetrics: -1 = absent
    torch.testing.assert_close(deepcam_iou_per_sample(logits, target, 3), expected.mean(1))
    assert deepcam_iou(logits, target, 3) == pytest.approx(expected.mean().item())
    assert deepcam_iou_per_sample(logits, target, 3)[0] == 1.0


def test_validation_sums_select_the_deepcam_or_the_global_miou():
    from hpcdl.metrics import deepcam_iou, mean_iou
    from hpcdl.train.evaluate import ValidationSums

    target = torch.tensor([[[0, 1], [1, 1]], [[2, 2], [2, 2]]])
    logits = torch.nn.functional.one_hot(torch.tensor([[[0, 0], [1, 1]], [[2, 2], [2, 2]]]), 3).permute(0, 3, 1, 2)
    for miou, reference in (("global", mean_iou), ("deepcam", deepcam_iou)):
        sums = ValidationSums("segmentation", 3, miou=miou)
        sums.update(logits.float(), target, 0.0)
        assert sums.metrics()["val_miou"] == pytest.approx(reference(logits, target, 3))
    assert deepcam_iou(logits, target, 3) == pytest.approx(((0.5 + 2 / 3 + 1) / 3 + 1) / 2)
    with pytest.raises(ValueError, match="miou must be 'global' or 'deepcam'"):
        ValidationSums("segmentation", 3, miou="mean")
