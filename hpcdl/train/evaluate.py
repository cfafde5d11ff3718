"""Validation metrics that reduce exactly across ranks.

Each rank evaluates its own part of the validation set and keeps only sums
(loss sum, sample count, correct count, per-class intersections and unions,
per-class score histograms). Sums add across ranks, so the backend's
``allreduce_mean`` times the number of ranks gives the same totals, and the
same metric, on 1 or N ranks. The metric by task:

- binary classification (the HEP jet taggers): ROC AUC (as
  :func:`hpcdl.metrics.roc_auc`, which needs every score in one place) from 4096-bin
  histograms of the signal-class probability per true class (ties within a bin
  count one half, so the error is below one bin's mass);
- other classification: accuracy;
- segmentation (climate): ``train.miou: global`` (default), mean
  intersection-over-union over classes present in the prediction or the
  target (as :func:`hpcdl.metrics.mean_iou`, but from intersections and unions
  summed over ranks); ``train.miou: deepcam``, the MLPerf DeepCAM metric (as
  :func:`hpcdl.metrics.deepcam_iou`, from the per-sample scores' sum);
- language: next-token accuracy.
"""

from __future__ import annotations

import torch

from hpcdl.metrics import confusion_matrix, deepcam_iou_per_sample

AUC_BINS = 4096


def metric_name(task: str, num_classes: int) -> str:
    if task == "segmentation":
        return "miou"
    if task == "classification" and num_classes == 2:
        return "auc"
    return "accuracy"


class ValidationSums:
    """Sums over validation batches from which :meth:`metrics` computes loss and the task's metric."""

    def __init__(self, task: str, num_classes: int, miou: str = "global"):
        if miou not in ("global", "deepcam"):
            raise ValueError(f"miou must be 'global' or 'deepcam', got {miou!r}")
        self.task, self.num_classes, self.miou = task, num_classes, miou
        self.name = metric_name(task, num_classes)
        self.sums: dict[str, float] = {"loss_sum": 0.0, "count": 0.0, "correct": 0.0,
                                       "sample_iou_sum": 0.0, "samples": 0.0}
        if self.name == "miou":
            for c in range(num_classes):
                self.sums[f"intersection_{c}"] = self.sums[f"union_{c}"] = 0.0
        if self.name == "auc":
            for label in (0, 1):
                for b in range(AUC_BINS):
                    self.sums[f"hist{label}_{b:04d}"] = 0.0

    def update(self, logits: torch.Tensor, target: torch.Tensor, mean_loss: float) -> None:
        """Add one batch: ``logits`` (N, C, ...) or (N, T, C) for language, ``target`` class ids."""
        if self.task == "language":
            logits = logits.flatten(0, 1)
            target = target.flatten()
        predicted = logits.argmax(dim=1)
        items = target.numel()
        self.sums["loss_sum"] += mean_loss * items
        self.sums["count"] += items
        self.sums["correct"] += float((predicted == target).sum())
        if self.name == "miou":
            matrix = confusion_matrix(predicted, target, self.num_classes)
            intersection = matrix.diagonal()
            union = matrix.sum(0) + matrix.sum(1) - intersection
            for c in range(self.num_classes):
                self.sums[f"intersection_{c}"] += float(intersection[c])
                self.sums[f"union_{c}"] += float(union[c])
            self.sums["sample_iou_sum"] += float(deepcam_iou_per_sample(predicted, target, self.num_classes).sum())
            self.sums["samples"] += target.shape[0]
        if self.name == "auc":
            score = torch.softmax(logits.float(), dim=1)[:, 1]
            bins = (score * AUC_BINS).long().clamp_(0, AUC_BINS - 1)
            for label in (0, 1):
                counts = torch.bincount(bins[target == label], minlength=AUC_BINS)
                for b in torch.nonzero(counts).flatten().tolist():
                    self.sums[f"hist{label}_{b:04d}"] += float(counts[b])

    def metrics(self, totals: dict[str, float] | None = None) -> dict[str, float]:
        """``{"val_loss", "val_metric", "val_<name>"}`` from these sums or from ``totals`` (summed over ranks)."""
        sums = totals if totals is not None else self.sums
        count = sums["count"]
        if count == 0:
            raise ValueError("the validation set is empty; raise data.val_fraction or use a larger data set")
        if self.name == "miou" and self.miou == "deepcam":
            value = sums["sample_iou_sum"] / sums["samples"]
        elif self.name == "miou":
            ious = [sums[f"intersection_{c}"] / sums[f"union_{c}"]
                    for c in range(self.num_classes) if sums[f"union_{c}"] > 0]
            value = sum(ious) / len(ious)
        elif self.name == "auc":
            value = _binned_auc([sums[f"hist0_{b:04d}"] for b in range(AUC_BINS)],
                                [sums[f"hist1_{b:04d}"] for b in range(AUC_BINS)])
        else:
            value = sums["correct"] / count
        return {"val_loss": sums["loss_sum"] / count, "val_metric": value, f"val_{self.name}": value}


def _binned_auc(negatives: list[float], positives: list[float]) -> float:
    """P(score of a positive > score of a negative) + P(tie)/2, from per-bin counts."""
    total_neg, total_pos = sum(negatives), sum(positives)
    if total_neg == 0 or total_pos == 0:
        return float("nan")
    below, wins = 0.0, 0.0
    for neg, pos in zip(negatives, positives):
        wins += pos * (below + 0.5 * neg)
        below += neg
    return wins / (total_neg * total_pos)
