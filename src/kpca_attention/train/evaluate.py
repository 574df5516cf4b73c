"""Evaluation: top-1/top-5 accuracy for vision models, perplexity for language models, mIoU / mean
accuracy / pixel accuracy for segmentation models.

``kpca-attention evaluate CHECKPOINT [--dataset NAME] [--split val] [--ema]`` rebuilds the model with
:func:`kpca_attention.train.load_model` and prints (and optionally writes as JSON) the metrics.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..checks import check_choice, check_int
from .config import check_device
from .distributed import all_reduce_sum

__all__ = ["evaluate_vision", "evaluate_lm", "evaluate_segmentation", "evaluate_checkpoint"]


def _autocast(device: torch.device, amp: bool) -> Any:
    return torch.autocast(device.type, dtype=torch.bfloat16 if device.type == "cpu" else torch.float16) \
        if amp else nullcontext()


@torch.no_grad()
def evaluate_vision(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device | str = "cpu",
    *,
    amp: bool = False,
    progress: bool = False,
    desc: str = "eval",
) -> dict[str, float]:
    """Top-1 / top-5 accuracy (fractions) and mean cross-entropy over ``loader`` of (images, labels),
    images (B, C, H, W) in [0, 1]. Under DDP each rank passes its shard; counts are summed over ranks."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # correct1, correct5, loss_sum, n
    for x, y in tqdm(loader, desc=desc, disable=None if progress else True, leave=False):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with _autocast(device, amp):
            logits = model(x)
        logits = logits.float()
        k = min(5, logits.shape[-1])
        topk = logits.topk(k, dim=-1).indices
        hit = topk == y[:, None]
        sums[0] += hit[:, 0].sum()
        sums[1] += hit.any(dim=-1).sum()
        sums[2] += F.cross_entropy(logits, y, reduction="sum").double()
        sums[3] += y.numel()
    all_reduce_sum(sums)
    model.train(was_training)
    if sums[3].item() == 0:
        raise ValueError(f"{desc}: no examples to evaluate (the loader is empty)")
    n = sums[3].item()
    return {"top1": sums[0].item() / n, "top5": sums[1].item() / n, "loss": sums[2].item() / n,
            "n": sums[3].item()}


@torch.no_grad()
def evaluate_segmentation(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device | str = "cpu",
    *,
    num_classes: int,
    ignore_index: int = 255,
    amp: bool = False,
    progress: bool = False,
    desc: str = "eval",
) -> dict[str, float]:
    """mIoU, mean accuracy, pixel accuracy (mmseg's conventions, see
    :mod:`kpca_attention.segmentation.metrics`) and mean per-pixel cross-entropy over ``loader`` of
    (images (B, C, H, W) in [0, 1], labels (B, H', W')). Logits are upsampled bilinearly to the labels'
    size when it differs (ADE20K validation labels stay at the original resolution). Under DDP each rank
    passes its shard; the confusion matrices are summed over ranks."""
    from ..segmentation import SegmentationAccumulator

    device = torch.device(device)
    was_training = model.training
    model.eval()
    acc = SegmentationAccumulator(num_classes, ignore_index, device=device)
    loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # cross-entropy sum, labelled pixels
    for x, y in tqdm(loader, desc=desc, disable=None if progress else True, leave=False):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with _autocast(device, amp):
            logits = model(x)
        logits = logits.float()
        if logits.shape[-2:] != y.shape[-2:]:
            logits = F.interpolate(logits, size=y.shape[-2:], mode="bilinear", align_corners=False)
        loss_sum[0] += F.cross_entropy(logits, y, ignore_index=ignore_index, reduction="sum").double()
        loss_sum[1] += (y != ignore_index).sum()
        acc.update(logits.argmax(dim=1), y)
    all_reduce_sum(acc.confusion)
    all_reduce_sum(loss_sum)
    model.train(was_training)
    m = acc.compute()
    return {"miou": m["miou"], "mean_accuracy": m["mean_accuracy"], "pixel_accuracy": m["pixel_accuracy"],
            "loss": loss_sum[0].item() / max(loss_sum[1].item(), 1.0), "pixels": float(m["pixels"])}


@torch.no_grad()
def evaluate_lm(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device | str = "cpu",
    *,
    amp: bool = False,
    progress: bool = False,
    desc: str = "eval",
) -> dict[str, float]:
    """Token-level cross-entropy and perplexity over non-overlapping windows ``(x, y)`` (B, L).

    This is the fast per-epoch estimate; the paper's sliding-window protocol is
    :func:`kpca_attention.models.lm.perplexity` (used by ``kpca-attention evaluate``)."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss_sum, tokens
    for x, y in tqdm(loader, desc=desc, disable=None if progress else True, leave=False):
        x, y = x.to(device), y.to(device)
        with _autocast(device, amp):
            _, loss = model(x, y)
        sums[0] += loss.double() * y.numel()
        sums[1] += y.numel()
    all_reduce_sum(sums)
    model.train(was_training)
    if sums[1].item() == 0:
        raise ValueError(f"{desc}: no tokens to evaluate (the loader is empty)")
    n = sums[1].item()
    mean = sums[0].item() / n
    return {"loss": mean, "ppl": math.exp(min(mean, 700.0)), "tokens": sums[1].item()}


def evaluate_checkpoint(
    path: str,
    *,
    dataset: str | None = None,
    split: str = "val",
    data_root: str | None = None,
    subset: int | None = None,
    batch_size: int | None = None,
    ema: bool = False,
    device: str = "auto",
    progress: bool = True,
    stride: int = 1,
) -> dict[str, Any]:
    """Metrics of a checkpoint on a dataset (default: the one it was trained on).

    Vision: top-1/top-5 on ``split``; segmentation: mIoU, mean and pixel accuracy; ``subset`` = number of
    images. LMs: sliding-window perplexity
    (window = training context, ``stride`` 1 = the paper's protocol); ``subset`` = first N tokens.

    Raises:
        ValueError: before the checkpoint is loaded, for a ``split`` other than train / val / valid /
            test, a ``subset``, ``batch_size`` or ``stride`` that is not an integer >= 1 (None: all /
            the config's ``eval_batch_size``), or a ``device`` other than auto / cpu / cuda."""
    from .checkpoint import load_model
    from .distributed import resolve_device

    check_choice(split, "split", ("train", "val", "valid", "test"))
    check_int(subset, "subset", min=1, allow_none=True)
    check_int(batch_size, "batch_size", min=1, allow_none=True)
    check_int(stride, "stride", min=1)
    check_device(device)

    dev = resolve_device(device)
    model, cfg = load_model(path, dev, ema=ema)
    if dataset is not None:
        cfg.dataset = dataset
    if data_root is not None:
        cfg.data_root = data_root
    bs = cfg.eval_batch_size if batch_size is None else batch_size
    if cfg.task == "segmentation":
        from ..data.segmentation import build_segmentation_dataset
        from .build import vision_info

        ds = build_segmentation_dataset(cfg.dataset, split, root=cfg.data_root, img_size=cfg.img_size,
                                        subset=subset)
        loader = DataLoader(ds, batch_size=bs, shuffle=False, num_workers=cfg.num_workers)
        metrics = evaluate_segmentation(model, loader, dev, num_classes=vision_info(cfg).num_classes,
                                        progress=progress, desc=f"evaluate {cfg.dataset}/{split}")
    elif cfg.task == "vision":
        from ..data.images import build_image_dataset

        ds = build_image_dataset(cfg.dataset, split, root=cfg.data_root, img_size=cfg.img_size, subset=subset)
        loader = DataLoader(ds, batch_size=bs, shuffle=False, num_workers=cfg.num_workers)
        metrics = evaluate_vision(model, loader, dev, progress=progress,
                                  desc=f"evaluate {cfg.dataset}/{split}")
    else:
        from .lm import lm_sliding_perplexity

        metrics = lm_sliding_perplexity(model, cfg, split=split, subset=subset, stride=stride,
                                        batch_size=bs, device=dev, progress=progress)
    return {"checkpoint": str(path), "model": cfg.model, "dataset": cfg.dataset, "split": split, **metrics}
