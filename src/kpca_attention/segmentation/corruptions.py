"""Segmentation under common corruptions, as the RPC-Attention paper's ADE20K-C: the ImageNet-C
corruptions (:mod:`kpca_attention.robustness.corruptions`, ``imagecorruptions``) applied to the images,
the labels unchanged, at every severity.

Results are per image (:func:`~kpca_attention.segmentation.metrics.item_record`: the classes an image
touches with their intersection / prediction / label pixel counts), so a study can cache items and
:func:`~kpca_attention.segmentation.metrics.metrics_from_records` turns any set of them into dataset
metrics (mIoU is a ratio of dataset sums, not a mean of per-image scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm.auto import tqdm

from ..modules import eval_mode
from ..robustness.corruptions import (
    COMMON_CORRUPTIONS,
    SEVERITIES,
    check_corruption,
    corrupt,
    item_seed,
    tensor_to_uint8,
    uint8_to_tensor,
)
from .metrics import confusion_matrix, item_record, metrics_from_records

__all__ = ["CorruptedSegmentation", "segmentation_items", "evaluate_corrupted_segmentation", "CLEAN"]

#: the corruption name of the clean rows (severity 0)
CLEAN = "clean"


class CorruptedSegmentation(Dataset):
    """``self[i]`` = ``(corrupt(image_i), label_i)`` for ``base[i] = (image (C, H, W) in [0, 1], label)``.

    Image ``i`` is corrupted with the seed :func:`~kpca_attention.robustness.corruptions.item_seed`
    ``(seed, i, name, severity)``: the same in every process, worker and run. Labels pass through
    unchanged, as in the paper (the geometric corruptions - ``elastic_transform``, ``zoom_blur``,
    ``glass_blur`` - move image content a few pixels against them)."""

    def __init__(self, base: Dataset, name: str, severity: int, seed: int = 0) -> None:
        check_corruption(name, severity)
        self.base, self.name, self.severity, self.seed = base, name, int(severity), int(seed)

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, label = self.base[index]
        out = corrupt(tensor_to_uint8(image), self.name, self.severity,
                      seed=item_seed(self.seed, index, self.name, self.severity))
        return uint8_to_tensor(out), label


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


@torch.no_grad()
def segmentation_items(
    model: nn.Module,
    dataset: Dataset,
    num_classes: int,
    *,
    indices: Sequence[int] | None = None,
    batch_size: int = 8,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    ignore_index: int = 255,
    progress: bool = False,
    desc: str = "segment",
) -> list[dict[str, Any]]:
    """One record per image of ``dataset`` (or of ``indices``): ``{"index": i, "classes", "intersect",
    "pred", "label"}`` (see :func:`~kpca_attention.segmentation.metrics.item_record`).

    ``model`` maps images (B, C, H, W) in [0, 1] to logits (B, K, H, W) (a ``NormalizedModel`` around a
    Segmenter); logits are upsampled bilinearly to the label's size when it differs. Images of one
    shape are batched together; images of different sizes (ADE20K) go one shape group at a time.
    """
    device = torch.device(device)
    order = list(range(len(dataset))) if indices is None else [int(i) for i in indices]  # type: ignore[arg-type]
    loader = DataLoader(Subset(dataset, order), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=_as_list)
    records: list[dict[str, Any]] = []
    pos = 0
    with eval_mode(model):
        for batch in tqdm(loader, desc=desc, disable=None if progress else True, leave=False):
            groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
            for j, (x, y) in enumerate(batch):
                groups.setdefault((tuple(x.shape), tuple(y.shape)), []).append(j)
            out: list[dict[str, Any] | None] = [None] * len(batch)
            for members in groups.values():
                x = torch.stack([batch[j][0] for j in members]).to(device)
                y = torch.stack([torch.as_tensor(batch[j][1]) for j in members]).to(device)
                logits = model(x).float()
                if logits.shape[-2:] != y.shape[-2:]:
                    logits = F.interpolate(logits, size=y.shape[-2:], mode="bilinear", align_corners=False)
                pred = logits.argmax(dim=1)
                for k, j in enumerate(members):
                    conf = confusion_matrix(pred[k], y[k], num_classes, ignore_index)
                    out[j] = {"index": order[pos + j], **item_record(conf)}
            records.extend(r for r in out if r is not None)
            pos += len(batch)
    return records


def evaluate_corrupted_segmentation(
    model: nn.Module,
    dataset: Dataset,
    num_classes: int,
    corruptions: Sequence[str] = COMMON_CORRUPTIONS,
    severities: Sequence[int] = SEVERITIES,
    *,
    clean: bool = True,
    seed: int = 0,
    indices: Sequence[int] | None = None,
    batch_size: int = 8,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    ignore_index: int = 255,
    progress: bool = False,
    class_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Clean and corrupted segmentation metrics of ``model`` on ``dataset`` (labels unchanged).

    Returns:
        ``{"rows": [...], "summary": {...}}``. Each row is ``{"corruption", "severity", "metrics",
        "items"}`` - the clean row first (``corruption="clean"``, ``severity=0``), then every
        (corruption, severity); ``metrics`` holds ``miou``, ``mean_accuracy``, ``pixel_accuracy`` and the
        per-class lists, ``items`` the per-image records of :func:`segmentation_items`. ``summary`` gives
        the clean values and the means over all corrupted rows (``corrupted_miou``,
        ``corrupted_mean_accuracy``, ``corrupted_pixel_accuracy``) and per corruption (mean over severities).
    """
    for name in corruptions:
        for s in severities:
            check_corruption(name, s)
    views: list[tuple[str, int, Dataset]] = [(CLEAN, 0, dataset)] if clean else []
    views += [(n, int(s), CorruptedSegmentation(dataset, n, s, seed))
              for n in corruptions for s in severities]
    rows = []
    for name, sev, view in views:
        items = segmentation_items(model, view, num_classes, indices=indices, batch_size=batch_size,
                                   num_workers=num_workers, device=device, ignore_index=ignore_index,
                                   progress=progress, desc=f"{name} s{sev}" if sev else name)
        rows.append({"corruption": name, "severity": sev,
                     "metrics": metrics_from_records(items, num_classes, class_names), "items": items})
    keys = ("miou", "mean_accuracy", "pixel_accuracy")
    summary: dict[str, Any] = {}
    clean_rows = [r for r in rows if r["corruption"] == CLEAN]
    if clean_rows:
        summary.update({f"clean_{k}": clean_rows[0]["metrics"][k] for k in keys})
    corrupted = [r for r in rows if r["corruption"] != CLEAN]
    if corrupted:
        summary.update({f"corrupted_{k}": float(np.mean([r["metrics"][k] for r in corrupted])) for k in keys})
        summary["per_corruption"] = {
            n: {k: float(np.mean([r["metrics"][k] for r in corrupted if r["corruption"] == n])) for k in keys}
            for n in corruptions
        }
    return {"rows": rows, "summary": summary}
