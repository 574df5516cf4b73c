"""Benchmark any image classifier the RobustBench way: ``benchmark(model, dataset=..., threat_model=...)``.

RobustBench's conventions (github RobustBench/robustbench): the model takes images in [0, 1] and
normalises inside; threat models ``Linf``, ``L2`` (AutoAttack ``standard`` - APGD-CE, APGD-T, FAB-T,
Square - or ``rand`` for randomised defences) and ``corruptions`` (the 15 common corruptions at
severities 1-5); a fixed, published subset of test images; one JSON per model with ``clean_acc``,
``autoattack_acc`` or ``corruptions_acc`` / ``corruptions_mce``, ``eps``, ``threat_model``, ``dataset``,
``reported`` (RobustBench's field for the robust accuracy a paper reported, as a string: ``""``, every
number here is measured) and ``footnote`` (how far the record lines up with RobustBench's leaderboard),
and ``autoattack_robust_after``: the robust accuracy after each of
AutoAttack's attacks as AutoAttack reports it (``clean`` first; absent for results stored before it was
recorded) with ``flags``: signs of gradient masking read from it (:func:`autoattack_flags`). The images here
are the first ``n`` of the dataset's committed list
(:mod:`~kpca_attention.robustness.image_ids`), whose SHA-256 the JSON records; every number comes with a
95 % interval (Wilson over images for accuracies, a bootstrap over images for the corruption mean).

Before any attack the model is checked on a known batch (the first 200 images of the list), and a
mistake is one ``ValueError`` line:

* in training mode (any submodule): RobustBench evaluates in eval mode;
* images outside [0, 1] (a dataset that normalises already);
* randomised - two forward passes on the same batch differ - unless ``version="rand"``;
* computing part of its output without gradient (a layer with ``adaptive_options``, e.g. Elliptical
  attention's metric), unless ``adaptive`` says how to attack it: ``True`` through those parts (an adaptive
  attack, :mod:`kpca_attention.attention.adaptive`), ``False`` as the model computes it (its published
  protocol); the JSON records which;
* normalisation doubled: two normalisation modules (``NormalizedModel``, torchvision's ``Normalize``)
  in the model - wrapping a model of this project, which normalises already, is the usual way;
* normalisation missing or doubled in a way the module tree does not show. The check: top-1 on the
  batch as given (``x`` in [0, 1]), on the normalised batch ``(x - mean) / std`` (what a model without
  normalisation inside would need) and on ``x * std + mean`` (what undoes a second normalisation), with
  the dataset's mean / std. If either alternative beats the given input by 20 points or more, the model
  expects other inputs than it gets and benchmarking it would attack the wrong space. (200 images: the
  standard error of a difference is at most ~5 points, so a correct model is not refused by chance;
  a model whose accuracy does not depend on normalisation is not refused, and then its numbers are
  those of the function it computes.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, Subset

from ..checks import check_int
from ..modules import weights_sha256
from .sources import model_label

__all__ = ["benchmark", "check_model", "parse_eps", "wilson_interval", "THREAT_MODELS", "DEFAULT_EPS",
           "ROBUSTBENCH_EPS", "CHECK_IMAGES", "NORMALISATION_MARGIN"]

THREAT_MODELS: tuple[str, ...] = ("Linf", "L2", "corruptions")
#: the default budget of a threat model: RobustBench's ImageNet Linf budget and its (CIFAR-10) L2 budget;
#: :data:`ROBUSTBENCH_EPS` overrides it where RobustBench has a leaderboard for the dataset
DEFAULT_EPS: dict[str, str] = {"Linf": "4/255", "L2": "0.5"}
#: RobustBench's leaderboards: (dataset, threat model) -> budget (CIFAR-10/100 Linf 8/255, CIFAR-10 L2
#: 0.5, ImageNet Linf 4/255). Other pairs are not RobustBench threat models (the JSON says so).
ROBUSTBENCH_EPS: dict[tuple[str, str], str] = {("cifar10", "Linf"): "8/255", ("cifar100", "Linf"): "8/255",
                                               ("cifar10", "L2"): "0.5", ("imagenet", "Linf"): "4/255"}
#: images of the known batch the checks run on
CHECK_IMAGES = 200
#: top-1 gain (fraction) of normalised / de-normalised inputs over the given ones that refuses a model
NORMALISATION_MARGIN = 0.2


def parse_eps(eps: Any, norm: str = "Linf") -> tuple[float, str]:
    """``(value, text)`` of a budget given as a number or a fraction (``"4/255"``, ``"0.5"``, ``0.0157``).

    The text is RobustBench's and one per budget, however it was typed: an Linf budget that is a whole
    number of grey levels is ``k/255`` (``"16/510"``, ``8 / 255`` -> ``"8/255"``), any other budget the
    shortest decimal that reads back as the same float (``"0.50"`` -> ``"0.5"``), so two budgets never share a
    text (the benchmark's folder, the leaderboard's table) and one budget never gets two."""
    if isinstance(eps, str):
        try:
            value = float(Fraction(eps.strip()))
        except (ValueError, ZeroDivisionError, OverflowError):  # 1e309: no float
            raise ValueError(f"eps must be a number or a fraction such as 4/255, got {eps!r}") from None
    elif isinstance(eps, (int, float)) and not isinstance(eps, bool):
        value = float(eps)
    else:
        raise ValueError(f"eps must be a number or a fraction such as 4/255, got {eps!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"eps must be a finite budget > 0, got {eps!r}")
    k = value * 255
    if norm == "Linf" and k >= 1 and abs(k - round(k)) < 1e-6:
        return value, f"{round(k)}/255"
    return value, repr(value)


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k / n`` (fractions)."""
    from scipy.stats import norm

    if n <= 0:
        raise ValueError(f"n must be >= 1, got {n}")
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _top1(model: nn.Module, x: Tensor, y: Tensor, batch_size: int) -> float:
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + batch_size]).argmax(1) for i in range(0, len(x), batch_size)])
    return float((pred.cpu() == y).float().mean())


def check_model(model: nn.Module, x: Tensor, y: Tensor, mean: Any, std: Any, *, version: str = "standard",
                batch_size: int = 100) -> dict[str, float]:
    """The checks of the module docstring on the known batch ``(x, y)`` (``x`` on the model's device).
    Returns the top-1 of the given / normalised / de-normalised inputs; raises one-line ValueErrors."""
    training = [n or type(model).__name__ for n, m in model.named_modules() if m.training]
    if training:
        raise ValueError(f"the model is in training mode ({training[0]}): call model.eval() first "
                         "(RobustBench evaluates in eval mode)")
    norms = _normalisations(model)
    if len(norms) > 1:
        raise ValueError(f"the model normalises its inputs twice ({' and '.join(norms)}): remove one "
                         "normalisation (a model of this project already normalises inside)")
    if not x.is_floating_point() or bool(x.min() < 0) or bool(x.max() > 1):
        lo, hi = (float(x.min()), float(x.max())) if x.numel() else (0.0, 0.0)
        raise ValueError(f"inputs must be images in [0, 1] (the model normalises inside), got values in "
                         f"[{lo:.3g}, {hi:.3g}]: give the dataset without normalisation")
    probe = x[:min(len(x), 64)]
    with torch.no_grad():
        a, b = model(probe), model(probe)
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-5) and version != "rand":
        raise ValueError(f"the model is randomised (two forward passes on the same batch differ by up to "
                         f"{float((a - b).abs().max()):.3g}): use version 'rand' (--version rand)")
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    acc = {"given": _top1(model, x, y, batch_size), "normalised": _top1(model, (x - m) / s, y, batch_size),
           "denormalised": _top1(model, x * s + m, y, batch_size)}
    if acc["normalised"] - acc["given"] >= NORMALISATION_MARGIN:
        raise ValueError(f"the model expects normalised inputs but gets images in [0, 1] (top-1 "
                         f"{100 * acc['given']:.0f}% as given, {100 * acc['normalised']:.0f}% normalised): "
                         "wrap it in NormalizedModel(model, mean, std)")
    if acc["denormalised"] - acc["given"] >= NORMALISATION_MARGIN:
        raise ValueError(f"the model normalises its inputs twice (top-1 {100 * acc['given']:.0f}% on images "
                         f"in [0, 1], {100 * acc['denormalised']:.0f}% with one normalisation undone): "
                         "remove one normalisation")
    return acc


def _normalisations(model: nn.Module) -> list[str]:
    """The normalisation modules in ``model``: ``NormalizedModel`` and torchvision's ``Normalize``."""
    from ..models.normalize import NormalizedModel

    found = []
    for n, m in model.named_modules():
        if isinstance(m, NormalizedModel) or type(m).__name__ == "Normalize" and hasattr(m, "std"):
            found.append(f"{type(m).__name__} at {n or 'the top'}")
    return found


def _resolve(model: Any, dataset: str | Dataset | None, device: torch.device
             ) -> tuple[nn.Module, str, dict[str, Any]]:
    """``(model taking [0, 1] images, dataset name or the given Dataset, info)``."""
    from ..models.normalize import NormalizedModel
    from ..train.resolve import resolve_model

    info: dict[str, Any] = {}
    if isinstance(model, nn.Module):
        info.update(name=type(model).__name__, architecture=type(model).__name__)
        net = model
    elif isinstance(model, (str, Path)):
        loaded = resolve_model(str(model), pretrained=False, device=str(device))
        if loaded.takes_text:
            raise ValueError(f"{model}: benchmark evaluates image classifiers, this is a text model")
        net = loaded.model
        if loaded.normalize is not None:  # a timm model: normalisation goes inside, as RobustBench does
            net = NormalizedModel(net, *loaded.normalize)
            net.training = False  # the wrapper's own flag only: the loaded model's modes are checked
        cfg_ds = getattr(loaded.config, "dataset", None)
        if cfg_ds is not None and isinstance(dataset, str) and dataset != cfg_ds:
            # a robust accuracy on images of another dataset measures nothing the leaderboard could list
            raise ValueError(f"{model} was trained on {cfg_ds}, not {dataset}: benchmark it on its own "
                             "dataset (leave out --dataset)")
        dataset = dataset if dataset is not None else cfg_ds
        base = str(model).partition("@")[0].rstrip("/")
        info.update(name=model_label(str(model)), architecture=getattr(loaded.config, "model", None) or base,
                    img_size=(loaded.input_size or (None, None))[1],
                    data_root=getattr(loaded.config, "data_root", None))
    else:
        raise ValueError(f"model must be an nn.Module or a model specifier (run directory, timm NAME or "
                         f"NAME@FILE), got {type(model).__name__}")
    if dataset is None:
        raise ValueError("give the dataset (dataset='fashion-mnist', --dataset): the model does not name one")
    return net.to(device), dataset, info


def benchmark(
    model: nn.Module | str,
    dataset: str | None = None,
    threat_model: str = "Linf",
    eps: float | str | None = None,
    n: int = 1000,
    version: str = "standard",
    *,
    adaptive: bool | None = None,
    name: str | None = None,
    data_root: str | None = None,
    out: str | Path | None = None,
    device: str = "cpu",
    batch_size: int = 100,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Clean and robust accuracy of ``model`` on the first ``n`` images of ``dataset``'s committed test
    list, as RobustBench reports them (see the module docstring).

    Args:
        model: an ``nn.Module`` taking images in [0, 1] (eval mode), or a model specifier: a run directory
            of this project, a timm name with local weights ``NAME@FILE`` (normalisation is put inside).
        dataset: a dataset name (default: the run's); its test split is evaluated.
        threat_model: ``Linf``, ``L2`` (AutoAttack) or ``corruptions``.
        eps: the budget in pixel units, a number or ``"4/255"`` (default: RobustBench's for the dataset,
            :data:`ROBUSTBENCH_EPS` - CIFAR Linf 8/255 - else Linf 4/255, L2 0.5).
        version: AutoAttack ``standard`` or ``rand`` (randomised defences).
        adaptive: attack through what layers compute without gradient (True) or not (False); None is
            refused for a model that has such layers (the module docstring).
        out: folder for ``<dataset>/<threat_model>/<eps>/<name>.json`` (RobustBench's model_info layout
            with a folder per budget, e.g. ``fashion-mnist/Linf/4_255/``; corruptions have none) and the
            per-example results ``results/<name>.json`` (reused when run again); None: nothing written.
    Returns:
        the RobustBench-format record (accuracies as percent strings, as RobustBench writes them), with
        ``n``, ``protocol`` (``pixel``), the image list and its SHA-256, intervals and the checks' numbers.
    """
    import tempfile

    from ..attention.adaptive import adaptive_layers
    from ..data.images import build_image_dataset, dataset_info
    from ..io import output_path, write_json_atomic
    from ..robustness.attacks import check_pixel_budget
    from ..robustness.image_ids import ids_path, image_ids_sha256, load_image_ids
    from ..robustness.store import ResultStore
    from ..tasks.classification.suites import AutoAttackSuite, evaluate_autoattack
    from ..train.distributed import resolve_device

    check_int(batch_size, "--batch-size", min=1)
    if threat_model not in THREAT_MODELS:
        raise ValueError(f"unknown threat model {threat_model!r}; valid: {', '.join(THREAT_MODELS)}")
    if version not in ("standard", "rand"):
        raise ValueError(f"unknown AutoAttack version {version!r}; valid: standard, rand")
    if eps is not None:  # a bad budget is refused before the model is loaded
        if threat_model == "corruptions":
            raise ValueError("--eps is a budget of the Linf and L2 threat models: corruptions take none")
        check_pixel_budget(threat_model, parse_eps(eps, threat_model)[0], "--eps")
    dev = resolve_device(device)
    net, ds_name, info = _resolve(model, dataset, dev)
    default = ROBUSTBENCH_EPS.get((ds_name, threat_model), DEFAULT_EPS.get(threat_model))
    eps_value, eps_text = (None, None) if threat_model == "corruptions" else parse_eps(
        default if eps is None else eps, threat_model)
    gradient_free = adaptive_layers(net)
    if gradient_free and adaptive is None and threat_model != "corruptions":
        more = f" and {len(gradient_free) - 1} more layers" if len(gradient_free) > 1 else ""
        raise ValueError(f"the model computes part of its output without gradient ({gradient_free[0]}"
                         f"{more}): attack through it with --adaptive, or as computed with --no-adaptive")
    if not isinstance(ds_name, str):
        raise ValueError("dataset must be a dataset name (its committed test-image list is used)")
    ids = load_image_ids(ds_name, n)
    meta = dataset_info(ds_name)
    test_set = build_image_dataset(ds_name, "test", root=data_root or info.get("data_root"),
                                   img_size=info.get("img_size"))
    name = name or re.sub(r"[^A-Za-z0-9_.+-]+", "_", str(info["name"]))

    weights = weights_sha256(net)
    json_path: Path | None = None
    if out is not None:
        # through output_path, before any work: a link inside --out (out/fashion-mnist -> elsewhere) must
        # not carry the JSON out of it
        budget = [] if eps_text is None else [eps_text.replace("/", "_")]
        json_path = output_path(out, ds_name, threat_model, *budget, f"{name}.json",
                                what="the benchmark JSON")
        # the name taken by another model's results: they were replaced without a word
        taken = ResultStore(output_path(out, "results", f"{name}.json", what="name"))
        others = sorted({k.get("weights") for k in (r.get("key") for r in taken.records().values())
                         if isinstance(k, dict) and k.get("weights") not in (None, weights)})
        if others:
            raise ValueError(f"{taken.path} holds the results of another model named {name!r} (weights "
                             f"{others[0][:12]}..., this one {weights[:12]}...): give --name another name, "
                             "or delete that file to replace its results")
        clash = _clashing_benchmark(taken.records(), json_path, threat_model, eps_text, eps_value, n, version,
                                    bool(adaptive))
        if clash:
            raise ValueError(f"{taken.path}: {clash}; under the same name this benchmark would replace those "
                             f"results: give --name another name (e.g. {name}-n{n}), or delete "
                             "the earlier files to replace them")
    known = Subset(test_set, load_image_ids(ds_name)[:CHECK_IMAGES])
    xs, ys = zip(*(known[i] for i in range(len(known))), strict=True)
    checks = check_model(net, torch.stack(xs).to(dev), torch.as_tensor(ys), meta.mean, meta.std,
                         version=version, batch_size=batch_size)

    tmp = None if out is not None else tempfile.TemporaryDirectory()
    root = Path(out) if out is not None else Path(tmp.name)  # type: ignore[union-attr]
    store = ResultStore(output_path(root, "results", f"{name}.json", what="name"))
    # the architecture is part of every item's key, so the leaderboard can check a JSON's against them
    base_key = {"weights": weights, "architecture": info["architecture"], "dataset": ds_name,
                "img_size": info.get("img_size"), "split": "test"}
    record: dict[str, Any] = {
        "name": name, "link": "", "authors": "", "additional_data": False, "number_forward_passes": 1,
        "dataset": ds_name, "venue": "", "architecture": info["architecture"], "eps": eps_text,
        "reported": "", "threat_model": threat_model, "n": n,
        "image_ids": ids_path(ds_name).name, "image_ids_sha256": image_ids_sha256(ds_name),
        "footnote": _robustbench_note(ds_name, threat_model, eps_text),
        "interval": "95% (Wilson over images; corruptions: bootstrap over images)",
        "checks": {"images": len(known), **{f"top1_{k}": round(100 * v, 2) for k, v in checks.items()}},
    }
    if threat_model != "corruptions":  # attacks in pixel units; a corruption has no budget to scale
        record["protocol"] = "pixel"
    try:
        if threat_model == "corruptions":
            record.update(_corruptions(net, Subset(test_set, ids), store, base_key, ds_name, batch_size,
                                       root))
        else:
            suite = AutoAttackSuite(eps=(eps_value,), norm=threat_model, version=version, n=n, seeds=None,
                                    adaptive=bool(adaptive))
            res = evaluate_autoattack(net, test_set, suite, store, base_key, dataset=ds_name,
                                      batch_size=batch_size, log=log)
            clean = res["clean_autoattack_subset"]
            robust = next(iter(res["autoattack"][suite.name].values()))
            record.update(_acc("clean_acc", clean), **_acc("autoattack_acc", robust), version=version,
                          adaptive=bool(adaptive), gradient_free_layers=len(gradient_free))
            if robust.get("robust_after"):  # AutoAttack's own breakdown, as it reports it
                record["autoattack_robust_after"] = {k: f"{100 * c / n:.2f}"
                                                     for k, c in robust["robust_after"].items()}
                record["flags"] = autoattack_flags(robust["robust_after"], n)
            if version == "rand":
                record["autoattack_acc_note"] = RAND_NOTE
    finally:
        if tmp is not None:
            tmp.cleanup()
    _print(record, log)
    if json_path is not None:
        write_json_atomic(json_path, record)
        log(f"wrote {json_path}")
    return record


def autoattack_flags(robust_after: Mapping[str, int], n: int) -> list[str]:
    """Signs of gradient masking in AutoAttack's own per-attack counts (``robust_after``: images still
    correct after each attack, in the order run): Square, gradient-free and run last, breaking more than
    AutoAttack's tolerance (0.2 % of the ``n`` images) that every gradient attack before it left correct -
    the rule of AutoAttack's ``check_square_sr`` and of :mod:`~kpca_attention.robustness.attack_checks`
    (RobustBench footnotes such entries). A flag is a sign, not proof; no flag is not proof of the
    opposite."""
    from ..robustness.attack_checks import TOLERANCE

    names = list(robust_after)
    if "square" not in names or names.index("square") == 0:
        return []
    broken = robust_after[names[names.index("square") - 1]] - robust_after["square"]
    if broken <= TOLERANCE * n:
        return []
    return [f"white-box >= black-box: Square broke {100 * broken / n:.2f} % of the images every gradient "
            f"attack left correct (tolerance {100 * TOLERANCE:g} %, AutoAttack's check_square_sr): a sign of "
            "gradient masking - the robust accuracy may overstate the model's robustness"]


#: in the JSON of a ``--version rand`` benchmark: why its number and AutoAttack's own log can differ
RAND_NOTE = ("a randomised model: autoattack_acc is one more forward pass of the model on AutoAttack's "
             "adversarial images (as RobustBench's benchmark() evaluates them), so an image AutoAttack broke "
             "can count as robust on this draw and the other way round; AutoAttack's own count after its "
             "attacks is autoattack_robust_after")


def _clashing_benchmark(records: dict[str, dict[str, Any]], json_path: Path, threat_model: str,
                        eps_text: str | None, eps_value: float | None, n: int, version: str,
                        adaptive: bool) -> str | None:
    """What an earlier benchmark under the same name (its result ``records``, its JSON at ``json_path``)
    holds that this one (``n`` images, ``version``, ``adaptive``) would replace - its clean results on
    another number of images, its robust item of the same budget run otherwise, or its JSON from another
    AutoAttack version - or None."""
    from ..io import read_json
    from ..tasks.classification.suites import eps_label

    if threat_model == "corruptions":
        return None
    clean = records.get("autoattack/clean", {}).get("key") or {}
    if clean.get("n") not in (None, n):
        return f"it holds this model's AutoAttack on {clean['n']} images, this one is on {n}"
    item = records.get(f"autoattack/{version}-{threat_model}/{eps_label(eps_value)}", {}).get("key") or {}
    if item and bool(item.get("adaptive", False)) != adaptive:
        was = "an adaptive" if item.get("adaptive") else "a plain (not adaptive)"
        return f"it holds {was} AutoAttack {version} at {eps_text} for this model"
    earlier = read_json(json_path)
    if isinstance(earlier, dict) and earlier.get("version", version) != version:
        return (f"its JSON for {threat_model} {eps_text} holds AutoAttack {earlier['version']}, this one "
                f"is {version}")
    return None


def _robustbench_note(dataset: str, threat_model: str, eps_text: str | None) -> str:
    """How far this record can be lined up with RobustBench's leaderboard, in one line."""
    images = ("images: the first n of this package's seeded list, not RobustBench's (CIFAR: the first n "
              "test images in order; ImageNet: its 5000-image list)")
    if threat_model == "corruptions":
        return ("not RobustBench's corruptions: imagecorruptions with the ImageNet-C parameters, applied on "
                f"the fly (RobustBench reads the released CIFAR-10-C / ImageNet-C); {images}")
    rb = ROBUSTBENCH_EPS.get((dataset, threat_model))
    if rb is None:
        return f"not a RobustBench threat model ({dataset}, {threat_model}); {images}"
    if rb != eps_text:
        return (f"RobustBench's {dataset} {threat_model} leaderboard uses {rb}, this record {eps_text}; "
                f"{images}")
    return f"RobustBench's {dataset} {threat_model} budget and AutoAttack; {images}"


def _acc(field: str, r: dict[str, Any]) -> dict[str, Any]:
    from ..robustness.store import decode_bits

    bits = decode_bits(r["correct"])
    lo, hi = wilson_interval(int(bits.sum()), len(bits))
    return {field: f"{100 * bits.mean():.2f}", f"{field}_interval": [round(100 * lo, 2), round(100 * hi, 2)]}


def _corruptions(net: nn.Module, base: Dataset, store: Any, base_key: dict[str, Any], ds_name: str,
                 batch_size: int, root: Path) -> dict[str, Any]:
    from ..robustness.common import collect_logits
    from ..robustness.corruptions import COMMON_CORRUPTIONS, SEVERITIES, corrupted_views, images_version_key
    from ..robustness.metrics import mce
    from ..robustness.store import decode_bits, example_result

    def clean_of(ds: Dataset) -> dict[str, Any]:
        return example_result(*collect_logits(net, ds, batch_size=batch_size, progress=False))

    from ..robustness.image_ids import ids_key

    # the images are the first n of the committed list: it keys them, as the AutoAttack items'
    key = {**base_key, "n": len(base), **ids_key(ds_name), "corruption_seed": 0}  # type: ignore[arg-type]
    clean = store.get_or_compute("corruptions/clean", key, lambda: clean_of(base))[0]
    key.update(images_version_key())  # the corrupted views: made by corrupt()
    views = corrupted_views(base, COMMON_CORRUPTIONS, SEVERITIES, seed=0, cache_dir=root / "cache")
    bits, errors = [], {}
    for (c, s), view in views.items():
        r = store.get_or_compute(f"corruptions/{c}/{s}", {**key, "corruption": c, "severity": s},
                                 lambda view=view: clean_of(view))[0]
        bits.append(decode_bits(r["correct"]))
        errors.setdefault(c, {})[s] = 1 - r["top1"]
    per_image = np.stack(bits).mean(0)
    rng = np.random.default_rng(0)
    boot = [per_image[rng.integers(0, len(per_image), len(per_image))].mean() for _ in range(2000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    out = {**_acc("clean_acc", clean), "corruptions_acc": f"{100 * per_image.mean():.2f}",
           "corruptions_acc_interval": [round(100 * float(lo), 2), round(100 * float(hi), 2)],
           # mCE is defined against AlexNet's ImageNet-C errors: on other data sets it means nothing
           "corruptions_mce": f"{mce(errors):.2f}" if ds_name == "imagenet" else None}
    return out


def _print(r: dict[str, Any], log: Callable[[str], None]) -> None:
    def line(label: str, field: str) -> str:
        lo, hi = r[f"{field}_interval"]
        return f"{label}: {r[field]}% [{lo:.2f}, {hi:.2f}] (95%, {r['n']} images)"

    log(f"{r['name']} on {r['dataset']} ({r['image_ids']}, sha256 {r['image_ids_sha256'][:12]})")
    log(line("clean accuracy", "clean_acc"))
    if "autoattack_acc" in r:
        log(line(f"AutoAttack {r['version']} {r['threat_model']} eps {r['eps']} (pixel) robust accuracy",
                 "autoattack_acc"))
        after = r.get("autoattack_robust_after")
        if after:
            log("  robust accuracy after each attack: " + ", ".join(
                f"{k.upper()} {v}%" for k, v in after.items() if k != "clean"))
        for flag in r.get("flags", []):
            log(f"  flag: {flag}")
    else:
        log(line("corruptions accuracy (15 corruptions x 5 severities)", "corruptions_acc"))
        if r["corruptions_mce"] is not None:
            log(f"mCE (AlexNet = 100): {r['corruptions_mce']}")
