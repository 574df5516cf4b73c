"""Image classification (``TrainConfig.task = "vision"``): timm ViTs on image datasets, cross-entropy
(label smoothing, Mixup / CutMix through timm), top-1 / top-5 held out, throughput in images/s, the
robustness suites of :mod:`.suites` (clean, corruptions, attacks; per-example bits) and the report
sections of :mod:`.report`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ..base import Objective, StudySections, autocast, sum_over_loader
from ..images import ImageTask
from .suites import ImageSuites, evaluate_image_suites, fixed_subset

__all__ = ["ImageClassification", "evaluate_vision", "FOLDER_DATASETS", "DEIT_TRANSFORM_FIELDS",
           "deit_options_set"]

#: datasets whose training transform is DeiT's (timm create_transform); the recipe's options go there
FOLDER_DATASETS = ("imagenet", "imagefolder")
#: the config fields of DeiT's transform (:data:`FOLDER_DATASETS` only)
DEIT_TRANSFORM_FIELDS = ("auto_augment", "color_jitter", "reprob", "remode", "recount", "train_interpolation")


def deit_options_set(cfg: Any) -> list[str]:
    """The DeiT transform fields of ``cfg`` set to other values than TrainConfig's defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    return [f"{name}={getattr(cfg, name)!r}" for name in DEIT_TRANSFORM_FIELDS
            if getattr(cfg, name) != defaults[name]]


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

    def step(x: torch.Tensor, y: torch.Tensor, sums: torch.Tensor) -> None:  # correct1, correct5, loss, n
        with autocast(device, amp):
            logits = model(x)
        logits = logits.float()
        k = min(5, logits.shape[-1])
        topk = logits.topk(k, dim=-1).indices
        hit = topk == y[:, None]
        sums[0] += hit[:, 0].sum()
        sums[1] += hit.any(dim=-1).sum()
        sums[2] += F.cross_entropy(logits, y, reduction="sum").double()
        sums[3] += y.numel()

    sums = sum_over_loader(model, loader, device, 4, step, progress=progress, desc=desc, counted=3)
    n = int(sums[3].item())  # a count: an int in evaluate's JSON
    return {"top1": sums[0].item() / n, "top5": sums[1].item() / n, "loss": sums[2].item() / n, "n": n}


class ImageClassification(ImageTask):
    """Image classification (see the module docstring)."""

    name = "vision"
    robustbench = True
    title = "image classification"
    held_out_metrics = ("top1", "top5", "loss")
    suites_type = ImageSuites
    config_fields = frozenset({"img_size", "hflip", "drop_path", "smoothing", "mixup", "cutmix", "mixup_prob",
                               "mixup_switch_prob", "mixup_mode", *DEIT_TRANSFORM_FIELDS})

    def owns_name(self, name: str) -> bool:
        """Any image model timm can build (this package's ViTs and FAN are registered there): the task of
        the image models no other task claims (:func:`~kpca_attention.tasks.of_model_name`)."""
        import timm

        return timm.is_model(name)

    def data_info(self, cfg: Any) -> Any:
        """The dataset's :class:`~kpca_attention.data.images.ImageDatasetInfo`."""
        from ...data.images import dataset_info

        return dataset_info(cfg.dataset, root=cfg.data_root if cfg.dataset in ("imagefolder",) else None)

    def builder(self, cfg: Any) -> Any:
        """ImageNet / ImageFolder trees get DeiT's training transform with the recipe's RandAugment /
        colour jitter / random erasing; small datasets their own light one."""
        from ...data.images import build_image_dataset

        kw: dict[str, Any] = {"hflip": cfg.hflip}
        if cfg.dataset in FOLDER_DATASETS:
            kw.update(auto_augment=cfg.auto_augment, color_jitter=cfg.color_jitter, re_prob=cfg.reprob,
                      re_mode=cfg.remode, re_count=cfg.recount, interpolation=cfg.train_interpolation)

        def build(split: str, augment: bool, subset: int | None) -> Any:
            unused = deit_options_set(cfg) if augment and cfg.dataset not in FOLDER_DATASETS else []
            if unused:  # never silently recorded as if applied
                raise ValueError(f"{', '.join(unused)}: DeiT's transform options apply to "
                                 f"{' and '.join(FOLDER_DATASETS)} only; {cfg.dataset}'s training transform "
                                 "is a padded random crop and a flip (hflip) - leave them at their defaults")
            extra = kw if split == "train" else {}  # the recipe's transform options (train split)
            return build_image_dataset(cfg.dataset, split, root=cfg.data_root, img_size=cfg.img_size,
                                       train_transform=augment, subset=subset, **extra)

        return build

    def objective(self, cfg: Any, info: Mapping[str, Any]) -> Objective:
        """Cross-entropy; label smoothing; timm's Mixup / CutMix with soft targets when asked for."""
        from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

        mix = None
        if cfg.mixup > 0 or cfg.cutmix > 0:
            from timm.data import Mixup

            if cfg.batch_size % 2:
                raise ValueError(f"Mixup/CutMix need an even batch size, got {cfg.batch_size}")
            mix = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                        switch_prob=cfg.mixup_switch_prob, mode=cfg.mixup_mode,
                        label_smoothing=cfg.smoothing, num_classes=info["num_classes"])
            criterion: nn.Module = SoftTargetCrossEntropy()
        elif cfg.smoothing > 0:
            criterion = LabelSmoothingCrossEntropy(smoothing=cfg.smoothing)
        else:
            criterion = nn.CrossEntropyLoss()
        return Objective(lambda net, x, y: criterion(net(x), y), mix)

    def evaluate(self, model: nn.Module, loader: Any, device: torch.device | str, *, cfg: Any,
                 amp: bool = False, progress: bool = False, desc: str = "eval") -> dict[str, float]:
        return evaluate_vision(model, loader, device, amp=amp, progress=progress, desc=desc)

    def evaluate_split(self, model: nn.Module, cfg: Any, split: str, *, subset: int | None, batch_size: int,
                       device: torch.device, progress: bool) -> dict[str, float]:
        data = self.split_set(cfg, split, subset)
        return evaluate_vision(model, self.loader(data, batch_size, cfg), device, progress=progress,
                               desc=f"evaluate {cfg.dataset}/{split}")

    def evaluate_suites(self, suites: ImageSuites, model: Any, cfg: Any, store: Any,
                        base_key: Mapping[str, Any], *, has_pap: bool = False, **kw: Any) -> dict[str, Any]:
        """:func:`~.suites.evaluate_image_suites` on the test split of ``cfg``'s dataset (or
        ``suites.split``: then named in every item's key - other images than the test split's items)."""
        data = self.test_set(cfg) if suites.split == "test" else self.builder(cfg)(suites.split, False, None)
        if suites.split != "test":  # items stored on the test split keep their key
            base_key = {**base_key, "split": suites.split}
        return evaluate_image_suites(model, data, suites, store, base_key, dataset=cfg.dataset,
                                     img_size=cfg.img_size, **kw)

    def trace_batches(self, suites: ImageSuites, cfg: Any, n: int) -> DataLoader:
        data = fixed_subset(self.test_set(cfg), n, suites.data_seed + 2)
        return DataLoader(data, batch_size=128, shuffle=False)

    def sections(self, settings: Mapping[str, Any]) -> StudySections:
        from .report import ClassificationSections

        return ClassificationSections(settings, self.throughput_key)
