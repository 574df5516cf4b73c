"""The paired cells of the studies that decide, for ``docs/results.md`` - generated from the committed
``results/<study>/summary.json``, never typed.

The page's prose used to restate each study's cells by hand at every seed count ("at six seeds ...", "at
seven ..."), and each restatement went stale with the next seed that landed. :data:`GRIDS` is the one
declarative list of what the page shows per study (the comparisons and the metrics);
:func:`cells_markdown` renders, per study, a table of its paired cells - variant minus comparator over the
paired seeds, the 95 % t interval, the verdict word, and for an ``inconclusive`` cell whose raw p is under
0.05 the raw and Holm-adjusted p (an interval that excludes 0 without surviving the family's correction) -
and a table of each row's mean and SD over its own seeds. ``kpca-attention leaderboard`` puts it between
``<!-- cells:begin -->`` and ``<!-- cells:end -->`` after every finished run
(:func:`~.headline.update_results_doc`); ``tests/test_leaderboard.py`` checks that the committed page is
in sync.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..report.verdicts import interim_note, verdict_cell
from ..tables import table_row
from .zoo import ATTENTION_MECHANISMS, LM_MECHANISMS

__all__ = ["Grid", "GRIDS", "cells_markdown", "BEGIN", "END"]

BEGIN, END = "<!-- cells:begin -->", "<!-- cells:end -->"

#: the image metrics the page discusses: the paper's Table 1 and 2 columns and the two AutoAttack members
IMAGE_METRICS = ("clean", "corrupted", "fgsm@8", "pgd@8", "apgd-ce@4", "square@4")
#: the zoo's: PGD 4/255 too, the budget the mechanisms' papers lead with
ZOO_METRICS = ("clean", "corrupted", "fgsm@8", "pgd@4", "pgd@8", "apgd-ce@4", "square@4")


@dataclass(frozen=True)
class Grid:
    """The cells of ``study`` shown on the page: each ``(variant, comparator)`` (comparator None: the
    study's baseline) on each metric (a report metric key). A comparison with no cell yet is left out."""

    study: str
    comparisons: tuple[tuple[str, str | None], ...]
    metrics: tuple[str, ...] = IMAGE_METRICS


GRIDS: tuple[Grid, ...] = (
    Grid("rpc-seeds", (("rpc_official", None), ("vit", None), ("rpc_no_sparse", None),
                       ("vit", "rpc_official"), ("rpc_no_sparse", "rpc_official"),
                       ("rpc_all2_l3", None), ("rpc_paper_tau", None))),
    Grid("rpc-depth12", (("rpc12_official", None),)),
    Grid("zoo", (*((m, None) for m in (*ATTENTION_MECHANISMS, "fan")), ("rpc_fan", "fan"),
                 ("rpc_official", None), ("symvit", None)), ZOO_METRICS),
    Grid("rpc-fan", (("rpc_fan_sym", None),)),
    Grid("zoo-language", tuple((m, None) for m in (*LM_MECHANISMS, "rpc_symlm", "symlm")),
         ("ppl/test", "wordswap/test")),
)


def _p(p: float) -> str:
    return f"{p:.3f}" if p < 0.995 else "1"


def _cell_text(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    text = f"{cell['mean']:+.2f}"
    if cell.get("ci") is None:
        return f"{text} ({cell['n']} seed{'s' * (cell['n'] != 1)}: no test)"
    text += f" ({cell['ci'][0]:+.2f}, {cell['ci'][1]:+.2f}) "
    word = cell["word"]
    if word != "inconclusive":
        note = interim_note(cell)
        return text + f"**{word}**" + (f" ({note})" if note else "")
    p_raw, p_holm = cell.get("p_raw"), cell.get("p_holm")
    if p_raw is not None and p_raw < 0.05 and p_holm is not None:
        return text + f"inconclusive (raw p {_p(p_raw)}, Holm {_p(p_holm)})"
    return text + word


def _margins(cells: dict[str, dict[str, Any] | None], titles: dict[str, str]) -> str:
    return ", ".join(f"{titles[m]} +-{c['margin']:g}" for m, c in cells.items()
                     if c is not None and c.get("margin") is not None)


def _grid_markdown(grid: Grid, summary: dict[str, Any], labels: dict[str, str]) -> list[str]:
    ver = summary.get("verdicts") or {}
    base = ver.get("baseline")
    meta = ver.get("metrics") or {}
    titles = {m: (meta.get(m) or {}).get("title", m) for m in grid.metrics}
    units = {(meta.get(m) or {}).get("unit", "") for m in grid.metrics}
    percent = units == {"percentage points"}
    rows = []
    for variant, comparator in grid.comparisons:
        cells = {m: verdict_cell(summary, variant, m, comparator) for m in grid.metrics}
        if any(c is not None for c in cells.values()):
            rows.append((variant, comparator or base, cells))
    if not rows:
        return []
    margins = {_margins(cells, titles) for *_, cells in rows}
    shared = margins.pop() if len(margins) == 1 else None
    size = (ver.get("family") or {}).get("size")
    unit = "percentage points" if percent else " / ".join(sorted(u for u in units if u)) or "metric units"
    lines = [f"**`{grid.study}`**: variant - comparator over the paired seeds ({unit}), 95 % t interval, "
             f"verdict (Holm over the study's {size} seed-level tests; margins declared in the study "
             f"definition: {(shared or 'none') if shared is not None else 'named in each row'}).", ""]
    lines += [table_row(["variant - comparator (paired seeds)", *titles.values()]),
              "|---|" + "---|" * len(titles)]
    for variant, comparator, cells in rows:
        n = max(c["n"] for c in cells.values() if c is not None)
        own = _margins(cells, titles)
        said = f"; margins {own}" if shared is None and own else ""
        row = f"{labels.get(variant, variant)} - {labels.get(comparator, comparator)} ({n}{said})"
        lines.append(table_row([row, *(_cell_text(c) for c in cells.values())]))
    lines += ["", f"Mean and SD over each row's own seeds{', %' if percent else ''}:", "",
              table_row(["row (seeds)", *titles.values()]), "|---|" + "---|" * len(titles)]
    per_seed = summary.get("metrics") or {}
    scale, digits = (100.0, 1) if percent else (1.0, 2)
    shown = dict.fromkeys([base] + [s for variant, comparator, _ in rows for s in (variant, comparator)])
    for slug in shown:
        seeds = per_seed.get(slug) or {}
        if not seeds:
            continue
        out = []
        for m in grid.metrics:
            values = [scale * v[m] for v in seeds.values() if v.get(m) is not None]
            sd = f" +- {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
            out.append(f"{statistics.fmean(values):.{digits}f}{sd}" if values else "-")
        lines.append(table_row([f"{labels.get(slug, slug)} ({len(seeds)})", *out]))
    return lines


def cells_markdown(results: str | os.PathLike = "results", grids: tuple[Grid, ...] = GRIDS) -> str:
    """The tables of :data:`GRIDS` from the committed summaries under ``results`` (a study without a
    summary is left out)."""
    results = Path(results)
    parts = []
    for grid in grids:
        path = results / grid.study / "summary.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        settings = json.loads((results / grid.study / "settings.json").read_text())
        labels = {v["slug"]: v.get("label", v["slug"]) for v in settings.get("variants", [])}
        lines = _grid_markdown(grid, summary, labels)
        if lines:
            parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
