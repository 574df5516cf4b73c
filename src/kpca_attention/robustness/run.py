"""Robustness suites over trained checkpoints, side by side, with resumable per-item results.

Every (checkpoint, suite, item) result - one corruption at one severity, one attack at one eps, one
OOD set, one LM split - is kept in the checkpoint's result store ``<out>/results/<label>.json``
(:mod:`kpca_attention.robustness.store`, per-example correctness included) together with the
parameters that produced it (checkpoint weights hash, data, subset size, seed,
attack options). A run that is interrupted and started again reuses every file whose parameters
match and computes only the rest; change a parameter and the affected items are recomputed.

Reports: ``<out>/<suite>.json`` (everything), ``<out>/<suite>.md`` (tables in the shape of the
paper's tables) and PNG plots.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Subset
from tqdm.auto import tqdm

from ..io import read_json, sha256_file, write_json_atomic, write_text_atomic
from . import attacks as A
from . import metrics as M
from .common import collect_logits
from .corruptions import COMMON_CORRUPTIONS, SEVERITIES, CorruptedDataset, check_corruption, imagenet_c_folder
from .store import ResultStore, example_result

SUITES: tuple[str, ...] = ("corruptions", "ood", "attacks", "wordswap")


# ----------------------------------------------------------------------------- checkpoints

@dataclass
class Checkpoint:
    """A model to evaluate, named by the package's one model specifier
    (:func:`kpca_attention.train.resolve.resolve_model`): a run or checkpoint directory of this project,
    or an image classifier given as a timm name with an optional local weights file
    (``vit_small_patch16_224@weights.safetensors``). ``label`` names it in tables; the model is loaded on
    first use. Models that are not project checkpoints need ``dataset`` (and ``data_root``): what
    they classify is not recorded with them."""

    path: str
    label: str
    device: str = "cpu"
    ema: bool = False
    dataset: str | None = None
    data_root: str | None = None
    _loaded: tuple[nn.Module, Any] | None = field(default=None, repr=False)

    @functools.cached_property
    def is_project(self) -> bool:
        p = Path(self.path).expanduser()
        return p.exists() and any((p / f).exists() for f in ("COMPLETE", "checkpoints", "latest.json",
                                                               "model.safetensors"))

    @functools.cached_property
    def ckpt_dir(self) -> Path:
        from ..train.checkpoint import resolve_checkpoint

        if not self.is_project:
            raise ValueError(f"{self.path} is not a checkpoint of this project")
        return resolve_checkpoint(self.path)

    @functools.cached_property
    def config(self) -> Any:
        from ..train.checkpoint import read_config

        if self.is_project:
            return read_config(self.ckpt_dir)
        from ..train import TrainConfig

        size = self._model_and_meta()[1]  # first: an unknown name or a missing path is the error to report
        if not self.dataset:
            raise ValueError(f"{self.path}: give --dataset (and --data-root): a model that is not a "
                             "checkpoint of this project does not record what it classifies")
        return TrainConfig(task="vision", model=self.path.partition("@")[0], dataset=self.dataset,
                           data_root=self.data_root, img_size=int(size[1]))

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the weights file (from the checkpoint's COMPLETE marker when it has one); for
        other models, of the weights file given with ``@`` or of the loaded parameters."""
        if not self.is_project:
            _, _, weights = self.path.partition("@")
            if weights:
                return sha256_file(Path(weights))
            h = hashlib.sha256()
            for k, v in sorted(self.load().state_dict().items()):
                h.update(k.encode())
                h.update(v.detach().cpu().contiguous().numpy().tobytes())
            return h.hexdigest()
        from ..train.checkpoint import EMA_FILE, MARKER_FILE, MODEL_FILE

        fname = EMA_FILE if self.ema else MODEL_FILE
        marker = read_json(self.ckpt_dir / MARKER_FILE)
        try:
            return str(marker["files"][fname]["sha256"])  # type: ignore[index]
        except (TypeError, KeyError):
            return sha256_file(self.ckpt_dir / fname)

    def _model_and_meta(self) -> tuple[nn.Module, tuple[int, int, int]]:
        if self._loaded is None:
            if self.is_project:
                from ..train.checkpoint import load_model

                model, cfg = load_model(self.path, self.device, ema=self.ema)
                self._loaded = (model, None)
            else:
                from ..models.normalize import NormalizedModel
                from ..train.resolve import resolve_model

                loaded = resolve_model(self.path, pretrained=False, device=self.device)
                if loaded.takes_text:
                    raise ValueError(f"{self.path} is a text model: the robustness suites of "
                                     "other models take image classifiers")
                model = loaded.model
                if loaded.normalize is not None:  # images enter in [0, 1]; normalise inside
                    model = NormalizedModel(model, *loaded.normalize).to(self.device).eval()
                self._loaded = (model, loaded.input_size)
        return self._loaded[0], self._loaded[1]  # type: ignore[return-value]

    def load(self) -> nn.Module:
        return self._model_and_meta()[0]


def default_labels(paths: Sequence[str]) -> list[str]:
    """Run-directory names (``runs/demo/symvit`` -> ``symvit``); duplicates get ``-2``, ``-3``..."""
    labels = []
    for p in paths:
        if not Path(p).exists():  # a model name: its name (without a weights file)
            labels.append(str(p).partition("@")[0])
            continue
        path = Path(p).resolve()
        if path.parent.name == "checkpoints":  # a checkpoint directory inside a run
            path = path.parent.parent
        labels.append(path.name)
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab}-{seen[lab]}")
    return out


# ----------------------------------------------------------------------------- result store

class Stores:
    """One :class:`~kpca_attention.robustness.store.ResultStore` per checkpoint label:
    ``<out>/results/<label>.json``, items named ``<suite>/<item>``."""

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.root = Path(out_dir) / "results"
        self._stores: dict[str, ResultStore] = {}

    def get_or_compute(self, label: str, suite: str, item: str, key: dict[str, Any],
                       compute: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        if label not in self._stores:
            self._stores[label] = ResultStore(self.root / f"{label}.json")
        return self._stores[label].get_or_compute(f"{suite}/{item}", key, compute)


# ----------------------------------------------------------------------------- options

@dataclass
class Options:
    """Everything that changes the numbers (part of each item's cache key) plus run settings."""

    split: str = "test"
    n: int | None = None  # examples for corruptions/ood (None: all)
    batch_size: int = 128
    seed: int = 0
    corruptions: tuple[str, ...] = COMMON_CORRUPTIONS
    severities: tuple[int, ...] = SEVERITIES
    imagenet_c: str | None = None
    cache: bool = True
    methods: tuple[str, ...] = ("fgsm", "pgd")
    eps: tuple[float, ...] | None = None  # None: attacks.DEFAULT_EPS per method
    attack_n: int = 500
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    imagenet_a: str | None = None
    imagenet_r: str | None = None
    imagenet_o: str | None = None
    imagenet_val: str | None = None
    lm_splits: tuple[str, ...] = ("valid", "test")
    rate: float = 0.015
    stride: int = 1
    max_tokens: int | None = None
    baseline: str | None = None  # label of the baseline run for relative mCE (default: the first)
    progress: bool = True


def _echo(msg: str) -> None:
    tqdm.write(msg)


def _image_test_set(ck: Checkpoint, opts: Options, n: int | None) -> Dataset:
    from ..data.images import build_image_dataset
    from ..tasks import get as get_task  # the study engine replaces this module; until then: the task
    from ..tasks.classification.suites import ImageSuites

    cfg = ck.config
    if get_task(cfg.task).suites_type is not ImageSuites:
        raise ValueError(f"{ck.label}: the image suites need a vision checkpoint, got task={cfg.task!r}")
    return build_image_dataset(cfg.dataset, opts.split, root=cfg.data_root, img_size=cfg.img_size, subset=n)


def _data_key(ck: Checkpoint, opts: Options, n: int | None) -> dict[str, Any]:
    cfg = ck.config
    return {"weights": ck.fingerprint, "dataset": cfg.dataset, "img_size": cfg.img_size,
            "split": opts.split, "n": n, "ema": ck.ema}


# ----------------------------------------------------------------------------- corruptions

def run_corruptions(ckpts: Sequence[Checkpoint], out: Path, opts: Options) -> dict[str, Any]:
    for name in opts.corruptions:
        for s in opts.severities:
            check_corruption(name, s)
    store = Stores(out)
    per_model: dict[str, dict[str, Any]] = {}
    items = [("clean", None, None)] + [(f"{c}-s{s}", c, s) for c in opts.corruptions for s in opts.severities]
    for ck in ckpts:
        base: Dataset | None = None
        reused = 0
        res: dict[str, Any] = {}
        bar = tqdm(items, desc=f"corruptions {ck.label}", disable=None if opts.progress else True)
        for item, name, sev in bar:
            key = {**_data_key(ck, opts, opts.n), "item": item, "seed": opts.seed,
                   "imagenet_c": opts.imagenet_c}

            def compute(name=name, sev=sev, item=item, ck=ck) -> dict[str, Any]:
                nonlocal base
                if base is None:
                    base = _image_test_set(ck, opts, opts.n)
                if name is None:
                    ds = base
                elif opts.imagenet_c:
                    folder = imagenet_c_folder(opts.imagenet_c, name, sev, _imagenet_c_transform(ck))
                    ds = _same_images(folder, base)
                else:
                    cache_dir = out / "cache" if opts.cache else None
                    ds = CorruptedDataset(base, name, sev, seed=opts.seed, cache_dir=cache_dir)
                    if cache_dir is not None:
                        ds.build_cache(progress=opts.progress)
                logits, labels = collect_logits(ck.load(), ds, opts.batch_size, progress=opts.progress,
                                                desc=item)
                return example_result(logits, labels)

            res[item], hit = store.get_or_compute(ck.label, "corruptions", item, key, compute)
            reused += hit
        if reused:
            _echo(f"{ck.label}: reused {reused}/{len(items)} finished corruption items")
        per_model[ck.label] = res
    return _summarise_corruptions(ckpts, per_model, out, opts)


def _same_images(folder: Dataset, base: Dataset) -> Dataset:
    """The ImageNet-C images of the clean evaluation images: ImageNet-C mirrors the val tree file by
    file, so a seeded subset of val (``--n``) maps to the same indices of each corruption folder."""
    full = base.dataset if isinstance(base, Subset) else base
    if len(folder) != len(full):  # type: ignore[arg-type]
        raise ValueError(f"the ImageNet-C folder has {len(folder)} images but the clean set "  # type: ignore[arg-type]
                         f"{len(full)}: they must be the same images")  # type: ignore[arg-type]
    return Subset(folder, base.indices) if isinstance(base, Subset) else folder


def _imagenet_c_transform(ck: Checkpoint) -> Callable[[Any], torch.Tensor]:
    from torchvision import transforms

    size = ck.config.img_size or 224
    tf: list[Any] = [] if size == 224 else [transforms.Resize(size)]
    return transforms.Compose([*tf, transforms.ToTensor()])


def _summarise_corruptions(
    ckpts: Sequence[Checkpoint], per_model: dict[str, dict[str, Any]], out: Path, opts: Options
) -> dict[str, Any]:
    labels = [c.label for c in ckpts]
    baseline = opts.baseline or labels[0]
    if baseline not in per_model:
        raise ValueError(f"baseline {baseline!r} is not among the checkpoints' labels {labels}")
    errors = {lab: {c: {s: 1 - per_model[lab][f"{c}-s{s}"]["top1"] for s in opts.severities}
                    for c in opts.corruptions} for lab in labels}
    full = tuple(opts.severities) == SEVERITIES
    summary: dict[str, Any] = {"baseline": baseline, "models": {}}
    for lab in labels:
        acc = {c: 100 * float(np.mean([1 - e for e in errors[lab][c].values()])) for c in opts.corruptions}
        entry: dict[str, Any] = {
            "clean_top1": 100 * per_model[lab]["clean"]["top1"],
            "corrupted_top1_mean": float(np.mean(list(acc.values()))),
            "per_corruption_top1": acc,
            "items": per_model[lab],
        }
        if full:
            entry["ce_vs_baseline"] = M.corruption_errors(errors[lab], errors[baseline])
            entry["mce_vs_baseline"] = float(np.mean(list(entry["ce_vs_baseline"].values())))
            if set(COMMON_CORRUPTIONS) <= set(opts.corruptions) and _is_imagenet(ckpts, lab):
                entry["mce_alexnet"] = M.mce({c: errors[lab][c] for c in COMMON_CORRUPTIONS})
        summary["models"][lab] = entry
    write_json_atomic(out / "corruptions.json", summary)

    acc_tab = {lab: summary["models"][lab]["per_corruption_top1"] for lab in labels}
    lines = [
        f"# Corruption robustness ({', '.join(labels)})", "",
        f"Data: {ckpts[0].config.dataset} {opts.split}"
        + (f" ({opts.n} images, a seeded sample, the same for every model)" if opts.n else "")
        + (f", ImageNet-C folders {opts.imagenet_c}" if opts.imagenet_c else
           f", corrupted on the fly with imagecorruptions (seed {opts.seed})")
        + f"; severities {list(opts.severities)}.", "",
        "Top-1 accuracy (%) per corruption, averaged over severities:", "",
        M.accuracy_table(acc_tab, list(opts.corruptions)), "",
        "| summary | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels),
        "| clean top-1 (%) | "
        + " | ".join(f"{summary['models'][x]['clean_top1']:.2f}" for x in labels) + " |",
        "| mean corrupted top-1 (%) | "
        + " | ".join(f"{summary['models'][x]['corrupted_top1_mean']:.2f}" for x in labels) + " |",
    ]
    if full:
        lines.append(f"| mCE relative to {baseline} (%) | "
                     + " | ".join(f"{summary['models'][x]['mce_vs_baseline']:.2f}" for x in labels) + " |")
        if all("mce_alexnet" in summary["models"][x] for x in labels):
            lines.append("| mCE vs AlexNet (ImageNet-C, %) | "
                         + " | ".join(f"{summary['models'][x]['mce_alexnet']:.2f}" for x in labels) + " |")
        lines += ["", f"mCE relative to {baseline}: CE_c = sum_s err(s,c) / sum_s err_{baseline}(s,c), "
                  f"averaged over the corruptions shown; {baseline} scores 100, lower is more robust. "
                  "This is not the ImageNet-C mCE (which normalises by AlexNet)."]
    write_text_atomic(out / "corruptions.md", "\n".join(lines) + "\n")
    _plot_corruptions(summary, labels, list(opts.corruptions), list(opts.severities), out / "corruptions.png")
    return summary


def _is_imagenet(ckpts: Sequence[Checkpoint], label: str) -> bool:
    ck = next(c for c in ckpts if c.label == label)
    return str(ck.config.dataset).lower().replace("_", "-") in ("imagenet", "imagenet-1k")


def _plot_corruptions(summary: dict[str, Any], labels: list[str], corruptions: list[str],
                      severities: list[int], path: Path) -> None:
    from ..plotting import new_figure, save_figure

    fig, (ax1, ax2) = new_figure(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(labels)
    x = np.arange(len(corruptions))
    for i, lab in enumerate(labels):
        m = summary["models"][lab]
        ax1.bar(x + i * width, [m["per_corruption_top1"][c] for c in corruptions], width, label=lab)
        sev_acc = [100 * np.mean([m["items"][f"{c}-s{s}"]["top1"] for c in corruptions]) for s in severities]
        ax2.plot([0, *severities], [m["clean_top1"], *sev_acc], "o-", label=lab)
    ax1.set_xticks(x + width * (len(labels) - 1) / 2, corruptions, rotation=45, ha="right")
    ax1.set_ylabel("top-1 accuracy (%)")
    ax1.set_title("accuracy per corruption (mean over severities)")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("severity (0 = clean)")
    ax2.set_title("mean over corruptions")
    ax2.grid(alpha=0.3)
    save_figure(fig, path, dpi=120)


# ----------------------------------------------------------------------------- attacks

def _eps_grid(method: str, opts: Options) -> tuple[float, ...]:
    return tuple(opts.eps) if opts.eps is not None else A.DEFAULT_EPS[method]


def run_attacks(ckpts: Sequence[Checkpoint], out: Path, opts: Options) -> dict[str, Any]:
    for m in opts.methods:
        if m not in A.METHODS:
            raise ValueError(f"unknown attack {m!r}; valid: {', '.join(A.METHODS)}")
    store = Stores(out)
    sweeps: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for ck in ckpts:
        data: tuple[torch.Tensor, torch.Tensor] | None = None

        def tensors(ck: Checkpoint = ck) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal data
            if data is None:
                ds = _image_test_set(ck, opts, opts.attack_n)
                xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
                data = torch.stack(xs), torch.as_tensor(ys)
            return data

        items = [(m, e) for m in opts.methods for e in (0.0, *_eps_grid(m, opts))]
        sweeps[ck.label] = {m: [] for m in opts.methods}
        reused = 0
        for method, eps in tqdm(items, desc=f"attacks {ck.label}", disable=None if opts.progress else True):
            options = dict(opts.attack_options.get(method, {}))
            item = "clean" if eps == 0 else f"{method}-eps{eps:.6g}"
            key = {**_data_key(ck, opts, opts.attack_n), "item": item, "seed": opts.seed,
                   **({} if eps == 0 else {"method": method, "eps": eps, "options": options})}

            def compute(method=method, eps=eps, options=options, ck=ck, tensors=tensors) -> dict[str, Any]:
                lg, lb, nm = A.attack_logits(ck.load(), tensors(), method, eps, batch_size=opts.batch_size,
                                             progress=opts.progress, seed=opts.seed, **options)
                return {**example_result(lg, lb), "norm": A.NORMS[method], "mean_norm": nm.mean().item(),
                        "max_norm": nm.max().item()}

            r, hit = store.get_or_compute(ck.label, "attacks", item, key, compute)
            reused += hit
            sweeps[ck.label][method].append({"eps": eps, **r})
        if reused:
            _echo(f"{ck.label}: reused {reused}/{len(items)} finished attack items")
    write_json_atomic(out / "attacks.json", {"sweeps": sweeps, "n": opts.attack_n,
                                            "options": opts.attack_options})
    labels = list(sweeps)
    lines = [f"# Adversarial attacks ({', '.join(labels)})", "",
             f"{opts.attack_n} images of {ckpts[0].config.dataset} {opts.split} (a seeded sample, the "
             "same for every model); eps in pixel units "
             "(images in [0, 1], normalisation inside the model); Linf eps also shown as k/255.", "",
             "| attack | norm | eps | " + " | ".join(f"{x} top-1 | {x} top-5" for x in labels) + " |",
             "|---|---|---:|" + "---:|---:|" * len(labels)]
    clean = [sweeps[x][opts.methods[0]][0] for x in labels]
    cells = " | ".join(f"{100 * r['top1']:.2f} | {100 * r['top5']:.2f}" for r in clean)
    lines.append(f"| clean | - | 0 | {cells} |")
    for method in opts.methods:
        for k, row in enumerate(sweeps[labels[0]][method]):
            eps = row["eps"]
            if eps == 0:
                continue
            e_txt = f"{eps:.4g}" + (f" ({eps * 255:.3g}/255)" if A.NORMS[method] == "Linf" else "")
            rows = [sweeps[x][method][k] for x in labels]
            cells = " | ".join(f"{100 * r['top1']:.2f} | {100 * r['top5']:.2f}" for r in rows)
            lines.append(f"| {method} | {A.NORMS[method]} | {e_txt} | {cells} |")
    write_text_atomic(out / "attacks.md", "\n".join(lines) + "\n")
    A.plot_eps_sweep(sweeps, out / "attacks.png", title=f"{ckpts[0].config.dataset}: accuracy under attack")
    return {"sweeps": sweeps}


# ----------------------------------------------------------------------------- ood

def run_ood(ckpts: Sequence[Checkpoint], out: Path, opts: Options) -> dict[str, Any]:
    sets = {"imagenet-a": opts.imagenet_a, "imagenet-r": opts.imagenet_r, "imagenet-o": opts.imagenet_o}
    store = Stores(out)
    results: dict[str, dict[str, Any]] = {ck.label: {} for ck in ckpts}
    skipped = []
    for name, root in sets.items():
        if root is None or not Path(root).is_dir():
            why = f"no --{name} path given" if root is None else f"{root} not found"
            skipped.append(f"{name}: skipped ({why})")
            continue
        if name == "imagenet-o" and (opts.imagenet_val is None or not Path(opts.imagenet_val).is_dir()):
            skipped.append("imagenet-o: skipped (needs --imagenet-val, the in-distribution ImageNet val "
                           "folder)")
            continue
        for ck in ckpts:
            key = {"weights": ck.fingerprint, "root": str(root), "val": opts.imagenet_val,
                   "img_size": ck.config.img_size, "item": name}

            def compute(name=name, root=root, ck=ck) -> dict[str, Any]:
                if name == "imagenet-o":
                    return M.imagenet_o_aupr(ck.load(), root, opts.imagenet_val, ck.config.img_size,
                                             opts.batch_size, opts.progress)
                return M.masked_accuracy(ck.load(), root, name[-1], ck.config.img_size, opts.batch_size,
                                         opts.progress)

            results[ck.label][name], _ = store.get_or_compute(ck.label, "ood", name, key, compute)
    for msg in skipped:
        _echo(msg)
    write_json_atomic(out / "ood.json", {"results": results, "skipped": skipped})
    labels = [c.label for c in ckpts]
    lines = [f"# Out-of-distribution sets ({', '.join(labels)})", "",
             "| set | metric | " + " | ".join(labels) + " |", "|---|---|" + "---:|" * len(labels)]
    for name in sets:
        if all(name in results[x] for x in labels):
            metric = "AUPR (%)" if name == "imagenet-o" else "top-1 (%) on 200-class mask"
            val = (lambda r: r["aupr"]) if name == "imagenet-o" else (lambda r: 100 * r["top1"])
            cells = " | ".join(f"{val(results[x][name]):.2f}" for x in labels)
            lines.append(f"| {name} | {metric} | {cells} |")
    lines += [""] + [f"- {m}" for m in skipped]
    write_text_atomic(out / "ood.md", "\n".join(lines) + "\n")
    return {"results": results, "skipped": skipped}


# ----------------------------------------------------------------------------- wordswap

def _vocab_of(ck: Checkpoint) -> Any:
    """The LM's vocabulary: ``model.vocab`` (set by the train package's model builder) or the
    checkpoint's ``vocab.json``."""
    from ..data.text import Vocab
    from ..tasks.language import VOCAB_FILE

    vocab = getattr(ck.load(), "vocab", None)
    if vocab is not None:
        return vocab
    for place in (ck.ckpt_dir / VOCAB_FILE, ck.ckpt_dir.parent.parent / VOCAB_FILE):
        if place.exists():
            return Vocab.load(place)
    raise FileNotFoundError(f"{ck.label}: no {VOCAB_FILE} in {ck.ckpt_dir} or its run directory")


def run_wordswap(ckpts: Sequence[Checkpoint], out: Path, opts: Options) -> dict[str, Any]:
    from ..data.text import load_corpus
    from ..tasks import get as get_task
    from .wordswap import perplexity_table, wordswap_perplexity

    store = Stores(out)
    results: dict[str, dict[str, Any]] = {}
    for ck in ckpts:
        cfg = ck.config
        if not get_task(cfg.task).takes_tokens:
            raise ValueError(f"{ck.label}: wordswap needs a language-model checkpoint, got task={cfg.task!r}")
        results[ck.label] = {}
        for split in opts.lm_splits:
            key = {"weights": ck.fingerprint, "dataset": cfg.dataset, "split": split, "rate": opts.rate,
                   "seed": opts.seed, "stride": opts.stride, "max_tokens": opts.max_tokens,
                   "context": cfg.context}

            def compute(split=split, ck=ck, cfg=cfg) -> dict[str, Any]:
                text = load_corpus(cfg.dataset, cfg.data_root).split(split)
                return wordswap_perplexity(ck.load(), _vocab_of(ck).encode, text, cfg.context, opts.rate,
                                           opts.seed, batch_size=opts.batch_size, stride=opts.stride,
                                           progress=opts.progress, max_tokens=opts.max_tokens)

            results[ck.label][split], _ = store.get_or_compute(ck.label, "wordswap", split, key, compute)
    write_json_atomic(out / "wordswap.json", results)
    first = next(iter(results.values()))
    some = next(iter(first.values()))
    note = (f"Word swap: {100 * opts.rate:.1f}% of non-stopword words -> AAA (seed {opts.seed}); "
            f"sliding-window perplexity, stride {opts.stride}"
            + (" (the paper's protocol)" if opts.stride == 1
               else " (an approximation of the paper's stride 1)")
            + (f"; first {opts.max_tokens} tokens" if opts.max_tokens else "")
            + f"; {some['n_swapped']} of {some['n_candidates']} candidate words swapped in the first split.")
    write_text_atomic(out / "wordswap.md", f"# Word-swap attack\n\n{perplexity_table(results)}\n\n{note}\n")
    return results


RUNNERS: dict[str, Callable[[Sequence[Checkpoint], Path, Options], dict[str, Any]]] = {
    "corruptions": run_corruptions, "ood": run_ood, "attacks": run_attacks, "wordswap": run_wordswap,
}


def run_robustness(
    paths: Sequence[str],
    suites: Sequence[str],
    out_dir: str | os.PathLike,
    opts: Options | None = None,
    labels: Sequence[str] | None = None,
    device: str = "cpu",
    ema: bool = False,
    dataset: str | None = None,
    data_root: str | None = None,
) -> dict[str, Any]:
    """Run ``suites`` on every checkpoint in ``paths``; returns ``{suite: summary}``."""
    opts = opts or Options()
    bad = [s for s in suites if s not in SUITES]
    if bad:
        raise ValueError(f"unknown suite(s) {bad}; valid: {', '.join(SUITES)}")
    if "attacks" in suites:  # every attack option checked before any model is loaded or evaluated
        for m in opts.methods:
            if m not in A.METHODS:
                raise ValueError(f"unknown attack {m!r}; valid: {', '.join(A.METHODS)}")
            for e in _eps_grid(m, opts):
                A.check_attack_options(m, e, dict(opts.attack_options.get(m, {})))
    if not paths:
        raise ValueError("no checkpoints given")
    labels = list(labels) if labels else default_labels(paths)
    if len(labels) != len(paths) or len(set(labels)) != len(labels):
        raise ValueError(f"need one distinct label per checkpoint, got {labels} for {len(paths)} checkpoints")
    ckpts = [Checkpoint(str(p), lab, device, ema, dataset, data_root)
             for p, lab in zip(paths, labels, strict=True)]
    if opts.baseline is not None and opts.baseline not in labels:  # before any evaluation, not after it
        raise ValueError(f"baseline {opts.baseline!r} is not among the checkpoints' labels: "
                         f"{', '.join(labels)}")
    for ck in ckpts:
        _ = ck.config  # fail early on a missing checkpoint, an unknown model or a missing --dataset
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output folder {out} is a file")
    out.mkdir(parents=True, exist_ok=True)
    return {s: RUNNERS[s](ckpts, out, opts) for s in suites}
