"""Markdown tables from rows of values (generic; used by the demo and reusable by any report)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["markdown_table", "fmt_pct", "fmt_num"]


def fmt_pct(v: Any, digits: int = 2) -> str:
    """A fraction as a percentage (``0.8312 -> "83.12"``); missing/NaN -> ``"-"``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{100.0 * float(v):.{digits}f}"


def fmt_num(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (int, float)):
        return f"{float(v):.{digits}f}"
    return str(v)


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
        formats: ``{key: value -> str}``; default :func:`fmt_num` for numbers, ``str`` otherwise.
        align_right: keys to right-align (default: columns whose values are all numbers).
    """
    headers = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
    formats = dict(formats or {})
    keys = list(headers)
    if align_right is None:
        align_right = [k for k in keys if rows and all(isinstance(r.get(k), (int, float)) for r in rows)]
    lines = ["| " + " | ".join(headers[k] for k in keys) + " |",
             "|" + "|".join("---:" if k in align_right else "---" for k in keys) + "|"]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            f = formats.get(k)
            if f is not None:
                cells.append(f(v))
            elif isinstance(v, (int, float)):
                cells.append(fmt_num(v))
            else:
                cells.append("-" if v is None else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
