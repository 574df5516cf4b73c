"""The leaderboard of a study report (``Study.leaderboard``, recorded in ``settings.json``): one row per
variant with the mean +- std over seeds of the leaderboard's metrics, the paired difference of each against
the study's baseline with its 95 % interval, verdict word and the margin used (the verdicts of
:func:`kpca_attention.report.verdict_sections.study_verdicts`), and a plot of one metric against another (e.g.
clean against robust accuracy), one point per variant with its seeds' standard deviation as error bars.

Written by the one study report (:func:`kpca_attention.report.study.write_study_report`) for any study
that asks for a leaderboard, whatever its task: the values are the task's seed-level metrics
(:meth:`~kpca_attention.tasks.base.StudySections.seed_metrics`, in the report's unit)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..plotting import new_figure, save_figure
from ..tables import fmt_pm, markdown_table
from ..tasks.base import SeedMetric, StudySections
from .verdicts import Verdict, planned_pairs, planned_seeds, table_word

__all__ = ["leaderboard_lines", "leaderboard_plot", "diff_cell"]


def diff_cell(v: Verdict | None, planned: int | None = None) -> str:
    """A leaderboard's paired-difference cell: ``mean (low, high) word; margin`` (``-`` for none); a
    decided word on fewer than the ``planned`` paired seeds says it is interim (:func:`.table_word`)."""
    if v is None:
        return "-"
    interval = f" ({v.ci[0]:+.2f}, {v.ci[1]:+.2f})" if v.ci is not None else f" ({v.n} seed)"
    margin = f"m +-{v.margin:g}" if v.margin is not None else "no margin"
    mean = "-" if v.mean is None else f"{v.mean:+.2f}"
    return f"{mean}{interval} {table_word(v, planned)}; {margin}"


def _stats(values: Mapping[int, float]) -> dict[str, Any]:
    vals = list(values.values())
    return {"n": len(vals), "mean": float(np.mean(vals)) if vals else None,
            "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else None, "seeds": sorted(values)}


def leaderboard_lines(out: Path, sec: StudySections, verdicts: Mapping[tuple[str, str], Verdict],
                      summary: dict[str, Any]) -> list[str]:
    """The leaderboard section (table and plot) and ``summary["leaderboard"]``; nothing when the study
    asks for none. ``verdicts``: ``{(metric key, slug): Verdict}`` against the baseline."""
    lb = sec.settings.get("leaderboard")
    if not lb:
        return []
    label, base = sec.label, sec.base
    base_label = label.get(base, base)  # the baseline may have no finished run yet
    metrics = {m.key: m for m in sec.seed_metrics()}
    keys = [k for k in lb["metrics"] if k in metrics and any(metrics[k].values.values())]
    if not keys:
        return []
    rows, data = [], {}
    for s in sec.slugs:
        row: dict[str, str] = {"variant": label[s]}
        data[s] = {}
        planned = {k: planned_pairs(sec.settings, s, base, metrics[k].seeds) for k in keys}
        for k in keys:
            st = _stats(metrics[k].values.get(s, {}))
            v = verdicts.get((k, s)) if s != base else None
            row[k] = fmt_pm(list(metrics[k].values.get(s, {}).values()), scale=1, digits=2)
            row["d:" + k] = "baseline" if s == base else diff_cell(v, planned[k])
            data[s][k] = {**st, "diff": None if v is None else {
                "mean": v.mean, "ci": None if v.ci is None else list(v.ci), "word": v.word,
                "margin": v.margin, "n": v.n, "planned": planned[k]}}
        n = max((data[s][k]["n"] for k in keys), default=0)
        most = len(planned_seeds(sec.settings, s)) if s == base else max(planned.values(), default=0)
        row["seeds"] = str(n) if n >= most else f"{n} of {most} planned"
        rows.append(row)
    unit = metrics[keys[0]].unit
    cols = {"variant": "variant", "seeds": "seeds", **{k: metrics[k].title for k in keys},
            **{"d:" + k: f"{metrics[k].title} - {base_label}" for k in keys}}
    lines = ["## Leaderboard", "",
             f"Mean ± std over seeds ({sec.value_unit}), then the paired difference against {base_label} "
             f"(same seed; in {unit}): mean (95 % t interval), the verdict word and the margin it used (the "
             "variant's own paper's effect where one is declared; see the verdict tables below, the same "
             "Holm family).", "", markdown_table(rows, cols), ""]
    summary["leaderboard"] = {"metrics": keys, "unit": sec.value_unit, "rows": data}
    plot = lb.get("plot")
    if plot and all(k in metrics for k in plot):
        p = leaderboard_plot(out / "leaderboard.png", sec, metrics[plot[0]], metrics[plot[1]])
        if p is not None:
            lines += [f"![{p.stem}]({p.name})", ""]
            summary["leaderboard"]["plot"] = {"x": plot[0], "y": plot[1], "file": p.name}
    return lines


def _sd(v: list[float]) -> float:
    return float(np.std(v, ddof=1)) if len(v) > 1 else 0.0


def leaderboard_plot(path: Path, sec: StudySections, x: SeedMetric, y: SeedMetric) -> Path | None:
    """``y`` against ``x``: one point per variant (the mean over its seeds) with the seeds' standard
    deviation as error bars in both directions, sized for a page; ``None`` when no variant has both."""
    fig, ax = new_figure(figsize=(7.5, 4.8))
    drawn = 0
    markers = "osD^v<>pPX*h"
    for i, s in enumerate(sec.slugs):
        xs, ys = x.values.get(s, {}), y.values.get(s, {})
        common = sorted(set(xs) & set(ys))
        if not common:
            continue
        xv, yv = [xs[sd] for sd in common], [ys[sd] for sd in common]
        seeds = f"{len(common)} seed{'s' if len(common) != 1 else ''}"
        ax.errorbar(np.mean(xv), np.mean(yv), xerr=_sd(xv), yerr=_sd(yv), fmt=markers[i % len(markers)],
                    color=f"C{i % 10}", ms=7, capsize=3, label=f"{sec.label[s]} ({seeds})")
        drawn += 1
    if not drawn:
        return None
    unit = sec.value_unit
    ax.set_xlabel(f"{x.title} ({unit})")
    ax.set_ylabel(f"{y.title} ({unit})")
    ax.set_title(f"{y.title} against {x.title}: mean over seeds, error bars: std over seeds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return save_figure(fig, path)
