"""The headline table of ``docs/results.md``: each published claim the studies test, with the verdict its
study gives it now - generated from the committed ``results/<study>/summary.json``, never typed.

:data:`CLAIMS` is the one declarative list (a claim, where it was published and with what effect, the study,
variant, comparator and metric that test it). :func:`headline_markdown` reads each study's verdict cells
(``summary["verdicts"]``: against the baseline in ``cells``, against a further comparator in
``also.<slug>.cells``; :mod:`kpca_attention.report.study` writes them) and renders one row per claim: the
paired difference over seeds with its 95 % t interval, the margin, the verdict word and, for an
``inconclusive`` cell, the seeds that would decide it either way (equivalence within the margin if the true
difference is 0; the observed difference under Holm if it is the true one); :func:`headline_plot` draws the
claims that have a margin and an interval as one forest plot in units of their margins (each claim's
published effect is 1 there, so claims in accuracy and in perplexity share one axis).
:func:`update_results_doc` puts the table between the markers ``<!-- headline:begin -->`` and
``<!-- headline:end -->`` of a page, and :mod:`.landed`'s table of finished seeds between its own
(``kpca-attention leaderboard`` does, after each finished run;
``tests/test_leaderboard.py`` checks that the committed page is in sync), so the page cannot keep a number
its study no longer gives. :func:`check_summaries` (run by ``kpca-attention leaderboard`` before it writes
anything) refuses a ``summary.json`` those tables read that is not what ``kpca-attention report`` writes
from the study's sealed result files: the summary is derived and unsealed, so an edited verdict cell would
otherwise be published while ``kpca-attention results verify`` passes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..report.verdicts import decided_word, interim_note, verdict_cell
from ..tables import table_row
from .rpc_seeds import SEED_CAP

__all__ = ["Claim", "CLAIMS", "headline_markdown", "headline_plot", "update_results_doc",
           "check_summaries", "page_studies", "BEGIN", "END"]

BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


@dataclass(frozen=True)
class Claim:
    """``variant`` against ``comparator`` (None: the study's baseline) on ``metric`` (a report metric key)
    in ``study``; ``claim`` says what was claimed, ``source`` where and with what effect."""

    claim: str
    source: str
    study: str
    variant: str
    metric: str
    comparator: str | None = None


_RPC = "RPC-SymViT (4 it., block 1) vs SymViT"
#: where a paper's gain "at the highest budget" serves as the margin at our pixel 8/255 (docs/robustness.md)
_TOP = "at its highest budget, 6/255 on normalised tensors (about 1.4/255 in pixels)"
_MECH = "more robust than the ViT (its paper: DeiT-tiny on ImageNet)"
_LOGS = "more robust than the ViT (its repository's logs: DeiT-tiny on ImageNet, one run)"
_MORE = "more robust than the ViT"
_FAN = f"{_MORE} (its paper: FAN against DeiT and others on ImageNet-C)"
CLAIMS: tuple[Claim, ...] = (
    Claim(f"{_RPC}: clean top-1", "paper Table 1, +0.50", "rpc-seeds", "rpc_official", "clean"),
    Claim(f"{_RPC}: corrupted top-1", "paper Table 1, ImageNet-C, +0.90", "rpc-seeds", "rpc_official",
          "corrupted"),
    Claim(f"{_RPC}: FGSM 8/255 in pixels", f"paper Table 2, +3.24 {_TOP}", "rpc-seeds", "rpc_official",
          "fgsm@8"),
    Claim(f"{_RPC}: PGD 8/255 in pixels", f"paper Table 2, +0.17 {_TOP}", "rpc-seeds", "rpc_official",
          "pgd@8"),
    Claim(f"{_RPC}: APGD-CE", "no paper number for APGD-CE alone (Table 2's AutoAttack, all four attacks: "
          "+1.47)", "rpc-seeds", "rpc_official", "apgd-ce@4"),
    Claim(f"{_RPC}: Square", "no paper number for 4 it. (appendix E.4, the 6-it. model: +2.14)", "rpc-seeds",
          "rpc_official", "square@4"),
    Claim("RPC with 2 it. in every block, lambda 3, vs SymViT: clean", "paper Table 1, +0.15; margin the "
          "4-it. setting's +0.50", "rpc-seeds", "rpc_all2_l3", "clean"),
    Claim("RPC with the paper's tau = lambda / mu (lambda 4) vs SymViT: FGSM 8/255", "paper's threshold "
          "convention; margin the 4-it. setting's +3.24", "rpc-seeds", "rpc_paper_tau", "fgsm@8"),
    Claim("forcing S = 0 leaves RPC-SymViT's clean accuracy as it is", "our ablation; margin Table 1's "
          "+0.50", "rpc-seeds", "rpc_no_sparse", "clean", "rpc_official"),
    Claim("forcing S = 0 leaves RPC-SymViT's FGSM 8/255 accuracy as it is", "our ablation; margin Table "
          "2's +3.24", "rpc-seeds", "rpc_no_sparse", "fgsm@8", "rpc_official"),
    Claim("the asymmetric ViT vs SymViT: corrupted top-1", "our earlier reading: raw p 0.045 at 3 seeds; "
          "margin borrowed from RPC's Table 1 +0.90", "rpc-seeds", "vit", "corrupted"),
    Claim("RPC-SymViT with 12 blocks (PAP in block 1 of 12) vs its SymViT: clean",
          "paper Table 1, +0.50 (PAP in 1 of 12 blocks)", "rpc-depth12", "rpc12_official", "clean"),
    Claim("RPC-Symlm vs Symlm: test perplexity", "paper Table 3, -1.10", "language", "rpc_symlm",
          "ppl/test"),
    Claim("RPC-Symlm vs Symlm: word-swap test perplexity", "paper Table 3, -1.16", "language", "rpc_symlm",
          "wordswap/test"),
    Claim("the asymmetric LM vs Symlm: test perplexity", "our question (ordinary attention); margin borrowed "
          "from RPC's Table 3 -1.10", "language", "lm", "ppl/test"),
    Claim("Segmenter-RPC vs Segmenter-SymViT: mIoU", "paper Table 6, +0.69", "segmentation", "rpc_symvit",
          "clean:miou"),
    Claim("Segmenter-RPC vs Segmenter-SymViT: corrupted mIoU", "paper Table 6, +1.00", "segmentation",
          "rpc_symvit", "corrupted:miou"),
    Claim("RPC-FAN vs FAN (zoo: FAN with queries; two differences, not the paper's one): PGD 8/255 in "
          "pixels", f"paper Tables 9-10, +3.33 {_TOP}", "zoo", "rpc_fan", "pgd@8", "fan"),
    Claim("RPC-FAN vs FAN, both symmetric (the paper's pair): FGSM 8/255 in pixels",
          f"paper Tables 9-10, +3.11 {_TOP}", "rpc-fan", "rpc_fan_sym", "fgsm@8"),
    Claim("RPC-FAN vs FAN, both symmetric (the paper's pair): PGD 8/255 in pixels",
          f"paper Tables 9-10, +3.33 {_TOP}", "rpc-fan", "rpc_fan_sym", "pgd@8"),
    # each mechanism on the robustness its paper leads with: adversarial (PGD 4/255) for most; corruptions
    # (ImageNet-C) for FAN and RVT, whose abstracts claim ImageNet-C first
    *(Claim(f"{label} {mech}: {what}", source, "zoo", slug, key) for label, mech, slug, source, what, key in (
        ("Twicing", _MECH, "twicing", "ICLR 2025", "PGD 4/255", "pgd@4"),
        ("NeuTRENO", _MECH, "neutreno", "NeurIPS 2023", "PGD 4/255", "pgd@4"),
        # the PID discretisation and gains are assumed (attention/pid.py): the paper could not be read
        ("PID feedback (PIDformer-style: assumed discretisation and gains)",
         f"{_MORE} (its paper's PIDformer: DeiT-tiny on ImageNet)", "pid", "ICML 2024", "PGD 4/255", "pgd@4"),
        ("Elliptical", _MECH, "elliptical", "NeurIPS 2024", "PGD 4/255", "pgd@4"),
        ("KDE", _LOGS, "kde", "robust_transformer logs, +0.13", "PGD 4/255", "pgd@4"),
        ("RKDE-Huber (the paper's norm)", f"{_MORE} (its repository's logs: DeiT-tiny on ImageNet, one run, "
         "with the official code's norm)", "rkde", "robust_transformer logs, +0.85", "PGD 4/255", "pgd@4"),
        ("RVT's position-aware scaling", f"{_MORE} (its paper: an ablation inside RVT on ImageNet)", "rvt",
         "CVPR 2022", "corrupted top-1", "corrupted"),
        ("FAN", _FAN, "fan", "ICML 2022", "corrupted top-1", "corrupted"),
        ("FAN", _FAN, "fan", "ICML 2022", "mCE (lower is better)", "mce"))),
)


def _cell(summary: dict[str, Any], claim: Claim) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``(the verdict cell or None, the metric's title / unit)`` of ``claim`` in a study summary."""
    meta = ((summary.get("verdicts") or {}).get("metrics") or {}).get(claim.metric) or {}
    return verdict_cell(summary, claim.variant, claim.metric, claim.comparator), meta


def _claim_cells(results: Path) -> list[tuple[Claim, dict[str, Any] | None, dict[str, Any], str]]:
    """``(claim, its cell or None, the metric's title / unit, the comparator's slug)`` of every claim, each
    study's summary read once."""
    summaries: dict[str, dict[str, Any]] = {}
    out = []
    for claim in CLAIMS:
        if claim.study not in summaries:
            path = results / claim.study / "summary.json"
            summaries[claim.study] = json.loads(path.read_text()) if path.is_file() else {}
        summary = summaries[claim.study]
        cell, meta = _cell(summary, claim)
        comparator = claim.comparator or (summary.get("verdicts") or {}).get("baseline") or "the baseline"
        out.append((claim, cell, meta, comparator))
    return out


def _num(x: float) -> str:
    return f"{x:+.2f}"


def _seeds(n: int | None) -> str:
    return f"{n} seeds" if n is not None and n <= SEED_CAP else f"> {SEED_CAP} seeds"


def _plan(cell: dict[str, Any]) -> str:
    """What would decide an inconclusive cell, from the report's two planning numbers: the seeds for TOST
    to show equivalence within the margin if the true difference is 0, and the seeds for the paired t test
    at the level of Holm's first step to detect the observed difference if it is the true one."""
    parts = []
    margin, ci = cell.get("margin"), cell.get("ci")
    if margin is not None and ci is not None and (ci[0] > margin or ci[1] < -margin):
        parts.append(f"the 95 % interval lies outside +-{margin:g}")  # seeds for a true 0 would mislead
    elif margin is not None and cell.get("mean") is not None and abs(cell["mean"]) >= margin:
        parts.append(f"the observed difference lies outside +-{margin:g}")  # more seeds would not show it
    elif margin is not None:
        parts.append(f"equivalence: {_seeds(cell.get('seeds_needed'))} if the true difference is 0")
    if cell.get("mean"):  # a difference of exactly 0 has nothing to detect
        parts.append(f"the observed difference under Holm: {_seeds(cell['seeds_to_detect'])}")
    return "; ".join(parts) or "no margin declared"


def _inside_margin_but_not_zero(cell: dict[str, Any]) -> str:
    """For an ``equivalent`` cell whose 95 % interval excludes 0: that it does, with the raw and Holm p - a
    difference smaller than the margin that its test does not decide (read alone, the word hid it)."""
    lo, hi = cell["ci"]
    if not cell["word"].startswith("equivalent") or lo <= 0 <= hi:
        return ""
    side = "below" if hi < 0 else "above"
    return (f"; the 95 % interval lies {side} 0 (raw p {cell['p_raw']:.2g}, Holm {cell['p_holm']:.2g}: "
            "not a decided difference)")


def _row(claim: Claim, cell: dict[str, Any] | None, meta: dict[str, Any]) -> list[str]:
    what = [claim.claim, claim.source]
    if cell is None:
        return [*what, f"`{claim.study}`", "-", "-", "no paired seeds yet"]
    unit = {"percentage points": "pp", "perplexity": ""}.get(meta.get("unit", ""), meta.get("unit", ""))
    diff = _num(cell["mean"]) + (f" ({_num(cell['ci'][0])}, {_num(cell['ci'][1])})" if cell.get("ci") else "")
    word = cell["word"]
    if cell.get("ci") is None:
        word += f" ({cell['n']} seed: no test yet)" if cell["n"] == 1 else f" ({cell.get('reason', '')})"
    elif word == "inconclusive":
        word += f" ({_plan(cell)})"
    else:
        word = decided_word(cell) + _inside_margin_but_not_zero(cell)
    margin = "-" if cell.get("margin") is None else f"+-{cell['margin']:g}"
    return [*what, f"`{claim.study}`, {cell['n']} seed{'s' * (cell['n'] != 1)}",
            f"{diff} {unit}".rstrip(), margin, word]


def headline_markdown(results: str | os.PathLike = "results") -> str:
    """The table of :data:`CLAIMS` with the verdicts the committed summaries under ``results`` give."""
    results = Path(results)
    head = ["claim", "source, published effect", "study, paired seeds",
            "variant - comparator (95 % t interval)", "margin", "verdict"]
    lines = [table_row(head), "|" + "---|" * len(head)]
    lines += [table_row(_row(c, cell, meta)) for c, cell, meta, _ in _claim_cells(results)]
    return "\n".join(lines) + "\n"


_CLIP = 6.0  # margins: an interval wider than this (PGD's +-0.17) is cut at the edge and says so


def clip_interval(a: float, b: float, edge: float = _CLIP) -> tuple[float, float]:
    """The interval between ``a`` and ``b`` (either order) cut to ``[-edge, +edge]``, as ``(lo, hi)`` with
    ``lo <= hi``: both ends are clipped, so an interval wholly past one edge becomes that edge (a point),
    not a reversed interval reaching back across it."""
    lo, hi = sorted((a, b))
    return min(max(lo, -edge), edge), min(max(hi, -edge), edge)


def headline_plot(path: str | os.PathLike, results: str | os.PathLike = "results") -> Path | None:
    """The claims whose cells have an interval and a margin, as a forest plot in multiples of each margin,
    signed so that right is "the variant better" (perplexity: lower); None when no claim has both yet."""
    from ..report.forest import forest_plot
    from ..report.verdicts import Verdict

    rows = []
    for claim, cell, meta, comparator in _claim_cells(Path(results)):
        if cell is None or cell.get("ci") is None or cell.get("margin") is None:
            continue
        k = (1.0 if meta.get("higher_is_better", True) else -1.0) / cell["margin"]
        clipped = any(abs(x * k) > _CLIP for x in cell["ci"])

        def scaled(pair: list[float] | None, k: float = k) -> tuple[float, float] | None:
            return None if pair is None else clip_interval(pair[0] * k, pair[1] * k)

        label = (f"{claim.variant} - {comparator}, {meta.get('title', claim.metric)}"
                 + (f" (cut at +-{_CLIP:g})" if clipped else "")
                 + (" (interim)" if interim_note(cell) else ""))
        mean = max(-_CLIP, min(_CLIP, cell["mean"] * k))
        rows.append((label, Verdict(
            word=cell["word"], mean=mean, ci=scaled(cell["ci"]), p_raw=cell.get("p_raw"),
            p_holm=cell.get("p_holm"), tost_p=cell.get("tost_p"), tost_ci=scaled(cell.get("tost_ci")),
            margin=1.0, mde=None, seeds_needed=cell.get("seeds_needed"),
            seeds_to_detect=cell.get("seeds_to_detect"), n=cell["n"], sd=None,
            alpha=cell.get("alpha", 0.05), reason=cell.get("reason", ""))))
    if not rows:
        return None
    return forest_plot(rows, path, "Claims against their margins (1 = published effect)",
                       "margins (> 0: variant better)")


def update_results_doc(page: str | os.PathLike, results: str | os.PathLike = "results") -> bool:
    """Regenerate the page's generated tables from ``results``: :func:`headline_markdown` between the
    headline markers, :func:`~.landed.landed_markdown` (the finished seeds of each long study) between
    the landed markers and :func:`~.cells.cells_markdown` (the paired cells of the studies that decide)
    between the cells markers; returns whether the page changed. A table whose two markers are not both on the
    page (in order) is left alone."""
    from ..io import write_text_atomic
    from . import cells, landed

    page = Path(page)
    text = page.read_text() if page.is_file() else ""
    new = text
    tables = ((BEGIN, END, headline_markdown), (landed.BEGIN, landed.END, landed.landed_markdown),
              (cells.BEGIN, cells.END, cells.cells_markdown))
    for begin, end, render in tables:
        if begin not in new or end not in new or new.index(begin) > new.index(end):
            continue
        head, rest = new.split(begin, 1)
        _, tail = rest.split(end, 1)
        new = f"{head}{begin}\n{render(results)}{end}{tail}"
    if new != text:
        write_text_atomic(page, new)
    return new != text


def page_studies() -> list[str]:
    """The studies whose ``summary.json`` the page's generated tables read: the claims' and the paired
    cells' (:data:`~.cells.GRIDS`), in that order."""
    from .cells import GRIDS

    return list(dict.fromkeys([c.study for c in CLAIMS] + [g.study for g in GRIDS]))


def check_summaries(results: str | os.PathLike = "results", studies: list[str] | None = None) -> list[str]:
    """Refuse a ``results/<study>/summary.json`` of ``studies`` (default :func:`page_studies`) that is not
    what the study's report (:func:`~kpca_attention.report.study.write_study_report`) writes from its
    sealed result files; returns the studies checked (those with a summary).

    Each report is written again, without its plots, into a temporary copy of the study folder (and of the
    result folders its result files refer to), so nothing under ``results`` is touched, and the two
    summaries are compared as JSON (floats to 1e-9 relative). A mismatch, a summary with no
    ``settings.json`` beside it and a summary of a study with no finished run are each one ValueError line
    naming the file and what differs."""
    import shutil
    import tempfile

    from ..io import read_json
    from ..report.study import reused_runs, write_study_report

    results = Path(results)
    checked = []
    for study in page_studies() if studies is None else studies:
        folder = results / study
        path = folder / "summary.json"
        if not path.is_file():
            continue  # the tables say "no paired seeds yet"
        rerun = f"`kpca-attention report {folder}` rewrites it from the results"
        if not (folder / "settings.json").is_file():
            raise ValueError(f"{path}: there is no {folder / 'settings.json'} beside it, so its cells cannot "
                             "be checked against the study's sealed results: restore the study folder")
        published = read_json(path)
        with tempfile.TemporaryDirectory(prefix="kpca-summary-") as tmp:
            copy = Path(tmp) / study
            shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.png", "report.md", "summary.json"))
            for other in reused_runs(folder):  # the result files referred to: <root>/<other>/results/
                if (results / other / "results").is_dir() and other != study:
                    shutil.copytree(results / other / "results", Path(tmp) / other / "results")
            try:
                write_study_report(copy, plots=False)  # the summary is compared, not the plots
            except FileNotFoundError as e:
                raise ValueError(f"{path}: the study's sealed results hold no finished run to give its "
                                 f"cells ({e})") from None
            true = read_json(copy / "summary.json")
        if published is None:
            raise ValueError(f"{path}: not readable JSON; {rerun}")
        diff = _difference(published, true)
        if diff is not None:
            where, mine, theirs = diff
            raise ValueError(f"{path}: {where} is {_shown(mine)} in the file but {_shown(theirs)} in the "
                             f"report of the study's sealed results (edited, or stale); {rerun}")
        checked.append(study)
    return checked


_ABSENT = object()


def _difference(mine: Any, true: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """The first place where the JSON ``mine`` differs from ``true``: ``(dotted path, mine's value, true's
    value)`` (:data:`_ABSENT` for a missing key), or None; floats compare to 1e-9 relative."""
    import math

    if isinstance(mine, dict) and isinstance(true, dict):
        for k in [*true, *(k for k in mine if k not in true)]:
            d = _difference(mine.get(k, _ABSENT), true.get(k, _ABSENT), f"{where}.{k}" if where else str(k))
            if d is not None:
                return d
        return None
    if isinstance(mine, list) and isinstance(true, list) and len(mine) == len(true):
        for i, (a, b) in enumerate(zip(mine, true, strict=True)):
            d = _difference(a, b, f"{where}[{i}]")
            if d is not None:
                return d
        return None
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (mine, true))
    if numbers and (math.isclose(mine, true, rel_tol=1e-9, abs_tol=1e-12) or mine != mine and true != true):
        return None  # equal, or both NaN
    if not numbers and type(mine) is type(true) and mine == true:
        return None
    return where or "the summary", mine, true


def _shown(value: Any) -> str:
    """A JSON value for a one-line message (cut at 80 characters)."""
    text = "absent" if value is _ABSENT else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
