"""Validation metrics: classification accuracy, binary ROC AUC, and segmentation mean IoU (global, and
DeepCAM's per-sample definition).

Each takes torch tensors (any device) or array-likes and returns a Python float; the
accumulating caller (the trainer) concatenates predictions over a validation set
first, because AUC and IoU are not averages of per-batch values.
"""

from __future__ import annotations

import torch


def _tensor(values) -> torch.Tensor:
    return values.detach() if isinstance(values, torch.Tensor) else torch.as_tensor(values)


def _labels(predictions, target: torch.Tensor, class_dim: int) -> torch.Tensor:
    """Class ids from ``predictions``: taken as-is if shaped like ``target``, else the argmax over ``class_dim``."""
    predictions = _tensor(predictions)
    if predictions.shape == target.shape:
        return predictions.long()
    if predictions.dim() != target.dim() + 1:
        raise ValueError(
            f"predictions {tuple(predictions.shape)} must be class ids shaped like the target {tuple(target.shape)} "
            f"or scores with one extra class dimension"
        )
    labels = predictions.argmax(dim=class_dim)
    if labels.shape != target.shape:
        raise ValueError(
            f"scores {tuple(predictions.shape)} reduced over dim {class_dim} give {tuple(labels.shape)}, "
            f"not the target's {tuple(target.shape)}; pass the class dimension as class_dim"
        )
    return labels


def accuracy(predictions, target, class_dim: int = 1) -> float:
    """Fraction of elements whose predicted class equals the target class.

    ``predictions``: class ids shaped like ``target``, or scores/logits with a class
    dimension at ``class_dim`` (1 for (N, C) and (N, C, H, W); -1 for language
    models' (N, T, vocab)).
    """
    target = _tensor(target)
    if target.numel() == 0:
        raise ValueError("accuracy of an empty target is undefined")
    labels = _labels(predictions, target, class_dim)
    return (labels == target.to(labels.device)).double().mean().item()


def roc_auc(scores, labels) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (1 = positive, 0 = negative).

    Equals the probability that a random positive scores above a random negative,
    counting ties as one half (the Mann-Whitney U statistic, computed from average
    ranks in O(n log n)). 0.5 is chance, 1.0 a perfect separation.
    """
    scores = _tensor(scores).double().flatten()
    labels = _tensor(labels).flatten().to(scores.device)
    if scores.shape != labels.shape:
        raise ValueError(f"roc_auc needs one score per label, got {scores.numel()} scores and {labels.numel()} labels")
    if not torch.isfinite(scores).all():
        raise ValueError("roc_auc scores contain NaN or infinity")
    if not ((labels == 0) | (labels == 1)).all():
        raise ValueError(f"roc_auc labels must be 0 or 1, got values {sorted(set(labels.unique().tolist()))}")
    positives = int(labels.sum().item())
    negatives = labels.numel() - positives
    if positives == 0 or negatives == 0:
        raise ValueError(
            f"roc_auc needs both classes, got {positives} positives and {negatives} negatives"
        )
    _, inverse, counts = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    first_rank = torch.cumsum(counts, 0) - counts + 1
    ranks = (first_rank + (counts - 1) / 2.0)[inverse]
    rank_sum = ranks[labels == 1].sum().item()
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def confusion_matrix(predictions, target, num_classes: int, class_dim: int = 1) -> torch.Tensor:
    """(num_classes, num_classes) int64 counts; row = true class, column = predicted class."""
    target = _tensor(target).long()
    labels = _labels(predictions, target, class_dim).to(target.device)
    for name, values in (("target", target), ("predicted", labels)):
        if values.numel() and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(
                f"{name} class ids must lie in [0, {num_classes}), got range [{values.min().item()}, {values.max().item()}]"
            )
    flat = target.flatten() * num_classes + labels.flatten()
    return torch.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def iou_per_class(predictions, target, num_classes: int, class_dim: int = 1) -> torch.Tensor:
    """Intersection over union of each class, float64; NaN for a class absent from both prediction and target."""
    matrix = confusion_matrix(predictions, target, num_classes, class_dim).double()
    intersection = matrix.diagonal()
    union = matrix.sum(0) + matrix.sum(1) - intersection
    return torch.where(union > 0, intersection / union.clamp(min=1), torch.full_like(union, float("nan")))


def mean_iou(predictions, target, num_classes: int, class_dim: int = 1) -> float:
    """Mean over classes of the per-pixel IoU, skipping classes absent from both prediction and target.

    The DeepCAM benchmark's quality metric. ``predictions``: class ids (N, H, W) or
    logits (N, C, H, W).
    """
    ious = iou_per_class(predictions, target, num_classes, class_dim)
    present = ~torch.isnan(ious)
    if not present.any():
        raise ValueError("mean_iou of an empty target is undefined")
    return ious[present].mean().item()


def deepcam_iou_per_sample(predictions, target, num_classes: int, class_dim: int = 1) -> torch.Tensor:
    """Per sample (dim 0), the mean over classes of that sample's IoU, a class absent from both its prediction
    and its target scoring 1; float64, shape (N,). The MLPerf HPC DeepCAM reference's definition."""
    target = _tensor(target).long()
    labels = _labels(predictions, target, class_dim).to(target.device)
    confusion_matrix(labels, target, num_classes)  # range check with its message
    if target.dim() < 1 or target.shape[0] == 0:
        raise ValueError("deepcam_iou needs a batch of at least one sample (dim 0)")
    labels, target = labels.flatten(1), target.flatten(1)
    scores = torch.zeros(target.shape[0], dtype=torch.float64, device=target.device)
    for c in range(num_classes):
        predicted, actual = labels == c, target == c
        intersection = (predicted & actual).sum(1).double()
        union = (predicted | actual).sum(1).double()
        scores += torch.where(union > 0, intersection / union.clamp(min=1), torch.ones_like(union))
    return scores / num_classes


def deepcam_iou(predictions, target, num_classes: int, class_dim: int = 1) -> float:
    """DeepCAM's mIoU: :func:`deepcam_iou_per_sample` averaged over samples.

    Unlike :func:`mean_iou` (IoU per class over all pixels of all samples, absent classes skipped), every
    sample weighs the same, and a class a sample rightly does not predict counts as a perfect score.
    """
    return deepcam_iou_per_sample(predictions, target, num_classes, class_dim).mean().item()
