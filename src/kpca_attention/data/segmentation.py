"""Semantic-segmentation datasets yielding ``(image, label)``: ``image`` float ``(C, H, W)`` in [0, 1],
``label`` int64 ``(H, W)`` with class indices and :data:`IGNORE_INDEX` (255) for unlabelled pixels.

=========================  ================================================================================
``fashion-mnist-scenes``   the embedded task: canvases (default 48 px, 1 channel) with 2-4 Fashion-MNIST
                           items at seeded positions and scales, generated deterministically from the Debian
                           package's images; label = item class + 1 where the item's pixel is above a
                           threshold, 0 (background) elsewhere; 11 classes. Train scenes use the training
                           images, val/test scenes the test images.
``ade20k``                 ADE20K as released (``ADEChallengeData2016``:
                           ``images/{training,validation}/*.jpg``,
                           ``annotations/{training,validation}/*.png``), 150 classes: label 0 ("other") ->
                           255, labels 1..150 -> 0..149 (mmseg's ``reduce_zero_label``).
=========================  ================================================================================

ADE20K transforms follow the Segmenter / mmseg ADE20K pipeline: training - resize to fit
``(4 * crop, crop) * r`` with ``r ~ U(0.5, 2)`` keeping the aspect ratio, random crop (``crop`` = 512; up to
10 draws until no class covers more than 75 % of the crop, mmseg's ``cat_max_ratio``), horizontal flip
(0.5), photometric distortion (brightness, contrast, saturation, hue, each with probability 0.5; saturation
and hue through torchvision's ``adjust_saturation`` / ``adjust_hue`` rather than mmseg's OpenCV HSV edit),
padding to the crop (image: the dataset mean, i.e. 0 after normalisation as mmseg; label: 255).
Validation - resize to fit ``(4 * crop, crop)`` keeping the ratio (short side 512); the label stays at the
original resolution (mmseg evaluates there: upsample the logits to the label's size).

Random draws use python's and torch's global RNGs, which :class:`kpca_attention.train.data.SeededAugmentation`
seeds per sample.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset, Subset
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from ..models.normalize import IMAGENET_MEAN, IMAGENET_STD
from .images import FASHION_MNIST_CLASSES, ImageDatasetInfo, build_image_dataset
from .sampling import seeded_indices

__all__ = [
    "IGNORE_INDEX",
    "SEGMENTATION_DATASETS",
    "SceneSpec",
    "FashionMNISTScenes",
    "ADE20KSegmentation",
    "segmentation_info",
    "build_segmentation_dataset",
]

IGNORE_INDEX = 255
SEGMENTATION_DATASETS: tuple[str, ...] = ("fashion-mnist-scenes", "ade20k")
SCENE_CLASSES: tuple[str, ...] = ("background", *FASHION_MNIST_CLASSES)
ADE20K_NUM_CLASSES = 150
_ADE_SPLITS = {"train": "training", "val": "validation", "test": "validation"}

# Pixel mean / std of the first 4000 training scenes at 48 px (the default SceneSpec); at 32 px they are
# 0.147 / 0.279.
_SCENES_MEAN, _SCENES_STD = (0.1449,), (0.2850,)


def _check_name(name: str) -> str:
    key = name.lower().replace("_", "-")
    if key not in SEGMENTATION_DATASETS:
        raise ValueError(f"unknown segmentation dataset {name!r}; valid: {', '.join(SEGMENTATION_DATASETS)}")
    return key


def segmentation_info(name: str, img_size: int | None = None, root: str | os.PathLike | None = None
                      ) -> ImageDatasetInfo:
    """Classes (the ignore index not counted), channels, training window / canvas size, normalisation
    statistics and class names (ADE20K: read from ``objectInfo150.txt`` in ``root`` when present)."""
    key = _check_name(name)
    if key == "fashion-mnist-scenes":
        return ImageDatasetInfo(len(SCENE_CLASSES), 1, img_size or 48, _SCENES_MEAN, _SCENES_STD,
                                SCENE_CLASSES)
    names = _ade_class_names(Path(root)) if root is not None else None
    return ImageDatasetInfo(ADE20K_NUM_CLASSES, 3, img_size or 512, IMAGENET_MEAN, IMAGENET_STD, names)


# ----------------------------------------------------------------------------- Fashion-MNIST scenes

@dataclass(frozen=True)
class SceneSpec:
    """How scenes are drawn: canvas side, items per scene (inclusive range), item side as a fraction of the
    canvas (inclusive range), and the threshold (fraction of 255) above which an item pixel is labelled."""

    canvas: int = 48
    items: tuple[int, int] = (2, 4)
    scale: tuple[float, float] = (1 / 3, 7 / 12)
    threshold: float = 0.25

    def __post_init__(self) -> None:
        if self.canvas < 8:
            raise ValueError(f"canvas must be >= 8 px, got {self.canvas}")
        lo, hi = self.items
        if not 1 <= lo <= hi:
            raise ValueError(f"items must be (min, max) with 1 <= min <= max, got {self.items}")
        s_lo, s_hi = self.scale
        if not 0 < s_lo <= s_hi <= 1:
            raise ValueError(f"scale must be (min, max) fractions with 0 < min <= max <= 1, got {self.scale}")
        if not 0 <= self.threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {self.threshold}")

    @property
    def sizes(self) -> tuple[int, int]:
        return max(4, round(self.scale[0] * self.canvas)), max(4, round(self.scale[1] * self.canvas))


class FashionMNISTScenes(Dataset):
    """Dense-prediction scenes composed from Fashion-MNIST items, a pure function of ``(seed, split, index)``.

    Scene ``i`` holds source image ``i`` (so an epoch sees every image once) plus 1-3 others drawn at random,
    each resized to a random side in ``spec.sizes`` and pasted at a random position; later items occlude
    earlier ones where their pixels exceed ``spec.threshold``. Labels: class + 1 there, 0 elsewhere.

    Args:
        split: ``"train"`` (the 60k training images) or ``"val"`` / ``"test"`` (the 10k test images).
        spec: the scene layout (:class:`SceneSpec`).
        hflip: probability of a horizontal flip of image and label (training augmentation; 0 for eval).
        root: Fashion-MNIST folder (default: the Debian package's).
        seed: scene layout seed (fixed per dataset, not per training run).
    """

    def __init__(self, split: str = "train", spec: SceneSpec | None = None, *, hflip: float = 0.0,
                 root: str | os.PathLike | None = None, seed: int = 0) -> None:
        if split not in _ADE_SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(_ADE_SPLITS)}")
        if not 0 <= hflip <= 1:
            raise ValueError(f"hflip must be a probability in [0, 1], got {hflip}")
        source = build_image_dataset("fashion-mnist", "train" if split == "train" else "test", root=root)
        self.images: Tensor = source.images  # (N, 1, 28, 28) uint8
        self.item_labels: Tensor = source.labels
        self.split, self.spec, self.hflip, self.seed = split, spec or SceneSpec(), hflip, seed
        self.classes = list(SCENE_CLASSES)
        self._split_id = 0 if split == "train" else 1

    def __len__(self) -> int:
        return self.images.shape[0]

    def scene(self, index: int) -> tuple[Tensor, Tensor]:
        """The un-augmented scene ``index``: uint8 ``(1, S, S)`` and int64 labels ``(S, S)``."""
        if not 0 <= index < len(self):
            raise IndexError(f"scene {index} out of range 0..{len(self) - 1}")
        spec = self.spec
        rng = np.random.default_rng([self.seed, self._split_id, index])
        n_items = int(rng.integers(spec.items[0], spec.items[1] + 1))
        sources = [index, *rng.integers(0, len(self), size=n_items - 1).tolist()]
        lo, hi = spec.sizes
        c = spec.canvas
        canvas = torch.zeros(1, c, c, dtype=torch.uint8)
        label = torch.zeros(c, c, dtype=torch.int64)
        cut = round(spec.threshold * 255)
        for src in sources:
            side = int(rng.integers(lo, min(hi, c) + 1))
            top, left = (int(v) for v in rng.integers(0, c - side + 1, size=2))
            item = F.interpolate(self.images[src][None].float(), size=(side, side), mode="bilinear",
                                 antialias=True, align_corners=False)[0]
            item = item.round().clamp(0, 255).to(torch.uint8)  # (1, side, side)
            mask = item[0] > cut
            region = canvas[:, top : top + side, left : left + side]
            region[:, mask] = item[:, mask]
            label[top : top + side, left : left + side][mask] = int(self.item_labels[src]) + 1
        return canvas, label

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, label = self.scene(index)
        x = image.float().div_(255.0)
        if self.hflip > 0 and torch.rand(()).item() < self.hflip:
            x, label = x.flip(-1), label.flip(-1)
        return x, label


# ----------------------------------------------------------------------------- ADE20K

def _ade_class_names(root: Path) -> tuple[str, ...] | None:
    """Class names from the release's ``objectInfo150.txt`` (tab-separated: Idx, Ratio, Train, Val, Name)."""
    path = root / "objectInfo150.txt"
    if not path.is_file():
        return None
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    names = tuple(r[-1].split(";")[0].strip() for r in rows)
    return names if len(names) == ADE20K_NUM_CLASSES else None


def _rescale_size(h: int, w: int, long_edge: float, short_edge: float) -> tuple[int, int]:
    """mmcv's ``imrescale``: the largest size with the aspect ratio of ``(h, w)`` fitting in the scale."""
    factor = min(long_edge / max(h, w), short_edge / min(h, w))
    return int(h * factor + 0.5), int(w * factor + 0.5)


def _photometric(x: Tensor) -> Tensor:
    """mmseg's ``PhotoMetricDistortion`` on an image in [0, 1]: brightness +-32/255, contrast x[0.5, 1.5]
    (before or after the colour edits), saturation x[0.5, 1.5], hue +-18/180 of the circle; each p = 0.5."""
    def coin() -> bool:
        return random.random() < 0.5

    if coin():
        x = (x + random.uniform(-32, 32) / 255.0).clamp(0, 1)
    contrast_first = coin()

    def contrast(img: Tensor) -> Tensor:
        return (img * random.uniform(0.5, 1.5)).clamp(0, 1) if coin() else img

    if contrast_first:
        x = contrast(x)
    if coin():
        x = TF.adjust_saturation(x, random.uniform(0.5, 1.5))
    if coin():
        x = TF.adjust_hue(x, random.randint(-18, 18) / 180.0)
    if not contrast_first:
        x = contrast(x)
    return x


class ADE20KSegmentation(Dataset):
    """ADE20K (SceneParsing, ``ADEChallengeData2016``) with the Segmenter / mmseg transforms.

    Args:
        root: the folder holding ``images/`` and ``annotations/``.
        split: ``"train"`` (``training``) or ``"val"`` / ``"test"`` (``validation``: ADE20K's test labels are
            not public).
        train_transform: the training pipeline (resize with ratio range, crop, flip, photometric); else the
            validation resize.
        crop_size: training crop and short side of the validation resize (512).
        ratio_range: the training resize's random ratio range ((0.5, 2.0)).
        cat_max_ratio: crop redraws until no class covers more than this fraction (0.75; 1 disables).
        hflip: flip probability (0.5).
        photometric: apply the photometric distortion (True).
    """

    def __init__(self, root: str | os.PathLike, split: str = "train", *, train_transform: bool = False,
                 crop_size: int = 512, ratio_range: tuple[float, float] = (0.5, 2.0),
                 cat_max_ratio: float = 0.75, hflip: float = 0.5, photometric: bool = True) -> None:
        if split not in _ADE_SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(_ADE_SPLITS)}")
        base = Path(root).expanduser()
        img_dir, ann_dir = base / "images" / _ADE_SPLITS[split], base / "annotations" / _ADE_SPLITS[split]
        if not img_dir.is_dir() or not ann_dir.is_dir():
            raise FileNotFoundError(
                f"ade20k: expected the released ADEChallengeData2016 layout under {base}: {img_dir} and "
                f"{ann_dir} (images/*.jpg, annotations/*.png); nothing is downloaded")
        self.images = sorted(img_dir.glob("*.jpg"))
        if not self.images:
            raise FileNotFoundError(f"ade20k: no .jpg images in {img_dir}")
        self.annotations = [ann_dir / (p.stem + ".png") for p in self.images]
        missing = [p.name for p in self.annotations if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"ade20k: {len(missing)} annotation(s) missing in {ann_dir}, "
                                    f"e.g. {missing[0]}")
        if crop_size < 1:
            raise ValueError(f"crop_size must be >= 1, got {crop_size}")
        self.split, self.train_transform, self.crop_size = split, train_transform, crop_size
        self.ratio_range, self.cat_max_ratio, self.hflip, self.photometric = (
            ratio_range, cat_max_ratio, hflip, photometric)
        self.classes = list(_ade_class_names(base) or [str(i) for i in range(ADE20K_NUM_CLASSES)])

    def __len__(self) -> int:
        return len(self.images)

    def read(self, index: int) -> tuple[Tensor, Tensor]:
        """The raw image uint8 ``(3, H, W)`` and the label mapped to 0..149 / 255, int64 ``(H, W)``."""
        from PIL import Image

        with Image.open(self.images[index]) as im:
            image = torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1)
        with Image.open(self.annotations[index]) as an:
            raw = torch.from_numpy(np.asarray(an).astype(np.int64))
        if raw.dim() != 2 or raw.shape != image.shape[1:]:
            raise ValueError(f"{self.annotations[index]}: label {tuple(raw.shape)} does not match image "
                             f"{tuple(image.shape[1:])} (expected a single-channel PNG)")
        label = torch.where(raw == 0, IGNORE_INDEX, raw - 1)  # reduce_zero_label
        return image, label

    def _crop_box(self, h: int, w: int) -> tuple[int, int, int, int]:
        ch, cw = min(self.crop_size, h), min(self.crop_size, w)
        top = random.randint(0, h - ch)
        left = random.randint(0, w - cw)
        return top, left, ch, cw

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, label = self.read(index)
        h, w = image.shape[1:]
        crop = self.crop_size
        if not self.train_transform:
            size = _rescale_size(h, w, 4 * crop, crop)
            x = TF.resize(image, list(size), interpolation=InterpolationMode.BILINEAR, antialias=True)
            return x.float().div_(255.0), label
        ratio = random.uniform(*self.ratio_range)
        size = _rescale_size(h, w, 4 * crop * ratio, crop * ratio)
        x = TF.resize(image, list(size), interpolation=InterpolationMode.BILINEAR, antialias=True)
        y = TF.resize(label[None], list(size), interpolation=InterpolationMode.NEAREST)[0]
        box = self._crop_box(*size)
        if self.cat_max_ratio < 1:
            for _ in range(10):
                top, left, ch, cw = box
                window = y[top : top + ch, left : left + cw]
                counts = torch.bincount(window[window != IGNORE_INDEX].flatten(), minlength=1)
                counts = counts[counts > 0]
                if len(counts) > 1 and counts.max().item() / counts.sum().item() < self.cat_max_ratio:
                    break
                box = self._crop_box(*size)
        top, left, ch, cw = box
        x, y = x[:, top : top + ch, left : left + cw], y[top : top + ch, left : left + cw]
        if random.random() < self.hflip:
            x, y = x.flip(-1), y.flip(-1)
        xf = x.float().div_(255.0)
        if self.photometric:
            xf = _photometric(xf)
        if ch < crop or cw < crop:
            mean = torch.tensor(IMAGENET_MEAN, dtype=xf.dtype).view(3, 1, 1)
            padded = mean.expand(3, crop, crop).clone()
            padded[:, :ch, :cw] = xf
            y_pad = torch.full((crop, crop), IGNORE_INDEX, dtype=torch.int64)
            y_pad[:ch, :cw] = y
            xf, y = padded, y_pad
        return xf, y


# ----------------------------------------------------------------------------- entry point

def build_segmentation_dataset(
    name: str,
    split: str,
    root: str | os.PathLike | None = None,
    img_size: int | None = None,
    train_transform: bool = False,
    *,
    hflip: float = 0.5,
    subset: int | None = None,
    subset_seed: int | None = 0,
) -> Dataset:
    """A dataset of ``(image (C, H, W) float in [0, 1], label (H, W) int64)``.

    Args:
        name: ``"fashion-mnist-scenes"`` or ``"ade20k"``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        root: ADE20K's ``ADEChallengeData2016`` folder (required); for the scenes the Fashion-MNIST folder.
        img_size: scenes: the canvas (48); ADE20K: the crop (512).
        train_transform: augment (scenes: flip with ``hflip``; ADE20K: see :class:`ADE20KSegmentation`).
        subset: keep this many items, a random sample drawn with ``subset_seed`` (first N if None).
    """
    key = _check_name(name)
    ds: Dataset
    if key == "fashion-mnist-scenes":
        ds = FashionMNISTScenes(split, SceneSpec(canvas=img_size or 48),
                                hflip=hflip if train_transform else 0.0, root=root)
    else:
        if root is None:
            raise ValueError("ade20k: root= (data_root) is required: the ADEChallengeData2016 folder; "
                             "nothing is downloaded")
        ds = ADE20KSegmentation(root, split, train_transform=train_transform, crop_size=img_size or 512,
                                hflip=hflip)
    if subset is not None:
        if subset < 1:
            raise ValueError(f"subset must be >= 1, got {subset}")
        n = len(ds)
        if subset < n:
            if subset_seed is None:
                idx = list(range(subset))
            else:
                idx = seeded_indices(n, subset, subset_seed)
            ds = Subset(ds, idx)
    return ds
