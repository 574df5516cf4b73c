"""The report of :mod:`kpca_attention.ablations`: tables, paired tests and plots from the cached results.

Noise, three ways (each answers a different question):

* **seeds** - mean +- std over training seeds per variant, and the paired difference against SymViT per
  seed (same init and data order) with a paired t-test (df = n_seeds - 1; with 2 seeds it has 1
  degree of freedom and is nearly powerless: it needs |t| > 12.7 for p < 0.05).
* **SymViT seed vs seed** - the difference between two seeds of the *same* model: the scale of
  training noise that any variant's difference must exceed.
* **images** - exact McNemar tests on the same test images (discordant pairs pooled over seeds) and a
  paired bootstrap 95% interval over test images (for corruptions: clustered by base image, all its
  corrupted views resampled together). These measure how sure we are about *these trained models* on
  the test distribution; they do not account for training randomness (the seed-vs-seed row shows how
  much that is).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["load_results", "metrics_of", "write_ablation_report"]

#: metric key -> column title
METRICS: dict[str, str] = {
    "clean": "clean",
    "corrupted": "corrupted",
    "fgsm_2": "FGSM 2/255",
    "fgsm_4": "FGSM 4/255",
    "pgd_2": "PGD 2/255",
    "pgd_4": "PGD 4/255",
}
N_BOOT = 2000


def _arr(bits: str) -> np.ndarray:
    return np.frombuffer(bits.encode(), dtype=np.uint8) == ord("1")


def load_results(
    out_dir: str | os.PathLike, settings: dict[str, Any] | None = None
) -> dict[str, dict[int, dict[str, Any]]]:
    """``{slug: {seed: results}}`` from ``out_dir/results/*.json`` (written by ``run_ablations``).

    With ``settings`` (the run's ``settings.json``), results evaluated under other settings (left over
    from an earlier run in the same folder) are skipped, so one table never mixes test sets."""
    wanted = None
    if settings:
        wanted = {k: v for k, v in settings.items() if k not in ("seeds", "variants", "throughput_repeats")}
    res: dict[str, dict[int, dict[str, Any]]] = {}
    for f in sorted(Path(out_dir, "results").glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError:
            continue
        if wanted is not None and data.get("key", {}).get("settings") != wanted:
            continue
        res.setdefault(data["slug"], {})[int(data["seed"])] = data["results"]
    return res


def per_image(r: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-image correctness of one run: clean ``(n,)``, corrupted ``(views, n_base)``, attacks ``(n,)``."""
    out = {"clean": _arr(r["clean"])}
    views = [_arr(b) for c in r["corruptions"].values() for b in c.values()]
    out["corrupted"] = np.stack(views)  # (corruption x severity, base images)
    for meth, per in r["attacks"].items():
        for eps, bits in per.items():
            out[f"{meth}_{eps}"] = _arr(bits)
    return out


def metrics_of(r: dict[str, Any]) -> dict[str, float]:
    """Accuracies (fractions) and throughput of one run."""
    m = {k: float(v.mean()) for k, v in per_image(r).items()}
    m["images_per_s"] = float(r["training"]["images_per_s"])
    # drops from the clean accuracy of the same images (robustness separated from clean accuracy)
    clean_c = float(_arr(r["clean_corrupt_subset"]).mean())
    clean_a = float(_arr(r["clean_attack_subset"]).mean())
    m["drop_corrupted"] = clean_c - m["corrupted"]
    for k in [k for k in m if k.startswith(("fgsm_", "pgd_"))]:
        m["drop_" + k] = clean_a - m[k]
    return m


def _bootstrap_ci(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """95% paired bootstrap interval of mean(a) - mean(b) over the last axis (images); leading axes
    (seeds, corrupted views) are carried along with their image."""
    n = a.shape[-1]
    diff = (a.astype(np.float64) - b.astype(np.float64)).reshape(-1, n).mean(0)  # per image
    idx = rng.integers(0, n, size=(N_BOOT, n))
    boots = diff[idx].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(lo), float(hi)


def _mcnemar(a: np.ndarray, b: np.ndarray) -> tuple[int, int, float]:
    """Exact McNemar: (a right & b wrong, a wrong & b right, two-sided p)."""
    from scipy.stats import binomtest

    n01 = int((a & ~b).sum())
    n10 = int((~a & b).sum())
    p = 1.0 if n01 + n10 == 0 else float(binomtest(n01, n01 + n10, 0.5).pvalue)
    return n01, n10, p


def _ttest(d: list[float]) -> float | None:
    if len(d) < 2:
        return None
    from scipy.stats import ttest_1samp

    if np.allclose(d, d[0]):
        return 0.0 if d[0] != 0 else 1.0
    return float(ttest_1samp(d, 0.0).pvalue)


def _pm(values: list[float], pct: bool = True, digits: int = 1) -> str:
    if not values:
        return "-"
    scale = 100 if pct else 1
    mean = scale * float(np.mean(values))
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * float(np.std(values, ddof=1)):.{digits}f}"


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def _trace_cells(r: dict[str, Any]) -> dict[str, Any] | None:
    tr = r.get("trace")
    if not tr:
        return None
    (layer,) = tr["layers"].values() if len(tr["layers"]) == 1 else (next(iter(tr["layers"].values())),)
    q = layer["quantities"]
    return {
        "s_active": tr["summary"]["s_active"],
        "s_density_max": tr["summary"]["s_density_max"],
        "s_density_mean": q["s_density"]["mean"],
        "first_active": layer.get("s_first_active_iter"),
        "tau": q["tau"]["mean"][0],
        "k_abs_max": q["k_abs_max"]["mean"][0],
        "ratio_mean": layer["tau_over_kmax"]["mean"][0],
        "ratio_min": tr["summary"]["tau_over_kmax_min"],
        "dual_last": q["dual_norm"]["mean"][-1],
        "l_change_last": q["l_change"]["mean"][-1],
    }


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return "inf" if math.isinf(x) else "-"
    return f"{x:.{digits}g}"


def _plots(
    out: Path,
    slugs: list[str],
    labels: dict[str, str],
    res: dict[str, dict[int, dict[str, Any]]],
    met: dict[str, dict[int, dict[str, float]]],
    keys: list[str],
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 4.2), sharey=False)
    for ax, k in zip(axes, keys, strict=True):
        for i, s in enumerate(slugs):
            vals = [100 * met[s][seed][k] for seed in sorted(met[s])]
            if not vals:
                continue
            ax.bar(i, np.mean(vals), color=f"C{i}", alpha=0.6)
            ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(slugs)))
        ax.set_xticklabels([labels[s] for s in slugs], rotation=60, ha="right", fontsize=7)
        ax.set_title(METRICS[k])
        ax.grid(axis="y", alpha=0.3)
        lo = min((100 * met[s][seed][k] for s in slugs for seed in met[s]), default=0)
        ax.set_ylim(max(0, lo - 10), None)
    axes[0].set_ylabel("top-1 (%), bars: mean over seeds, dots: seeds")
    fig.tight_layout()
    p = out / "ablation_accuracy.png"
    fig.savefig(p, dpi=100)
    plt.close(fig)
    paths.append(p)

    traced = [s for s in slugs if any(_trace_cells(r) for r in res[s].values())]
    if traced:
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for s in traced:
            for j, (_seed, r) in enumerate(sorted(res[s].items())):
                tr = r.get("trace")
                if not tr:
                    continue
                layer = next(iter(tr["layers"].values()))
                q = layer["quantities"]
                it = np.arange(1, layer["n_iter"] + 1)
                kw = dict(
                    color=f"C{slugs.index(s)}", marker="o", alpha=0.8, label=labels[s] if j == 0 else None
                )
                axes[0].plot(it, q["s_density"]["mean"], **kw)
                ratio = np.asarray(layer["tau_over_kmax"]["mean"], dtype=float)
                if np.all(np.isfinite(ratio)):
                    axes[1].plot(it, ratio, **kw)
                axes[2].plot(it, q["dual_norm"]["mean"], **kw)
        axes[0].set_title("s_density (fraction of S != 0)")
        axes[1].set_title("tau / max|K| (log)")
        axes[1].set_yscale("log")
        axes[1].axhline(1, color="r", ls="--", lw=1)
        axes[2].set_title("||Y|| / ||K||")
        for ax in axes:
            ax.set_xlabel("PAP iteration")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        p = out / "ablation_trace.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def write_ablation_report(out_dir: str | os.PathLike) -> Path:
    """Write ``report.md``, ``summary.json`` and the plots of an ablation folder; returns the report path."""
    from .ablations import BASELINE, VARIANTS

    out = Path(out_dir)
    settings = json.loads((out / "settings.json").read_text()) if (out / "settings.json").exists() else {}
    res = load_results(out, settings)
    if not res:
        raise FileNotFoundError(
            f"no results under {out / 'results'} (evaluated with the settings of {out / 'settings.json'}): "
            f"run `kpca-attention ablate --out {out}`"
        )
    slugs = [s for s in VARIANTS if s in res] + sorted(s for s in res if s not in VARIANTS)
    labels = {s: VARIANTS[s].label if s in VARIANTS else s for s in slugs}
    met = {s: {seed: metrics_of(r) for seed, r in per.items()} for s, per in res.items()}
    img = {s: {seed: per_image(r) for seed, r in per.items()} for s, per in res.items()}
    rng = np.random.default_rng(0)
    # metrics every run has (a quick run may lack an eps)
    cols = {k: t for k, t in METRICS.items() if all(k in m for per in met.values() for m in per.values())}
    lines = ["# RPC-Attention ablations on Fashion-MNIST", ""]
    if settings:
        lines += [
            f"Budget per run: {settings['epochs']} epoch(s) of the `fmnist-cpu` recipe over "
            f"{settings['train_subset'] or 60000} training images, batch {settings['batch_size']}; seeds "
            f"{settings['seeds']} (same init and data order across variants of one seed). Clean: "
            f"{'all 10000' if settings['clean_images'] is None else settings['clean_images']} test images; "
            f"corrupted: {len(settings['corruptions'])} corruptions x severities {settings['severities']} on "
            f"{settings['corrupt_images']} fixed test images; attacks (Linf, pixel space, PGD 20 steps of "
            f"0.15 eps) on {settings['attack_images']} fixed test images. PAP trace on "
            f"{settings['trace_images']} test images.",
            "",
        ]
    # --- table 1
    tput_file = out / "throughput.json"
    tput = json.loads(tput_file.read_text())["images_per_s"] if tput_file.exists() else {}
    head = ["variant", "seeds", *cols.values(), "train img/s (loop)", "img/s side by side"]
    lines += [
        "## Accuracy (top-1 %, mean ± std over seeds)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for s in slugs:
        seeds = sorted(met[s])
        cells = [labels[s], ",".join(map(str, seeds))]
        cells += [_pm([met[s][sd][k] for sd in seeds]) for k in cols]
        cells.append(_pm([met[s][sd]["images_per_s"] for sd in seeds], pct=False, digits=0))
        cells.append(
            f"{tput[s]:.0f} ({tput[s] / tput[BASELINE]:.2f}x)" if s in tput and BASELINE in tput else "-"
        )
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Throughput: `loop` is the training loop's own images/s (it depends on the machine's load while "
        "that run trained); `side by side` is one forward + backward + AdamW step on a batch of "
        f"{settings.get('batch_size', 128)}, all variants interleaved in one process (median of 7), "
        "and its ratio to SymViT.",
        "",
        "Variants: " + "; ".join(f"**{labels[s]}**: {VARIANTS[s].what}" for s in slugs if s in VARIANTS),
        "",
    ]
    # --- table 2: paired differences
    summary: dict[str, Any] = {"metrics": met, "paired": {}}
    if BASELINE in res:
        lines += [
            "## Paired differences against SymViT (percentage points)",
            "",
            "Per metric: mean ± std over seeds of (variant - SymViT, same seed) [paired t-test p]; then the "
            "per-image 95% bootstrap interval (seeds pooled) and, for clean and attacks, the exact McNemar "
            "p (discordant images pooled over seeds). The first row is SymViT against itself across "
            "seeds (seed 1 - seed 0): training noise.",
            "",
        ]
        head = ["variant", *cols.values()]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        base_seeds = sorted(img[BASELINE])
        if len(base_seeds) >= 2:
            a, b = img[BASELINE][base_seeds[1]], img[BASELINE][base_seeds[0]]
            cells = [f"SymViT s{base_seeds[1]} - s{base_seeds[0]}"]
            for k in cols:
                d = 100 * (a[k].mean() - b[k].mean())
                lo, hi = _bootstrap_ci(a[k], b[k], rng)
                cell = f"{d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                if k != "corrupted":
                    cell += f" McN p {_p(_mcnemar(a[k], b[k])[2])}"
                cells.append(cell)
            lines.append("| " + " | ".join(cells) + " |")
        for s in slugs:
            if s == BASELINE:
                continue
            seeds = [sd for sd in sorted(img[s]) if sd in img[BASELINE]]
            if not seeds:
                continue
            cells = [labels[s]]
            summary["paired"][s] = {}
            for k in cols:
                diffs = [100 * (met[s][sd][k] - met[BASELINE][sd][k]) for sd in seeds]
                a = np.stack([img[s][sd][k] for sd in seeds])
                b = np.stack([img[BASELINE][sd][k] for sd in seeds])
                lo, hi = _bootstrap_ci(a, b, rng)
                pt = _ttest(diffs)
                cell = f"{np.mean(diffs):+.1f}" + (
                    f" ± {np.std(diffs, ddof=1):.1f}" if len(diffs) > 1 else ""
                )
                cell += f" [t p {_p(pt)}] ({100 * lo:+.1f}, {100 * hi:+.1f})"
                entry = {"diffs": diffs, "t_p": pt, "boot_ci": [100 * lo, 100 * hi]}
                if k != "corrupted":
                    n01, n10, p = _mcnemar(a.ravel(), b.ravel())
                    cell += f" McN p {_p(p)}"
                    entry.update(mcnemar_better=n01, mcnemar_worse=n10, mcnemar_p=p)
                summary["paired"][s][k] = entry
                cells.append(cell)
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    # --- drops from clean
    drop_cols = {"drop_" + k: t for k, t in cols.items() if k != "clean"}
    if BASELINE in met:
        lines += [
            "## Robustness as the drop from clean accuracy on the same images (percentage points)",
            "",
            "A model that is simply more accurate is also more accurate under attack; the drop (clean "
            "top-1 on the attacked / corrupted images minus top-1 after the attack / corruption) separates "
            "robustness from clean accuracy. Lower is more robust. Per variant: mean ± std over seeds; in "
            "brackets the paired difference against SymViT (mean over seeds, same seed pairs).",
            "",
            "| variant | " + " | ".join(drop_cols.values()) + " |",
            "|" + "---|" * (len(drop_cols) + 1),
        ]
        for s in slugs:
            cells = [labels[s]]
            seeds = [sd for sd in sorted(met[s]) if sd in met[BASELINE]]
            for k in drop_cols:
                cell = _pm([met[s][sd][k] for sd in sorted(met[s])])
                if s != BASELINE and seeds:
                    d = [100 * (met[s][sd][k] - met[BASELINE][sd][k]) for sd in seeds]
                    cell += f" [{np.mean(d):+.1f}]"
                cells.append(cell)
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    # --- trace
    traced = [s for s in slugs if any(_trace_cells(r) for r in res[s].values())]
    if traced:
        lines += [
            "## PAP trace of the RPC layer (block 1) on test images",
            "",
            "| variant | seed | S ever active | max s_density | s_density per iteration | first active | "
            "tau (it 1) | max abs K | tau / max abs K mean (min) | dual norm (last) | l_change (last) |",
            "|" + "---|" * 11,
        ]
        summary["trace"] = {}
        for s in traced:
            for sd, r in sorted(res[s].items()):
                c = _trace_cells(r)
                if c is None:
                    continue
                summary["trace"].setdefault(s, {})[sd] = c
                lines.append(
                    f"| {labels[s]} | {sd} | {'yes' if c['s_active'] else 'no'} | "
                    f"{_num(c['s_density_max'])} | "
                    + ", ".join(_num(x, 2) for x in c["s_density_mean"])
                    + f" | {c['first_active'] or '-'} | {_num(c['tau'])} | {_num(c['k_abs_max'])} | "
                    f"{_num(c['ratio_mean'])} ({_num(c['ratio_min'])}) | {_num(c['dual_last'])} | "
                    f"{_num(c['l_change_last'])} |"
                )
        lines.append("")
    # --- trained weights with an ablation switched on
    swaps_file = out / "swaps.json"
    swaps = json.loads(swaps_file.read_text())["rows"] if swaps_file.exists() else []
    if swaps:
        lines += [
            "## Trained weights with an ablation switched on at inference",
            "",
            "The trained weights, unchanged, in the model with the ablation switched on (no retraining), on "
            f"the first {swaps[0]['n']} test images. A max |logit difference| at rounding level means the "
            "ablation computes the same function on this trained model.",
            "",
            "| seed | weights, ablation | max abs logit diff | same prediction | top-1 before | "
            "top-1 after |",
            "|---|---|---|---|---|---|",
        ]
        for r in swaps:
            lines.append(
                f"| {r['seed']} | {r['what']} | {r['max_abs_logit_diff']:.2g} | "
                f"{100 * r['same_prediction']:.1f} % | {100 * r['acc_trained']:.1f} | "
                f"{100 * r['acc_swapped']:.1f} |"
            )
        lines.append("")
    # --- per corruption
    if res:
        any_run = next(iter(next(iter(res.values())).values()))
        corrs = list(any_run["corruptions"])
        lines += [
            "## Accuracy per corruption (top-1 %, mean over severities and seeds)",
            "",
            "| variant | " + " | ".join(corrs) + " |",
            "|" + "---|" * (len(corrs) + 1),
        ]
        for s in slugs:
            cells = [labels[s]]
            for c in corrs:
                vals = [
                    float(np.mean([_arr(b).mean() for b in r["corruptions"][c].values()]))
                    for r in res[s].values()
                ]
                cells.append(f"{100 * np.mean(vals):.1f}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    for p in _plots(out, slugs, labels, res, met, list(cols)):
        lines += [f"![{p.stem}]({p.name})", ""]
    lines += [
        "Raw per-image results: `results/<variant>-s<seed>.json`; the paired statistics: `summary.json`.",
        "",
    ]
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=float))
    os.replace(tmp, out / "summary.json")
    report = out / "report.md"
    tmp = out / "report.md.tmp"
    tmp.write_text("\n".join(lines))
    os.replace(tmp, report)
    return report
