"""Model and dataset construction from a :class:`TrainConfig` (shared by training, evaluation and
:func:`kpca_attention.train.load_model`, so a checkpoint always rebuilds the model it was made with)."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.data import Dataset

from .config import TrainConfig

__all__ = ["build_model", "vision_datasets", "segmentation_datasets", "lm_datasets", "vision_info"]

#: datasets whose training transform is DeiT's (timm create_transform); the recipe's options go there
_FOLDER_DATASETS = ("imagenet", "imagefolder")


def vision_info(cfg: TrainConfig) -> Any:
    """The dataset's :class:`~kpca_attention.data.images.ImageDatasetInfo` (classes, channels, size,
    statistics)."""
    if cfg.task == "segmentation":
        from ..data.segmentation import segmentation_info

        return segmentation_info(cfg.dataset, img_size=cfg.img_size)
    from ..data.images import dataset_info

    return dataset_info(cfg.dataset, root=cfg.data_root if cfg.dataset in ("imagefolder",) else None)


def build_model(cfg: TrainConfig, vocab: Any | None = None) -> nn.Module:
    """The model of ``cfg``: vision models wrapped in ``NormalizedModel`` (they take [0, 1] images);
    language models get ``vocab`` (default: built from the corpus) as ``model.vocab``."""
    from ..models import NormalizedModel, create_model

    if cfg.task in ("vision", "segmentation"):
        info = vision_info(cfg)
        net = create_model(
            cfg.model,
            num_classes=info.num_classes,
            in_chans=info.in_chans,
            img_size=cfg.img_size or info.img_size,
            drop_path_rate=cfg.drop_path,
            **cfg.model_kwargs,
        )
        return NormalizedModel(net, info.mean, info.std)
    from .lm import build_lm

    return build_lm(cfg, vocab)


Splits = tuple[Dataset, "Dataset | None", dict[str, Any]]


def vision_datasets(cfg: TrainConfig, *, with_eval: bool = True) -> Splits:
    """``(train, eval, info)`` for a vision config. ImageNet/ImageFolder trees get DeiT's transform with
    the recipe's RandAugment / colour jitter / random erasing; small datasets their own light one."""
    from ..data.images import build_image_dataset

    info = vision_info(cfg)
    kw: dict[str, Any] = {}
    if cfg.dataset in _FOLDER_DATASETS:
        kw = dict(auto_augment=cfg.auto_augment, color_jitter=cfg.color_jitter, re_prob=cfg.reprob,
                  re_mode=cfg.remode, re_count=cfg.recount, hflip=cfg.hflip,
                  interpolation=cfg.train_interpolation)
    train = build_image_dataset(cfg.dataset, "train", root=cfg.data_root, img_size=cfg.img_size,
                                train_transform=cfg.augment, subset=cfg.train_subset, **kw)
    ev = None
    if with_eval:
        ev = build_image_dataset(cfg.dataset, "val", root=cfg.data_root, img_size=cfg.img_size,
                                 train_transform=False, subset=cfg.eval_subset)
    return train, ev, {"num_classes": info.num_classes, "in_chans": info.in_chans}


def segmentation_datasets(cfg: TrainConfig, *, with_eval: bool = True) -> Splits:
    """``(train, eval, info)`` for a segmentation config (:mod:`kpca_attention.data.segmentation`):
    training augmentation when ``cfg.augment`` (flip with ``cfg.hflip``; ADE20K: resize, crop, flip,
    photometric distortion), evaluation on the ``val`` split."""
    from ..data.segmentation import build_segmentation_dataset

    info = vision_info(cfg)
    train = build_segmentation_dataset(cfg.dataset, "train", root=cfg.data_root, img_size=cfg.img_size,
                                       train_transform=cfg.augment, hflip=cfg.hflip, subset=cfg.train_subset)
    ev = None
    if with_eval:
        ev = build_segmentation_dataset(cfg.dataset, "val", root=cfg.data_root, img_size=cfg.img_size,
                                        subset=cfg.eval_subset)
    return train, ev, {"num_classes": info.num_classes, "in_chans": info.in_chans}


def lm_datasets(cfg: TrainConfig, *, with_eval: bool = True) -> Splits:
    from .lm import lm_datasets as _lm

    return _lm(cfg, with_eval=with_eval)
