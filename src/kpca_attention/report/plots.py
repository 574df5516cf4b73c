"""Small matplotlib helpers (figures without pyplot, PNG files) for training and evaluation reports.

* :func:`plot_training_curves` - loss, learning rate and held-out accuracy of several runs, read from
  their ``steps.csv`` / ``epochs.csv`` (:mod:`kpca_attention.train.logger`).
* :func:`plot_grouped_bars` - one bar per model for each category (e.g. accuracy per corruption).
* :func:`plot_lines` - y against x, one line per model (e.g. accuracy against severity).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..plotting import new_figure, save_figure

__all__ = ["plot_training_curves", "plot_grouped_bars", "plot_lines"]


def _save(fig, path: str | os.PathLike) -> Path:
    return save_figure(fig, path, dpi=120)


def _smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what exists so far)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_training_curves(
    runs: Mapping[str, str | os.PathLike],
    path: str | os.PathLike,
    *,
    accuracy_key: str = "eval_top1",
    smooth: int = 10,
    title: str | None = None,
) -> Path:
    """Three panels for runs ``{label: run_dir}``: training loss per step (moving average over
    ``smooth`` logged steps), learning rate per step, and ``accuracy_key`` per epoch (in %; for LMs
    pass ``accuracy_key="eval_ppl"``, plotted as is)."""
    from ..train.logger import read_csv

    fig, axes = new_figure(1, 3, figsize=(13, 3.6))
    for label, run_dir in runs.items():
        steps_file, epochs_file = Path(run_dir) / "steps.csv", Path(run_dir) / "epochs.csv"
        if not steps_file.exists():
            raise FileNotFoundError(f"{steps_file} not found: is {run_dir} a training run directory?")
        steps = read_csv(steps_file)
        x = [r["step"] for r in steps]
        axes[0].plot(x, _smooth([r["loss"] for r in steps], smooth), label=label)
        axes[1].plot(x, [r["lr"] for r in steps], label=label)
        if epochs_file.exists():
            ep = [r for r in read_csv(epochs_file) if not math.isnan(r.get(accuracy_key, math.nan))]
            scale = 100.0 if accuracy_key.endswith(("top1", "top5")) else 1.0
            axes[2].plot([r["step"] for r in ep], [scale * r[accuracy_key] for r in ep], "o-", label=label)
    axes[0].set(xlabel="step", ylabel="training loss", title=f"training loss ({smooth}-point average)")
    axes[1].set(xlabel="step", ylabel="learning rate", title="learning rate")
    unit = " (%)" if accuracy_key.endswith(("top1", "top5")) else ""
    axes[2].set(xlabel="step", ylabel=f"{accuracy_key}{unit}", title=f"held-out {accuracy_key}")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_grouped_bars(
    values: Mapping[str, Mapping[str, float]],
    path: str | os.PathLike,
    *,
    ylabel: str,
    title: str | None = None,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """Grouped bars: ``values[model][category]``, categories on the x axis in first-seen order."""
    models = list(values)
    cats = list(dict.fromkeys(c for m in models for c in values[m]))
    if not cats:
        raise ValueError("nothing to plot")
    width = 0.8 / max(len(models), 1)
    fig, ax = new_figure(figsize=(max(6.0, 0.55 * len(cats) * max(len(models), 1) + 2), 4))
    for i, m in enumerate(models):
        xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(cats))]
        ax.bar(xs, [values[m].get(c, math.nan) for c in cats], width=width, label=m)
    ax.set_xticks(range(len(cats)), cats, rotation=45, ha="right")
    ax.set(ylabel=ylabel, title=title or "")
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_lines(
    series: Mapping[str, Mapping[float, float]],
    path: str | os.PathLike,
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
) -> Path:
    """``series[model][x] = y``, one line with markers per model."""
    fig, ax = new_figure(figsize=(5.5, 3.8))
    for m, pts in series.items():
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], "o-", label=m)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title or "")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)
