"""What every study report shares, whatever its suites: reading a study folder's runs, number
formatting, and the PAP-trace section (``report/study.py`` for images, ``study_segmentation.py``,
``study_lm.py`` build on it)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..io import read_json
from ..plotting import new_figure, save_figure
from ..robustness.store import ResultStore
from ..robustness.suites import structure_items
from .tables import markdown_table

__all__ = ["read_settings", "load_runs", "fmt_pm", "fmt_p", "fmt_num", "trace_section", "regenerate_lines",
           "plot_training_curves"]

Runs = dict[str, dict[int, dict[str, Any]]]


def read_settings(out: str | os.PathLike) -> dict[str, Any]:
    """A study folder's ``settings.json`` (FileNotFoundError naming it when there is none)."""
    out = Path(out)
    settings = read_json(out / "settings.json")
    if not isinstance(settings, dict):
        raise FileNotFoundError(f"no study in {out}: {out / 'settings.json'} is missing "
                                "(run the study first)")
    return settings


def load_runs(out: str | os.PathLike, settings: Mapping[str, Any],
              keep: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None) -> Runs:
    """``{slug: {seed: results}}`` of every ``results/<slug>-s<seed>.json`` of the settings' variants,
    structured by :func:`~kpca_attention.robustness.suites.structure_items`; runs without a training
    summary (``run``) or a ``clean`` item are skipped, and ``keep(results)`` may filter or drop
    (return ``None``) what a report does not read."""
    out = Path(out)
    res: Runs = {}
    for v in settings["variants"]:
        for f in sorted((out / "results").glob(f"{v['slug']}-s*.json")):
            seed_txt = f.stem[len(v["slug"]) + 2:]
            if not seed_txt.isdigit():
                continue
            r: dict[str, Any] | None = structure_items(ResultStore(f).items())
            if "run" not in r or "clean" not in r:
                continue
            if keep is not None:
                r = keep(r)
            if r is not None:
                res.setdefault(v["slug"], {})[int(seed_txt)] = r
    return res


def fmt_pm(values: Sequence[float | None], scale: float = 100, digits: int = 1) -> str:
    """``mean ± std`` (sample std) of the finite values, scaled; one value alone; ``-`` for none."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "-"
    mean = scale * float(np.mean(vals))
    if len(vals) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * float(np.std(vals, ddof=1)):.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def fmt_num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def trace_section(res: Runs, slugs: Sequence[str], label: Mapping[str, str]) -> tuple[list[str], list[dict]]:
    """The markdown lines and rows of the PAP-trace table (empty when no run was traced)."""
    rows = []
    for s in slugs:
        for sd, r in sorted(res.get(s, {}).items()):
            tr = r.get("trace")
            if not tr:
                continue
            for name, layer in tr["layers"].items():
                q = layer["quantities"]
                rows.append({
                    "variant": label[s], "seed": str(sd), "layer": name.removeprefix("model."),
                    "S active": "yes" if layer["s_active"] else "no",
                    "max s_density": fmt_num(layer["s_density_max"]),
                    "s_density per iteration": ", ".join(fmt_num(x, 2) for x in q["s_density"]["mean"]),
                    "tau / max abs K (it 1)": fmt_num(layer["tau_over_kmax"]["mean"][0]),
                    "dual norm (last)": fmt_num(q["dual_norm"]["mean"][-1]),
                    "l_change (last)": fmt_num(q["l_change"]["mean"][-1]),
                })
    if not rows:
        return [], rows
    lines = ["## PAP trace of the RPC layers on test inputs", "",
             "Is the sparse component S of Principal Attention Pursuit ever non-zero? tau / max|K| above 1 "
             "means the first step shrinks nothing; s_density is the fraction of non-zero entries of S.",
             "", markdown_table(rows, list(rows[0])), ""]
    return lines, rows


def regenerate_lines(settings: Mapping[str, Any], out: str | os.PathLike) -> list[str]:
    """The report's "Regenerate:" paragraph (empty when the settings record no command)."""
    if not settings.get("command"):
        return []
    return ["", f"Regenerate: `{settings['command']}` (finished runs are reused; "
            f"`kpca-attention report {out}` rewrites this report from the results)."]


def plot_training_curves(res: Runs, slugs: Sequence[str], label: Mapping[str, str], metric: str, path: Path,
                         ylabel: str, scale: float = 100, log: bool = False) -> Path | None:
    """The held-out ``metric`` of every run's ``epochs.csv`` rows (kept in its ``run`` summary) against
    the epoch, one colour per variant; ``None`` when no run logged it."""
    fig, ax = new_figure(figsize=(6, 4))
    drawn = False
    for i, s in enumerate(slugs):
        for j, (_sd, r) in enumerate(sorted(res.get(s, {}).items())):
            ep = [e for e in r["run"].get("epochs", []) if metric in e]
            if ep:
                ax.plot([e["epoch"] + 1 for e in ep], [scale * e[metric] for e in ep], "o-", color=f"C{i}",
                        alpha=0.7, label=label[s] if j == 0 else None)
                drawn = True
    if not drawn:
        return None
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
