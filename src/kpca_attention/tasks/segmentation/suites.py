"""The evaluation of a segmentation study: clean and corrupted mIoU, mean accuracy and pixel accuracy of a
trained Segmenter, with per-image pixel counts, item by item into a
:class:`~kpca_attention.robustness.store.ResultStore` (the study engine's per-run cache).

:class:`SegmentationSuites` is the ``suites`` object of a :class:`~kpca_attention.studies.Study` of
segmentation models (``kind = "segmentation"``), as
:class:`~kpca_attention.tasks.classification.suites.ImageSuites` is for classifiers.

Images. One fixed order of the test split (``torch.randperm`` seeded with ``data_seed``): the clean item
holds its first ``clean`` images, every corrupted view (the ImageNet-C corruptions applied to the images,
labels unchanged, :class:`~kpca_attention.segmentation.corruptions.CorruptedSegmentation`) its first
``corruptions.n``. Every corrupted image is therefore also a clean image, at the same position, so the
clean result of the corrupted images is read from the clean item, and every model of a study sees the
same images: per-image results pair up across models and seeds.

Items (names as in the image suites, so
:func:`~kpca_attention.tasks.images.structure_items` reads them)::

    clean                          first `clean` images
    corruptions/<name>/<severity>  first `corruptions.n` images, corrupted

Each result holds the dataset metrics (``miou``, ``mean_accuracy``, ``pixel_accuracy``; the clean item
also per-class ``iou``, ``accuracy`` and ``class_names``;
:func:`~kpca_attention.segmentation.metrics.metrics_from_areas`) and the
per-image, per-class pixel counts (:func:`encode_counts`): ``(n, 3, K)`` intersection / prediction /
label counts for the clean item; ``(n, 2, K)`` intersection / prediction counts for a corrupted view,
whose label counts are the clean item's first ``n`` rows (the labels are unchanged). Any dataset metric
of any subset of the images - a bootstrap resample, say - is a function of these counts
(:func:`counts_of_item`), so paired per-image statistics need nothing else.
"""

from __future__ import annotations

import lzma
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from ...checks import check_int
from ...io import pack_bytes, unpack_bytes
from ...robustness.common import model_device
from ...robustness.corruptions import images_version_key
from ...robustness.store import ResultStore
from ...segmentation.corruptions import CorruptedSegmentation, segmentation_items
from ...segmentation.metrics import metrics_from_areas
from ..images import Corruptions

__all__ = ["SegmentationSuites", "evaluate_segmentation_suites", "encode_counts", "decode_counts",
           "records_to_counts", "counts_of_item", "evaluation_order", "COUNT_FIELDS", "COUNTS_FORMAT"]

#: the per-class pixel counts of a clean item, in the order of its counts array's second axis
COUNT_FIELDS: tuple[str, ...] = ("intersect", "pred", "label")
#: how items store their per-image counts (:func:`encode_counts`; part of every item's key)
COUNTS_FORMAT = "xz_base85"


@dataclass(frozen=True)
class SegmentationSuites:
    """What a segmentation study measures on each trained model (see the module docstring).

    Args:
        clean: clean images (the first ``clean`` of the fixed order; ``None``: the whole test split).
        corruptions: corruption names x severities on the first ``corruptions.n`` images of the same
            order (``n`` must not exceed ``clean``); ``None``: clean only.
        data_seed: seeds the image order and the corruptions (per image, as
            :class:`~kpca_attention.segmentation.corruptions.CorruptedSegmentation`).
        batch_size: images per forward pass.
    """

    clean: int | None = 2000
    corruptions: Corruptions | None = None
    data_seed: int = 0
    batch_size: int = 250

    #: how ``settings.json`` names these suites (``suites.kind``; read by ``kpca_attention.tasks``)
    kind = "segmentation"

    def __post_init__(self) -> None:
        if self.clean is not None:
            check_int(self.clean, "clean images", min=1)
        check_int(self.batch_size, "batch size", min=1)
        if isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int) or self.data_seed < 0:
            raise ValueError(f"data_seed must be an integer >= 0, got {self.data_seed!r}")
        if self.corruptions is not None and self.clean is not None and self.corruptions.n > self.clean:
            raise ValueError(f"the corrupted images are the first {self.corruptions.n} clean images: "
                             f"corruptions.n must be <= clean ({self.clean})")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind}


# ----------------------------------------------------------------------------- per-image counts

def encode_counts(counts: np.ndarray) -> dict[str, Any]:
    """A non-negative integer array as ``{"shape", "dtype", "xz_base85"}``: the smallest of
    uint8/16/32/64 that holds it (little-endian, C order), as :func:`~kpca_attention.io.pack_bytes` text
    (xz, base85) - exact and small in JSON. Per-class pixel counts are
    mostly zeros; on 500 trained-model predictions of 32-px scenes xz gives 0.79 of zlib's size (level 9)
    and base85 adds 25 % where base64 adds 33 %."""
    a = np.asarray(counts)
    if a.dtype.kind not in "iu" or (a.size and a.min() < 0):
        raise ValueError(f"counts must be non-negative integers, got {a.dtype} with minimum "
                         f"{a.min() if a.size else '-'}")
    top = int(a.max()) if a.size else 0
    dtype = next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if top <= np.iinfo(t).max)
    raw = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
    return {"shape": list(a.shape), "dtype": np.dtype(dtype).name, "xz_base85": pack_bytes(raw)}


def decode_counts(data: Mapping[str, Any]) -> np.ndarray:
    """The int64 array of :func:`encode_counts`."""
    try:
        raw = unpack_bytes(data["xz_base85"], max_size=8 * int(np.prod(data["shape"])))
        dtype = np.dtype(data["dtype"]).newbyteorder("<")
        return np.frombuffer(raw, dtype=dtype).reshape(data["shape"]).astype(np.int64)
    except (KeyError, TypeError, ValueError, lzma.LZMAError) as e:
        raise ValueError(f"not an encoded counts array ({type(e).__name__}: {e}); expected "
                         "{'shape', 'dtype', 'xz_base85'} from encode_counts") from e


def records_to_counts(records: Sequence[Mapping[str, Sequence[int]]], num_classes: int) -> np.ndarray:
    """Per-image records of :func:`~kpca_attention.segmentation.metrics.item_record` as one int64 array
    ``(n, 3, K)``: intersection, prediction and label pixel counts per image and class."""
    out = np.zeros((len(records), len(COUNT_FIELDS), num_classes), dtype=np.int64)
    for i, rec in enumerate(records):
        classes = np.asarray(rec["classes"], dtype=np.int64)
        if classes.size and (classes.min() < 0 or classes.max() >= num_classes):
            raise ValueError(f"record {i} has classes outside 0..{num_classes - 1}: {classes.tolist()}")
        for j, f in enumerate(COUNT_FIELDS):
            out[i, j, classes] = np.asarray(rec[f], dtype=np.int64)
    return out


def counts_of_item(result: Mapping[str, Any],
                   clean: Mapping[str, Any] | np.ndarray | None = None) -> np.ndarray:
    """The ``(n, 3, K)`` intersection / prediction / label counts of a stored item: a clean item's own, or
    a corrupted view's ``(n, 2, K)`` with the label counts of the first ``n`` images of ``clean`` (the
    clean item, or its counts already decoded: decoding is the slow part when reading many views)."""
    counts = decode_counts(result["counts"])
    if counts.ndim != 3 or counts.shape[1] not in (2, 3):
        raise ValueError(f"counts of shape {counts.shape}: expected (n, 3, K) or (n, 2, K)")
    if counts.shape[1] == 3:
        return counts
    if clean is None:
        raise ValueError("a corrupted view stores no label counts: pass the clean item (its first n images)")
    base = clean if isinstance(clean, np.ndarray) else decode_counts(clean["counts"])
    n, k = counts.shape[0], counts.shape[2]
    if base.shape[0] < n or base.shape[2] != k:
        raise ValueError(f"clean counts {base.shape} do not cover a view of {n} images and {k} classes")
    return np.concatenate([counts, base[:n, 2:3]], axis=1)


def evaluation_order(n_total: int, data_seed: int) -> list[int]:
    """The fixed order of the test split's images: ``torch.randperm(n_total)`` seeded with ``data_seed``
    (a prefix of it is a class-mixed sample, and shorter prefixes are subsets of longer ones)."""
    g = torch.Generator().manual_seed(data_seed)
    return torch.randperm(n_total, generator=g).tolist()


# ----------------------------------------------------------------------------- evaluation

def evaluate_segmentation_suites(
    model: nn.Module | Callable[[], nn.Module],
    test_set: Dataset,
    suites: SegmentationSuites,
    store: ResultStore,
    base_key: Mapping[str, Any],
    *,
    num_classes: int,
    class_names: Sequence[str] | None = None,
    cache_dir: str | Path | None = None,
    seed: int | None = None,
    log: Callable[[str], None] = print,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate a segmentation ``model`` (images (B, C, H, W) in [0, 1] -> logits (B, K, H, W), e.g. a
    ``NormalizedModel`` around a Segmenter) on every item of ``suites``, reusing the items of ``store``
    whose key (``base_key`` + the item's parameters) matches.

    Args:
        model: the model, or a function returning it (called only if some item must be computed).
        test_set: ``(image (C, H, W) in [0, 1], label (H, W) int64)`` items, 255 = ignored.
        cache_dir, seed: accepted for the engine's interface; unused (corrupting a 32-px scene takes about
            2 ms, so corrupted images are not cached on disk).
    Returns:
        ``{"clean": result, "corruptions": {name: {severity: result}}, "timing": {...}}`` with the stored
        results (module docstring).
    """
    from tqdm.auto import tqdm

    del cache_dir, seed
    t0 = time.perf_counter()
    loaded: list[nn.Module] = [model] if isinstance(model, nn.Module) else []

    def net() -> nn.Module:
        if not loaded:
            loaded.append(model())  # type: ignore[operator]
        return loaded[0]

    n_total = len(test_set)  # type: ignore[arg-type]
    n_clean = n_total if suites.clean is None else suites.clean
    if n_clean > n_total:
        raise ValueError(f"clean: {n_clean} images asked of a test split of {n_total}")
    order = evaluation_order(n_total, suites.data_seed)
    # the counts' format is part of each item's key: stored items of another format are recomputed
    params = {"data_seed": suites.data_seed, "num_classes": num_classes, "format": COUNTS_FORMAT}

    def measure(data: Dataset, n: int, clean: bool) -> dict[str, Any]:
        m = net()
        records = segmentation_items(m, data, num_classes, indices=order[:n], batch_size=suites.batch_size,
                                     device=model_device(m))
        counts = records_to_counts(records, num_classes)
        sums = counts.sum(axis=0)
        metrics = metrics_from_areas(sums[0], sums[1], sums[2], class_names if clean else None)
        if not clean:  # per-class values of a view follow from its counts: keep the stored results small
            metrics = {k: metrics[k] for k in ("miou", "mean_accuracy", "pixel_accuracy", "pixels")}
        return {"n": n, **metrics, "counts": encode_counts(counts if clean else counts[:, :2])}

    out: dict[str, Any] = {}
    out["clean"], _ = store.get_or_compute("clean", {**base_key, **params, "n": n_clean},
                                           lambda: measure(test_set, n_clean, True))
    t_clean = time.perf_counter()
    log(f"  clean: mIoU {100 * out['clean']['miou']:.1f}%, mean accuracy "
        f"{100 * out['clean']['mean_accuracy']:.1f}% on {n_clean} images")

    c = suites.corruptions
    if c is not None:
        if c.n > n_clean:
            raise ValueError(f"corruptions.n ({c.n}) exceeds the clean images ({n_clean})")
        corr: dict[str, dict[str, Any]] = {}
        views = [(name, sev) for name in c.names for sev in c.severities]
        for name, sev in tqdm(views, desc="corruptions", disable=None if progress else True, leave=False):
            key = {**base_key, **params, "n": c.n, "corruption": name, "severity": sev,
                   **images_version_key()}
            view = CorruptedSegmentation(test_set, name, sev, seed=suites.data_seed)
            corr.setdefault(name, {})[str(sev)], _ = store.get_or_compute(
                f"corruptions/{name}/{sev}", key, lambda view=view: measure(view, c.n, False))
        out["corruptions"] = corr
        mean_miou = float(np.mean([r["miou"] for per in corr.values() for r in per.values()]))
        log(f"  corruptions: {len(views)} views of {c.n} images, mean mIoU {100 * mean_miou:.1f}%")
    out["timing"] = {"clean_s": t_clean - t0, "corruptions_s": time.perf_counter() - t_clean}
    return out
