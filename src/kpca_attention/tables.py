"""Markdown tables and the number formats of every report (core: the task modules' report sections, the
study report, the KPCA and PAP-trace reports all write through these)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["markdown_table", "table_row", "fmt_num", "fmt_pm", "fmt_p"]


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits (``0.012345 -> "0.0123"``); one with more integer digits
    than that whole, with thousands separators, below a billion (``5781.2 -> "5,781"``, not ``5.78e+03``);
    ``-`` for None / NaN, ``inf`` for infinity."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if 10 ** digits <= abs(float(f"{x:.{digits}g}")) < 1e9:  # after rounding: 999.6 -> "1,000"
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


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
    """A p-value with two significant digits; ``<1e-4`` below that; ``-`` for None."""
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def _cell(v: Any) -> str:
    """The default cell of a number: two decimals (``-`` for NaN)."""
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return f"{float(v):.2f}"


def _table_text(text: str) -> str:
    """A cell's text that stays one cell: a pipe not yet escaped is escaped (a label such as ``a|b`` split
    the row), a line break becomes a space."""
    return re.sub(r"(?<!\\)\|", r"\\|", str(text)).replace("\r", " ").replace("\n", " ")


def table_row(cells: Sequence[Any]) -> str:
    """One row of a markdown table, ``| a | b |``, each cell kept one cell (:func:`_table_text`): the row
    writer of every table written by hand (a header row, a row of formatted cells)."""
    return "| " + " | ".join(_table_text(c) for c in cells) + " |"


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | Mapping[str, str],
    *,
    formats: Mapping[str, Callable[[Any], str]] | None = None,
    align_right: Sequence[str] | None = None,
) -> str:
    """A GitHub markdown table.

    Args:
        rows: one mapping per row.
        columns: keys to show, or ``{key: header}``.
        formats: ``{key: value -> str}``; default two decimals for numbers, ``str`` otherwise, ``-``
            for None.
        align_right: keys to right-align (default: columns whose values are all numbers).
    """
    headers = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
    formats = dict(formats or {})
    keys = list(headers)
    if align_right is None:
        align_right = [k for k in keys if rows and all(isinstance(r.get(k), (int, float)) for r in rows)]
    lines = [table_row([headers[k] for k in keys]),
             "|" + "|".join("---:" if k in align_right else "---" for k in keys) + "|"]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            f = formats.get(k)
            if f is not None:
                cells.append(f(v))
            elif isinstance(v, (int, float)):
                cells.append(_cell(v))
            else:
                cells.append("-" if v is None else str(v))
        lines.append(table_row(cells))
    return "\n".join(lines)
