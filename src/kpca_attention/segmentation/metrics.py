"""Semantic-segmentation metrics with mmsegmentation's conventions (``IoUMetric``, ``mean_iou``).

Per class ``k`` over all evaluated pixels whose ground truth is not ``ignore_index``:

* intersection ``I_k`` = pixels predicted ``k`` whose label is ``k``; ``P_k`` = pixels predicted ``k``;
  ``L_k`` = pixels labelled ``k``; union ``U_k = P_k + L_k - I_k``;
* ``iou[k] = I_k / U_k`` and ``accuracy[k] = I_k / L_k``; a 0/0 is NaN and the class is left out of the
  mean (``np.nanmean``, as mmseg): ``miou`` averages the classes present in the ground truth *or* the
  predictions (a class predicted but absent from the ground truth counts with IoU 0, as in mmseg),
  ``mean_accuracy`` (mmseg's mAcc) the classes present in the ground truth;
* ``pixel_accuracy`` (mmseg's aAcc) = ``sum I_k / sum L_k``.

Sums are over the whole dataset (one confusion matrix), not means of per-image scores. mmseg silently
drops predictions or labels outside ``0..num_classes-1`` (``torch.histc``); here they are an error, since
they always mean a wrong ``num_classes`` or label mapping. Values are fractions (mmseg prints percent).

The confusion matrix is built with ``torch.bincount`` (written here rather than taken from mmseg, which
would pull in mmcv/mmengine for four lines).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["SegmentationAccumulator", "segmentation_metrics", "metrics_from_confusion", "metrics_from_areas",
           "metrics_from_records", "item_record", "confusion_matrix", "class_areas"]


def _check(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int) -> tuple[Tensor, Tensor]:
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    pred, target = torch.as_tensor(pred), torch.as_tensor(target)
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} must have one shape "
                         "(class indices per pixel; take argmax over the class dimension of logits first)")
    if pred.is_floating_point() or target.is_floating_point():
        raise TypeError(f"pred and target must hold integer class indices, got {pred.dtype} and "
                        f"{target.dtype}")
    if 0 <= ignore_index < num_classes:
        raise ValueError(f"ignore_index {ignore_index} is a valid class index (num_classes={num_classes})")
    valid = target != ignore_index
    pred, target = pred[valid].long(), target[valid].long()
    for name, t in (("pred", pred), ("target", target)):
        if t.numel() and (t.min() < 0 or t.max() >= num_classes):
            bad = t[(t < 0) | (t >= num_classes)][0].item()
            raise ValueError(f"{name} holds {bad}, outside 0..{num_classes - 1} (num_classes={num_classes}; "
                             f"ignore_index={ignore_index} is excluded)")
    return pred, target


def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int = 255) -> Tensor:
    """``C[t, p]`` = number of non-ignored pixels with label ``t`` predicted ``p``; int64 ``(K, K)``.

    ``pred`` and ``target`` are integer tensors of one shape (e.g. ``(B, H, W)``)."""
    pred, target = _check(pred, target, num_classes, ignore_index)
    flat = target * num_classes + pred
    return torch.bincount(flat, minlength=num_classes * num_classes).view(num_classes, num_classes)


def class_areas(confusion: Tensor) -> dict[str, Tensor]:
    """mmseg's four per-class areas ``intersect``, ``union``, ``pred``, ``label`` (int64 ``(K,)``)."""
    inter = confusion.diagonal()
    pred = confusion.sum(dim=0)
    label = confusion.sum(dim=1)
    return {"intersect": inter, "union": pred + label - inter, "pred": pred, "label": label}


def _nanmean(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else math.nan


def metrics_from_areas(intersect: Any, pred: Any, label: Any,
                       class_names: Sequence[str] | None = None) -> dict[str, Any]:
    """``miou``, ``mean_accuracy``, ``pixel_accuracy`` (floats; NaN when nothing was evaluated) and the
    per-class lists ``iou``, ``accuracy`` (NaN for classes left out) from the per-class pixel counts
    ``intersect``, ``pred``, ``label`` (each ``(K,)``, summed over the dataset)."""
    inter, p, lab = (np.asarray(torch.as_tensor(a).cpu(), dtype=np.float64) for a in (intersect, pred, label))
    if not inter.shape == p.shape == lab.shape or inter.ndim != 1:
        raise ValueError(f"intersect, pred and label must be (K,) each, got {inter.shape}, {p.shape}, "
                         f"{lab.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (p + lab - inter)
        acc = inter / lab
        total = lab.sum()
        pix = float(inter.sum() / total) if total else math.nan
    out: dict[str, Any] = {
        "miou": _nanmean(iou), "mean_accuracy": _nanmean(acc), "pixel_accuracy": pix,
        "iou": iou.tolist(), "accuracy": acc.tolist(), "pixels": int(total),
    }
    if class_names is not None:
        if len(class_names) != inter.shape[0]:
            raise ValueError(f"{len(class_names)} class names for {inter.shape[0]} classes")
        out["class_names"] = list(class_names)
    return out


def metrics_from_confusion(confusion: Tensor, class_names: Sequence[str] | None = None) -> dict[str, Any]:
    """:func:`metrics_from_areas` of a confusion matrix ``(K, K)`` (rows: labels, columns: predictions)."""
    a = class_areas(confusion)
    return metrics_from_areas(a["intersect"], a["pred"], a["label"], class_names)


def item_record(confusion: Tensor) -> dict[str, list[int]]:
    """A compact, JSON-ready record of one image's confusion matrix ``(K, K)``: the classes it touches
    (predicted or labelled) with their ``intersect``, ``pred`` and ``label`` pixel counts. Records of a
    dataset sum to its metrics with :func:`metrics_from_records` (mIoU is a ratio of sums, not a mean of
    per-image scores)."""
    a = class_areas(confusion)
    touched = torch.nonzero((a["pred"] > 0) | (a["label"] > 0)).flatten()
    counts = {k: a[k][touched].tolist() for k in ("intersect", "pred", "label")}
    return {"classes": touched.tolist(), **counts}


def metrics_from_records(records: Sequence[dict[str, Sequence[int]]], num_classes: int,
                         class_names: Sequence[str] | None = None) -> dict[str, Any]:
    """Dataset metrics from per-image :func:`item_record` dicts."""
    sums = {k: np.zeros(num_classes, dtype=np.int64) for k in ("intersect", "pred", "label")}
    for rec in records:
        classes = np.asarray(rec["classes"], dtype=np.int64)
        if classes.size and (classes.min() < 0 or classes.max() >= num_classes):
            raise ValueError(f"record has classes outside 0..{num_classes - 1}: {classes.tolist()}")
        for k in sums:
            np.add.at(sums[k], classes, np.asarray(rec[k], dtype=np.int64))
    return metrics_from_areas(sums["intersect"], sums["pred"], sums["label"], class_names)


def segmentation_metrics(
    pred: Tensor, target: Tensor, num_classes: int, ignore_index: int = 255
) -> dict[str, Any]:
    """Metrics of predictions ``pred`` against labels ``target`` (integer tensors of one shape, any number
    of images): ``miou``, ``pixel_accuracy``, ``mean_accuracy``, per-class ``iou`` and ``accuracy``
    (see the module docstring for the conventions). For a whole dataset use
    :class:`SegmentationAccumulator`, which keeps only the confusion matrix."""
    return metrics_from_confusion(confusion_matrix(pred, target, num_classes, ignore_index))


class SegmentationAccumulator:
    """Streams predictions batch by batch into one ``(K, K)`` confusion matrix (nothing else is kept).

    ``update(pred, target)`` takes class indices ``(B, H, W)`` or logits ``(B, K, H, W)`` (argmax taken);
    ``compute()`` gives :func:`metrics_from_confusion`. Under DDP sum ``acc.confusion`` over ranks first
    (``torch.distributed.all_reduce``); ``merge`` adds another accumulator.
    """

    def __init__(self, num_classes: int, ignore_index: int = 255, device: torch.device | str = "cpu") -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)

    def update(self, pred: Tensor, target: Tensor) -> Tensor:
        """Add a batch; returns its own confusion matrix (e.g. for per-image records)."""
        if pred.is_floating_point():
            if pred.dim() != target.dim() + 1 or pred.shape[1] != self.num_classes:
                raise ValueError(f"logits must be (B, {self.num_classes}, H, W) for targets (B, H, W), got "
                                 f"{tuple(pred.shape)} and {tuple(target.shape)}")
            pred = pred.argmax(dim=1)
        conf = confusion_matrix(pred, target.to(pred.device), self.num_classes, self.ignore_index)
        self.confusion += conf.to(self.confusion.device)
        return conf

    def reset(self) -> None:
        self.confusion.zero_()

    def compute(self, class_names: Sequence[str] | None = None) -> dict[str, Any]:
        return metrics_from_confusion(self.confusion, class_names)
