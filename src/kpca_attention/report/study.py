"""The report of a study (:mod:`kpca_attention.studies`), one writer for every task: tables, paired
statistics and plots from the per-run results in ``<out>/results/*.json``; writes ``report.md``,
``summary.json`` and PNG plots.

The writer lays out the frame every study report shares - the title and description, the training and
evaluation settings, the regenerate line, the main table (metrics, mean ± std over seeds, with training
throughput and time), the verdicts over seeds (:mod:`.verdict_sections`), the paired differences against the
baseline (the baseline against itself across seeds first: training noise), the PAP trace of the RPC layers,
the study-wide checks, the training curves and the plots - and asks the study's task
(:mod:`kpca_attention.tasks`, found from ``settings.json``) for its
:class:`~kpca_attention.tasks.base.StudySections`: the metrics, their titles and cells, the paired statistics
over examples, and the sections and plots only that task has.

Everything here is read from files, so ``kpca-attention report OUT`` rewrites a report without the
checkpoints, e.g. from results committed to a repository.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import check_slug
from ..io import read_json, write_json_atomic, write_text_atomic
from ..machine import machine_kind
from ..plotting import figures_not_saved, new_figure, save_figure, series_style
from ..robustness.store import ResultStore
from ..tables import fmt_num, fmt_pm, markdown_table
from ..tasks import for_settings as task_of_settings
from ..tasks.base import StudySections
from .board import leaderboard_lines
from .verdict_sections import NOISE_NOTE, verdict_lines

__all__ = ["read_settings", "reused_runs", "machine_counts", "load_runs", "result_files",
           "load_study_results", "write_study_report", "regenerate_lines",
           "plot_training_curves", "trace_rows"]

Runs = dict[str, dict[int, dict[str, Any]]]


# ----------------------------------------------------------------------------- reading

def read_settings(out: str | os.PathLike) -> dict[str, Any]:
    """A study folder's ``settings.json`` (FileNotFoundError naming it when there is none)."""
    out = Path(out)
    if out.is_file():
        raise ValueError(f"{out} is a file: give the study's folder (with settings.json and results/)")
    path = out / "settings.json"
    settings = read_json(path)
    if not isinstance(settings, dict):
        if not path.is_file():
            raise FileNotFoundError(f"no study in {out}: {path} is missing (run the study first)")
        raise ValueError(f"{path} is not a study's settings (unreadable, not JSON, or not a JSON object): "
                         "run the study again to rewrite it, or restore the file")
    variants = settings.get("variants")
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise ValueError(f"{out / 'settings.json'}: 'variants' must be a list of objects")
    for v in variants:  # slugs name files here: a downloaded folder's must not lead out of it
        check_slug(v.get("slug"), f"{out / 'settings.json'}: variant slug")
    return settings


def load_runs(out: str | os.PathLike, settings: Mapping[str, Any],
              keep: Callable[[dict[str, Any]], dict[str, Any] | None], *,
              structure: Callable[[Mapping[str, Any]], dict[str, Any]] = dict,
              unsealed: list[Path] | None = None) -> Runs:
    """``{slug: {seed: results}}`` of every ``results/<slug>-s<seed>.json`` of the settings' variants
    (``results/<slug>.json`` as seed 0 for an existing model, ``source``): the items of the run its ``run``
    item describes (:meth:`~kpca_attention.robustness.store.ResultStore.run_items`), structured by
    ``structure`` (the task's: :meth:`~kpca_attention.tasks.StudySections.structure`); ``keep(results)``
    filters what a report reads, or drops the run (returns ``None``). The legacy files read (not sealed: an
    edit of their items cannot be detected) are appended to ``unsealed``."""
    res: Runs = {}
    for v in settings["variants"]:
        for f, seed in result_files(out, v):
            store = _store_of(f, v, None if v.get("source") else seed)
            if unsealed is not None and not store.sealed:
                unsealed.append(f)
            r = keep(structure(store.run_items()))
            if r is not None:
                res.setdefault(v["slug"], {})[seed] = r
    return res


def result_files(out: str | os.PathLike, variant: Mapping[str, Any]) -> list[tuple[Path, int]]:
    """``[(result file, seed)]`` of a study variant (a ``settings.json`` entry) in the study folder ``out``:
    ``results/<slug>-s<seed>.json`` per finished seed, or ``results/<slug>.json`` as seed 0 for an existing
    model the study evaluated once (``source``)."""
    folder = Path(out) / "results"
    if variant.get("source"):
        f = folder / f"{variant['slug']}.json"
        return [(f, 0)] if f.exists() else []
    files = []
    for f in sorted(folder.glob(f"{variant['slug']}-s*.json")):
        seed_txt = f.stem[len(variant["slug"]) + 2:]
        if seed_txt.isdigit():
            files.append((f, int(seed_txt)))
    return files


def _store_of(path: Path, variant: Mapping[str, Any], seed: int | None) -> ResultStore:
    """The result file of ``variant`` (``seed``; None: an existing model), refused when its own run item
    says it holds another run: each file records what it was computed from (the training config's model,
    seed and the variant's keyword arguments; an existing model's path), and two files swapped or renamed
    passed every hash check and were reported under each other's names."""
    store = ResultStore(path)
    run = store.records().get("run")
    if run is None:
        return store  # not finished: nothing to report from it yet
    if seed is None:
        held = (run["result"] or {}).get("source") if isinstance(run["result"], dict) else None
        want = (variant.get("source") or {}).get("path")
        if held is not None and want is not None and str(held) != str(want):
            raise ValueError(f"{path}: holds the results of {held}, but settings.json gives this file to "
                             f"{variant['slug']} ({want}): result files swapped or renamed - restore them")
        return store
    train = run["key"].get("train") if isinstance(run["key"], dict) else None
    if not isinstance(train, dict):
        return store  # a legacy run item without the training config: nothing to compare
    kwargs = train.get("model_kwargs") or {}
    wanted = {"model": variant.get("model"), "seed": seed}
    differ = [f"{k} {train.get(k)!r} (settings: {w!r})" for k, w in wanted.items() if train.get(k) != w]
    differ += [f"model_kwargs.{k} {kwargs.get(k)!r} (settings: {w!r})"
               for k, w in (variant.get("kwargs") or {}).items()
               if json.dumps(kwargs.get(k), sort_keys=True) != json.dumps(w, sort_keys=True)]
    if differ:
        raise ValueError(f"{path}: its run was trained with {'; '.join(differ)}, not what settings.json says "
                         f"of {variant['slug']} seed {seed}: result files swapped or renamed - restore them")
    return store


def _sections(out: str | os.PathLike) -> tuple[StudySections, Runs]:
    """The task's report sections of the study folder ``out`` (``sec.unsealed``: its legacy result files)
    and the runs they report."""
    settings = read_settings(out)
    sec = task_of_settings(settings).sections(settings)
    return sec, sec.select(load_runs(out, sec.settings, sec.keep, structure=sec.structure,
                                     unsealed=sec.unsealed))


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

#: a command a report shows for copying: ``kpca-attention`` and plain words (no shell syntax: ``;``, ``|``,
#: ``$``, quotes, redirections), as the package records it
_PLAIN_COMMAND = re.compile(r"kpca-attention( [A-Za-z0-9_./,:=@+%-]+)+")


def regenerate_lines(settings: Mapping[str, Any], out: str | os.PathLike) -> list[str]:
    """The report's "Regenerate:" paragraph (empty when the settings record no command). A downloaded
    folder's ``settings.json`` is not trusted to put shell code in front of a reader: a command that is not a
    plain ``kpca-attention`` command line is named as such, not shown."""
    command = settings.get("command")
    if not command:
        return []
    if not (isinstance(command, str) and _PLAIN_COMMAND.fullmatch(command)):
        return ["", "Regenerate: the command recorded in settings.json is not a plain `kpca-attention` "
                "command line and is not shown; `kpca-attention report` rewrites this report from the "
                "results."]
    return ["", f"Regenerate: `{command}` (finished runs are reused; "
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
            fmt = {k: fmt_num for k in cols_c if isinstance(result[0][k], float)}
            lines += [markdown_table(result, cols_c, formats=fmt), ""]
        summary.setdefault("checks", {})[f.stem] = result
    return lines


# ----------------------------------------------------------------------------- the report

def _kind_letters(res: Runs, slugs: Sequence[str]) -> dict[str, str]:
    """``{machine kind: "A", ...}`` (most runs first) where the trained runs of ``slugs`` span several kinds;
    empty for one kind: the training-speed cells are then per kind (:func:`_per_kind`)."""
    kinds, _ = machine_counts(r for s in slugs for r in res[s].values())
    if len(kinds) < 2:
        return {}
    return {k: chr(ord("A") + i) for i, (k, _) in enumerate(kinds.most_common())}


def _per_kind(runs: Mapping[int, Mapping[str, Any]], seeds: Sequence[int], kinds: Mapping[str, str],
              value: Callable[[Mapping[str, Any]], float | None], digits: int) -> str:
    """``mean ± std`` of ``value(run item)`` over ``seeds``; per kind of machine (``A: ...; B: ...``) where
    ``kinds`` has several: the AMD EPYC trains the language study 3x faster than the Xeon, and one mean over
    both read as the seeds' spread."""
    if not kinds:
        return fmt_pm([value(runs[sd]["run"]) for sd in seeds], scale=1, digits=digits)
    by_kind: dict[str, list[float | None]] = {}
    for sd in seeds:
        run = runs[sd]["run"]
        kind = machine_kind(run["machine"]) if isinstance(run.get("machine"), dict) else None
        by_kind.setdefault(kinds.get(kind, "machine not recorded"), []).append(value(run))
    return "; ".join(f"{letter}: {fmt_pm(vals, scale=1, digits=digits)}"
                     for letter, vals in sorted(by_kind.items()))


#: the file of ``benchmarks/machine_replica.py`` in a study folder: one seed trained on two kinds of machine
MACHINE_REPLICA = "machine_replica.md"


def _machines_line(res: Runs, slugs: Sequence[str], out: Path) -> str:
    """Which kinds of machine trained the runs (one kind per study: other kinds take other floating-point
    paths, :func:`~kpca_attention.machine.machine_kind`), and where runs of two kinds are, the measurement
    of how far apart the kinds end for one seed if the folder holds one (:data:`MACHINE_REPLICA`)."""
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
    threads = Counter(r["run"]["machine"].get("torch_threads") for s in slugs for r in res[s].values()
                      if isinstance(r.get("run"), dict) and isinstance(r["run"].get("machine"), dict))
    threads.pop(None, None)  # runs recorded before the machine had its thread count
    mixed = ("" if len(threads) < 2 else
             " **Torch threads differ between runs**: " + ", ".join(
                 f"{t} ({n} run{'s' * (n > 1)})" for t, n in sorted(threads.items())) +
             " - other thread counts split reductions in another order: the spread over seeds includes them.")
    if len(kinds) == 1:
        return f"Trained on one kind of machine: {said}.{isa}{mixed}"
    replica = (f" How far apart the kinds end for the same seed, every recorded number side by side: "
               f"`{MACHINE_REPLICA}`." if (out / MACHINE_REPLICA).is_file() else "")
    return (f"**Trained on {len(kinds)} kinds of machine**: {said} - the same seed takes other "
            f"floating-point paths on each, so the spread over seeds includes the machine."
            f"{replica}{isa}{mixed}")


def write_study_report(out: str | os.PathLike, *, plots: bool = True) -> Path:
    """Write ``report.md``, ``summary.json`` and the plots of a study folder (``plots=False``: no PNG is
    rendered or written, the report and summary are the same); returns the report."""
    if not plots:
        with figures_not_saved():
            return write_study_report(out)
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
                  + _machines_line(res, [s for s in slugs if not variants[s].get("source")], out),
                  sec.evaluation()]
    else:  # existing models (a run directory, NAME@FILE): evaluated as they are
        lines += ["Models, evaluated as they are (not trained by this study): " + "; ".join(
            f"{label[s]} = `{variants[s]['source']['path']}` ({res[s][0]['run']['params'] / 1e6:.3f} M "
            f"parameters, weights sha256 {str(res[s][0]['run'].get('weights', ''))[:12]})" for s in slugs)
            + ".", sec.evaluation()]
    if s_.get("incomplete"):
        lines += ["", f"Still in evaluation, not shown: {', '.join(s_['incomplete'])} (their finished "
                  "items are kept and reused)."]
    if sec.unsealed:
        lines += ["", "Not sealed (legacy result files, written before items carried hashes: an edit of "
                  f"their items cannot be detected): {', '.join(f.name for f in sec.unsealed)}; "
                  f"`kpca-attention results seal {out}` verifies and seals them."]
    lines += regenerate_lines(s_, out)
    lines.append("")

    # --- the main table ----------------------------------------------------------------------------
    rows = []
    times = [r["run"].get("train_time_s") for s in slugs for r in res[s].values()]
    kinds = _kind_letters(res, [s for s in slugs if not variants[s].get("source")])
    # minutes, or seconds for a smoke run (a column of "0.0 +- 0.0" minutes says nothing)
    per_unit, unit = (60, "train min") if any(t is not None and t >= 60 for t in times) else (1, "train s")
    for s in slugs:
        seeds = sorted(met[s])
        row: dict[str, Any] = {"variant": label[s], "seeds": ",".join(map(str, seeds))}
        for k in keys:
            row[k] = sec.cell([met[s][sd].get(k) for sd in seeds])
        row.update(sec.row_extras(s, seeds, summary))
        row["throughput"] = _per_kind(res[s], seeds, kinds, lambda run: run.get(sec.throughput_key), 0)
        row["train min"] = _per_kind(res[s], seeds, kinds,
                                     lambda run: run.get("train_time_s", np.nan) / per_unit, 1)
        if sec.summary_means:
            summary["means"][s] = {k: float(np.mean([met[s][sd][k] for sd in seeds if k in met[s][sd]]))
                                   for k in keys if any(k in met[s][sd] for sd in seeds)}
        rows.append(row)
    cols = {"variant": "variant", "seeds": "seeds", **{k: sec.title(k) for k in keys},
            **sec.extra_columns(rows),
            **({"throughput": sec.throughput_title, "train min": unit} if trained else {})}
    lines += [sec.table_title, "", markdown_table(rows, cols), ""] + sec.table_notes(cols)
    if trained and len(kinds) > 1:
        lines += ["Training speed per kind of machine (" + ", ".join(f"{v}: {k}" for k, v in kinds.items()) +
                  "): a mean over kinds would mix machines, not seeds.", ""]
    if trained and len({tuple(sorted(met[s])) for s in slugs}) > 1:  # a difference of these means mixes seeds
        lines += ["The rows average over their own seeds (the seeds column), which differ between rows: "
                  "compare variants through the paired differences over the seeds both have (the verdict "
                  "tables), not by subtracting these means.", ""]

    # --- the leaderboard (when the study asks for one) and the verdicts over seeds ---------------------
    vlines = verdict_lines(out, sec, summary)
    lines += leaderboard_lines(out, sec, getattr(sec, "verdicts_", {}), summary) + vlines

    # --- paired differences ------------------------------------------------------------------------
    if base in res and len(slugs) > 1:
        bseeds = sorted(res[base])
        noise_row = (" The first row is the baseline against itself across seeds: the size of training noise."
                     if len(bseeds) >= 2 else "")
        lines += [f"## Paired differences against {label[base]}{sec.paired_unit}", "",
                  sec.paired_note() + noise_row, "", f"Example-level columns: {NOISE_NOTE}.", ""]
        prow = []
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
