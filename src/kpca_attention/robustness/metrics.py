"""Robustness metrics: corruption error and mCE, per-corruption tables, ImageNet-A/R accuracy on
200-class masks of 1000-way logits, ImageNet-O AUPR.

mCE (Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
Perturbations", ICLR 2019): for each corruption c, CE_c = sum_s E(s, c) / sum_s E_base(s, c) over the
severities s = 1..5 of top-1 errors E; mCE = mean over the 15 corruptions of CE_c, in percent.
On ImageNet-C the baseline is AlexNet (:data:`ALEXNET_ERRORS`). On any other data set AlexNet's
numbers mean nothing, so :func:`mce` takes the errors of a *named baseline run* instead (e.g. SymViT
for RPC-SymViT): that "mCE relative to <baseline>" is 100 for the baseline itself and below 100 for a
model that is more robust than it.
"""

from __future__ import annotations

import math
import os
import pkgutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..checks import check_int, check_real
from ..tables import table_row
from .common import collect_logits
from .corruptions import COMMON_CORRUPTIONS, SEVERITIES
from .store import encode_bits

# AlexNet top-1 error on ImageNet-C per corruption and severity 1..5 (Hendrycks & Dietterich 2019,
# the AlexNet evaluation of the ImageNet-C repository, github.com/hendrycks/robustness; the same
# table is in timm's ``imagenetc_alexnet_error_rates_list``). Each row's mean is the paper's AlexNet
# corruption error used for mCE (0.886428 for gaussian noise, ...); the tests check the means.
ALEXNET_ERRORS: dict[str, tuple[float, float, float, float, float]] = {
    "gaussian_noise": (0.69528, 0.82542, 0.93554, 0.98138, 0.99452),
    "shot_noise": (0.71224, 0.85108, 0.93574, 0.98182, 0.99146),
    "impulse_noise": (0.78374, 0.89808, 0.9487, 0.9872, 0.99548),
    "defocus_blur": (0.65624, 0.73202, 0.85036, 0.91364, 0.94714),
    "glass_blur": (0.64308, 0.75054, 0.88806, 0.91622, 0.93344),
    "motion_blur": (0.5843, 0.70048, 0.82108, 0.8975, 0.92638),
    "zoom_blur": (0.70008, 0.76992, 0.80784, 0.84198, 0.87198),
    "snow": (0.71726, 0.88392, 0.86468, 0.9187, 0.94952),
    "frost": (0.6139, 0.79734, 0.8879, 0.89942, 0.9343),
    "fog": (0.67474, 0.7605, 0.84378, 0.8726, 0.945),
    "brightness": (0.4514, 0.48502, 0.54048, 0.62166, 0.7244),
    "contrast": (0.64548, 0.7615, 0.88874, 0.9776, 0.9927),
    "elastic_transform": (0.52596, 0.70116, 0.55686, 0.64076, 0.80554),
    "pixelate": (0.52218, 0.5462, 0.73728, 0.87092, 0.91262),
    "jpeg_compression": (0.51002, 0.54718, 0.57294, 0.65458, 0.74778),
}

Errors = Mapping[str, Mapping[int, float] | Sequence[float]]


def _per_severity(errors: Errors, name: str, what: str) -> np.ndarray:
    """Errors of one corruption as an array over severities 1..5, validating that all are there."""
    row = errors[name]
    if isinstance(row, Mapping):
        # JSON turns int keys into strings: accept both.
        keyed = {int(k): float(v) for k, v in row.items()}
        missing = [s for s in SEVERITIES if s not in keyed]
        if missing:
            raise ValueError(f"{what}: {name} lacks severities {missing}; CE needs all of 1..5")
        vals = np.array([keyed[s] for s in SEVERITIES])
    else:
        vals = np.asarray(row, dtype=float)
        if vals.shape != (len(SEVERITIES),):
            raise ValueError(f"{what}: {name} needs 5 errors (severities 1..5), got {vals.shape}")
    if not np.all((vals >= 0) & (vals <= 1)):  # NaN fails both comparisons
        raise ValueError(f"{what}: errors are fractions in [0, 1], got {vals.tolist()} for {name}")
    return vals


def corruption_errors(errors: Errors, baseline: Errors | None = None) -> dict[str, float]:
    """CE_c in percent for every corruption in ``errors``.

    Args:
        errors: ``errors[corruption][severity]`` = top-1 error fraction (severity 1..5, as a mapping
            or a length-5 sequence).
        baseline: the same structure for the normalising model; ``None`` = AlexNet on ImageNet-C.
    """
    base = ALEXNET_ERRORS if baseline is None else baseline
    base_name = "AlexNet (ImageNet-C)" if baseline is None else "baseline"
    out = {}
    for name in errors:
        if name not in base:
            raise ValueError(f"no {base_name} errors for corruption {name!r}; it has: {', '.join(base)}")
        num = _per_severity(errors, name, "errors").sum()
        den = _per_severity(base, name, base_name).sum()
        if den == 0:
            raise ValueError(f"{base_name} has zero error on {name}: CE is undefined")
        out[name] = 100.0 * num / den
    return out


def mce(errors: Errors, baseline: Errors | None = None, require_all: bool = True) -> float:
    """Mean corruption error in percent (Hendrycks & Dietterich 2019).

    ``baseline=None`` normalises by AlexNet's ImageNet-C errors (the standard ImageNet-C mCE: only
    meaningful for ImageNet models on ImageNet-C). On other data pass the errors of a named baseline
    run: the result is then "mCE relative to that run" (the baseline itself scores 100).
    ``require_all`` insists on all 15 common corruptions, as the benchmark defines mCE.
    """
    if require_all:
        missing = [c for c in COMMON_CORRUPTIONS if c not in errors]
        if missing:
            raise ValueError(f"mCE is defined over the 15 ImageNet-C corruptions; missing {missing} "
                             "(pass require_all=False for a partial mean, and say so when reporting it)")
    extra = [c for c in errors if c not in COMMON_CORRUPTIONS]
    if extra:
        raise ValueError(f"{extra} are not among the 15 mCE corruptions ({', '.join(COMMON_CORRUPTIONS)})")
    ces = corruption_errors(errors, baseline)
    if not ces:
        raise ValueError("no corruption errors given")
    return float(np.mean(list(ces.values())))


def relative_mce(
    errors: Errors, clean_error: float, baseline: Errors, baseline_clean_error: float
) -> float:
    """Relative mCE (Hendrycks & Dietterich 2019, Sec. 3): mean over corruptions of
    sum_s (E(s,c) - E_clean) / sum_s (E_base(s,c) - E_base_clean), in percent. It measures the
    *degradation* from clean accuracy rather than the corrupted error itself."""
    check_real(clean_error, "clean_error", min=0, max=1)
    check_real(baseline_clean_error, "baseline_clean_error", min=0, max=1)
    vals = []
    for name in errors:
        if name not in baseline:
            raise ValueError(f"baseline has no errors for {name!r}")
        num = (_per_severity(errors, name, "errors") - clean_error).sum()
        den = (_per_severity(baseline, name, "baseline") - baseline_clean_error).sum()
        if den <= 0:
            raise ValueError(f"baseline is not degraded by {name}: relative CE is undefined")
        vals.append(100.0 * num / den)
    return float(np.mean(vals))


def accuracy_table(
    accuracies: Mapping[str, Mapping[str, float]],
    corruptions: Sequence[str] | None = None,
    digits: int = 2,
) -> str:
    """Markdown table, one row per corruption and one column per model (the shape of the paper's
    Table 4): ``accuracies[model][corruption]`` = top-1 accuracy in percent, usually averaged over
    severities. Rows absent for a model show "-"; a final row gives the mean over the shown rows."""
    check_int(digits, "digits", min=0)
    models = list(accuracies)
    if not models:
        raise ValueError("no models to tabulate")
    rows = list(corruptions) if corruptions is not None else list(
        dict.fromkeys(c for m in models for c in accuracies[m]))
    lines = [table_row(["corruption", *models]), "|---|" + "---:|" * len(models)]
    for c in rows:
        cells = [f"{accuracies[m][c]:.{digits}f}" if c in accuracies[m] else "-" for m in models]
        lines.append(table_row([c, *cells]))
    means = []
    for m in models:
        vals = [accuracies[m][c] for c in rows if c in accuracies[m]]
        means.append(f"{np.mean(vals):.{digits}f}" if vals else "-")
    lines.append(table_row(["**mean**", *means]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- ImageNet-A/R/O

def _timm_info_lines(filename: str) -> list[str]:
    data = pkgutil.get_data("timm.data", f"_info/{filename}")
    if data is None:
        raise FileNotFoundError(f"timm does not ship {filename}")
    return data.decode().split()


def imagenet_subset_indices(subset: str) -> tuple[list[int], list[str]]:
    """ImageNet-1K class indices and wnids of the 200 classes of ImageNet-A (``"a"``) or -R (``"r"``).

    The lists are the ones released with the data sets (Hendrycks et al. 2021), as shipped in timm's
    ``timm/data/_info``; the indices are recomputed from the wnids and the 1K synset order as a check.
    """
    subset = subset.lower().removeprefix("imagenet-").removeprefix("imagenet_")
    if subset not in ("a", "r"):
        raise ValueError(f"subset must be 'a' or 'r' (ImageNet-A / ImageNet-R), got {subset!r}")
    wnids = _timm_info_lines(f"imagenet_{subset}_synsets.txt")
    indices = [int(i) for i in _timm_info_lines(f"imagenet_{subset}_indices.txt")]
    synsets_1k = _timm_info_lines("imagenet_synsets.txt")
    position = {w: i for i, w in enumerate(synsets_1k)}
    if [position[w] for w in wnids] != indices or len(wnids) != 200:
        raise RuntimeError(f"timm's ImageNet-{subset.upper()} index list disagrees with its synsets")
    return indices, wnids


def _require_dir(path: str | os.PathLike | None, what: str) -> Path:
    if path is None or not Path(path).is_dir():
        raise FileNotFoundError(f"{what}: folder {path} not found")
    return Path(path)


def _image_folder(root: Path, img_size: int | None) -> Dataset:
    from torchvision import datasets, transforms

    size = img_size or 224
    tf = transforms.Compose([
        transforms.Resize(int(math.floor(size / 0.875)), interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(size),
        transforms.ToTensor(),  # [0, 1]: the model normalises inside
    ])
    return datasets.ImageFolder(str(root), transform=tf)


def masked_accuracy(
    model: nn.Module,
    root: str | os.PathLike,
    subset: str,
    img_size: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> dict[str, float]:
    """Top-1 accuracy of a 1000-way ImageNet model on ImageNet-A or -R in ``root`` (``<wnid>/*``).

    The logits are restricted to the 200 classes of the data set before the arg-max, as in Hendrycks
    et al.; images are resized to 1/0.875 of ``img_size`` (bicubic) and centre-cropped, as DeiT
    evaluates. ``correct``: per-example correctness (:func:`~kpca_attention.robustness.store.encode_bits`).
    """
    check_int(img_size, "img_size", min=1, allow_none=True)
    check_int(batch_size, "batch_size", min=1)
    root = _require_dir(root, f"ImageNet-{subset.upper()}")
    indices, wnids = imagenet_subset_indices(subset)
    ds = _image_folder(root, img_size)
    unknown = [c for c in ds.classes if c not in wnids]
    if unknown:
        raise ValueError(f"{root} has folders that are not ImageNet-{subset.upper()} wnids: {unknown[:5]}")
    # ImageFolder numbers the folders present in sorted order; map them to positions in the 200-list.
    to_200 = torch.tensor([wnids.index(c) for c in ds.classes])
    logits, labels = collect_logits(model, ds, batch_size, progress=progress, desc=f"imagenet-{subset}")
    if logits.shape[1] != 1000:
        raise ValueError(f"ImageNet-{subset.upper()} needs a 1000-way ImageNet model, got {logits.shape[1]}")
    pred = logits[:, indices].argmax(dim=1)
    correct = pred == to_200[labels]
    return {"top1": correct.float().mean().item(), "n": len(ds), "correct": encode_bits(correct)}


def ood_aupr(in_scores: Tensor | np.ndarray, ood_scores: Tensor | np.ndarray) -> float:
    """Area under the precision-recall curve (average precision) with the OOD examples as the
    positive class; ``*_scores`` are anomaly scores (higher = more anomalous)."""
    from sklearn.metrics import average_precision_score

    a, b = np.asarray(in_scores, dtype=float).ravel(), np.asarray(ood_scores, dtype=float).ravel()
    if len(a) == 0 or len(b) == 0:
        raise ValueError("AUPR needs both in-distribution and out-of-distribution examples")
    y = np.concatenate([np.zeros(len(a)), np.ones(len(b))])
    return float(average_precision_score(y, np.concatenate([a, b])))


def msp_anomaly_score(logits: Tensor, class_indices: Sequence[int] | None = None) -> Tensor:
    """Anomaly score = minus the maximum softmax probability (Hendrycks & Gimpel 2017), optionally
    over a subset of the classes (the softmax is then taken over that subset)."""
    if class_indices is not None:
        logits = logits[:, list(class_indices)]
    return -torch.softmax(logits.float(), dim=1).amax(dim=1)


def imagenet_o_aupr(
    model: nn.Module,
    imagenet_o_root: str | os.PathLike,
    in_distribution_root: str | os.PathLike,
    img_size: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> dict[str, float]:
    """ImageNet-O AUPR in percent: ImageNet-O images are the positives, images of
    ``in_distribution_root`` (the ImageNet validation set, ``<wnid>/*``) the negatives, and the
    anomaly score is minus the maximum softmax probability over the 1000 classes."""
    check_int(img_size, "img_size", min=1, allow_none=True)
    check_int(batch_size, "batch_size", min=1)
    o_root = _require_dir(imagenet_o_root, "ImageNet-O")
    in_root = _require_dir(in_distribution_root, "ImageNet-O in-distribution set (ImageNet val)")
    o_logits, _ = collect_logits(model, _image_folder(o_root, img_size), batch_size, progress=progress,
                                 desc="imagenet-o")
    in_logits, _ = collect_logits(model, _image_folder(in_root, img_size), batch_size, progress=progress,
                                  desc="imagenet-val")
    aupr = ood_aupr(msp_anomaly_score(in_logits), msp_anomaly_score(o_logits))
    return {"aupr": 100.0 * aupr, "n_ood": len(o_logits), "n_in": len(in_logits)}
