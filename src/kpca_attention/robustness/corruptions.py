"""Common corruptions (ImageNet-C, Hendrycks & Dietterich, ICLR 2019) through ``imagecorruptions``.

The corruption code itself is the ``imagecorruptions`` module (PyPI ``imagecorruptions-imaug``, a
maintained fork of ``imagecorruptions`` 1.1.2 that works with current numpy/scikit-image and runs
glass blur's pixel shuffle under numba). This module adds what an evaluation needs around it:

* validation of names and severities with clear errors;
* determinism: ``imagecorruptions`` draws from numpy's *global* legacy RNG, except glass blur and
  impulse noise, which take a ``seed`` argument (and otherwise draw a fresh unseeded one). We seed
  all three sources per image and restore the caller's global RNG state afterwards;
* images smaller than 32 px (the module refuses them) are reflect-padded to 32 px, corrupted and
  cropped back. Padding rather than resizing keeps the corruption's pixel scale (noise per pixel,
  blur radii in pixels) and makes the round trip exact when nothing is changed;
* grayscale images (Fashion-MNIST, digits) are replicated to 3 channels, corrupted, and converted
  back with the ITU-R 601-2 luma transform (PIL's ``"L"`` mode), as a camera would. Independent
  per-channel noise (gaussian/shot/impulse/speckle) is therefore averaged by the luma weights: its
  standard deviation drops to about 0.67 of the RGB value, so these corruptions are milder on gray
  data than on colour data at the same severity. Comparisons between models are unaffected;
* :class:`CorruptedDataset`, a corrupted view of any image dataset returning ``(C, H, W)`` floats in
  [0, 1], deterministic per (seed, index), optionally cached on disk;
* :func:`imagenet_c_folder`, reading the released ImageNet-C tree
  ``<root>/<corruption>/<severity>/<wnid>/*.JPEG``.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset
from tqdm.auto import tqdm

from ..checks import check_int
from ..io import atomic_path, sha256_file, write_text_atomic

# The 15 ImageNet-C corruptions (the benchmark, used for mCE) in the paper's order, then the 4
# "extra"/validation corruptions of Hendrycks & Dietterich (not part of mCE).
COMMON_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness",
    "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip
EXTRA_CORRUPTIONS: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
ALL_CORRUPTIONS: tuple[str, ...] = COMMON_CORRUPTIONS + EXTRA_CORRUPTIONS
#: the named sets of corruptions (``--corruptions common``)
CORRUPTION_SUBSETS: dict[str, tuple[str, ...]] = {"common": COMMON_CORRUPTIONS, "extra": EXTRA_CORRUPTIONS,
                                                  "all": ALL_CORRUPTIONS}
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
#: the version of the corrupted images :func:`corrupt` makes, in every cache file's name: bump it with any
#: change of what it returns, so images cached before are not read as the new ones; the results computed
#: on corrupted images name it in their keys when it is not 1 (:func:`images_version_key`)
IMAGES_VERSION = 1


def images_version_key() -> dict[str, int]:
    """What a result computed on :func:`corrupt`'s images adds to its key: ``{"images_version": v}`` once
    the images changed (v > 1), nothing before (every result stored so far was made on version 1)."""
    return {"images_version": IMAGES_VERSION} if IMAGES_VERSION != 1 else {}

# Corruptions whose implementation accepts its own ``seed`` (they do not use numpy's global RNG).
_SEEDED_BY_ARGUMENT = frozenset({"glass_blur", "impulse_noise"})
_MIN_SIZE = 32  # imagecorruptions refuses smaller images


def check_corruption(name: str, severity: int) -> None:
    """Raise ``ValueError`` naming the valid choices when ``name`` or ``severity`` is not valid."""
    if name not in ALL_CORRUPTIONS:
        raise ValueError(
            f"unknown corruption {name!r}; valid names: {', '.join(ALL_CORRUPTIONS)}"
        )
    valid_type = isinstance(severity, (int, np.integer)) and not isinstance(severity, bool)
    if not valid_type or severity not in SEVERITIES:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")


def corruption_names(subset: str = "common") -> tuple[str, ...]:
    """``"common"`` (the 15 of ImageNet-C), ``"extra"`` (4 validation corruptions) or ``"all"``
    (:data:`CORRUPTION_SUBSETS`)."""
    if subset not in CORRUPTION_SUBSETS:
        raise ValueError(f"unknown corruption subset {subset!r}; valid: {', '.join(CORRUPTION_SUBSETS)}")
    return CORRUPTION_SUBSETS[subset]


def item_seed(seed: int, index: int, name: str, severity: int) -> int:
    """A 32-bit seed for one (dataset seed, item index, corruption, severity), stable across runs."""
    entropy = [int(seed) & 0xFFFFFFFF, int(index), ALL_CORRUPTIONS.index(name), int(severity)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def corrupt(image: np.ndarray, name: str, severity: int, seed: int | None = None) -> np.ndarray:
    """Corrupt one image with ``imagecorruptions``.

    Args:
        image: uint8 array ``(H, W, C)`` with C in {1, 3}, or ``(H, W)``; any size (images under 32 px
            are reflect-padded to 32 and cropped back).
        name: one of :data:`ALL_CORRUPTIONS`.
        severity: 1..5.
        seed: makes the result deterministic; ``None`` draws from numpy's global RNG as
            imagecorruptions does (glass blur and impulse noise then use a fresh random seed).

    Returns:
        uint8 array of the same shape as ``image``. Gray inputs come back gray (luma of the corrupted
        RGB image; see the module docstring).
    """
    check_corruption(name, severity)
    check_int(seed, "seed", min=0, allow_none=True)
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise TypeError(f"expected a uint8 numpy array, got {type(image).__name__} "
                        f"{getattr(image, 'dtype', '')}")
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3)):
        raise ValueError(f"expected an image (H, W), (H, W, 1) or (H, W, 3), got shape {image.shape}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"expected an image of at least 1x1 pixels, got {image.shape[0]}x{image.shape[1]} "
                         f"(shape {image.shape})")
    from imagecorruptions import corrupt as _ic_corrupt  # imports numba/cv2: keep it lazy

    shape = image.shape
    gray = image.ndim == 2 or image.shape[2] == 1
    rgb = np.repeat(image.reshape(shape[0], shape[1], 1), 3, axis=2) if gray else image
    h, w = shape[:2]
    ph, pw = max(0, _MIN_SIZE - h), max(0, _MIN_SIZE - w)
    pads = ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0))
    if ph or pw:
        rgb = np.pad(rgb, pads, mode="reflect")

    kwargs: dict[str, Any] = {}
    if seed is None:
        out = _ic_corrupt(rgb, severity=severity, corruption_name=name)
    else:
        if name in _SEEDED_BY_ARGUMENT:
            kwargs["seed"] = int(seed)
        state = np.random.get_state()
        np.random.seed(int(seed) & 0xFFFFFFFF)
        try:
            out = _ic_corrupt(rgb, severity=severity, corruption_name=name, **kwargs)
        finally:
            np.random.set_state(state)  # leave the caller's global RNG as it was

    out = np.asarray(out, dtype=np.uint8)
    if out.shape[:2] != rgb.shape[:2]:
        # A few corruptions (frost with very wide images in old versions) could change the size.
        raise RuntimeError(f"{name} changed the image size from {rgb.shape[:2]} to {out.shape[:2]}")
    out = out[pads[0][0] : pads[0][0] + h, pads[1][0] : pads[1][0] + w]
    if gray:
        # ITU-R 601-2 luma, the transform of PIL's convert("L").
        luma = out.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        out = np.clip(np.rint(luma), 0, 255).astype(np.uint8).reshape(shape)
    return np.ascontiguousarray(out)


def tensor_to_uint8(image: Tensor) -> np.ndarray:
    """``(C, H, W)`` float in [0, 1] -> uint8 ``(H, W, C)`` (rounded)."""
    if image.dim() != 3:
        raise ValueError(f"expected an image tensor (C, H, W), got shape {tuple(image.shape)}")
    arr = image.detach().to("cpu", torch.float32).clamp(0, 1).mul(255).round().to(torch.uint8)
    return arr.permute(1, 2, 0).numpy()


def uint8_to_tensor(image: np.ndarray) -> Tensor:
    """uint8 ``(H, W, C)`` -> ``(C, H, W)`` float32 in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div(255)


def _atomic_save_npy(path: Path, array: np.ndarray) -> str:
    """Save ``array`` to ``path`` atomically; returns the SHA-256 of the bytes written."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
        digest = sha256_file(tmp)
    return digest


def hash_path(path: Path) -> Path:
    """The file beside a cache file recording its SHA-256 (``<name>.sha256``, ``sha256sum``'s format)."""
    return path.with_name(path.name + ".sha256")


def _stat_key(path: Path) -> tuple[int, ...]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


#: cache files this process checked or wrote and found good: ``{path: (stat, SHA-256)}``; a file unchanged
#: since (same inode, size and mtime) is not hashed again when the next model reads it (an ImageNet-C-sized
#: view is gigabytes)
_HASHED: dict[Path, tuple[tuple[int, ...], str]] = {}


class CorruptedDataset(Dataset):
    """A corrupted view of an image dataset.

    ``base[i]`` must return ``(image, label)`` with ``image`` a float tensor ``(C, H, W)`` in [0, 1]
    (C = 1 or 3); ``self[i]`` returns the corrupted image with the same shape and the same label.
    Item ``i`` is corrupted with :func:`item_seed` ``(seed, i, name, severity)``, so a view is the same
    in every process, worker and run.

    With ``cache_dir``, :meth:`build_cache` writes all corrupted images once to one ``.npy`` file
    and their labels to a second one (each atomically; the name holds the corruption, severity, seed
    and a fingerprint of the base data), and later instances (other checkpoints, a restarted run) read
    them instead of recomputing. Each file's SHA-256 is recorded beside it once it is written
    (:func:`hash_path`, ``<name>.sha256``) and checked when it is read, so a file changed since (zeroed,
    a flipped byte) is not taken for the images. A cache counts as built only when both files are
    readable, hold ``len(self)`` items and match their recorded SHA-256: :meth:`build_cache` repairs an
    incomplete one (a missing or damaged labels file is rewritten from the base data set without
    corrupting anything again; damaged images, or images without a recorded SHA-256 (a cache written
    before hashes were recorded), are recomputed) and warns when what it replaces was there but damaged,
    and reading items from an incomplete cache warns once and computes them on the fly.
    """

    def __init__(
        self,
        base: Dataset,
        name: str,
        severity: int,
        seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        check_corruption(name, severity)
        self.base = base
        self.name = name
        self.severity = int(severity)
        self.seed = check_int(seed, "seed", min=0)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._cache: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        self._fingerprint: str | None = None
        self._warned = False

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def fingerprint(self) -> str:
        """Hash of the base dataset's length, its first and last items (images and labels) and, for a
        subset (at any depth), the indices it takes: a list of ids changed in its middle is another set."""
        if self._fingerprint is None:
            h = hashlib.sha1(str(len(self)).encode())
            data = self.base
            while isinstance(data, Subset):
                h.update(np.asarray(data.indices, dtype=np.int64).tobytes())
                data = data.dataset
            for i in sorted({0, len(self) - 1} if len(self) else set()):
                img, label = self.base[i]
                h.update(tensor_to_uint8(img).tobytes())
                h.update(str(int(label)).encode())
            self._fingerprint = h.hexdigest()[:12]
        return self._fingerprint

    @property
    def cache_path(self) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / (f"{self.name}-s{self.severity}-seed{self.seed}-{self.fingerprint()}"
                                 f"-v{IMAGES_VERSION}.npy")

    def _corrupt_item(self, index: int) -> tuple[np.ndarray, int]:
        img, label = self.base[index]
        out = corrupt(tensor_to_uint8(img), self.name, self.severity,
                      seed=item_seed(self.seed, index, self.name, self.severity))
        return out, int(label)

    @property
    def labels_path(self) -> Path | None:
        """The labels file next to :attr:`cache_path`."""
        path = self.cache_path
        return None if path is None else path.with_suffix(".labels.npy")

    def _hash_problem(self, path: Path, what: str) -> str:
        """Empty when ``path`` matches the SHA-256 recorded beside it (:func:`hash_path`), else why not. A
        file checked (or written) in this process and unchanged since (same inode, size and mtime) is not
        hashed again."""
        try:
            recorded = hash_path(path).read_text().split()[0].lower()
        except (OSError, UnicodeDecodeError, IndexError):
            return f"{what} file without a recorded SHA-256 (written before hashes were, or interrupted)"
        try:
            stat = _stat_key(path)
            if _HASHED.get(path) == (stat, recorded):
                return ""
            actual = sha256_file(path)
        except OSError as e:
            return f"unreadable {what} file ({e})"
        if actual != recorded:
            return f"damaged {what} file (its SHA-256 differs from the one recorded when it was written)"
        _HASHED[path] = (stat, recorded)
        return ""

    def _save(self, path: Path, array: np.ndarray) -> None:
        """Write one cache file atomically, then its SHA-256 beside it (also atomically): a crash between
        the two leaves a file whose hash is missing or stale, which is rebuilt, never trusted."""
        digest = _atomic_save_npy(path, array)
        write_text_atomic(hash_path(path), f"{digest}  {path.name}\n")
        _HASHED[path] = (_stat_key(path), digest)

    def _read_images(self) -> tuple[np.ndarray | None, str]:
        """The cached images ``(N, H, W, C)`` uint8 (memory-mapped), or None and why not."""
        path = self.cache_path
        if path is None or not path.exists():
            return None, "no images file"
        try:
            images = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as e:  # truncated or foreign file
            return None, f"unreadable images file ({e})"
        if images.dtype != np.uint8 or images.ndim != 4 or len(images) != len(self):
            return None, (f"images file holds {images.dtype} {images.shape}, expected uint8 "
                          f"({len(self)}, H, W, C)")
        why = self._hash_problem(path, "images")
        return (None, why) if why else (images, "")

    def _read_labels(self) -> tuple[np.ndarray | None, str]:
        """The cached labels ``(N,)``, or None and why not."""
        path = self.labels_path
        if path is None or not path.exists():
            return None, "no labels file"
        try:
            labels = np.load(path)
        except (ValueError, OSError) as e:
            return None, f"unreadable labels file ({e})"
        if labels.shape != (len(self),) or not np.issubdtype(labels.dtype, np.integer):
            return None, f"labels file holds {labels.dtype} {labels.shape}, expected integers ({len(self)},)"
        why = self._hash_problem(path, "labels")
        return (None, why) if why else (labels, "")

    def cache_problem(self) -> str | None:
        """None when the cache is complete (both files readable, ``len(self)`` items each, each matching its
        recorded SHA-256), else what is wrong ("no images file", "no labels file", "damaged images
        file ...", ...)."""
        if self.cache_path is None:
            return "no cache_dir"
        images, why_images = self._read_images()
        labels, why_labels = self._read_labels()
        if images is None or labels is None:
            return "; ".join(w for w in (why_images, why_labels) if w)
        return None

    def build_cache(self, progress: bool = True) -> Path:
        """Corrupt every item once and save images and labels; a no-op when the cache is complete.

        An incomplete cache is repaired: when only the labels file is missing or damaged it is rewritten
        from the base data set (labels do not depend on the corruption), otherwise everything is
        recomputed and both files are replaced.
        """
        path, labels_path = self.cache_path, self.labels_path
        if path is None or labels_path is None:
            raise ValueError("build_cache needs cache_dir")
        if len(self) == 0:
            raise ValueError("build_cache: the base data set is empty")
        images, why_images = self._read_images()
        labels, why_labels = self._read_labels()
        if images is not None and labels is not None:
            return path
        self._cache = self._labels = None
        damaged = [w for w in (why_images, why_labels) if w and not w.startswith("no ")]
        if damaged:  # there but not to be trusted: say so, once, as the rebuild replaces it
            warnings.warn(f"corruption cache {path} was not usable ({'; '.join(damaged)}): rebuilding it",
                          stacklevel=2)
        if images is None:
            first, label = self._corrupt_item(0)
            images = np.empty((len(self), *first.shape), dtype=np.uint8)
            fresh = np.empty(len(self), dtype=np.int64)
            images[0], fresh[0] = first, label
            for i in tqdm(range(1, len(self)), desc=f"{self.name} s{self.severity} (cache)",
                          initial=1, total=len(self), disable=None if progress else True, leave=False):
                images[i], fresh[i] = self._corrupt_item(i)
            self._save(path, images)
        else:
            fresh = np.fromiter((int(self.base[i][1]) for i in tqdm(
                range(len(self)), desc=f"{self.name} s{self.severity} (cache labels)",
                disable=None if progress else True, leave=False)), dtype=np.int64, count=len(self))
        self._save(labels_path, fresh)
        return path

    def _load_cache(self) -> bool:
        if self._cache is not None:
            return True
        if self.cache_path is None:
            return False
        images, why_images = self._read_images()
        labels, why_labels = self._read_labels()
        if images is None or labels is None:
            there = [w for w in (why_images, why_labels) if w and not w.startswith("no ")]
            if (images is not None or labels is not None or there) and not self._warned:
                # Some of a cache is there: it is incomplete, not absent. Say so once, and how to repair.
                self._warned = True
                problem = "; ".join(w for w in (why_images, why_labels) if w)
                warnings.warn(f"corruption cache {self.cache_path} is incomplete ({problem}): computing "
                              "the images on the fly; build_cache() repairs it", stacklevel=3)
            return False
        self._cache, self._labels = images, labels
        return True

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if self._load_cache():
            assert self._cache is not None and self._labels is not None
            return uint8_to_tensor(np.array(self._cache[index])), int(self._labels[index])
        out, label = self._corrupt_item(index)
        return uint8_to_tensor(out), label


def imagenet_c_folder(
    root: str | os.PathLike,
    name: str,
    severity: int,
    transform: Callable[[Any], Tensor] | None = None,
) -> Dataset:
    """The released ImageNet-C images of one corruption and severity as a torchvision ``ImageFolder``.

    ``root`` is the folder holding ``<corruption>/<severity>/<wnid>/*.JPEG``. Classes are the sorted
    wnid folder names, which for the full 1000 classes is the standard ImageNet-1K label order.
    ``transform`` defaults to ``ToTensor`` (the released images are already 224 x 224 center crops).
    """
    from torchvision import datasets, transforms

    check_corruption(name, severity)
    folder = Path(root) / name / str(severity)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no ImageNet-C folder {folder}: expected <root>/<corruption>/<severity>/<wnid>/*.JPEG "
            "(download ImageNet-C from https://zenodo.org/record/2235448 and extract the tars into root)"
        )
    return datasets.ImageFolder(str(folder), transform=transform or transforms.ToTensor())


def corrupted_views(
    base: Dataset,
    names: Sequence[str] = COMMON_CORRUPTIONS,
    severities: Sequence[int] = SEVERITIES,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> dict[tuple[str, int], CorruptedDataset]:
    """``{(name, severity): CorruptedDataset}`` for every combination (validated up front)."""
    if isinstance(names, str):
        raise ValueError(f"names must be a sequence of corruption names, got the string {names!r} "
                         f"(use [{names!r}])")
    if not names or not severities:
        raise ValueError(f"names and severities must be non-empty; got names={list(names)}, "
                         f"severities={list(severities)}")
    check_int(seed, "seed", min=0)
    for n in names:
        for s in severities:
            check_corruption(n, s)
    return {(n, s): CorruptedDataset(base, n, s, seed, cache_dir) for n in names for s in severities}
