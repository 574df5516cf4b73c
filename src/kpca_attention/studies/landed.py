"""What has landed: the table of ``docs/results.md`` that says, for each long study, which seeds of which
row are finished and committed and which kinds of machine trained them - generated from the committed
``results/<study>/`` folders, never typed (a typed one went stale within hours of each run landing).

:func:`landed_markdown` reads each study as its report does
(:func:`~kpca_attention.report.study.load_study_results`: only runs evaluated on every item their
settings ask for count as finished) and renders one row per variant: the finished seeds, the seeds the
study plans, and the machines that trained them (the kind, :func:`~kpca_attention.machine.machine_kind`,
with the vector instructions of torch's CPU kernels where recorded); a run another study trained and this
one refers to (``Study.reuse``) says where it came from. ``kpca-attention leaderboard`` puts it between
the markers ``<!-- landed:begin -->`` and ``<!-- landed:end -->`` of docs/results.md after every finished
run; ``tests/test_leaderboard.py`` checks that the committed page is in sync. Runs still training are not
in ``results/`` (``kpca-attention study NAME --status`` lists them from the runs folder).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..report.study import load_study_results, machine_counts, reused_runs
from ..tables import table_row

__all__ = ["LANDED_STUDIES", "landed_markdown", "seed_ranges", "BEGIN", "END"]

BEGIN, END = "<!-- landed:begin -->", "<!-- landed:end -->"

#: the studies whose seeds are still landing, in the order docs/results.md discusses them
LANDED_STUDIES: tuple[str, ...] = ("rpc-seeds", "rpc-depth12", "zoo", "rpc-fan", "zoo-language", "language")


def seed_ranges(seeds: Iterable[int]) -> str:
    """``[0, 1, 2, 4, 6, 7]`` -> ``"0-2, 4, 6-7"`` (``"-"`` for none)."""
    out: list[str] = []
    run: list[int] = []
    for s in sorted(set(seeds)):
        if run and s != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(s)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out) or "-"


def _machines(runs: Sequence[dict[str, Any]]) -> str:
    """``"AMD EPYC (AVX2 3, not recorded 2)"`` over the runs' recorded machines, the vector instructions
    counted within each kind (a study trains on one kind; where two trained it, each says its own)."""
    kinds, caps = machine_counts(runs)
    return "; ".join(f"{kind} (" + ", ".join(f"{c} {n}" for c, n in sorted(caps[kind].items())) + ")"
                     for kind in kinds) or "-"


def _taken_from(reused: dict[str, list[str]], slug: str) -> dict[str, list[int]]:
    """``{other study: [seeds]}`` of this row's runs among a study's :func:`reused_runs`."""
    taken: dict[str, list[int]] = {}
    for other, runs in reused.items():
        for run in runs:
            variant, seed = run.rsplit("-s", 1)
            if variant == slug:
                taken.setdefault(other, []).append(int(seed))
    return taken


def _rows(out: Path) -> list[list[str]]:
    settings, res = load_study_results(out)
    reused = reused_runs(out)  # read once per study, not once per row
    rows = []
    for v in settings["variants"]:
        slug = v["slug"]
        finished = res.get(slug, {})
        planned = [0] if v.get("source") else (v.get("seeds") or settings.get("seeds") or [])
        done = f"{seed_ranges(finished)} ({len(finished)})" if finished else "-"
        taken = _taken_from(reused, slug)
        machines = _machines([finished[s] for s in sorted(finished)])
        if taken:
            machines += "; " + "; ".join(f"seeds {seed_ranges(s)} taken from `{other}`"
                                         for other, s in taken.items())
        rows.append([f"`{settings.get('name', out.name)}`", v.get("label", slug), done, seed_ranges(planned),
                     machines])
    return rows


def landed_markdown(results: str | os.PathLike = "results", studies: Sequence[str] = LANDED_STUDIES) -> str:
    """The table of finished seeds per study and row (a study without a committed folder is left out)."""
    results = Path(results)
    head = ["study", "row", "seeds finished (count)", "seeds planned",
            "trained on (torch's CPU kernels: runs)"]
    lines = [table_row(head), "|" + "---|" * len(head)]
    for name in studies:
        if (results / name / "settings.json").is_file():
            lines += [table_row(row) for row in _rows(results / name)]
    return "\n".join(lines) + "\n"
