"""Figures without pyplot: the package's one way to make a matplotlib figure and save it as PNG.

``matplotlib.figure.Figure`` needs no backend and no global state, so library code never switches a
user's backend (``matplotlib.use("Agg")`` would, in a notebook) and figures are never left open in
pyplot's registry. Every plot of the package is made with :func:`new_figure` and written with
:func:`save_figure` (atomically: a temporary file and ``os.replace``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .io import atomic_path

__all__ = ["new_figure", "save_figure"]


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] = (6.4, 4.2),
               squeeze: bool = True, **subplot_kw: Any) -> tuple[Any, Any]:
    """``(figure, axes)`` like ``plt.subplots`` but detached from pyplot (no backend needed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    axes = fig.subplots(nrows, ncols, squeeze=squeeze, **subplot_kw)
    return fig, axes


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110, tight: bool = True) -> Path:
    """Write ``fig`` as PNG to ``path`` (folders created, written atomically); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    with atomic_path(path, suffix=path.suffix or ".png") as tmp:
        fig.savefig(tmp, dpi=dpi, format=(path.suffix.lstrip(".") or "png"))
    return path
