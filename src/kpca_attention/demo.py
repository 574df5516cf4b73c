"""``make demo`` / ``kpca-attention demo``: SymViT vs RPC-SymViT on Fashion-MNIST, on the CPU.

1. Trains ``symvit_mini_patch4_28`` and ``rpc_symvit_mini_patch4_28`` (PAP with 4 iterations and
   lambda 4 in the first block, the official README's setting) with the same seed, recipe and budget
   (the ``fmnist-cpu`` preset; by default 4 epochs over a fixed 30k-image subset).
2. Evaluates clean top-1/top-5 on the 10k test images, top-1 under common corruptions
   (:mod:`kpca_attention.robustness.corruptions`: ``imagecorruptions`` on the 28 px grayscale images,
   reflect-padded to 32 px and converted back to gray - see that module) at severities 1-5 on a fixed
   subset of test images, and under FGSM / PGD-20 in pixel space
   (:func:`kpca_attention.robustness.attacks.evaluate_attack`).
3. Writes ``runs/demo/report.md`` with the tables and PNG plots (training curves, accuracy per
   corruption, accuracy against severity and against eps) and ``results.json``; prints the report's
   path last.

Resumable: a model whose run directory holds a finished checkpoint of the same settings is not
retrained, an unfinished run (killed) is resumed exactly, a run made with other settings (or for an
older model definition) is trained again, and evaluation results are cached in ``results.json`` per
checkpoint; ``--force`` starts everything again. The corrupted images are cached under ``runs/demo/cache``.

Seams for the robustness code: :func:`corruption_results` and :func:`attack_results` each take the
loaded models and the test set and return plain dicts; the report only reads those dicts.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

__all__ = ["DemoSettings", "DEMO_MODELS", "DEMO_CORRUPTIONS", "run_demo", "demo_cmd",
           "corruption_results", "attack_results"]

#: label -> (timm name, model kwargs); same seed, recipe and budget for both
DEMO_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "SymViT": ("symvit_mini_patch4_28", {}),
    "RPC-SymViT": ("rpc_symvit_mini_patch4_28", {"rpc_iters": 4, "rpc_lambda": 4.0, "rpc_layers": "first"}),
}

#: the 15 ImageNet-C corruptions minus glass blur (about 0.5 s per image: minutes for the demo alone)
#: and frost (16 ms per image, and its frost photographs make little sense at 28 px)
DEMO_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "motion_blur", "zoom_blur",
    "snow", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip


@dataclass
class DemoSettings:
    """What the demo trains and measures. Default budget: 4 epochs over 30k training images (120k
    images seen, 936 steps per model: about 4-5 min per model on 2 shared cores), evaluated on 2000
    test images after every epoch for the curves; the final clean accuracy uses all 10k test images."""

    epochs: int = 4
    train_subset: int | None = 30000  # None: all 60k training images
    eval_subset: int | None = 2000  # per-epoch evaluation during training
    batch_size: int = 128
    seed: int = 0
    corrupt_images: int = 500  # test images per (corruption, severity)
    corruptions: tuple[str, ...] = DEMO_CORRUPTIONS
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)
    attack_images: int = 200
    attack_eps: tuple[float, ...] = (1 / 255, 2 / 255, 4 / 255)
    attacks: tuple[str, ...] = ("fgsm", "pgd")
    clean_images: int | None = None  # None: the whole test set
    extra: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides (tests, experiments)

    @classmethod
    def quick(cls) -> DemoSettings:
        """A minute-scale smoke run (tests): tiny data, two corruptions, one attack eps."""
        return cls(epochs=1, train_subset=512, eval_subset=256, corrupt_images=32,
                   corruptions=("gaussian_noise", "contrast"),
                   severities=(1, 3, 5), attack_images=16, attack_eps=(2 / 255,), clean_images=256,
                   extra={"batch_size": 64, "log_every_steps": 2})


def _slug(label: str) -> str:
    return label.lower().replace("-", "_")


def demo_config(label: str, settings: DemoSettings, out_dir: Path) -> Any:
    from .train import get_preset

    name, kw = DEMO_MODELS[label]
    opts: dict[str, Any] = dict(
        model=name, model_kwargs=dict(kw), epochs=settings.epochs, train_subset=settings.train_subset,
        batch_size=settings.batch_size, seed=settings.seed, output_dir=str(out_dir / "runs" / _slug(label)),
        warmup_epochs=min(0.5, 0.2 * settings.epochs), log_every_steps=10, eval_subset=settings.eval_subset,
        checkpoint_every_steps=50,  # a killed demo loses at most 50 steps
    )
    opts.update(settings.extra)
    return get_preset("fmnist-cpu", **opts)


# --- 1. training -------------------------------------------------------------------------------

def finished_run(run_dir: Path) -> bool:
    latest = run_dir / "checkpoints" / "latest.json"
    try:
        return bool(json.loads(latest.read_text()).get("finished"))
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def changed_settings(run_dir: Path, cfg: Any) -> list[str]:
    """Config fields that change the trained weights and differ from the run in ``run_dir``."""
    from .train.checkpoint import read_config, resolve_checkpoint

    if not (run_dir / "checkpoints" / "latest.json").exists():
        return []
    saved = read_config(resolve_checkpoint(run_dir)).to_dict()
    now = cfg.to_dict()
    return sorted(k for k in now if k not in NOT_TRAJECTORY and saved.get(k) != now[k])


def _loads(run_dir: Path) -> bool:
    from .train import CheckpointError, load_model

    try:
        load_model(run_dir)
    except CheckpointError:
        return False
    return True


#: bump when results.json gains or changes fields (older cached results are then recomputed)
RESULTS_VERSION = 2

#: config fields that do not change the trained weights (a finished run stays valid when they differ)
NOT_TRAJECTORY = frozenset({"progress", "checkpoint_every_steps", "log_every_steps", "num_workers", "device",
                             "preset", "output_dir"})


def train_models(settings: DemoSettings, out_dir: Path, *, force: bool,
                 progress: bool) -> tuple[dict[str, Path], set[str]]:
    """Train (or resume, or skip) every demo model; returns ``{label: run_dir}`` and the labels trained
    from scratch by this call."""
    from .train import train

    runs = {}
    fresh: set[str] = set()
    for label in DEMO_MODELS:
        cfg = demo_config(label, settings, out_dir)
        cfg.progress = progress
        run_dir = Path(cfg.output_dir)
        runs[label] = run_dir
        if force and run_dir.exists():
            shutil.rmtree(run_dir)
        if finished_run(run_dir) and not _loads(run_dir):
            print(f"[demo] {label}: the checkpoint in {run_dir} no longer matches the model definition "
                  "(the architecture changed); training again")
            shutil.rmtree(run_dir)
        diff = changed_settings(run_dir, cfg)
        if diff:
            print(f"[demo] {label}: {run_dir} was trained with other settings ({', '.join(diff)} differ); "
                  "training again")
            shutil.rmtree(run_dir)
        if finished_run(run_dir):
            print(f"[demo] {label}: finished checkpoint in {run_dir}, not retrained (--force retrains)")
            continue
        resume = (run_dir / "checkpoints" / "latest.json").exists()
        print(f"[demo] {label}: {'resuming' if resume else 'training'} {cfg.model} "
              f"({cfg.epochs} epoch(s), batch {cfg.batch_size}, seed {cfg.seed}, "
              f"{torch.get_num_threads()} threads)")
        train(cfg, resume=resume)
        if not resume:
            fresh.add(label)
    return runs, fresh


# --- 2. evaluation -----------------------------------------------------------------------------

def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def clean_results(models: Mapping[str, nn.Module], test_set: Dataset, settings: DemoSettings,
                  progress: bool) -> dict[str, dict[str, float]]:
    from .train.evaluate import evaluate_vision

    ds = test_set if settings.clean_images is None else Subset(test_set, range(settings.clean_images))
    loader = DataLoader(ds, batch_size=500, shuffle=False)
    return {label: evaluate_vision(m, loader, "cpu", progress=progress, desc=f"clean {label}")
            for label, m in models.items()}


def fixed_subset(test_set: Dataset, n: int, seed: int) -> Dataset:
    """``n`` test images drawn once with ``seed`` (class-mixed, unlike the first n)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(test_set), generator=g)[:n].sort().values.tolist()  # type: ignore[arg-type]
    return Subset(test_set, idx)


def corruption_results(models: Mapping[str, nn.Module], test_set: Dataset, settings: DemoSettings,
                       cache_dir: Path, progress: bool) -> dict[str, dict[str, dict[int, float]]]:
    """``{label: {corruption: {severity: top-1 accuracy}}}`` on ``settings.corrupt_images`` test images.

    Every corrupted view is computed once (seeded per image, cached on disk) and shared by all models.
    """
    from tqdm.auto import tqdm

    from .robustness.corruptions import CorruptedDataset
    from .train.evaluate import evaluate_vision

    base = fixed_subset(test_set, settings.corrupt_images, settings.seed)
    out: dict[str, dict[str, dict[int, float]]] = {label: {} for label in models}
    combos = [(c, s) for c in settings.corruptions for s in settings.severities]
    for c, s in tqdm(combos, desc="corruptions", disable=not progress):
        view = CorruptedDataset(base, c, s, seed=settings.seed, cache_dir=cache_dir)
        view.build_cache(progress=False)
        loader = DataLoader(view, batch_size=500, shuffle=False)
        for label, m in models.items():
            out[label].setdefault(c, {})[s] = evaluate_vision(m, loader, "cpu")["top1"]
    return out


def attack_results(models: Mapping[str, nn.Module], test_set: Dataset, settings: DemoSettings,
                   progress: bool) -> dict[str, dict[str, dict[float, dict[str, float]]]]:
    """``{label: {method: {eps: evaluate_attack(...) result}}}`` (top-1/top-5 fractions, measured norms);
    FGSM and PGD (20 steps, step 0.15 eps, random start: the paper's settings) in pixel units."""
    from .robustness.attacks import evaluate_attack

    base = fixed_subset(test_set, settings.attack_images, settings.seed + 1)
    out: dict[str, dict[str, dict[float, dict[str, float]]]] = {}
    for label, m in models.items():
        per: dict[str, dict[float, dict[str, float]]] = {}
        for method in settings.attacks:
            per[method] = {e: evaluate_attack(m, base, method, e, batch_size=100, progress=progress, seed=0)
                           for e in settings.attack_eps}
        out[label] = per
    return out


# --- 3. report ---------------------------------------------------------------------------------

def _json_ready(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    return obj


def run_history(run_dir: Path) -> dict[str, float]:
    from .train.logger import read_csv

    rows = read_csv(run_dir / "epochs.csv")
    train_time = sum(r["epoch_time_s"] for r in rows)
    images = sum(r["images_per_s"] * r["epoch_time_s"] for r in rows)
    return {"train_time_s": train_time, "images_per_s": images / max(train_time, 1e-9),
            "steps": rows[-1]["step"], "final_train_loss": rows[-1]["train_loss"]}


def write_report(out_dir: Path, results: dict[str, Any], runs: Mapping[str, Path]) -> Path:
    from .report.plots import plot_grouped_bars, plot_lines, plot_training_curves
    from .report.tables import fmt_num, fmt_pct, markdown_table
    from .robustness.metrics import accuracy_table, mce, relative_mce

    labels = [lab for lab in DEMO_MODELS if lab in results["models"]]  # baseline first (JSON sorts keys)
    base_label = labels[0]
    corr = results["corruptions"]
    plots = {}
    plots["curves"] = plot_training_curves(runs, out_dir / "training_curves.png",
                                           title="Fashion-MNIST, same seed and budget")
    mean_per_corr = {lab: {c: 100 * sum(v.values()) / len(v) for c, v in corr[lab].items()} for lab in labels}
    plots["corruptions"] = plot_grouped_bars(mean_per_corr, out_dir / "corruption_accuracy.png",
                                             ylabel="top-1 (%), mean over severities",
                                             title="Accuracy per corruption", ylim=(0, 100))
    sev = {lab: {float(s): 100 * sum(corr[lab][c][s] for c in corr[lab]) / len(corr[lab])
                 for s in next(iter(corr[lab].values()))} for lab in labels}
    sev_clean = {lab: {0.0: 100 * results["clean"][lab]["top1"], **sev[lab]} for lab in labels}
    plots["severity"] = plot_lines(sev_clean, out_dir / "severity.png", xlabel="severity (0 = clean)",
                                   ylabel="top-1 (%), mean over corruptions",
                                   title="Accuracy against severity")
    att = results["attacks"]
    if att:
        series = {f"{lab} {meth.upper()}": {255 * float(e): 100 * r["top1"]
                                            for e, r in att[lab][meth].items()}
                  for lab in labels for meth in att[lab]}
        for lab in labels:
            for meth in att[lab]:
                series[f"{lab} {meth.upper()}"][0.0] = 100 * results["clean_attack_subset"][lab]
        plots["attacks"] = plot_lines(series, out_dir / "attacks.png", xlabel="eps (x 1/255, Linf)",
                                      ylabel="top-1 (%)", title="FGSM / PGD-20 in pixel space")

    errors = {lab: {c: {s: 1 - a for s, a in v.items()} for c, v in corr[lab].items()} for lab in labels}
    full_sev = set(results["settings"]["severities"]) == {1, 2, 3, 4, 5}
    undefined_rel: set[str] = set()
    rows = []
    for lab in labels:
        hist = results["training"][lab]
        row = {
            "model": lab, "params": f"{results['models'][lab]['params'] / 1e6:.3f} M",
            "clean top-1": results["clean"][lab]["top1"], "clean top-5": results["clean"][lab]["top5"],
            "corrupted top-1": sum(mean_per_corr[lab].values()) / len(mean_per_corr[lab]) / 100,
            "images/s": hist["images_per_s"], "train time": f"{hist['train_time_s'] / 60:.1f} min",
        }
        if full_sev:
            row["mCE"] = mce(errors[lab], baseline=errors[base_label], require_all=False)
            # relative mCE: degradation from the clean error of the SAME images; corruptions that do not
            # degrade the baseline (relative CE undefined) are left out and named in the report
            clean_err = {k: 1 - results["clean_corrupt_subset"][k] for k in labels}
            rel = {}
            for c in errors[lab]:
                try:
                    rel[c] = relative_mce({c: errors[lab][c]}, clean_err[lab], {c: errors[base_label][c]},
                                          clean_err[base_label])
                except ValueError:
                    undefined_rel.add(c)
            row["rel. mCE"] = sum(rel.values()) / len(rel) if rel else None
        for meth in att.get(lab, {}):
            for e, r in att[lab][meth].items():
                row[f"{meth.upper()} {255 * float(e):g}/255"] = r["top1"]
        rows.append(row)
    cols = ["model", "params", "clean top-1", "clean top-5", "corrupted top-1"]
    cols += [c for c in rows[0] if c in ("mCE", "rel. mCE")]
    cols += [c for c in rows[0] if "/255" in c] + ["images/s", "train time"]
    pct = {c: fmt_pct for c in cols if "top-" in c or "/255" in c}
    pct.update({"mCE": lambda v: fmt_num(v, 1), "rel. mCE": lambda v: fmt_num(v, 1),
                "images/s": lambda v: fmt_num(v, 0)})
    summary = markdown_table(rows, cols, formats=pct)

    s = results["settings"]
    c0 = results["train_config"]
    m = results["machine"]
    t = results["timing"]
    lines = [
        "# SymViT vs RPC-SymViT on Fashion-MNIST (CPU demo)",
        "",
        f"Both models: {c0['epochs']} epoch(s) of the `fmnist-cpu` recipe on "
        f"{'all 60000' if c0['train_subset'] is None else c0['train_subset']} training images, batch "
        f"{c0['batch_size']}, peak lr {c0['lr']}, seed {c0['seed']}, identical initial weights "
        "(RPC-SymViT swaps the attention of block 1 for Principal Attention Pursuit, 4 iterations, "
        "lambda 4, and keeps the K/V weights).",
        f"Machine: {m['cpu']}, {m['threads']} torch threads, torch {m['torch']}. Wall time of this "
        f"invocation {t['total_s'] / 60:.1f} min; training loops {t['train_s'] / 60:.1f} min, evaluation "
        f"{t['eval_s'] / 60:.1f} min"
        f"{' (some training was done by an earlier invocation)' if t.get('reused') else ''}.",
        "",
        "## Summary",
        "",
        "Accuracies in %. Clean: "
        f"{'all' if s['clean_images'] is None else s['clean_images']} test images. "
        f"Corrupted: mean over {len(s['corruptions'])} corruptions x severities {s['severities']} on "
        f"{s['corrupt_images']} fixed test images. "
        + (f"mCE: mean corruption error relative to {base_label} (100 = as robust as {base_label}, lower is "
           f"better) over these {len(s['corruptions'])} corruptions (not the 15 of ImageNet-C: glass blur "
           "and frost are left out for time), rel. mCE the same on the drop from the clean accuracy of "
           "the same images"
           + (f" (without {', '.join(sorted(undefined_rel))}, which does not degrade {base_label})"
              if undefined_rel else "") + ". "
           if full_sev else "")
        + (f"Attacks: top-1 on {s['attack_images']} fixed test images, Linf eps in pixel units "
           "(normalisation inside the model), PGD with 20 steps of 0.15 eps. " if att else "")
        + "images/s: training throughput.",
        "",
        summary,
        "",
        "## Accuracy per corruption (top-1 %, mean over severities)",
        "",
        accuracy_table(mean_per_corr),
        "",
        "## Plots",
        "",
    ]
    for key, p in plots.items():
        lines += [f"![{key}]({Path(p).name})", ""]
    lines += [
        "## Notes",
        "",
        "- Corruptions come from `imagecorruptions` through `kpca_attention.robustness.corrupt`: the 28 px "
        "grayscale images are reflect-padded to 32 px, replicated to RGB, corrupted and converted back "
        "with the luma transform, so per-channel noise is milder than on colour data (both models see "
        "the same images).",
        "- The run directories hold the metrics (`steps.csv`, `epochs.csv`, TensorBoard `tb/`) and the "
        "checkpoints (`kpca-attention evaluate <run dir>`; `kpca_attention.train.load_model`).",
        f"- Raw numbers: `{out_dir / 'results.json'}`.",
    ]
    report = out_dir / "report.md"
    tmp = report.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, report)
    return report


# --- driver ------------------------------------------------------------------------------------

def run_demo(out_dir: str | os.PathLike = "runs/demo", settings: DemoSettings | None = None, *,
             force: bool = False, progress: bool = True) -> Path:
    """Train, evaluate, and write the report; returns the path of ``report.md``."""
    from .data.images import build_image_dataset
    from .robustness.common import read_json, write_json_atomic
    from .train import load_model
    from .train.checkpoint import resolve_checkpoint

    settings = settings or DemoSettings()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # trained_now: models whose whole training happened in this invocation (others skipped or resumed)
    runs, trained_now = train_models(settings, out, force=force, progress=progress)
    t_train = time.perf_counter() - t0

    models = {}
    ckpts = {}
    for lab, run_dir in runs.items():
        models[lab], _ = load_model(run_dir)
        ckpts[lab] = resolve_checkpoint(run_dir).name
    key = {"settings": _json_ready(asdict(settings)), "checkpoints": ckpts, "version": RESULTS_VERSION}
    results_file = out / "results.json"
    cached = None if force else read_json(results_file)
    if cached is not None and cached.get("key") == key:
        print(f"[demo] evaluation results for these checkpoints found in {results_file}")
        results = cached["results"]
        t_eval = results["timing"]["eval_s"]
    else:
        t1 = time.perf_counter()
        test_set = build_image_dataset("fashion-mnist", "test")
        print("[demo] clean accuracy")
        clean = clean_results(models, test_set, settings, progress)
        print(f"[demo] {len(settings.corruptions)} corruptions x {len(settings.severities)} severities "
              f"on {settings.corrupt_images} images")
        corr = corruption_results(models, test_set, settings, out / "cache", progress)
        from .train.evaluate import evaluate_vision

        sub = DataLoader(fixed_subset(test_set, settings.corrupt_images, settings.seed), batch_size=500)
        clean_corr = {lab: evaluate_vision(m, sub)["top1"] for lab, m in models.items()}
        att: dict[str, Any] = {}
        clean_att: dict[str, float] = {}
        if settings.attacks and settings.attack_images:
            print(f"[demo] attacks {', '.join(settings.attacks)} on {settings.attack_images} images")
            att = attack_results(models, test_set, settings, progress)
            sub = DataLoader(fixed_subset(test_set, settings.attack_images, settings.seed + 1),
                             batch_size=500)
            clean_att = {lab: evaluate_vision(m, sub)["top1"] for lab, m in models.items()}
        t_eval = time.perf_counter() - t1
        results = {
            "settings": _json_ready(asdict(settings)),
            "models": {lab: {"name": DEMO_MODELS[lab][0], "kwargs": DEMO_MODELS[lab][1],
                             "params": _params(models[lab]), "checkpoint": str(resolve_checkpoint(runs[lab]))}
                       for lab in models},
            "training": {lab: run_history(runs[lab]) for lab in runs},
            "train_config": demo_config(next(iter(DEMO_MODELS)), settings, out).to_dict(),
            "clean": clean,
            "corruptions": corr,
            "attacks": att,
            "clean_attack_subset": clean_att,
            "clean_corrupt_subset": clean_corr,
            "timing": {"eval_s": t_eval},
        }
        results = json.loads(json.dumps(_json_ready(results)))  # the same types as a reload would give
    # int / float keys back from JSON strings
    results["corruptions"] = {lab: {c: {int(s): a for s, a in v.items()} for c, v in per.items()}
                              for lab, per in results["corruptions"].items()}
    results["attacks"] = {lab: {m: {float(e): r for e, r in per.items()} for m, per in meths.items()}
                          for lab, meths in results["attacks"].items()}
    results["machine"] = {"cpu": f"{os.cpu_count()} logical CPUs ({platform.machine()})",
                          "threads": torch.get_num_threads(), "torch": torch.__version__}
    # train_s: the training loops' own time (also when an earlier invocation trained);
    # total_s: wall time of this invocation (includes loading and the corruption cache)
    results["timing"].update(train_s=sum(results["training"][lab]["train_time_s"] for lab in runs),
                             total_s=time.perf_counter() - t0, train_wall_s=t_train,
                             reused=len(trained_now) < len(runs))
    write_json_atomic(results_file, {"key": key, "results": _json_ready(results)})
    return write_report(out, results, runs)


def demo_cmd(
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Where runs, plots and report go.")] = Path(
        "runs/demo"),
    force: Annotated[bool, typer.Option(help="Retrain and re-evaluate even if results exist.")] = False,
    epochs: Annotated[int, typer.Option(help="Training epochs per model.")] = DemoSettings.epochs,
    train_subset: Annotated[int | None, typer.Option(
        help="Train on this many images (0: all 60000).")] = DemoSettings.train_subset,
    corrupt_images: Annotated[int, typer.Option(help="Test images per corruption and severity.")] = 500,
    attack_images: Annotated[int, typer.Option(help="Test images attacked (0: no attacks).")] = 200,
    quick: Annotated[bool, typer.Option(help="A one-minute smoke run on tiny subsets.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """Train SymViT and RPC-SymViT on Fashion-MNIST (CPU), evaluate clean / corrupted / attacked
    accuracy, write runs/demo/report.md with tables and plots (its path is printed last)."""
    # libgomp threads spin while waiting; on a shared, busy CPU that makes small-matrix training up to
    # ~50x slower. Passive waiting must be set before OpenMP starts, so re-run this command with it.
    if "OMP_WAIT_POLICY" not in os.environ and sys.argv[1:2] == ["demo"]:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "kpca_attention.cli", *sys.argv[1:]])
    settings = DemoSettings.quick() if quick else DemoSettings(
        epochs=epochs, train_subset=train_subset or None, corrupt_images=corrupt_images,
        attack_images=attack_images)
    report = run_demo(out_dir, settings, force=force, progress=progress)
    print(report)
