"""Forest plot of a study's verdicts: one row per paired comparison (a metric of a variant against its
baseline), the mean difference over seeds with its 95 % t interval (thin line) and 90 % TOST interval
(thick line), the declared margin as a shaded band between dashed lines at ``+-m``, and the verdict word
on the right (:mod:`.verdicts`). Sized for a page (7.5 in wide, about 0.4 in per row).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..plotting import new_figure, save_figure
from .verdicts import BETTER, INCONCLUSIVE, WORSE, Verdict

__all__ = ["forest_plot", "verdict_color"]

_COLORS = {BETTER: "#1a7f37", WORSE: "#c62828", INCONCLUSIVE: "#616161"}
_EQUIVALENT_COLOR = "#1f5fa8"


def verdict_color(word: str) -> str:
    """The colour a verdict word is drawn in (green better, red worse, blue equivalent, grey else)."""
    return _COLORS.get(word, _EQUIVALENT_COLOR if word.startswith("equivalent") else _COLORS[INCONCLUSIVE])


def forest_plot(rows: Sequence[tuple[str, Verdict]] | Mapping[str, Verdict], path: str | os.PathLike,
                title: str, unit: str, *, words: Sequence[str] | None = None,
                difference: str = "variant - baseline", higher_is_better: bool | None = None) -> Path:
    """Draw ``rows`` (``(label, verdict)`` pairs or ``{label: verdict}``, top to bottom) to the PNG
    ``path``; the x axis is the difference ``difference`` in ``unit`` (e.g. ``"points of top-1
    accuracy"``), and says which side is the variant's better one when ``higher_is_better`` is given (every
    row's metric the same way: accuracy True, perplexity False). Rows without an interval (fewer than 2
    seeds) show their mean alone. ``words``: the text
    on the right of each row (default: its verdict word; the colour is always the verdict's). A row whose
    95 % interval excludes 0 but whose verdict is not ``better`` / ``worse`` (the verdict is Holm-adjusted
    over its family, the drawn interval is not) says its Holm p beside the word. Returns the path.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    items = list(rows.items()) if isinstance(rows, Mapping) else list(rows)
    if not items:
        raise ValueError("forest_plot needs at least one row")
    for label, v in items:
        if not isinstance(v, Verdict):
            raise ValueError(f"row {label!r}: expected a Verdict, got {type(v).__name__}")
    n_rows = len(items)
    if words is not None and len(words) != n_rows:
        raise ValueError(f"words: one per row ({n_rows}), got {len(words)}")
    fig, ax = new_figure(figsize=(7.5, 1.4 + 0.42 * n_rows))
    ys = [n_rows - 1 - i for i in range(n_rows)]
    xs: list[float] = [0.0]
    for y, (_, v) in zip(ys, items, strict=True):
        color = verdict_color(v.word)
        if v.margin is not None:
            m = v.margin
            ax.fill_betweenx([y - 0.45, y + 0.45], -m, m, color="#9e9e9e", alpha=0.22, lw=0, zorder=0)
            ax.vlines([-m, m], y - 0.45, y + 0.45, colors="#616161", linestyles="--", lw=0.9, zorder=1)
            xs += [-m, m]
        if v.ci is not None:
            ax.hlines(y, *v.ci, colors=color, lw=1.3, zorder=2)
            xs += list(v.ci)
        if v.tost_ci is not None:
            ax.hlines(y, *v.tost_ci, colors=color, lw=5, alpha=0.45, zorder=3)
            xs += list(v.tost_ci)
        if v.mean is not None:
            ax.plot([v.mean], [y], "o", color=color, ms=5, zorder=4)
            xs.append(v.mean)
    xs = [x for x in xs if math.isfinite(x)]
    lo, hi = min(xs), max(xs)
    pad = 0.06 * (hi - lo) if hi > lo else 1.0
    ax.set_xlim(lo - pad, hi + pad)
    ax.axvline(0.0, color="black", lw=0.8, zorder=1)
    ax.set_ylim(-0.6, n_rows - 0.4)
    ax.set_yticks(ys, [f"{label}  (n={v.n})" for label, v in items])
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    texts = list(words) if words is not None else [v.word for _, v in items]
    right.set_yticks(ys, [t + _holm_note(v) for t, (_, v) in zip(texts, items, strict=True)])
    for tick, (_, v) in zip(right.get_yticklabels(), items, strict=True):
        tick.set_color(verdict_color(v.word))
    right.tick_params(axis="y", length=0)
    side = "" if higher_is_better is None else f"; {'> 0' if higher_is_better else '< 0'}: variant better"
    ax.set_xlabel(f"difference ({difference}), {unit}{side}")
    ax.grid(axis="x", alpha=0.3)
    adjusted = any(v.p_holm is not None for _, v in items)
    handles = [Line2D([], [], color="#424242", lw=1.3,
                      label="95 % interval (paired t, not Holm-adjusted)" if adjusted else
                      "95 % interval (paired t)")]
    if any(v.tost_ci is not None for _, v in items):
        handles.append(Line2D([], [], color="#424242", lw=5, alpha=0.45, label="90 % interval (TOST)"))
    if any(v.margin is not None for _, v in items):
        handles.append(Patch(facecolor="#9e9e9e", alpha=0.4, edgecolor="#616161", ls="--",
                             label="equivalence margin +-m"))
    ncol = len(handles) if len(handles) < 3 else 2  # three long labels do not fit one row at page width
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol,
              frameon=False, fontsize=8, borderaxespad=0.2)
    ax.set_title(title, pad=20 if ncol == len(handles) else 32)
    return save_figure(fig, path, dpi=130)


def _holm_note(v: Verdict) -> str:
    """`` (Holm p 0.09)`` where the drawn (unadjusted) interval excludes 0 and the Holm-adjusted verdict
    decided nothing: the two would read as a contradiction otherwise."""
    if v.ci is None or v.p_holm is None or v.word in (BETTER, WORSE) or v.ci[0] <= 0 <= v.ci[1]:
        return ""
    return f" (Holm p {v.p_holm:.2g})"
