"""Accuracy against the attack budget: :func:`eps_sweep` runs one attack at a list of budgets (and eps = 0,
clean) and :func:`plot_eps_sweep` draws the curves of several models - the shape of the paper's Fig. 3,
left."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn
from torch.utils.data import Dataset

from ..checks import check_int
from .attacks import DEFAULT_EPS, NORMS, check_attack_options, evaluate_attack

__all__ = ["eps_sweep", "plot_eps_sweep"]


def eps_sweep(
    model: nn.Module,
    data: Dataset | tuple[Tensor, Tensor],
    method: str,
    eps_list: Sequence[float] | None = None,
    n: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
    protocol: str = "pixel",
    **options: Any,
) -> list[dict[str, float]]:
    """:func:`evaluate_attack` at each eps (default :data:`DEFAULT_EPS`), plus eps = 0 (clean).
    Every eps and option is checked before the first attack runs."""
    check_attack_options(method, 0.0, options)  # the method and options, before the budgets
    eps_values = [0.0, *(DEFAULT_EPS[method] if eps_list is None else eps_list)]
    for e in eps_values:
        check_attack_options(method, e, options, protocol)
    check_int(n, "n", min=1, allow_none=True)
    check_int(batch_size, "batch_size", min=1)
    return [{"eps": float(e), **evaluate_attack(model, data, method, e, n, batch_size, progress, protocol,
                                                **options)}
            for e in dict.fromkeys(eps_values)]


def plot_eps_sweep(
    sweeps: Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]],
    path: str | os.PathLike,
    title: str | None = None,
) -> Path:
    """Top-1 (solid, filled markers) and top-5 (dashed, hollow markers) accuracy against eps, one panel per
    attack and one colour and marker per model (:func:`~kpca_attention.plotting.series_style`: past ten
    models the marker changes) - the shape of the paper's Fig. 3, left. ``sweeps[model][method]`` =
    :func:`eps_sweep` output. Linf budgets are shown in units of 1/255."""
    from ..plotting import panel_grid, save_figure, series_style

    methods = list(dict.fromkeys(m for s in sweeps.values() for m in s))
    if not methods:
        raise ValueError("nothing to plot")
    fig, axes = panel_grid(len(methods), panel=(4.2, 3.4))
    for ax, method in zip(axes, methods, strict=True):
        scale = 255.0 if NORMS[method] == "Linf" else 1.0
        for i, (label, per_method) in enumerate(sweeps.items()):
            if method not in per_method:
                continue
            rows = sorted(per_method[method], key=lambda r: r["eps"])
            e = [r["eps"] * scale for r in rows]
            st = series_style(i)  # its line style is replaced: solid top-1, dashed top-5
            c, m = st["color"], st["marker"]
            top1, top5 = [100 * r["top1"] for r in rows], [100 * r["top5"] for r in rows]
            ax.plot(e, top1, color=c, marker=m, linestyle="-", label=f"{label} top-1")
            ax.plot(e, top5, color=c, marker=m, linestyle="--", markerfacecolor="none", alpha=0.6,
                    label=f"{label} top-5")
        unit = " (x 1/255)" if scale == 255.0 else ""
        ax.set_xlabel(f"{NORMS[method]} eps{unit}")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(method.upper())
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi=120)
