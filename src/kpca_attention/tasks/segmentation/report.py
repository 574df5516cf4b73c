"""What semantic segmentation adds to the study report (:class:`SegmentationSections`, for
:class:`~kpca_attention.tasks.segmentation.suites.SegmentationSuites`): clean and corrupted mIoU / mean
accuracy / pixel accuracy as mean ± std over seeds, paired differences against the baseline (paired t over
seeds, bootstrap over test images), the drop from clean, per corruption and per class, plots. Written from
the per-run results files alone (``kpca-attention report OUT``).

Paired statistics on ratio metrics. mIoU is a ratio of sums over the images (not a mean of per-image
scores), so the image-level bootstrap here resamples images and recomputes each metric from the summed
per-image, per-class pixel counts the results store (:func:`bootstrap_metric_diff`); an image is a
cluster that carries all its corrupted views and all seeds. :func:`kpca_attention.report.stats.seed_test`
gives the t interval and p over seeds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...plotting import new_figure, panel_grid, row_starts, save_figure, series_style
from ...stats import N_BOOT, seed_test
from ...tables import fmt_p, fmt_pm, markdown_table
from ..base import StudySections, bar_plot
from ..images import structure_items
from .suites import counts_of_item

__all__ = ["SegmentationSections", "segmentation_run_counts", "run_segmentation_metrics",
           "metrics_from_count_sums", "bootstrap_metric_diff", "METRICS"]

#: one study's results: ``{variant slug: {seed: results}}``
Results = dict[str, dict[int, dict[str, Any]]]

#: the metrics of a segmentation study, in table order
METRICS: tuple[str, ...] = ("miou", "mean_accuracy", "pixel_accuracy")
_TITLE = {"miou": "mIoU", "mean_accuracy": "mean acc.", "pixel_accuracy": "pixel acc."}


# ----------------------------------------------------------------------------- counts and metrics

def segmentation_run_counts(r: Mapping[str, Any]) -> dict[str, Any]:
    """Per-image, per-class pixel counts of one run's results: ``{"clean": (m, 3, K), "views":
    {(corruption, severity): (n, 3, K)}}`` (intersection, prediction, label; views in stored order)."""
    clean = counts_of_item(r["clean"])
    views = {(c, int(s)): counts_of_item(x, clean)
             for c, per in r.get("corruptions", {}).items() for s, x in per.items()}
    return {"clean": clean, "views": dict(sorted(views.items(), key=lambda kv: kv[0]))}


def metrics_from_count_sums(sums: np.ndarray) -> dict[str, np.ndarray]:
    """``miou``, ``mean_accuracy``, ``pixel_accuracy`` of summed counts ``(..., 3, K)`` (intersection,
    prediction, label per class), over any leading axes at once, with mmseg's conventions exactly as
    :func:`kpca_attention.segmentation.metrics.metrics_from_areas` (0/0 classes left out of the means;
    NaN when nothing is left). Vectorised because the bootstrap evaluates it for thousands of resamples
    of every run and view at once; the tests check it against ``metrics_from_areas``."""
    s = np.asarray(sums, dtype=np.float64)
    inter, pred, label = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: nanmean gives NaN, as wanted
        iou = inter / (pred + label - inter)
        acc = inter / label
        return {"miou": np.nanmean(iou, axis=-1), "mean_accuracy": np.nanmean(acc, axis=-1),
                "pixel_accuracy": inter.sum(-1) / label.sum(-1)}


def _view_metrics(counts: np.ndarray) -> dict[str, float]:
    return {k: float(v) for k, v in metrics_from_count_sums(counts.sum(0)).items()}


def run_segmentation_metrics(c: Mapping[str, Any]) -> dict[str, Any]:
    """Dataset metrics of one run from its counts (:func:`segmentation_run_counts`): ``clean:<m>``,
    ``clean@corrupt:<m>`` (clean, the corrupted images only), ``corrupted:<m>`` (mean over views),
    ``drop:<m>`` (the difference of the two), and ``views`` / ``per_corruption`` / ``per_severity``."""
    out: dict[str, Any] = {f"clean:{k}": v for k, v in _view_metrics(c["clean"]).items()}
    views = {v: _view_metrics(x) for v, x in c["views"].items()}
    if views:
        n = next(iter(c["views"].values())).shape[0]
        out.update({f"clean@corrupt:{k}": v for k, v in _view_metrics(c["clean"][:n]).items()})
        for k in METRICS:
            out[f"corrupted:{k}"] = float(np.mean([m[k] for m in views.values()]))
            out[f"drop:{k}"] = out[f"clean@corrupt:{k}"] - out[f"corrupted:{k}"]
        names = list(dict.fromkeys(v[0] for v in views))
        sevs = sorted({v[1] for v in views})
        out["per_corruption"] = {nm: {k: float(np.mean([m[k] for v, m in views.items() if v[0] == nm]))
                                      for k in METRICS} for nm in names}
        out["per_severity"] = {str(sv): {k: float(np.mean([m[k] for v, m in views.items() if v[1] == sv]))
                                         for k in METRICS} for sv in sevs}
    return out


def bootstrap_metric_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray],
                          rng: np.random.Generator | int = 0, n_boot: int = N_BOOT,
                          level: float = 0.95) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals over images of ``metric(a) - metric(b)`` for every metric of
    :func:`metrics_from_count_sums`, in percentage points.

    ``a`` and ``b`` are lists over paired seeds of per-image counts ``(views, n, 3, K)`` (one view: the
    clean images). One resample draws ``n`` images with replacement - the same images for every seed and
    view, so an image carries its views and seeds - recomputes each metric per seed and view from the
    summed counts, averages over views and seeds, and takes the difference.
    """
    rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number (>= 1) of paired seeds, got {len(a)} and {len(b)}")
    shape = a[0].shape
    if any(x.shape != shape for x in (*a, *b)) or len(shape) != 4 or shape[2] != 3:
        raise ValueError(f"paired counts must all have one shape (views, n, 3, K), got "
                         f"{sorted({x.shape for x in (*a, *b)})}")
    v, n = shape[0], shape[1]
    idx = rng.integers(0, n, size=(n_boot, n))
    weights = np.zeros((n_boot, n))
    np.add.at(weights, (np.arange(n_boot)[:, None], idx), 1.0)

    def mean_metrics(runs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        total = {k: np.zeros(n_boot) for k in METRICS}
        for x in runs:  # one seed at a time: (n_boot, views, 3, K) sums
            flat = np.moveaxis(x, 1, 0).reshape(n, -1).astype(np.float64)
            sums = (weights @ flat).reshape(n_boot, v, 3, -1)
            for k, val in metrics_from_count_sums(sums).items():
                total[k] += val.mean(axis=1)
        return {k: t / len(runs) for k, t in total.items()}

    ma, mb = mean_metrics(a), mean_metrics(b)
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    out = {}
    for k in METRICS:
        d = 100 * (ma[k] - mb[k])
        d = d[np.isfinite(d)]
        lo, hi = np.percentile(d, q) if d.size else (math.nan, math.nan)
        out[k] = (float(lo), float(hi))
    return out


# ----------------------------------------------------------------------------- formatting

def _paired_cell(ps: Mapping[str, Any]) -> str:
    cell = f"{ps['seed_mean']:+.2f}"
    if ps.get("seed_ci") is not None:
        cell += f" ({ps['seed_ci'][0]:+.2f}, {ps['seed_ci'][1]:+.2f}) t p {fmt_p(ps['seed_p'])}"
    lo, hi = ps["boot_ci"]
    return cell + f" [{lo:+.2f}, {hi:+.2f}]"


# ----------------------------------------------------------------------------- the report

def _paired(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], ca: dict[int, dict[str, Any]],
            cb: dict[int, dict[str, Any]], rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    """Paired statistics of runs ``a`` against ``b`` (their metrics and counts, by seed) on the seeds
    both have: per metric key (``clean:miou``, ``corrupted:miou``, ...) the per-seed differences, the
    seed t-test and the image bootstrap interval."""
    seeds = sorted(set(a) & set(b))
    out: dict[str, dict[str, Any]] = {}
    groups = {"clean": ([ca[s]["clean"][None] for s in seeds], [cb[s]["clean"][None] for s in seeds])}
    if all(ca[s]["views"] for s in seeds) and all(cb[s]["views"] for s in seeds) \
            and all(list(ca[s]["views"]) == list(cb[s]["views"]) for s in seeds):
        groups["corrupted"] = ([np.stack(list(ca[s]["views"].values())) for s in seeds],
                               [np.stack(list(cb[s]["views"].values())) for s in seeds])
    for g, (xa, xb) in groups.items():
        boot = bootstrap_metric_diff(xa, xb, rng)
        for k in METRICS:
            diffs = [100 * (a[s][f"{g}:{k}"] - b[s][f"{g}:{k}"]) for s in seeds]
            out[f"{g}:{k}"] = {"seeds": seeds, "diffs": diffs,
                               **{f"seed_{q}": v for q, v in seed_test(diffs).items()},
                               "boot_ci": list(boot[k])}
    return out


# ----------------------------------------------------------------------------- the sections

class SegmentationSections(StudySections):
    """Semantic segmentation's part of the study report (see the module docstring)."""

    table_title = "## Clean and corrupted segmentation (%, mean ± std over seeds)"
    training_note = ("; every variant of one seed starts from the same weights and sees the same batches "
                     "(differences are paired)")
    paired_unit = " (percentage points)"
    curve = ("eval_miou", "held-out mIoU during training (%)", 100, False)
    footer = ("Per-run results with per-image pixel counts: `results/<variant>-s<seed>.json` "
              "(`kpca_attention.tasks.segmentation.suites.counts_of_item` decodes them); paired statistics: "
              "`summary.json`.")

    def __init__(self, settings: Mapping[str, Any], throughput_key: str) -> None:
        super().__init__(settings, throughput_key)
        corr = self.settings["suites"].get("corruptions") or {}
        self.want = {(c, str(s)) for c in corr.get("names", []) for s in corr.get("severities", [])}
        self.counts: dict[str, dict[int, dict[str, Any]]] = {}
        self.has_corr = False

    def structure(self, items: Mapping[str, Any]) -> dict[str, Any]:
        return structure_items(items)

    def keep(self, r: dict[str, Any]) -> dict[str, Any] | None:
        """Only the corrupted views the settings ask for (a store may hold items of an earlier evaluation)."""
        if "run" not in r or "clean" not in r:
            return None
        views = {c: {s: x for s, x in per.items() if (c, s) in self.want}
                 for c, per in r.get("corruptions", {}).items()}
        r["corruptions"] = {c: per for c, per in views.items() if per}
        return r

    def prepare(self) -> None:
        self.counts = {s: {sd: segmentation_run_counts(r) for sd, r in self.res[s].items()}
                       for s in self.slugs}
        self.met = {s: {sd: run_segmentation_metrics(c) for sd, c in self.counts[s].items()}
                    for s in self.slugs}
        self.has_corr = any("corrupted:miou" in m for per in self.met.values() for m in per.values())

    def metrics(self, r: Mapping[str, Any]) -> dict[str, Any]:
        return run_segmentation_metrics(segmentation_run_counts(r))

    def keys(self) -> list[str]:
        groups = ["clean"] + (["corrupted"] if self.has_corr else [])
        return [f"{g}:{k}" for g in groups for k in METRICS]

    def title(self, key: str) -> str:
        g, m = key.split(":")
        return f"{g} {_TITLE[m]}"

    def evaluation(self) -> str:
        settings = self.settings
        corr = settings["suites"].get("corruptions")
        n_clean = next(iter(next(iter(self.res.values())).values()))["clean"]["n"]
        return (
            f"Evaluation: clean on {n_clean} fixed test images"
            + (f"; {len(corr['names'])} corruptions x severities {corr['severities']} on the first "
               f"{corr['n']} of them (imagecorruptions, seeded per image, labels unchanged)" if corr else "")
            + "; mmseg's conventions (mIoU and mean accuracy average the classes present; pixel accuracy is "
              "mmseg's aAcc)"
            + (f"; PAP trace of the RPC models on {settings['trace']} test images" if settings.get("trace")
               else "")
            + "."
        )

    def table_notes(self, columns: Mapping[str, str]) -> list[str]:
        return ["Corrupted: the mean over every (corruption, severity) view, as the paper's Table 6. "
                "Throughput: the training loop's own images/s (one thread per run; it follows the machine's "
                "load).", ""]

    # --- paired differences -------------------------------------------------------------------------
    def paired_note(self) -> str:
        return ("Per metric: mean difference over seeds (variant - baseline, same seed) with its 95% t "
                "interval and paired t-test p when there are >= 2 seeds; [bootstrap 95% interval over test "
                f"images ({N_BOOT} resamples; an image carries all its corrupted views and all seeds; each "
                "metric recomputed from the resampled pixel counts)].")

    def seed_noise(self, b0: int, b1: int, rng: np.random.Generator,
                   summary: dict[str, Any]) -> dict[str, str]:
        met, counts, base = self.met, self.counts, self.base
        noise = _paired({0: met[base][b1]}, {0: met[base][b0]}, {0: counts[base][b1]}, {0: counts[base][b0]},
                        rng)
        summary["seed_noise"] = noise
        return {k: _paired_cell(ps) for k, ps in noise.items()}

    def paired(self, s: str, rng: np.random.Generator, summary: dict[str, Any]) -> dict[str, str] | None:
        met, counts, base = self.met, self.counts, self.base
        if not set(met[s]) & set(met[base]):
            return None
        ps_all = _paired(met[s], met[base], counts[s], counts[base], rng)
        summary["paired"][s] = ps_all
        return {k: _paired_cell(ps) for k, ps in ps_all.items()}

    # --- sections and plots -------------------------------------------------------------------------
    def sections_before_trace(self, out: Path, summary: dict[str, Any]) -> list[str]:
        """The drop from clean and mIoU per corruption (with corruptions); clean IoU per class."""
        met, res, slugs, label, base = self.met, self.res, self.slugs, self.label, self.base
        lines: list[str] = []
        any_clean = next(iter(next(iter(res.values())).values()))["clean"]
        if self.has_corr:
            drows = []
            for s in slugs:
                r2: dict[str, Any] = {"variant": label[s]}
                for k in METRICS:
                    cell = fmt_pm([met[s][sd][f"drop:{k}"] for sd in sorted(met[s])])
                    if s != base and base in met:
                        d = [100 * (met[s][sd][f"drop:{k}"] - met[base][sd][f"drop:{k}"])
                             for sd in met[s] if sd in met[base]]
                        if d:
                            cell += f" [{np.mean(d):+.2f}]"
                    r2[k] = cell
                drows.append(r2)
            lines += ["## Robustness as the drop from clean on the same images (percentage points)", "",
                      "Clean metric of the corrupted images minus the mean corrupted metric: lower is more "
                      "robust, separating robustness from clean quality. In brackets the mean paired "
                      f"difference against {label[base]}.", "",
                      markdown_table(drows, {"variant": "variant", **{k: _TITLE[k] for k in METRICS}}), ""]

            # --- per corruption -----------------------------------------------------------------
            names = list(dict.fromkeys(c for per in met.values() for m in per.values()
                                       for c in m.get("per_corruption", {})))
            crow = []
            for s in slugs:
                r3: dict[str, Any] = {"variant": label[s]}
                for c in names:
                    vals = [m["per_corruption"][c]["miou"] for m in met[s].values()
                            if c in m.get("per_corruption", {})]
                    r3[c] = f"{100 * np.mean(vals):.1f}" if vals else "-"
                crow.append(r3)
            for s in slugs:
                if s == base or base not in met:
                    continue
                r4: dict[str, Any] = {"variant": f"{label[s]} - {label[base]}"}
                for c in names:
                    d = [100 * (met[s][sd]["per_corruption"][c]["miou"]
                                - met[base][sd]["per_corruption"][c]["miou"])
                         for sd in met[s] if sd in met[base] and c in met[s][sd].get("per_corruption", {})
                         and c in met[base][sd].get("per_corruption", {})]
                    r4[c] = f"{np.mean(d):+.2f}" if d else "-"
                crow.append(r4)
            lines += ["## mIoU per corruption (%, mean over severities and seeds)", "",
                      markdown_table(crow, {"variant": "variant", **{c: c for c in names}}), ""]

        # --- per class ------------------------------------------------------------------------------
        class_names = any_clean.get("class_names")
        k_cls = len(any_clean["iou"])
        class_names = class_names or [str(i) for i in range(k_cls)]
        if k_cls <= 30:
            krows = []
            for s in slugs:
                ious = np.array([[np.nan if x is None else x for x in r["clean"]["iou"]]
                                 for r in res[s].values()], dtype=np.float64)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean_iou = np.nanmean(ious, axis=0)
                krows.append({"variant": label[s], **{c: "-" if math.isnan(v) else f"{100 * v:.1f}"
                                                      for c, v in zip(class_names, mean_iou, strict=True)}})
            lines += ["## Clean IoU per class (%, mean over seeds)", "",
                      markdown_table(krows, {"variant": "variant", **{c: c for c in class_names}}), ""]

        return lines

    def plots(self, out: Path, summary: dict[str, Any]) -> tuple[list[Path], list[Path]]:
        return _plots(out, self.slugs, self.label, self.res, self.met), []


def _plots(out: Path, slugs: list[str], label: dict[str, str], res: dict[str, dict[int, dict[str, Any]]],
           met: dict[str, dict[int, dict[str, Any]]]) -> list[Path]:
    """The metric bars and mIoU against corruption severity."""
    paths = []
    keys = [k for k in ("clean:miou", "corrupted:miou", "clean:mean_accuracy", "corrupted:mean_accuracy")
            if any(k in m for per in met.values() for m in per.values())]
    fig, axes = panel_grid(len(keys), panel=(3.5, 4.2))
    for ax, k in zip(axes, keys, strict=True):
        bar_plot(ax, {s: [100 * met[s][sd][k] for sd in sorted(met[s]) if k in met[s][sd]] for s in slugs},
                 slugs, label, rotation=30)
        g, m = k.split(":")
        ax.set_title(f"{g} {_TITLE[m]}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in row_starts(axes):
        ax.set_ylabel("% (bars: mean, dots: seeds)")
    paths.append(save_figure(fig, out / "metrics.png"))

    if any("per_severity" in m for per in met.values() for m in per.values()):
        fig, ax = new_figure(figsize=(6, 4))
        for i, s in enumerate(slugs):
            sevs = sorted({int(v) for m in met[s].values() for v in m.get("per_severity", {})})
            ys = [np.mean([100 * m["per_severity"][str(v)]["miou"] for m in met[s].values()]) for v in sevs]
            clean = np.mean([100 * m["clean@corrupt:miou"] for m in met[s].values()])
            ax.plot([0, *sevs], [clean, *ys], **series_style(i), label=label[s])
        ax.set_xlabel("severity (0 = clean, same images)")
        ax.set_xticks([0, *sevs])
        ax.set_ylabel("mIoU (%), mean over corruptions and seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, out / "severity.png"))

    return paths
