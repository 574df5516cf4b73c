"""Image datasets yielding ``(image, label)`` with ``image`` a float tensor ``(C, H, W)`` in [0, 1].

Normalisation is left to the model (:class:`kpca_attention.models.NormalizedModel` with the ``mean`` and
``std`` of :func:`dataset_info`), so corruptions and attacks work in pixel space.

=================  ==========================================================================================
``fashion-mnist``  the embedded default: Debian package ``dataset-fashion-mnist`` (idx files under
                   ``/usr/share/datasets/fashion-mnist``), 60k train / 10k test, 1 x 28 x 28, 10 classes
``digits``         scikit-learn's 8 x 8 digits (1797 images, shipped with scikit-learn), resized to 28 px by
                   default so the ``*_mini_patch4_28`` models apply unchanged; a fixed seeded 80/20 split;
                   a tiny fallback for tests
``imagenet``       ImageNet-1K as an ImageFolder tree ``root/{train,val}/<wnid>/*.JPEG``; DeiT transforms
                   through ``timm.data.create_transform``
``imagefolder``    any ImageFolder tree ``root/<split>/<class>/*``
``cifar10/100``    torchvision's ``cifar-10-batches-py`` / ``cifar-100-python`` under ``root`` (read with
                   ``download=False``), or an ImageFolder tree ``root/{train,test}/<class>/*.png``
=================  ==========================================================================================

Splits: ``"train"``, ``"test"`` and ``"val"``. Datasets with only one held-out set (Fashion-MNIST, digits,
CIFAR, ImageNet's ``val``) answer both ``"test"`` and ``"val"`` with it.
"""

from __future__ import annotations

import functools
import gzip
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset
from torchvision.transforms import v2

from ..checks import check_int, check_real
from ..models.normalize import IMAGENET_MEAN, IMAGENET_STD
from .sampling import seeded_indices

__all__ = [
    "ImageDatasetInfo",
    "TensorImageDataset",
    "CropFlip",
    "build_image_dataset",
    "dataset_info",
    "DATASETS",
    "FASHION_MNIST_ROOT",
]

#: where the Debian package ``dataset-fashion-mnist`` puts the idx files (override: $FASHION_MNIST_ROOT)
FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
SPLITS = ("train", "test", "val")

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@dataclass(frozen=True)
class ImageDatasetInfo:
    """What a model for this dataset needs: classes, channels, native size, normalisation statistics.

    ``mean`` and ``std`` are per channel, for images in [0, 1] (give them to ``NormalizedModel``).
    ``class_names`` is None when it depends on a folder not given.
    """

    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...] | None = None


_INFO: dict[str, ImageDatasetInfo] = {
    # Fashion-MNIST statistics of the training set (pixel mean / std over all 60k images).
    "fashion-mnist": ImageDatasetInfo(10, 1, 28, (0.2860,), (0.3530,), FASHION_MNIST_CLASSES),
    # digits: 0..16 scaled to [0, 1] and stored as uint8; statistics over all 1797 images at 8 x 8.
    "digits": ImageDatasetInfo(10, 1, 28, (0.3053,), (0.3759,), tuple(str(i) for i in range(10))),
    "imagenet": ImageDatasetInfo(1000, 3, 224, IMAGENET_MEAN, IMAGENET_STD, None),
    "imagefolder": ImageDatasetInfo(0, 3, 224, IMAGENET_MEAN, IMAGENET_STD, None),
    "cifar10": ImageDatasetInfo(10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
                                CIFAR10_CLASSES),
    "cifar100": ImageDatasetInfo(100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), None),
}
DATASETS: tuple[str, ...] = tuple(_INFO)
#: each dataset's horizontal-flip probability when training is augmented and none is given (the digits are
#: not mirror-symmetric); ``TrainConfig.hflip`` sets it
DEFAULT_HFLIP: dict[str, float] = {"digits": 0.0}


def _check_name(name: str) -> str:
    key = name.lower().replace("_", "-")
    key = {"fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist", "imagenet-1k": "imagenet",
           "cifar-10": "cifar10", "cifar-100": "cifar100"}.get(key, key)
    if key not in _INFO:
        raise ValueError(f"unknown image dataset {name!r}; valid: {', '.join(DATASETS)}")
    return key


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return split


def dataset_info(name: str, root: str | os.PathLike | None = None) -> ImageDatasetInfo:
    """Classes, channels, native image size and normalisation statistics of a dataset.

    For ``imagefolder`` (and ``imagenet``/``cifar100`` class names) give ``root`` to read the classes.
    """
    key = _check_name(name)
    info = _INFO[key]
    if root is not None and key in ("imagefolder", "imagenet", "cifar100"):
        ds = build_image_dataset(key, "train", root=root)
        classes = tuple(_classes_of(ds))
        info = ImageDatasetInfo(len(classes), info.in_chans, info.img_size, info.mean, info.std, classes)
    return info


def _classes_of(ds: Dataset) -> Sequence[str]:
    while isinstance(ds, Subset):
        ds = ds.dataset
    return ds.classes


# ----------------------------------------------------------------------------- in-memory datasets

class TensorImageDataset(Dataset):
    """Images held in memory as uint8 ``(N, C, H, W)``; items are ``(float (C, H', W') in [0, 1], int)``.

    ``transform`` (optional) maps the float image in [0, 1] to the output image (resize, augmentation).
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        classes: Sequence[str],
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        if images.dim() != 4 or images.dtype != torch.uint8:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must be ({images.shape[0]},), got {tuple(labels.shape)}")
        self.images, self.labels = images, labels.long()
        self.classes = list(classes)
        self.targets = self.labels.tolist()  # torchvision convention, used for class-balanced sampling
        self.transform = transform

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def random_items(self) -> bool:
        """Whether an item draws random numbers (only through ``transform``): the training loader
        seeds every item of a dataset that does (:class:`kpca_attention.train.data.SeededAugmentation`)."""
        return self.transform is not None and getattr(self.transform, "random", True)

    @property
    def seeded_items(self) -> bool:
        """Whether :meth:`seeded_batch` can make the items (no transform, or one with a ``batch(x, seeds)``
        method such as :class:`CropFlip`): the training loader then makes whole batches in one step."""
        return self.transform is None or hasattr(self.transform, "batch")

    def seeded_batch(self, indices: Tensor, seeds: Sequence[int],
                     device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
        """Items ``indices`` as one batch on ``device`` (default: where the images are): images ``(B, C, H,
        W)`` float in [0, 1], item ``i`` augmented with ``seeds[i]`` - the values ``self[index]`` gives
        under ``torch.manual_seed(seed)`` - and labels ``(B,)``. The images are copied to another device
        once (Fashion-MNIST: 47 MB) and kept there."""
        if not self.seeded_items:
            raise TypeError(f"TensorImageDataset.seeded_batch: the transform {self.transform!r} has no "
                            "batch(x, seeds) method")
        images, labels = self._on(torch.device(device) if device is not None else self.images.device)
        idx = torch.as_tensor(indices, dtype=torch.long).to(images.device)
        x = images[idx].float().div_(255.0)
        if self.transform is not None:
            x = self.transform.batch(x, seeds)
        return x, labels[idx]

    def _on(self, device: torch.device) -> tuple[Tensor, Tensor]:
        if device == self.images.device:
            return self.images, self.labels
        cache = self.__dict__.setdefault("_device_copies", {})
        if device not in cache:
            cache[device] = (self.images.to(device), self.labels.to(device))
        return cache[device]

    def __getstate__(self) -> dict[str, Any]:  # loader processes get the host copy only
        return {k: v for k, v in self.__dict__.items() if k != "_device_copies"}

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x = self.images[i].float().div_(255.0)
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.labels[i])


def _read_idx(path: Path) -> np.ndarray:
    """An idx file (the MNIST format: magic, dims as big-endian int32, then uint8 data), gzip or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not a uint8 idx file (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4)
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: truncated idx file ({data.size} bytes of data, dims {dims.tolist()})")
    return data.reshape(tuple(int(d) for d in dims))


def _find(root: Path, stem: str) -> Path | None:
    for cand in (root / f"{stem}.gz", root / stem):
        if cand.is_file():
            return cand
    return None


@functools.lru_cache(maxsize=4)
def _load_fashion_mnist(root: str, train: bool) -> tuple[Tensor, Tensor]:
    base = Path(root)
    prefix = "train" if train else "t10k"
    img_path = _find(base, f"{prefix}-images-idx3-ubyte")
    lab_path = _find(base, f"{prefix}-labels-idx1-ubyte")
    if img_path is None or lab_path is None:
        raise FileNotFoundError(
            f"Fashion-MNIST not found: expected {prefix}-images-idx3-ubyte.gz and "
            f"{prefix}-labels-idx1-ubyte.gz in {base}. Install the Debian package "
            "(sudo apt-get install dataset-fashion-mnist), or pass root= (or set $FASHION_MNIST_ROOT) "
            "to a folder holding the four idx files."
        )
    images = torch.from_numpy(_read_idx(img_path).copy()).unsqueeze(1)  # (N, 1, 28, 28)
    labels = torch.from_numpy(_read_idx(lab_path).astype(np.int64))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{img_path} has {images.shape[0]} images but {lab_path} {labels.shape[0]} labels")
    return images, labels


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits  # shipped with scikit-learn: no download

    d = load_digits()
    images = torch.from_numpy(np.round(d.images * (255.0 / 16.0)).astype(np.uint8)).unsqueeze(1)  # (N,1,8,8)
    return images, torch.from_numpy(d.target.astype(np.int64))


class CropFlip:
    """The small images' training transform, one vectorised step over a batch: a resize where the size is
    not the native one, then torchvision's ``RandomCrop(size, padding)`` (zeros around) and, where it is a
    symmetry, ``RandomHorizontalFlip()`` - the same draws in the same order from the same generator, so the
    same images as ``v2.Compose([Resize, RandomCrop, RandomHorizontalFlip])`` to the last bit
    (``tests/test_data.py`` checks it against torchvision).

    ``transform(x)`` on one image ``(C, H, W)`` draws from torch's global generator, as torchvision does;
    ``transform.batch(x, seeds)`` on ``(B, C, H, W)`` draws each image's crop and flip from a generator
    seeded with that image's seed - the values the one-image call gives under ``torch.manual_seed(seed)``
    (what :class:`kpca_attention.train.data.SeededAugmentation` did per item, at ~0.6 ms an item in seeding
    and Python). Without ``train`` only the resize is applied (no draws).
    """

    def __init__(self, size: int, native: int, train: bool, hflip: float) -> None:
        if isinstance(hflip, bool) or not 0 <= hflip <= 1:
            raise ValueError(f"hflip is a flip probability in [0, 1], got {hflip!r}")
        self.size, self.native, self.train, self.hflip = int(size), int(native), bool(train), float(hflip)
        self.padding = max(1, self.size // 8)
        self.resize = v2.Resize((self.size, self.size), antialias=True) if self.size != self.native else None

    @property
    def random(self) -> bool:
        """Whether the transform draws random numbers (only for training)."""
        return self.train

    def _draw(self, n_top: int, n_left: int, gen: torch.Generator | None) -> tuple[int, int, bool]:
        # RandomCrop.make_params draws top, then left; RandomHorizontalFlip(p) then flips when rand < p (at
        # p = 0 the flip is left out with its draw: the Compose without it, as the digits have always had)
        top = int(torch.randint(0, n_top, size=(), generator=gen))
        left = int(torch.randint(0, n_left, size=(), generator=gen))
        flip = self.hflip > 0 and torch.rand(1, generator=gen).item() < self.hflip
        return top, left, flip

    def _crop_flip(self, x: Tensor, draws: Sequence[tuple[int, int, bool]]) -> Tensor:
        b, s, p = x.shape[0], self.size, self.padding
        padded = torch.nn.functional.pad(x, (p, p, p, p))
        top, left, flip = (torch.tensor(c, device=x.device) for c in zip(*draws, strict=True))
        ar = torch.arange(s, device=x.device)
        rows = top[:, None] + ar  # (B, s)
        cols = left[:, None] + torch.where(flip[:, None], s - 1 - ar, ar)  # a flip reads the crop backwards
        out = padded[torch.arange(b, device=x.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
        return out.permute(0, 3, 1, 2).contiguous()  # (B, s, s, C) -> (B, C, s, s)

    def _ranges(self, x: Tensor) -> tuple[int, int]:
        p = self.padding
        return x.shape[-2] + 2 * p - self.size + 1, x.shape[-1] + 2 * p - self.size + 1

    def _apply(self, x: Tensor, gens: Iterable[torch.Generator | None]) -> Tensor:
        """Resize ``x (B, C, H, W)``; for training crop / flip image ``i`` with the draws of ``gens[i]``."""
        if self.resize is not None:
            x = self.resize(x)
        if not self.train:
            return x
        n_top, n_left = self._ranges(x)
        return self._crop_flip(x, [self._draw(n_top, n_left, g) for g in gens])

    def batch(self, x: Tensor, seeds: Sequence[int]) -> Tensor:
        """Images ``(B, C, H, W)`` float -> ``(B, C, size, size)``, image ``i`` drawn with ``seeds[i]``."""
        if self.train and len(seeds) != x.shape[0]:
            raise ValueError(f"CropFlip.batch: {x.shape[0]} images but {len(seeds)} seeds")
        gen = torch.Generator()  # re-seeded for each image
        return self._apply(x, (gen.manual_seed(int(s)) for s in seeds))

    def __call__(self, x: Tensor) -> Tensor:
        return self._apply(x[None], [None])[0]  # one image, drawn from the global generator

    def __repr__(self) -> str:
        return (f"CropFlip(size={self.size}, native={self.native}, train={self.train}, hflip={self.hflip}, "
                f"padding={self.padding})")


def _small_transform(img_size: int, native: int, train: bool, hflip: float) -> CropFlip | None:
    """Resize (if needed); for training a padded random crop and a horizontal flip with probability
    ``hflip``."""
    if img_size == native and not train:
        return None
    return CropFlip(img_size, native, train, hflip)


# ----------------------------------------------------------------------------- folder datasets

class _NormalizedSpace(torch.nn.Module):
    """Apply a transform written for normalised tensors (timm's RandomErasing, 'pixel' mode draws N(0, 1)
    noise) to an image in [0, 1]: normalise, transform, map back. Erased pixels are not clipped, so after
    the model's own normalisation they are exactly DeiT's N(0, 1) noise."""

    def __init__(
        self, inner: Callable[[Tensor], Tensor], mean: Sequence[float], std: Sequence[float]
    ) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(-1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.inner((x - self.mean) / self.std) * self.std + self.mean


def deit_transform(
    img_size: int = 224,
    train: bool = False,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    **kw: Any,
) -> Callable:
    """DeiT's ImageNet transforms through ``timm.data.create_transform``, outputs in [0, 1].

    Training (DeiT defaults, override through ``kw``): RandomResizedCrop (bicubic), flip, colour jitter 0.3,
    RandAugment ``rand-m9-mstd0.5-inc1``, random erasing 0.25 ('pixel' mode, in normalised space).
    Evaluation: resize to img_size / 0.875 (bicubic), centre crop.
    """
    from timm.data import create_transform
    from timm.data.random_erasing import RandomErasing

    zeros, ones = (0.0,) * len(mean), (1.0,) * len(mean)  # identity Normalize: the model normalises
    if not train:
        return create_transform(img_size, is_training=False, interpolation=kw.pop("interpolation", "bicubic"),
                                crop_pct=kw.pop("crop_pct", 0.875), mean=zeros, std=ones, **kw)
    re_prob = kw.pop("re_prob", 0.25)
    re_mode = kw.pop("re_mode", "pixel")
    re_count = kw.pop("re_count", 1)
    opts = dict(color_jitter=0.3, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic")
    opts.update(kw)
    tf = create_transform(img_size, is_training=True, re_prob=0.0, mean=zeros, std=ones, **opts)
    if re_prob > 0:
        erase = RandomErasing(re_prob, mode=re_mode, max_count=re_count, device="cpu")
        tf = v2.Compose([tf, _NormalizedSpace(erase, mean, std)])
    return tf


def _split_dir(root: Path, split: str, name: str) -> Path:
    aliases = {"train": ("train",), "val": ("val", "validation", "test"),
               "test": ("test", "val", "validation")}
    for cand in aliases[split]:
        if (root / cand).is_dir():
            return root / cand
    raise FileNotFoundError(
        f"{name}: no folder for split {split!r} under {root} (looked for {', '.join(aliases[split])}); "
        f"expected an ImageFolder tree {root}/<split>/<class>/<image>"
    )


def _need_root(name: str, root: str | os.PathLike | None) -> Path:
    if root is None:
        raise ValueError(f"{name}: root= is required (the folder holding the dataset); nothing is downloaded")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{name}: root {path} does not exist or is not a folder")
    return path


def _cifar(key: str, root: Path, split: str, img_size: int, train_tf: bool, hflip: float) -> Dataset:
    from torchvision import datasets

    info = _INFO[key]
    tf_small = _small_transform(img_size, 32, train_tf, hflip)
    to_tensor = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    transform = v2.Compose([to_tensor, tf_small]) if tf_small is not None else to_tensor
    folder = "cifar-10-batches-py" if key == "cifar10" else "cifar-100-python"
    # torchvision wants the parent of the batches folder; accept either
    base = root.parent if root.name == folder else root
    if (base / folder).is_dir():
        cls = datasets.CIFAR10 if key == "cifar10" else datasets.CIFAR100
        return cls(str(base), train=split == "train", transform=transform, download=False)
    try:
        return datasets.ImageFolder(str(_split_dir(root, split, key)), transform=transform)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{key}: neither {root / folder} (torchvision's python batches) nor an ImageFolder tree "
            f"{root}/{{train,test}}/<class>/*.png found ({info.num_classes} classes expected); nothing is "
            "downloaded"
        ) from e


# ----------------------------------------------------------------------------- entry point

def build_image_dataset(
    name: str,
    split: str,
    root: str | os.PathLike | None = None,
    img_size: int | None = None,
    train_transform: bool = False,
    *,
    subset: int | None = None,
    subset_seed: int | None = 0,
    hflip: float | None = None,
    **kw: Any,
) -> Dataset:
    """A dataset of ``(image (C, H, W) float in [0, 1], label int)``.

    Args:
        name: one of :data:`DATASETS` (``fashion-mnist``, ``digits``, ``imagenet``, ``imagefolder``,
            ``cifar10``, ``cifar100``).
        split: ``"train"``, ``"test"`` or ``"val"`` (see the module docstring for single-held-out sets).
        root: dataset folder; Fashion-MNIST defaults to ``$FASHION_MNIST_ROOT`` or the Debian package's.
        img_size: output size (square); default the dataset's native size (:func:`dataset_info`).
        train_transform: augment for training (small images: padded random crop and a horizontal flip;
            ImageNet / folders: DeiT's transforms, see :func:`deit_transform`, ``kw`` goes there).
        hflip: the flip's probability (None: the dataset's own, :data:`DEFAULT_HFLIP` - 0 for the digits,
            which are not mirror-symmetric; 0.5 for the others).
        subset: keep only this many examples (for fast CPU runs): a random sample drawn with
            ``subset_seed`` (fixed: 0), or the first ``subset`` when ``subset_seed`` is None.

    Raises:
        ValueError: before anything is read, for an unknown name or split, or an ``img_size``,
            ``subset`` (integers >= 1 or None) or ``subset_seed`` (an integer >= 0 or None) out of range.
    """
    key = _check_name(name)
    split = _check_split(split)
    check_int(img_size, "img_size", min=1, allow_none=True)
    check_int(subset, "subset", min=1, allow_none=True)
    check_int(subset_seed, "subset_seed", min=0, allow_none=True)
    check_real(hflip, "hflip", min=0, max=1, allow_none=True)
    info = _INFO[key]
    size = info.img_size if img_size is None else int(img_size)
    flip = DEFAULT_HFLIP.get(key, 0.5) if hflip is None else float(hflip)
    train = split == "train"

    ds: Dataset
    if key == "fashion-mnist":
        base = str(Path(root or os.environ.get("FASHION_MNIST_ROOT", FASHION_MNIST_ROOT)).expanduser())
        images, labels = _load_fashion_mnist(base, train)
        ds = TensorImageDataset(images, labels, FASHION_MNIST_CLASSES,
                                _small_transform(size, 28, train_transform, flip))
    elif key == "digits":
        images, labels = _load_digits()
        # fixed split: a seeded permutation, first 80% train, rest test/val
        perm = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(0))
        n_train = int(0.8 * images.shape[0])
        idx = perm[:n_train] if train else perm[n_train:]
        ds = TensorImageDataset(images[idx], labels[idx], info.class_names or (),
                                _small_transform(size, 8, train_transform, flip))
    elif key in ("imagenet", "imagefolder"):
        from torchvision import datasets

        path = _need_root(key, root)
        folder = _split_dir(path, split, key)
        transform = deit_transform(size, train_transform, hflip=flip, **kw)
        ds = datasets.ImageFolder(str(folder), transform=transform)
        if key == "imagenet" and len(ds.classes) != 1000:
            raise ValueError(f"imagenet: {folder} has {len(ds.classes)} class folders, expected 1000 "
                             "(use name='imagefolder' for other trees)")
    else:  # cifar10 / cifar100
        ds = _cifar(key, _need_root(key, root), split, size, train_transform, flip)

    if subset is not None:
        n = len(ds)
        if subset < n:
            if subset_seed is None:
                idx_list = list(range(subset))
            else:
                idx_list = seeded_indices(n, subset, subset_seed)
            ds = Subset(ds, idx_list)
    return ds
