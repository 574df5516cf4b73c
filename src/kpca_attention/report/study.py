"""The report of a study (:mod:`kpca_attention.studies`), one writer for every task: tables, paired
statistics and plots from the per-run results in ``<out>/results/*.json``; writes ``report.md``,
``summary.json`` and PNG plots.

The writer lays out the frame every study report shares - the title and description, the training and
evaluation settings, the regenerate line, the main table (metrics, mean ± std over seeds, with training
throughput and time), the paired differences against the baseline (the baseline against itself across
seeds first: training noise), the PAP trace of the RPC layers, the study-wide checks, the training curves
and the plots - and asks the study's task (:mod:`kpca_attention.tasks`, found from ``settings.json``)
for its :class:`~kpca_attention.tasks.base.StudySections`: the metrics, their titles and cells, the
paired statistics over examples, and the sections and plots only that task has.

Everything here is read from files, so ``kpca-attention report OUT`` rewrites a report without the
checkpoints, e.g. from results committed to a repository.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..io import read_json, write_json_atomic, write_text_atomic
from ..machine import machine_kind
from ..plotting import new_figure, save_figure, series_style
from ..robustness.store import ResultStore
from ..tables import fmt_num, fmt_p, fmt_pm, markdown_table
from ..tasks import for_settings as task_of_settings
from ..tasks.base import SeedMetric, StudySections
from ..tasks.classification.suites import structure_items
from .board import leaderboard_lines
from .forest import forest_plot
from .verdicts import (
    INCONCLUSIVE,
    INTERIM_NOTE,
    WORDS_HELP,
    Family,
    Verdict,
    decided_word,
    interim_note,
    planned_pairs,
    word_with_note,
)

__all__ = ["read_settings", "reused_runs", "machine_counts", "load_runs", "load_study_results",
           "write_study_report", "regenerate_lines",
           "plot_training_curves", "trace_rows", "study_verdicts", "verdict_lines", "ALPHA", "NOISE_NOTE"]

#: the verdicts' level (docs/verdicts.md)
ALPHA = 0.05
#: what the example-level statistics of the paired-differences table are (and are not)
NOISE_NOTE = ("test-set noise only, not a verdict: the bootstrap intervals [in brackets] and the McNemar / "
              "Wilcoxon p-values are over test examples (images; tokens for language models) of these "
              "trained models; the verdicts over seeds are in the verdict table")

Runs = dict[str, dict[int, dict[str, Any]]]


# ----------------------------------------------------------------------------- reading

def read_settings(out: str | os.PathLike) -> dict[str, Any]:
    """A study folder's ``settings.json`` (FileNotFoundError naming it when there is none)."""
    out = Path(out)
    settings = read_json(out / "settings.json")
    if not isinstance(settings, dict):
        raise FileNotFoundError(f"no study in {out}: {out / 'settings.json'} is missing "
                                "(run the study first)")
    return settings


def load_runs(out: str | os.PathLike, settings: Mapping[str, Any],
              keep: Callable[[dict[str, Any]], dict[str, Any] | None]) -> Runs:
    """``{slug: {seed: results}}`` of every ``results/<slug>-s<seed>.json`` of the settings' variants
    (``results/<slug>.json`` as seed 0 for an existing model, ``source``), structured by
    :func:`~kpca_attention.tasks.classification.suites.structure_items`; ``keep(results)`` filters what a
    report reads, or drops the run (returns ``None``)."""
    out = Path(out)
    res: Runs = {}
    for v in settings["variants"]:
        if v.get("source"):  # an existing model, evaluated once (no training seed)
            f = out / "results" / f"{v['slug']}.json"
            r = keep(structure_items(ResultStore(f).items())) if f.exists() else None
            if r is not None:
                res.setdefault(v["slug"], {})[0] = r
            continue
        for f in sorted((out / "results").glob(f"{v['slug']}-s*.json")):
            seed_txt = f.stem[len(v["slug"]) + 2:]
            if not seed_txt.isdigit():
                continue
            r = keep(structure_items(ResultStore(f).items()))
            if r is not None:
                res.setdefault(v["slug"], {})[int(seed_txt)] = r
    return res


def _sections(out: str | os.PathLike) -> tuple[StudySections, Runs]:
    settings = read_settings(out)
    sec = task_of_settings(settings).sections(settings)
    return sec, sec.select(load_runs(out, sec.settings, sec.keep))


def reused_runs(out: str | os.PathLike) -> dict[str, list[str]]:
    """``{other study: [run names]}`` of the result files of the study folder ``out`` that refer to another
    study's instead of holding their items (``Study.reuse``; robustness.store's references)."""
    taken: dict[str, list[str]] = {}
    for f in sorted((Path(out) / "results").glob("*.json")):
        reuses = (read_json(f) or {}).get("reuses")
        if isinstance(reuses, dict):
            taken.setdefault(str(reuses.get("study")), []).append(f.stem)
    return taken


def machine_counts(results: Iterable[Mapping[str, Any]]) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """``(runs per machine kind, {kind: runs per torch CPU capability})`` over runs' results (their ``run``
    item's recorded machine; a run without one is not counted). Capabilities are counted within each kind:
    pooled, an Intel run's AVX512 would read as the AMD EPYC's."""
    kinds: Counter[str] = Counter()
    caps: dict[str, Counter[str]] = {}
    for r in results:
        if isinstance(r.get("run"), dict) and "machine" in r["run"]:
            m = r["run"]["machine"]
            kind = machine_kind(m)
            kinds[kind] += 1
            caps.setdefault(kind, Counter())[m.get("cpu_capability") or "not recorded"] += 1
    return kinds, caps


def _taken_runs(out: Path) -> list[str]:
    """A line per study whose runs this study's result files refer to instead of holding them."""
    return [f"Taken from the study `{other}` (the same model, training and suites: not trained again): "
            f"{', '.join(runs)}. Their files here refer to its result files (`../{other}/results/`) item by "
            "item, by SHA-256.\n" for other, runs in reused_runs(out).items()]


def load_study_results(out: str | os.PathLike) -> tuple[dict[str, Any], Runs]:
    """``(settings, {slug: {seed: results}})`` of a study folder as its report reads them: only the
    items the settings ask for, only runs evaluated on all of them (image studies list a run still in
    evaluation in ``settings["incomplete"]``; its finished items stay in its file and are reused)."""
    sec, res = _sections(out)
    return sec.settings, res


# ----------------------------------------------------------------------------- shared pieces

def regenerate_lines(settings: Mapping[str, Any], out: str | os.PathLike) -> list[str]:
    """The report's "Regenerate:" paragraph (empty when the settings record no command)."""
    if not settings.get("command"):
        return []
    return ["", f"Regenerate: `{settings['command']}` (finished runs are reused; "
            f"`kpca-attention report {out}` rewrites this report from the results)."]


def trace_rows(res: Runs, slugs: Sequence[str], label: Mapping[str, str]) -> list[dict[str, str]]:
    """The rows of the PAP-trace table: one per RPC layer of every traced run."""
    rows = []
    for s in slugs:
        for sd, r in sorted(res.get(s, {}).items()):
            tr = r.get("trace")
            if not tr:
                continue
            for name, layer in tr["layers"].items():
                q = layer["quantities"]
                rows.append({
                    "variant": label[s], "seed": str(sd), "layer": name.removeprefix("model."),
                    "S active": "yes" if layer["s_active"] else "no",
                    "max s_density": fmt_num(layer["s_density_max"]),
                    "s_density per iteration": ", ".join(fmt_num(x, 2) for x in q["s_density"]["mean"]),
                    "tau / max abs K (it 1)": fmt_num(layer["tau_over_kmax"]["mean"][0]),
                    "dual norm (last)": fmt_num(q["dual_norm"]["mean"][-1]),
                    "l_change (last)": fmt_num(q["l_change"]["mean"][-1]),
                })
    return rows


def plot_training_curves(res: Runs, slugs: Sequence[str], label: Mapping[str, str], metric: str, path: Path,
                         ylabel: str, scale: float = 100, log: bool = False) -> Path | None:
    """The held-out ``metric`` of every run's ``epochs.csv`` rows (kept in its ``run`` summary) against
    the epoch, one colour per variant; ``None`` when no run logged it."""
    fig, ax = new_figure(figsize=(6, 4))
    drawn = False
    for i, s in enumerate(slugs):
        for j, (_sd, r) in enumerate(sorted(res.get(s, {}).items())):
            ep = [e for e in r["run"].get("epochs", []) if metric in e]
            if ep:
                ax.plot([e["epoch"] + 1 for e in ep], [scale * e[metric] for e in ep], **series_style(i),
                        alpha=0.7, label=label[s] if j == 0 else None)
                drawn = True
    if not drawn:
        return None
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _checks(out: Path, label: Mapping[str, str], base: str, summary: dict[str, Any]) -> list[str]:
    """One section per study-wide check (``<out>/checks/<name>.json``)."""
    lines: list[str] = []
    for f in sorted((out / "checks").glob("*.json")):
        chk = read_json(f)
        if not isinstance(chk, dict):
            continue
        result = chk.get("result")
        lines += [f"## {chk.get('title', f.stem)}", ""]
        if isinstance(result, dict) and all(isinstance(v, (int, float)) for v in result.values()) and result:
            ref = result.get(base)
            crows = [{"variant": label.get(k, k), "value": f"{v:.1f}",
                      f"ratio to {label.get(base, base)}": f"{v / ref:.3f}" if ref else "-"}
                     for k, v in result.items()]
            lines += [markdown_table(crows, list(crows[0])), ""]
        elif isinstance(result, list) and result and all(isinstance(x, dict) for x in result):
            cols_c = [k for k in result[0] if not isinstance(result[0][k], (dict, list))]
            cols_c.sort(key=lambda k: k != "variant")  # the row's name first (the JSON's keys come sorted)
            fmt = {k: (lambda v: fmt_num(v, 3)) for k in cols_c if isinstance(result[0][k], float)}
            lines += [markdown_table(result, cols_c, formats=fmt), ""]
        summary.setdefault("checks", {})[f.stem] = result
    return lines


# ----------------------------------------------------------------------------- verdicts

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
                   also: Sequence[tuple[str, str, Sequence[str]]] = ()
                   ) -> tuple[Family, dict[tuple[str, ...], Verdict], dict[tuple[str, ...], list[int]]]:
    """The verdict of every ``(metric key, variant)`` against ``base`` on the seeds both have
    (:mod:`.verdicts`), and of every ``(metric key, variant, comparator)`` of the further comparisons
    ``also`` (``(comparator slug, its label, its variants)``): one Holm family over all of them; the
    margin of each is the variant's own, else the metric's (None: no equivalence). Returns ``(family,
    {key: verdict}, {key: paired seeds})``."""
    comps = [(base, base_label, list(variants))] + [(c, cl, list(vs)) for c, cl, vs in also]
    nm = len(metrics)
    parts = [f"{len(vs)} variant{'s' if len(vs) != 1 else ''} x {nm} metric{'s' if nm != 1 else ''} "
             f"against {cl}" for _c, cl, vs in comps]
    others = ", ".join(cl for _c, cl, _v in comps[1:])
    fam = Family(f"every seed-level paired t test of this study: {' and '.join(parts)} (variant - "
                 f"{'comparator' if also else 'baseline'} per seed; a test with fewer than 2 paired seeds "
                 "has no p-value and does not count)"
                 + (f"; the comparison of {base_label} with {others} is counted once, in the table against "
                    f"{base_label}" if also else ""))
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


def _cell(v: Verdict, interim: bool) -> str:
    """A compact table's cell; a decided word on fewer paired seeds than planned says it is interim (the
    row's "paired seeds" says how many of how many)."""
    word = word_with_note(v.word, "interim" if interim and v.word != INCONCLUSIVE else None)
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
    also = [(c, label[c], [s for s in sec.slugs if s not in (c, base)])
            for c in settings.get("also_against", []) if c in sec.res]
    paired: dict[str, list[str]] = {}  # single comparisons (variant, comparator), grouped by comparator
    for v, c in settings.get("pairs", []):
        if v in sec.res and c in sec.res:
            paired.setdefault(c, []).append(v)
    also += [(c, label[c], vs) for c, vs in paired.items()]
    fam, ver, seeds = study_verdicts(metrics, variants, base, label[base], margins, variant_margins=vmargins,
                                     also=also)
    sec.verdicts_ = {k: v for k, v in ver.items() if len(k) == 2}
    lines: list[str] = []
    summary["verdicts"] = {"alpha": ALPHA, "baseline": base, "family": fam.to_dict()}
    for comp, _cl, vs in [(base, label[base], variants), *also]:
        sub = {(k[0], k[1]): v for k, v in ver.items() if (len(k) == 2) == (comp == base)
               and (comp == base or k[2] == comp)}
        sseeds = {(k[0], k[1]): sd for k, sd in seeds.items() if (len(k) == 2) == (comp == base)
                  and (comp == base or k[2] == comp)}
        part, cells, plots = _comparison_lines(out, sec, comp, vs, metrics, fam, sub, sseeds, margins,
                                               vmargins, first=comp == base)
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
                      vmargins: Mapping[str, Any], *, first: bool
                      ) -> tuple[list[str], dict[str, Any], list[str]]:
    """One comparison's section: ``(lines, summary cells, forest plot names)``."""
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
                + "." if first else f" {label[sec.base]} against {label[comp]} is the mirror of the row of "
                f"{label[comp]} in the table against {label[sec.base]} (the same test, counted once)."
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
                row[m.key] = _cell(ver[(m.key, s)], len(seeds.get((m.key, s), ())) < planned[(m.key, s)])
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
            return "this variant's own" + (f", in its comparison with {label.get(c, c)}" if c else "")

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
                  "TOST against the margin (90 % interval); MDE: the difference the paired t test detects "
                  "with 80 % power at these seeds and this SD; seeds needed: for TOST to show equivalence "
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
            plots.append(forest_plot(prow, out / name, f"{label[s]} - {label[comp]} over {n} seeds"
                                     + (f" ({note})" if note else ""), main_unit))
    if plots:
        lines += ["Forest plots (one per comparison with >= 2 paired seeds; "
                  + (f"{', '.join(m.title for m in metrics if m.unit != main_unit)} in the table only; "
                     if any(m.unit != main_unit for m in metrics) else "")
                  + "thin line: 95 % interval, thick: 90 % TOST interval, grey band: the margin):", ""]
        lines += [f"![{p.stem}]({p.name})\n" for p in plots]
    cells = {s: {k: {"seeds": seeds[(k, s2)], "planned": planned[(k, s2)], **v.to_dict()}
                 for (k, s2), v in ver.items() if s2 == s} for s in variants}
    return lines, cells, [p.name for p in plots]


# ----------------------------------------------------------------------------- the report

def _machines_line(res: Runs, slugs: Sequence[str]) -> str:
    """Which kinds of machine trained the runs (one kind per study: other kinds take other floating-point
    paths, :func:`~kpca_attention.machine.machine_kind`)."""
    kinds, caps = machine_counts(r for s in slugs for r in res[s].values())
    if not kinds:
        return ""
    said = ", ".join(f"{k} ({n} run{'s' * (n > 1)})" for k, n in kinds.most_common())
    per_kind = []
    for kind, _ in kinds.most_common():
        counted = ", ".join(f"{c} ({n})" for c, n in caps[kind].most_common())
        per_kind.append(f"{kind}: {counted}" if len(kinds) > 1 else counted)
    recorded = {c for of_kind in caps.values() for c in of_kind}
    isa = ("" if recorded <= {"not recorded"} else
           " Vector instructions of torch's CPU kernels (hosts of one CPU model differ here, and so do their "
           "floating-point paths): " + "; ".join(per_kind) + ".")
    if len(kinds) == 1:
        return f"Trained on one kind of machine: {said}.{isa}"
    return (f"**Trained on {len(kinds)} kinds of machine**: {said} - the same seed takes other "
            f"floating-point paths on each, so the spread over seeds includes the machine.{isa}")


def write_study_report(out: str | os.PathLike) -> Path:
    """Write ``report.md``, ``summary.json`` and the plots of a study folder; returns the report."""
    out = Path(out)
    sec, res = _sections(out)
    if not res:
        raise FileNotFoundError(f"no finished runs under {out / 'results'}: run the study first")
    s_ = sec.settings
    variants = {v["slug"]: v for v in s_["variants"]}
    slugs = [s for s in variants if s in res]
    label = {s: v["label"] for s, v in variants.items()}  # every variant: the baseline may have no run yet
    base = s_["baseline"]
    sec.res, sec.slugs, sec.label, sec.base = res, slugs, label, base
    sec.prepare()
    met = sec.met
    keys = sec.keys_ = sec.keys()
    rng = np.random.default_rng(0)
    summary: dict[str, Any] = {"study": s_["name"], "baseline": base, "metrics": met, "paired": {},
                               **sec.summary_extra()}
    if sec.summary_means:
        summary["means"] = {}

    # --- header ----------------------------------------------------------------------------------
    recipe = ", ".join(f"{k}={v}" for k, v in s_["recipe"].items())
    any_run = next(iter(next(iter(res.values())).values()))["run"]
    lines = [f"# {s_['title']}", ""]
    if s_.get("description"):
        lines += [s_["description"], ""]
    trained = any(not variants[s].get("source") for s in slugs)
    if trained:
        lines += [f"Training: preset `{s_['preset']}` with {recipe}; seeds {s_['seeds']}{sec.training_note}. "
                  f"Parameters: {any_run['params'] / 1e6:.3f} M ({label[slugs[0]]}). "
                  + _machines_line(res, [s for s in slugs if not variants[s].get("source")]),
                  sec.evaluation()]
    else:  # existing models (a run directory, NAME@FILE): evaluated as they are
        lines += ["Models, evaluated as they are (not trained by this study): " + "; ".join(
            f"{label[s]} = `{variants[s]['source']['path']}` ({res[s][0]['run']['params'] / 1e6:.3f} M "
            f"parameters, weights sha256 {str(res[s][0]['run'].get('weights', ''))[:12]})" for s in slugs)
            + ".", sec.evaluation()]
    if s_.get("incomplete"):
        lines += ["", f"Still in evaluation, not shown: {', '.join(s_['incomplete'])} (their finished "
                  "items are kept and reused)."]
    lines += regenerate_lines(s_, out)
    lines.append("")

    # --- the main table ----------------------------------------------------------------------------
    rows = []
    for s in slugs:
        seeds = sorted(met[s])
        row: dict[str, Any] = {"variant": label[s], "seeds": ",".join(map(str, seeds))}
        for k in keys:
            row[k] = sec.cell([met[s][sd].get(k) for sd in seeds])
        row.update(sec.row_extras(s, seeds, summary))
        row["throughput"] = fmt_pm([res[s][sd]["run"].get(sec.throughput_key) for sd in seeds], scale=1,
                                   digits=0)
        row["train min"] = fmt_pm([res[s][sd]["run"].get("train_time_s", np.nan) / 60 for sd in seeds],
                                  scale=1)
        if sec.summary_means:
            summary["means"][s] = {k: float(np.mean([met[s][sd][k] for sd in seeds if k in met[s][sd]]))
                                   for k in keys if any(k in met[s][sd] for sd in seeds)}
        rows.append(row)
    cols = {"variant": "variant", "seeds": "seeds", **{k: sec.title(k) for k in keys},
            **sec.extra_columns(rows),
            **({"throughput": sec.throughput_title, "train min": "train min"} if trained else {})}
    lines += [sec.table_title, "", markdown_table(rows, cols), ""] + sec.table_notes(cols)

    # --- the leaderboard (when the study asks for one) and the verdicts over seeds ---------------------
    vlines = verdict_lines(out, sec, summary)
    lines += leaderboard_lines(out, sec, getattr(sec, "verdicts_", {}), summary) + vlines

    # --- paired differences ------------------------------------------------------------------------
    if base in res and len(slugs) > 1:
        lines += [f"## Paired differences against {label[base]}{sec.paired_unit}", "", sec.paired_note(), "",
                  f"Example-level columns: {NOISE_NOTE}.", ""]
        prow = []
        bseeds = sorted(res[base])
        if len(bseeds) >= 2:
            prow.append({"variant": f"{label[base]} s{bseeds[1]} - s{bseeds[0]}",
                         **sec.seed_noise(bseeds[0], bseeds[1], rng, summary)})
        for s in slugs:
            if s == base:
                continue
            cells = sec.paired(s, rng, summary)
            if cells is not None:
                prow.append({"variant": label[s], **cells})
        lines += [markdown_table(prow, {"variant": "variant", **{k: sec.title(k) for k in keys}}), ""]

    # --- the task's sections around the PAP trace ----------------------------------------------------
    lines += sec.sections_before_trace(out, summary)
    trows = trace_rows(res, slugs, label)
    if trows:
        from ..kpca.pap_trace import trace_statement

        summary["trace"] = trows
        lines += [sec.trace_heading, "", sec.trace_note, "", markdown_table(trows, list(trows[0])), ""]
        if sec.trace_statements:
            lines += [f"- {label[s]} seed {sd}: {trace_statement(r['trace'])}"
                      for s in slugs for sd, r in sorted(res[s].items()) if r.get("trace")] + [""]
    lines += sec.sections_after_trace(out, summary)
    lines += _checks(out, label, base, summary)

    # --- plots ---------------------------------------------------------------------------------------
    before, after = sec.plots(out, summary)
    metric, ylabel, scale, log = sec.curve
    curves = plot_training_curves(res, slugs, label, metric, out / "training_curves.png", ylabel,
                                  scale=scale, log=log)
    plots = before + ([curves] if curves is not None else []) + after
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})\n" for p in plots]
    lines += [sec.footer if trained else sec.footer.replace("<variant>-s<seed>.json", "<variant>.json"), ""]
    lines += _taken_runs(out)
    write_json_atomic(out / "summary.json", summary)
    return write_text_atomic(out / "report.md", "\n".join(lines))
