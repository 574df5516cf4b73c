"""The verdict sections of a study report: every seed-level paired comparison of a study (against its
baseline, against each comparator of ``also_against`` and each declared pair) as one Holm family
(:mod:`.verdicts`), with the declared margins, and its tables, details and forest plots.

:func:`verdict_lines` writes the sections and ``summary["verdicts"]``; :func:`study_verdicts` computes the
words alone. Called by the one study report (:mod:`.study`), which lays out the rest of the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..io import output_path
from ..tables import fmt_num, fmt_p, markdown_table
from ..tasks.base import SeedMetric, StudySections
from .forest import forest_plot
from .verdicts import (
    INTERIM_NOTE,
    WORDS_HELP,
    Family,
    Verdict,
    decided_word,
    interim_note,
    planned_pairs,
    table_word,
)

__all__ = ["ALPHA", "NOISE_NOTE", "margin_of", "study_verdicts", "verdict_lines"]

#: the verdicts' level (docs/verdicts.md)
ALPHA = 0.05
#: what the example-level statistics of the paired-differences table are (and are not)
NOISE_NOTE = ("test-set noise only, not a verdict: the bootstrap intervals [in brackets] and the McNemar / "
              "Wilcoxon p-values are over test examples (images; tokens for language models) of these "
              "trained models; the verdicts over seeds are in the verdict table")


def _margins(settings: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The declared margins ``{metric: {"value", "source"}}``, or None for settings made before studies
    declared them."""
    m = settings.get("margins")
    return None if m is None else {k: dict(v) for k, v in m.items()}


def _variant_margins(settings: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """The margins declared for one variant only, ``{slug: {metric: {"value", "source"}}}``."""
    per_variant = settings.get("variant_margins") or {}
    return {s: {k: dict(v) for k, v in per.items()} for s, per in per_variant.items()}


def margin_of(margins: Mapping[str, Mapping[str, Any]] | None,
              variant_margins: Mapping[str, Mapping[str, Mapping[str, Any]]] | None,
              slug: str, key: str, comparator: str) -> dict[str, Any] | None:
    """The margin a comparison of variant ``slug`` with ``comparator`` on metric ``key`` uses: the
    variant's own (unless it belongs to another comparator, ``against``), else the metric's, else None."""
    own = (variant_margins or {}).get(slug, {}).get(key)
    if own is not None and own.get("against") not in (None, comparator):
        own = None
    m = own or (margins or {}).get(key)
    return None if m is None else dict(m)


def study_verdicts(metrics: Sequence[SeedMetric], variants: Sequence[str], base: str, base_label: str,
                   margins: Mapping[str, Mapping[str, Any]] | None, alpha: float = ALPHA, *,
                   variant_margins: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
                   also: Sequence[tuple[str, str, Sequence[str]]] = (), mirrors_left_out: bool = False
                   ) -> tuple[Family, dict[tuple[str, ...], Verdict], dict[tuple[str, ...], list[int]]]:
    """The verdict of every ``(metric key, variant)`` against ``base`` on the seeds both have
    (:mod:`.verdicts`), and of every ``(metric key, variant, comparator)`` of the further comparisons
    ``also`` (``(comparator slug, its label, its variants)``): one Holm family over all of them; the
    margin of each is the variant's own, else the metric's (None: no equivalence); ``mirrors_left_out``: a
    comparator's list leaves out the comparators before it (the family statement says so). Returns
    ``(family, {key: verdict}, {key: paired seeds})``."""
    comps = [(base, base_label, list(variants))] + [(c, cl, list(vs)) for c, cl, vs in also]
    nm = len(metrics)
    parts = [f"{len(vs)} variant{'s' if len(vs) != 1 else ''} x {nm} metric{'s' if nm != 1 else ''} "
             f"against {cl}" for _c, cl, vs in comps]
    others = ", ".join(cl for _c, cl, _v in comps[1:])
    fam = Family(f"every seed-level paired t test of this study: {' and '.join(parts)} (variant - "
                 f"{'comparator' if also else 'baseline'} per seed; a test with fewer than 2 paired seeds "
                 "has no p-value and does not count)"
                 + (f"; the comparison of {base_label} with {others} is counted once, in the table against "
                    f"{base_label}" if also else "")
                 + ("; a comparison between two of those comparators is counted once, in the table of the "
                    "one listed first" if mirrors_left_out else ""))
    seeds: dict[tuple[str, ...], list[int]] = {}
    direction = {m.key: m.higher_is_better for m in metrics}
    for i, (comp, _cl, vs) in enumerate(comps):
        for m in metrics:
            b = m.values.get(comp, {})
            for s in vs:
                a = m.values.get(s, {})
                common = sorted(set(a) & set(b))
                if common:
                    key = (m.key, s) if i == 0 else (m.key, s, comp)
                    fam.add(key, [a[sd] - b[sd] for sd in common])
                    seeds[key] = common

    def margin(key: tuple[str, ...]) -> float | None:
        m = margin_of(margins, variant_margins, key[1], key[0], key[2] if len(key) == 3 else base)
        return None if m is None else float(m["value"])

    verdicts = fam.verdicts(margin, lambda key: direction[key[0]], alpha)
    return fam, verdicts, seeds


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def _cell(v: Verdict, planned: int) -> str:
    """A compact table's cell; a decided word on fewer paired seeds than planned says it is interim (the
    row's "paired seeds" says how many of how many)."""
    word = table_word(v, planned, short=True)
    if v.ci is None:
        return f"{word}: {_f(v.mean)} ({v.n} seed{'s' if v.n != 1 else ''})"
    return f"{word}: {_f(v.mean)} ({_f(v.ci[0])}, {_f(v.ci[1])})"


def verdict_lines(out: Path, sec: StudySections, summary: dict[str, Any]) -> list[str]:
    """The verdict sections of a study report (against the baseline, then against each comparator of
    ``also_against``: table, margins, details, forest plots; one Holm family over all) and
    ``summary["verdicts"]`` (the baseline's cells; ``also`` holds the other comparisons')."""
    settings, label, base = sec.settings, sec.label, sec.base
    variants = [s for s in sec.slugs if s != base]
    metrics = [m for m in sec.seed_metrics() if any(m.values.values())]
    if base not in sec.res or not variants or not metrics:
        return []
    margins, vmargins = _margins(settings), _variant_margins(settings)
    # each comparator against the variants, less the baseline and the comparators before it: the mirror of a
    # comparison already made (c2 - c1 after c1 - c2) is the same test and enters the family once
    comparators = [c for c in settings.get("also_against", []) if c in sec.res]
    also = [(c, label[c], vs) for i, c in enumerate(comparators)  # (the last one may have none left)
            if (vs := [s for s in sec.slugs if s not in (c, base, *comparators[:i])])]
    paired: dict[str, list[str]] = {}  # single comparisons (variant, comparator), grouped by comparator
    for v, c in settings.get("pairs", []):
        if v in sec.res and c in sec.res:
            paired.setdefault(c, []).append(v)
    also += [(c, label[c], vs) for c, vs in paired.items()]
    fam, ver, seeds = study_verdicts(metrics, variants, base, label[base], margins, variant_margins=vmargins,
                                     also=also, mirrors_left_out=len(comparators) > 1)
    summary["verdicts"] = {"alpha": ALPHA, "baseline": base, "family": fam.to_dict()}
    if fam.size == 0 and all(v.get("source") for v in settings["variants"]):
        # existing models evaluated once each (the robustness command): nothing to pair over seeds
        summary["verdicts"]["none"] = "every model was evaluated once: no paired seeds"
        return ["## Verdicts over seeds", "", "None: a verdict word needs two or more paired training seeds "
                "per variant, and each model here is one existing model evaluated once. The paired "
                "differences below are over test examples: test-set noise only, not a verdict.", ""]
    sec.verdicts_ = {k: v for k, v in ver.items() if len(k) == 2}
    lines: list[str] = []
    for comp, _cl, vs in [(base, label[base], variants), *also]:
        sub = {(k[0], k[1]): v for k, v in ver.items() if (len(k) == 2) == (comp == base)
               and (comp == base or k[2] == comp)}
        sseeds = {(k[0], k[1]): sd for k, sd in seeds.items() if (len(k) == 2) == (comp == base)
                  and (comp == base or k[2] == comp)}
        # the tables before this comparator's hold its comparisons with them (a mirror here)
        before = [base, *comparators[:comparators.index(comp)]] if comp in comparators else [base]
        part, cells, plots = _comparison_lines(out, sec, comp, vs, metrics, fam, sub, sseeds, margins,
                                               vmargins, first=comp == base, before=before)
        lines += part
        if comp == base:
            summary["verdicts"].update({
                "margins": margins, "margins_note": settings.get("margins_note") if margins is not None
                else "no margin declared (settings.json predates declared margins)",
                "metrics": {m.key: {"title": m.title, "unit": m.unit, "higher_is_better": m.higher_is_better}
                            for m in metrics},
                "cells": cells, "forest_plots": plots,
                "paired_note": "summary['paired'] and the other example-level entries: " + NOISE_NOTE})
            if vmargins:
                summary["verdicts"]["variant_margins"] = vmargins
        else:
            summary["verdicts"].setdefault("also", {})[comp] = {"comparator": comp, "cells": cells,
                                                                "forest_plots": plots}
    return lines


def _comparison_lines(out: Path, sec: StudySections, comp: str, variants: Sequence[str],
                      metrics: Sequence[SeedMetric], fam: Family, ver: Mapping[tuple[str, str], Verdict],
                      seeds: Mapping[tuple[str, str], list[int]], margins: Mapping[str, Any] | None,
                      vmargins: Mapping[str, Any], *, first: bool, before: Sequence[str] = ()
                      ) -> tuple[list[str], dict[str, Any], list[str]]:
    """One comparison's section: ``(lines, summary cells, forest plot names)``; ``before``: the comparators
    whose tables come first and hold this one's comparisons with them."""
    settings, label = sec.settings, sec.label
    main_unit = metrics[0].unit
    title = {m.key: m.title for m in metrics}
    lines = [f"## Verdicts over seeds against {label[comp]}", "",
             f"Per cell: the verdict word, the mean paired difference over seeds (variant - {label[comp]}, "
             f"same seed) and its 95 % t interval, in {main_unit}"
             + "".join(f"; {m.title} in {m.unit}" for m in metrics if m.unit != main_unit)
             + f". Better is {'higher' if metrics[0].higher_is_better else 'lower'}"
             + "".join(f"; for {m.title} {'higher' if m.higher_is_better else 'lower'}" for m in metrics
                       if m.higher_is_better != metrics[0].higher_is_better)
             + f". alpha = {ALPHA:g}. {fam.statement}."
             + (" The words (docs/verdicts.md): " + "; ".join(f"`{w}`: {h}" for w, h in WORDS_HELP.items())
                + "." if first else "".join(
                    f" {label[c]} against {label[comp]} is the mirror of the row of {label[comp]} in the "
                    f"table against {label[c]} (the same test, counted once)." for c in before)
                if comp in settings.get("also_against", []) else
                f" A single comparison the study declares (pairs): {', '.join(label[v] for v in variants)} "
                f"against {label[comp]}."), ""]
    planned = {(m.key, s): planned_pairs(settings, s, comp, m.seeds) for m in metrics for s in variants}
    rows = []
    for s in variants:
        n = max((len(seeds[(m.key, s)]) for m in metrics if (m.key, s) in seeds), default=0)
        most = max((planned[(m.key, s)] for m in metrics), default=0)
        row = {"variant": label[s], "seeds": str(n) if n >= most else f"{n} of {most} planned"}
        for m in metrics:
            if (m.key, s) in ver:
                row[m.key] = _cell(ver[(m.key, s)], planned[(m.key, s)])
        rows.append(row)
    lines += [markdown_table(rows, {"variant": "variant", "seeds": "paired seeds", **title}), ""]
    if margins is None and not vmargins:
        lines += ["Margins: none declared (this folder's settings.json predates declared margins): no "
                  "cell can be `equivalent`; `inconclusive` says that no difference was detected and none "
                  "was excluded.", ""]
    elif first:
        margins = margins or {}
        used = [k for k in title if k in margins]
        own = [(s, k) for s in variants for k in title if k in vmargins.get(s, {})]
        lines += ["Margins declared in the study definition (settings.json)"
                  + (f" - {settings['margins_note']}" if settings.get("margins_note") else "")
                  + (":" if used or own else ": none for these metrics (no cell can be `equivalent`).")]
        lines += [f"- {title[k]}: +-{margins[k]['value']:g} ({margins[k]['source']})" for k in used]

        def whose(m: Mapping[str, Any]) -> str:
            c = m.get("against")
            return "this variant's own" + (f", in its comparison with {label.get(c, c)}" if c else
                                           ", applied in each of its comparisons: where its source measured "
                                           "another one, borrowed")

        lines += [f"- {label[s]}, {title[k]} ({whose(vmargins[s][k])}): +-{vmargins[s][k]['value']:g} "
                  f"({vmargins[s][k]['source']})" for s, k in own]
        unused = [k for k in margins if k not in title]
        if unused:
            lines.append(f"- declared, not measured here: {', '.join(unused)}")
        none = [title[m.key] for m in metrics if m.key not in margins]
        if none:
            what = ("- no margin for the metric as a whole (better / worse / inconclusive only, except where "
                    "a variant's own margin above applies)" if vmargins else
                    "- no margin declared (better / worse / inconclusive only)")
            lines.append(f"{what}: {', '.join(none)}")
        lines.append("")
    else:
        lines += [f"Margins: those listed against {label[sec.base]} (each variant's own where it belongs to "
                  "this comparison, else the metric's).", ""]
    drows = []
    for (k, s), v in sorted(ver.items(), key=lambda kv: variants.index(kv[0][1])):  # stable: metrics in order
        if v.ci is None:
            continue
        drows.append({"variant": label[s], "metric": title[k], "n": str(v.n), "mean": _f(v.mean),
                      "ci": f"({_f(v.ci[0])}, {_f(v.ci[1])})", "p": fmt_p(v.p_raw), "holm": fmt_p(v.p_holm),
                      "margin": "-" if v.margin is None else f"+-{v.margin:g}",
                      "tost_ci": "-" if v.tost_ci is None else f"({_f(v.tost_ci[0])}, {_f(v.tost_ci[1])})",
                      "tost_p": fmt_p(v.tost_p), "mde": fmt_num(v.mde),
                      "need": "-" if v.margin is None else str(v.seeds_needed or "> 1000"),
                      "detect": "-" if not v.mean else str(v.seeds_to_detect or "> 1000"),
                      "word": decided_word({"word": v.word, "n": v.n, "planned": planned[(k, s)]})})
    if drows:
        lines += ["Details of every test over >= 2 seeds: paired t p raw and Holm-adjusted over the family; "
                  "TOST against the margin (90 % interval; a test per cell, not adjusted over the family); "
                  "MDE: the difference the paired t test at the level of Holm's first step over the family "
                  "(alpha / family size) detects with 80 % power at these seeds and this SD (a difference "
                  "this large is decided whatever the other tests show); seeds needed: for TOST to show "
                  "equivalence "
                  "within the margin with 80 % power if the true difference is 0 (same SD); seeds to detect: "
                  "for the paired t test at the level of Holm's first step over the family (alpha / family "
                  "size) to detect the observed mean difference with 80 % power if it is the true one (same "
                  "SD)." + (INTERIM_NOTE if any("interim" in r["word"] for r in drows) else ""), "",
                  markdown_table(drows, {"variant": "variant", "metric": "metric", "n": "n", "mean": "mean",
                                         "ci": "95 % CI", "p": "p", "holm": "p Holm", "margin": "margin",
                                         "tost_ci": "90 % CI", "tost_p": "TOST p", "mde": "MDE 80 %",
                                         "need": "seeds needed", "detect": "seeds to detect",
                                         "word": "verdict"}), ""]
    plots = []
    for s in variants:
        shown = [m for m in metrics if m.unit == main_unit and (m.key, s) in ver]
        prow = [(m.title, ver[(m.key, s)]) for m in shown]
        if any(v.ci is not None for _, v in prow):
            n = max(v.n for _, v in prow)
            note = interim_note({"n": n, "planned": max(planned[(m.key, s)] for m in shown)})
            name = f"forest_{s}.png" if first else f"forest_{s}_vs_{comp}.png"
            title = f"{label[s]} - {label[comp]} over {n} seeds" + (f" ({note})" if note else "")
            ways = {m.higher_is_better for m in shown}  # one way for every row, or the axis says none
            plots.append(forest_plot(prow, output_path(out, name, what="plot"), title, main_unit,
                                     higher_is_better=ways.pop() if len(ways) == 1 else None))
    if plots:
        lines += ["Forest plots (one per comparison with >= 2 paired seeds; "
                  + (f"{', '.join(m.title for m in metrics if m.unit != main_unit)} in the table only; "
                     if any(m.unit != main_unit for m in metrics) else "")
                  + "thin line: 95 % interval, thick: 90 % TOST interval, grey band: the margin):", ""]
        lines += [f"![{p.stem}]({p.name})\n" for p in plots]
    cells = {s: {k: {"seeds": seeds[(k, s2)], "planned": planned[(k, s2)], **v.to_dict()}
                 for (k, s2), v in ver.items() if s2 == s} for s in variants}
    return lines, cells, [p.name for p in plots]
