"""Figures without pyplot: the package's one way to make a matplotlib figure and save it as PNG.

``matplotlib.figure.Figure`` needs no backend and no global state, so library code never switches a
user's backend (``matplotlib.use("Agg")`` would, in a notebook) and figures are never left open in
pyplot's registry. Every plot of the package is made with :func:`new_figure` (or :func:`panel_grid`, for
one panel per metric) and written with :func:`save_figure` (atomically: a temporary file and
``os.replace``).

Two rules keep the committed plots readable and small: a figure of many panels wraps them into rows no
wider than :data:`PAGE_WIDTH` inches (one row of fifteen metric panels was 45 inches wide - unreadable at
page width), and a PNG is stored with a 256-colour palette (pillow's median cut, no dithering): plots are
flat colours and anti-aliased edges, which a palette holds without visible loss at a third of the bytes.
"""

from __future__ import annotations

import contextvars
import io
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .io import atomic_path

__all__ = ["PAGE_WIDTH", "new_figure", "panel_grid", "row_starts", "series_style", "bar_style", "save_figure",
           "figures_not_saved"]

#: the widest a figure is made, in inches (about a page's text width at the default 110 dpi: 1650 pixels)
PAGE_WIDTH = 15.0


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] = (6.4, 4.2),
               squeeze: bool = True, **subplot_kw: Any) -> tuple[Any, Any]:
    """``(figure, axes)`` like ``plt.subplots`` but detached from pyplot (no backend needed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    axes = fig.subplots(nrows, ncols, squeeze=squeeze, **subplot_kw)
    return fig, axes


def panel_grid(n: int, *, panel: tuple[float, float] = (3.0, 4.2), max_width: float = PAGE_WIDTH,
               min_width: float = 4.0) -> tuple[Any, list[Any]]:
    """``(figure, [n axes])``: ``n`` panels of ``panel`` = (width, height) inches each, in rows of as many as
    fit in ``max_width`` inches (row-major; unused cells of the last row removed). The first axes of each
    row is ``axes[i * cols]`` - :func:`row_starts` gives them, for the y labels."""
    if n < 1:
        raise ValueError(f"panel_grid needs at least one panel, got {n}")
    cols = max(1, min(n, int(max_width // panel[0])))
    rows = math.ceil(n / cols)
    fig, grid = new_figure(rows, cols, figsize=(max(min_width, panel[0] * cols), panel[1] * rows),
                           squeeze=False)
    flat = list(grid.flat)
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n]


def row_starts(axes: list[Any]) -> list[Any]:
    """The first axes of each row of a :func:`panel_grid` (where a shared y label goes)."""
    if not axes:
        return []
    cols = axes[0].get_subplotspec().get_gridspec().ncols
    return axes[::cols]


_MARKERS = "osD^v<>ph*"


def series_style(i: int) -> dict[str, Any]:
    """Colour, marker and line style of the ``i``-th series of a line plot: matplotlib's ten colours
    (C0-C9), then, every further ten series, another marker and a dashed line - so a legend of twelve
    mechanisms has no two entries that look alike (``f"C{i}"`` alone wraps C10 to C0)."""
    r = i // 10
    return {"color": f"C{i % 10}", "marker": _MARKERS[r % len(_MARKERS)],
            "linestyle": "-" if r == 0 else "--"}


_HATCHES = ("", "///", "...", "xxx")


def bar_style(i: int) -> dict[str, Any]:
    """Colour and hatch of the ``i``-th bar of a bar chart: matplotlib's ten colours, then, every further
    ten bars, another hatch (a zoo of twelve variants would otherwise paint its eleventh bar like its
    first)."""
    r = i // 10
    return {"color": f"C{i % 10}", "hatch": _HATCHES[r % len(_HATCHES)], "edgecolor": "0.25" if r else None}


#: False inside :func:`figures_not_saved`
_SAVING: contextvars.ContextVar[bool] = contextvars.ContextVar("kpca_attention_saving_figures", default=True)


@contextmanager
def figures_not_saved() -> Iterator[None]:
    """Within this block :func:`save_figure` neither renders nor writes (it returns the path it would have
    written): for code that wants what a report computes, not its plots - rendering is half the time of
    rewriting a study's report (the leaderboard's summary check rewrites seven)."""
    token = _SAVING.set(False)
    try:
        yield
    finally:
        _SAVING.reset(token)


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110, tight: bool = True) -> Path:
    """Write ``fig`` as PNG to ``path`` (folders created, written atomically); returns the path (and writes
    nothing inside :func:`figures_not_saved`)."""
    path = Path(path)
    if not _SAVING.get():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fmt = path.suffix.lstrip(".").lower() or "png"
    with atomic_path(path, suffix=path.suffix or ".png") as tmp:
        if fmt == "png":
            _save_palette_png(fig, tmp, dpi)
        else:
            fig.savefig(tmp, dpi=dpi, format=fmt)
    return path


def _save_palette_png(fig: Any, dest: str | os.PathLike, dpi: int) -> None:
    """Render ``fig`` and write it as a 256-colour palette PNG (see the module's docstring)."""
    from PIL import Image  # matplotlib's own dependency

    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    buf.seek(0)
    with Image.open(buf) as im:
        rgb = im.convert("RGB")
    pal = rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    pal.save(dest, format="PNG", optimize=True)
