"""Semantic segmentation (``TrainConfig.task = "segmentation"``): Segmenters (a ViT encoder and a linear or
mask-transformer decoder) on the Fashion-MNIST scenes or ADE20K, per-pixel cross-entropy (255 marks
unlabelled pixels), mIoU / mean accuracy / pixel accuracy held out, throughput in images/s, the suites
of :mod:`.suites` (clean and corrupted, per-image pixel counts) and the report sections of :mod:`.report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ..base import Objective, StudySections, all_reduce_sum, autocast, sum_over_loader
from ..images import ImageTask, fixed_subset
from .suites import SegmentationSuites, evaluate_segmentation_suites

__all__ = ["SemanticSegmentation", "evaluate_segmentation"]


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
    from ...segmentation import SegmentationAccumulator

    device = torch.device(device)
    acc = SegmentationAccumulator(num_classes, ignore_index, device=device)

    def step(x: torch.Tensor, y: torch.Tensor, loss_sum: torch.Tensor) -> None:  # cross-entropy, pixels
        with autocast(device, amp):
            logits = model(x)
        logits = logits.float()
        if logits.shape[-2:] != y.shape[-2:]:
            logits = F.interpolate(logits, size=y.shape[-2:], mode="bilinear", align_corners=False)
        loss_sum[0] += F.cross_entropy(logits, y, ignore_index=ignore_index, reduction="sum").double()
        loss_sum[1] += (y != ignore_index).sum()
        acc.update(logits.argmax(dim=1), y)

    loss_sum = sum_over_loader(model, loader, device, 2, step, progress=progress, desc=desc)
    all_reduce_sum(acc.confusion)
    m = acc.compute()
    return {"miou": m["miou"], "mean_accuracy": m["mean_accuracy"], "pixel_accuracy": m["pixel_accuracy"],
            "loss": loss_sum[0].item() / max(loss_sum[1].item(), 1.0), "pixels": int(m["pixels"])}


class SemanticSegmentation(ImageTask):
    """Semantic segmentation (see the module docstring)."""

    name = "segmentation"
    title = "semantic segmentation"
    held_out_metrics = ("miou", "mean_accuracy", "pixel_accuracy", "loss")
    dense = True
    suites_type = SegmentationSuites
    config_fields = frozenset({"img_size", "hflip", "drop_path", "smoothing"})

    def owns(self, model: nn.Module) -> bool:
        from ...models.segmenter import Segmenter

        return isinstance(getattr(model, "model", model), Segmenter)

    def owns_name(self, name: str) -> bool:
        from ...models.family import FAMILY_SEGMENTATION_MODELS
        from ...models.segmenter import SEGMENTATION_MODELS

        return name in SEGMENTATION_MODELS or name in FAMILY_SEGMENTATION_MODELS

    def check_config(self, cfg: Any) -> None:
        if cfg.mixup > 0 or cfg.cutmix > 0:
            raise ValueError(f"task {self.name!r} takes no Mixup/CutMix (they mix labels of whole images); "
                             f"got mixup={cfg.mixup}, cutmix={cfg.cutmix}")

    def data_info(self, cfg: Any) -> Any:
        """The dataset's :class:`~kpca_attention.data.images.ImageDatasetInfo` (the scenes' or ADE20K's)."""
        from ...data.segmentation import segmentation_info

        return segmentation_info(cfg.dataset, img_size=cfg.img_size)

    def builder(self, cfg: Any) -> Any:
        """Training augmentation when asked (flip with ``cfg.hflip``; ADE20K: resize, crop, flip,
        photometric distortion); held-out splits as they are."""
        from ...data.segmentation import build_segmentation_dataset

        def build(split: str, augment: bool, subset: int | None) -> Any:
            where = dict(root=cfg.data_root, img_size=cfg.img_size)
            if split == "train":  # augmented or not (the un-augmented training data: the validation split)
                return build_segmentation_dataset(cfg.dataset, split, **where, train_transform=augment,
                                                  hflip=cfg.hflip, subset=subset)
            return build_segmentation_dataset(cfg.dataset, split, **where, subset=subset)

        return build

    def objective(self, cfg: Any, info: Mapping[str, Any]) -> Objective:
        """Per-pixel cross-entropy; 255 marks unlabelled pixels."""
        criterion = nn.CrossEntropyLoss(ignore_index=255, label_smoothing=cfg.smoothing)
        return Objective(lambda net, x, y: criterion(net(x), y))

    def evaluate(self, model: nn.Module, loader: Any, device: torch.device | str, *, cfg: Any,
                 amp: bool = False, progress: bool = False, desc: str = "eval") -> dict[str, float]:
        return evaluate_segmentation(model, loader, device, num_classes=self.data_info(cfg).num_classes,
                                     amp=amp, progress=progress, desc=desc)

    def evaluate_split(self, model: nn.Module, cfg: Any, split: str, *, subset: int | None, batch_size: int,
                       device: torch.device, progress: bool) -> dict[str, float]:
        data = self.split_set(cfg, split, subset)
        return evaluate_segmentation(model, self.loader(data, batch_size, cfg), device,
                                     num_classes=self.data_info(cfg).num_classes, progress=progress,
                                     desc=f"evaluate {cfg.dataset}/{split}")

    def evaluate_suites(self, suites: SegmentationSuites, model: Any, cfg: Any, store: Any,
                        base_key: Mapping[str, Any], *, has_pap: bool = False, **kw: Any) -> dict[str, Any]:
        """:func:`~.suites.evaluate_segmentation_suites` on the test split of ``cfg``'s dataset."""
        from ...data.segmentation import segmentation_info

        info = segmentation_info(cfg.dataset, cfg.img_size, cfg.data_root)
        return evaluate_segmentation_suites(model, self.test_set(cfg), suites, store, base_key,
                                            num_classes=info.num_classes, class_names=info.class_names, **kw)

    def trace_batches(self, suites: SegmentationSuites, cfg: Any, n: int) -> DataLoader:
        """``n`` fixed test scenes in batches of ``(images, labels)``."""
        data = fixed_subset(self.test_set(cfg), n, suites.data_seed + 2)
        return DataLoader(data, batch_size=min(128, suites.batch_size), shuffle=False)

    def sections(self, settings: Mapping[str, Any]) -> StudySections:
        from .report import SegmentationSections

        return SegmentationSections(settings, self.throughput_key)
