"""One engine for every study: train each (variant, seed), evaluate it through its task's suites
(:mod:`kpca_attention.tasks`) with per-example results, run the study-wide checks, write the report.

Files (``out`` is the study's results folder, small enough to commit; ``runs`` holds checkpoints)::

    <out>/settings.json              the study (Study.to_dict) this folder was made with
    <out>/results/<slug>-s<seed>.json  per-run ResultStore: training summary ("run"), clean, every
                                     corruption view and attack with per-example bits, PAP trace
    <out>/results/<slug>.json        the same for a variant that is an existing model (Variant.source:
                                     a run directory or NAME@FILE), evaluated once, never trained;
                                     "run" then describes the model (source, weights hash, parameters)
    <out>/checks/<name>.json         study-wide checks (throughput side by side, ...)
    <out>/summary.json, report.md, *.png      written by kpca_attention.report.study
    <runs>/<slug>-s<seed>/           training run directories (kpca_attention.train)
    <runs>/cache/                    corrupted test images, shared by every run

Every file the engine writes is named through :func:`~kpca_attention.io.output_path`: a ``results/``,
``checks/`` or ``settings.json`` in ``out`` that is a symbolic link leading out of ``out``, or a ``cache/``
in ``runs`` leading out of ``runs``, is refused (one line, before any work) rather than written through.
``runs`` itself may be anywhere (``--runs``, or ``<out>/runs`` linked to another disk), and so may a run
directory in it.

A study's declared margins (``Study.margins``) are fixed once its folder holds results: another value is
refused like other settings (``--force`` starts again); ``margins_note`` is kept.

Reuse across studies (``Study.reuse``): before a (variant, seed) is trained or evaluated, the results file
``<out>/../<other>/results/<slug>-s<seed>.json`` of another study named there is taken into this study's
results when it holds every item of the run with this study's key (the rule below), and the log says so:
this study's file becomes a reference to those items, by name and SHA-256 (``store.write_reference``),
not a copy - a study's folder stays small and one result is stored once.

Reuse, so a study can be continued on another machine from committed results: a run whose results
file holds every item with the same key (the training settings that change the weights, and the
evaluation parameters) is neither trained nor evaluated again - its checkpoint is not even needed.
Otherwise the run is trained when needed: a finished run with the same trajectory settings is reused,
a killed one is resumed exactly, one made with other settings is trained again (one line says why).
A run whose results file holds part of its items and that is trained here (its checkpoint gone) is
evaluated only if the new weights are bit for bit those the stored items were computed from (the SHA-256
in its ``run`` item, or its per-epoch log for results stored before; :func:`~.runs.check_retrained`) -
two trainings never share a row.
An existing model's items are keyed by the SHA-256 of its weights: a second call computes nothing, other
weights or parameters are computed anew.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..io import folder_lock, output_path, read_json, write_json_atomic
from ..machine import machine_info
from ..robustness.store import ResultStore, normalise_key, write_reference
from ..tasks import get as get_task
from ..train import load_model
from ..train.distributed import resolve_device
from ..train.rundir import RunDir, trajectory_settings
from .machines import check_machine_kind
from .runs import (
    check_retrained,
    delete_runs,
    ensure_trained,
    run_dir_of,
    training_summary,
)
from .schedule import RunsFailed, run_all
from .sources import LoadedSource
from .spec import Study, Variant

__all__ = ["run_study", "run_one", "run_state", "result_path", "cache_dir_of", "run_dir_of",
           "training_device", "RESULTS_VERSION"]

#: bump when the per-run results change meaning (older stored items are then recomputed)
RESULTS_VERSION = 3


def result_path(out: Path, variant: Variant, seed: int) -> Path:
    """``<out>/results/<slug>-s<seed>.json``; ``<slug>.json`` for an existing model (no seed).
    ``ValueError`` when it would lie outside ``out`` (``results`` a link leading out of it:
    :func:`~kpca_attention.io.output_path`)."""
    name = f"{variant.slug}.json" if variant.source is not None else f"{variant.slug}-s{seed}.json"
    return output_path(out, "results", name, what="the results file")


def cache_dir_of(runs: Path) -> Path:
    """``<runs>/cache``, the corrupted images shared by every run; ``ValueError`` when it would lie outside
    ``runs`` (a link leading out of it). ``runs`` may be anywhere (for ``robustness`` it is ``--out``)."""
    return output_path(runs, "cache", what="the corrupted-image cache")


def _say(prefix: str) -> Callable[[str], None]:
    def log(msg: str) -> None:
        print(f"[{prefix}] {msg}" if not msg.startswith("  ") else f"[{prefix}]{msg}", flush=True)

    return log


def _run_key(study: Study, variant: Variant, seed: int, runs: Path) -> dict[str, Any]:
    """What identifies a run's weights: the training settings that change the trajectory."""
    cfg = study.train_config(variant, seed, str(run_dir_of(runs, variant, seed)))
    return normalise_key({"train": trajectory_settings(cfg), "version": RESULTS_VERSION})


def run_one(study: Study, slug: str, seed: int, out: str | os.PathLike, runs: str | os.PathLike, *,
            progress: bool = True, threads: int | None = None, device: str | None = None,
            cache: bool = True, any_machine: bool = False, loader_workers: int | None = None) -> Path:
    """Train (when needed) and evaluate one (variant, seed) of ``study``; returns its results file.
    ``device``: where the run is evaluated (default: where its recipe trains it, the GPU when there is
    one - :func:`training_device`); an existing model (``variant.source``) is loaded there and evaluated
    only. ``cache``: keep expensive inputs (corrupted images) under ``<runs>/cache``; ``any_machine``: train
    here even if the study's finished runs were trained on another kind of machine; ``loader_workers``: the
    training loader's processes (None: the recipe's)."""
    if threads is not None:
        torch.set_num_threads(threads)
    out, runs = Path(out), Path(runs)
    variant = study.variant(slug)
    if variant.source is not None:
        return _evaluate_source(study, variant, out, runs, progress=progress,
                                device=device or str(resolve_device("auto")), cache=cache)
    log = _say(f"{slug} s{seed}")
    if study.reuse:
        _take_from_other_studies(study, variant, seed, out, runs, log)
    store = ResultStore(result_path(out, variant, seed))
    key = _run_key(study, variant, seed, runs)
    state: dict[str, Any] = {}

    def before_training() -> None:
        check_machine_kind(out, any_machine, run_dir_of(runs, variant, seed),
                           training_device(study, variant, seed, runs))
        state["trained"] = True  # here, now: items stored from an earlier training must be its weights

    def run_dir() -> Path:
        if "dir" not in state:
            state["first"] = store.get("run", key)  # the training the stored items were computed from
            state["dir"] = ensure_trained(study, variant, seed, runs, progress=progress, log=log,
                                          before_training=before_training, loader_workers=loader_workers)
        return state["dir"]

    def model() -> nn.Module:
        if "model" not in state:
            state["model"], _ = load_model(run_dir(), device=device or training_device(study, variant, seed,
                                                                                        runs))
            if state.get("trained") and state["first"] is not None:
                check_retrained(state["model"], state["first"], store.path, state["dir"])
        return state["model"]

    t0 = time.perf_counter()
    _evaluate_run(study, variant, seed, runs, store, key, run_dir, model, log=log, progress=progress)
    _done(store, t0, log)
    return store.path


def trace_key(study: Study, key: dict[str, Any]) -> dict[str, Any]:
    """The PAP trace's key: its batches are drawn with the suites' data seed (named when it is not 0, the
    value of every trace stored before it was)."""
    seed = getattr(study.suites, "data_seed", 0)
    return {**key, "n": study.trace, **({"data_seed": seed} if seed else {})}


def training_device(study: Study, variant: Variant, seed: int, runs: Path) -> str:
    """The device the recipe trains a run of ``study`` on (``TrainConfig.device``; "auto" is the GPU when
    there is one). A trained run is evaluated there too by default, so a study run on a GPU machine is
    evaluated on its GPU, and one on a CPU machine on its CPU."""
    cfg = study.train_config(variant, seed, str(run_dir_of(runs, variant, seed)))
    return str(resolve_device(cfg.device))


def _evaluate_run(study: Study, variant: Variant, seed: int, runs: Path, store: Any, key: dict[str, Any],
                  run_dir: Callable[[], Path], model: Callable[[], nn.Module], *,
                  log: Callable[[str], None], progress: bool) -> None:
    """Every item of one trained run: the training summary, the task's suites, the PAP trace."""
    task = study.task
    store.get_or_compute("run", key, lambda: training_summary(task, run_dir(), model()))
    cfg = study.train_config(variant, seed, str(run_dir_of(runs, variant, seed)))
    has_pap = task.has_pap(cfg)  # asked of the model (built untrained), not of its name
    # the task measures its suites (images, text, segmentation): see Study.suites
    task.evaluate_suites(study.suites, model, cfg, store, key, has_pap=has_pap, cache_dir=cache_dir_of(runs),
                         seed=seed, log=log, progress=progress)
    if study.trace and has_pap:
        from ..kpca.pap_trace import trace_model

        def trace() -> dict[str, Any]:
            return trace_model(model(), task.trace_batches(study.suites, cfg, study.trace))

        store.get_or_compute("trace", trace_key(study, key), trace)


class _Missing(Exception):
    """An item a store does not hold with the key asked for (raised by :class:`_Probe`)."""


class _Probe:
    """A read-only view of a :class:`ResultStore` that answers every item it holds with the same key and
    raises :class:`_Missing` for any other: running a run's evaluation against it tells, without
    computing or writing anything, whether the file holds everything this study would compute."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store
        self.path = store.path

    def get(self, item: str, key: dict[str, Any]) -> Any | None:
        return self.store.get(item, key)

    def put(self, item: str, key: dict[str, Any], result: Any) -> None:
        raise _Missing(item)  # a legacy item under an older key: the file is not complete as it is

    def get_or_compute(self, item: str, key: dict[str, Any], compute: Callable[[], Any]) -> tuple[Any, bool]:
        hit = self.store.get(item, key)
        if hit is None:
            raise _Missing(item)
        return hit, True


def _holds_everything(study: Study, variant: Variant, seed: int, runs: Path, path: Path) -> bool:
    """Whether the result file ``path`` holds every item of (variant, seed) of ``study`` with this study's
    key (the training settings that change the weights, and every evaluation parameter)."""
    if not path.is_file():
        return False

    def nothing() -> Any:
        raise _Missing("a model")  # an item would have to be computed

    try:
        probe = _Probe(ResultStore(path))
        _evaluate_run(study, variant, seed, runs, probe, _run_key(study, variant, seed, runs), nothing,
                      nothing, log=lambda _msg: None, progress=False)
    except _Missing:
        return False
    return True


def _nothing_to_train(study: Study, variant: Variant, seed: int, out: Path, runs: Path) -> bool:
    """Whether (variant, seed) needs no training: this study's result file holds every item, or one of
    the studies it reuses (``Study.reuse``) does (it will be referred to, not trained)."""
    paths = [result_path(out, variant, seed)]
    paths += [result_path(out.parent / other, variant, seed) for other in study.reuse]
    return any(_holds_everything(study, variant, seed, runs, p) for p in paths)


def run_state(study: Study, variant: Variant, seed: int, out: Path, runs: Path) -> str:
    """Where (variant, seed) of ``study`` stands: ``finished``, ``finished in <study>`` (a study it reuses
    holds every item), ``trained, N items stored`` (evaluating, or stopped during it), ``training
    (checkpoint NAME)``, ``N items stored, no checkpoint here`` or ``not started``."""
    path = result_path(out, variant, seed)
    if _holds_everything(study, variant, seed, runs, path):
        return "finished"
    for other in study.reuse:
        if _holds_everything(study, variant, seed, runs, result_path(out.parent / other, variant, seed)):
            return f"finished in {other}"
    stored = len(ResultStore(path).items()) if path.is_file() else 0
    rd = RunDir(run_dir_of(runs, variant, seed))
    if rd.finished():
        return f"trained, {stored} items stored"
    if rd.has_checkpoint():
        return f"training (checkpoint {(rd.latest() or {}).get('name', '?')})"
    return f"{stored} items stored, no checkpoint here" if stored else "not started"


def _take_from_other_studies(study: Study, variant: Variant, seed: int, out: Path, runs: Path,
                             log: Callable[[str], None]) -> None:
    """``Study.reuse``: refer to ``<out>/../<other>/results/<slug>-s<seed>.json`` from this study's results
    when it holds every item of this run with the same key and this study's own file does not already."""
    mine = result_path(out, variant, seed)
    if _holds_everything(study, variant, seed, runs, mine):
        return
    for other in study.reuse:
        theirs = result_path(out.parent / other, variant, seed)
        if theirs.resolve() == mine.resolve():
            continue
        if _holds_everything(study, variant, seed, runs, theirs):
            n = write_reference(mine, theirs)
            log(f"results of study {other!r} reused: {theirs} holds every item of this run with the same "
                f"key (model, training settings, suites); {mine} refers to its {n} items by hash")
            return
        if theirs.is_file():
            log(f"{theirs} not reused: some item is missing or was made with other settings")


def _done(store: ResultStore, t0: float, log: Callable[[str], None]) -> None:
    if store.computed:
        log(f"done in {time.perf_counter() - t0:.0f} s ({store.computed} item(s) computed, "
            f"{store.reused} reused)")
    else:
        log(f"results found: nothing to train or evaluate ({store.reused} item(s) reused)")


def _evaluate_source(study: Study, variant: Variant, out: Path, runs: Path, *, progress: bool, device: str,
                     cache: bool) -> Path:
    """Evaluate an existing model (``variant.source``) with the study's suites into
    ``<out>/results/<slug>.json``: nothing is trained; every item's key holds the weights' SHA-256."""
    assert variant.source is not None
    log = _say(variant.slug)
    src = LoadedSource(variant.source, device)
    cfg = src.config  # fails early on a missing checkpoint, an unknown model or a missing --dataset
    task = study.task
    if get_task(cfg.task) is not task:
        raise ValueError(f"{variant.label} ({variant.source.path}) is a {get_task(cfg.task).title} model; "
                         f"this study evaluates {task.title} ({task.name}) models")
    store = ResultStore(result_path(out, variant, 0))
    key = normalise_key({**src.key(), "version": RESULTS_VERSION})
    t0 = time.perf_counter()

    def about() -> dict[str, Any]:
        return {"source": variant.source.path, "weights": src.fingerprint,  # type: ignore[union-attr]
                "params": sum(p.numel() for p in src.load().parameters()), "machine": machine_info()}

    store.get_or_compute("run", key, about)
    has_pap = task.has_pap(cfg)
    task.evaluate_suites(study.suites, src.load, cfg, store, key, has_pap=has_pap,
                         cache_dir=cache_dir_of(runs) if cache else None, seed=None, log=log,
                         progress=progress)
    if study.trace and has_pap:
        from ..kpca.pap_trace import trace_model

        def trace() -> dict[str, Any]:
            return trace_model(src.load(), task.trace_batches(study.suites, cfg, study.trace))

        store.get_or_compute("trace", trace_key(study, key), trace)
    _done(store, t0, log)
    return store.path


def _worker(args: tuple[Study, str, int, str, str, dict[str, Any]]) -> str:
    """One run, from :func:`~.schedule.run_all` (a module-level function: worker processes pickle it)."""
    study, slug, seed, out, runs, options = args
    return str(run_one(study, slug, seed, out, runs, **options))


def _check_settings(study: Study, out: Path, force: bool, command: str | None = None) -> None:
    """Refuse to mix studies in one folder: ``settings.json`` must describe the same variants'
    models and the same recipe and evaluation (seeds may grow). Under a lock on the folder: two lanes
    starting together each keep the other's seeds (the planned seeds say whether a verdict is final)."""
    with folder_lock(out):
        _check_settings_locked(study, out, force, command)


def _check_settings_locked(study: Study, out: Path, force: bool, command: str | None) -> None:
    f = output_path(out, "settings.json", what="the settings file")
    saved = read_json(f)
    now = study.to_dict()
    if saved and not force and study.evaluate_only:
        # existing models: every item is keyed by the weights and the parameters, so other models or
        # suites may share the folder; the settings (and the report) are this call's
        if saved.get("name") != now["name"]:
            raise ValueError(f"{out} holds the results of study {saved.get('name')!r}: choose another --out "
                             "for these models")
    elif saved and not force:
        keys = ("preset", "recipe", "suites", "trace", "name")
        differ = [k for k in keys if saved.get(k) != now.get(k)]
        if differ:
            raise ValueError(f"{out} holds the results of study {saved.get('name')!r} with other settings "
                             f"({', '.join(differ)} differ): choose another --out, or --force to start again")
        old = {v["slug"]: v for v in saved.get("variants", [])}
        for v in now["variants"]:
            o = old.get(v["slug"])
            if o and (o["model"], o["kwargs"], o["recipe"]) != (v["model"], v["kwargs"], v["recipe"]):
                raise ValueError(f"{out}: variant {v['slug']} was run as another model; choose another --out")
        now["seeds"] = sorted(set(now["seeds"]) | set(saved.get("seeds", [])))
        known = {v["slug"] for v in now["variants"]}
        now["variants"] += [v for v in saved.get("variants", []) if v["slug"] not in known]
        _check_margins(saved, now, out)
    if saved and not force:
        for k in ("margins_note",):  # what was said of this folder's margins stays with them
            if k in saved and k not in now:
                now[k] = saved[k]
    if command or (saved or {}).get("command"):
        now["command"] = command or saved["command"]
    write_json_atomic(f, now)


def _margin_values(settings: dict[str, Any]) -> dict[str, Any]:
    """``{"metric" or "slug: metric": value}`` of the margins a settings dict declares (a variant's margin
    that belongs to one comparator: ``(value, comparator)``)."""
    out: dict[str, Any] = {k: float(m["value"]) for k, m in (settings.get("margins") or {}).items()}
    for slug, per in (settings.get("variant_margins") or {}).items():
        out.update({f"{slug}: {k}": float(m["value"]) if m.get("against") is None
                    else (float(m["value"]), m["against"]) for k, m in per.items()})
    return out


def _check_margins(saved: dict[str, Any], now: dict[str, Any], out: Path) -> None:
    """Margins are fixed before the runs: once a folder holds results, a declared margin may not change
    (added, removed or another value; a reworded source is taken) without ``--force``, except a margin
    of one variant that has no result file yet (``variant_margins``: still declared before that
    variant's runs). A folder whose settings predate margins (no ``margins`` entry) takes the
    definition's, and ``margins_note`` says that they were declared after results existed."""
    have = sorted((out / "results").glob("*.json")) if (out / "results").is_dir() else []
    if not have:
        return
    if "margins" not in saved:
        if _margin_values(now) and "margins_note" not in saved:
            day = time.strftime("%Y-%m-%d", time.gmtime())
            now["margins_note"] = (f"declared on {day}, after {len(have)} "
                                   "result file(s) of this folder existed (its settings.json had none): the "
                                   "values are the published effects of studies/margins.py, not chosen on "
                                   "these results")
        return
    old, new = _margin_values(saved), _margin_values(now)
    ran = {f.stem.rsplit("-s", 1)[0] for f in have}  # the variants with a result file
    # a margin of one variant only ("slug: metric") may still be declared or changed while that variant
    # has no result: it is then declared before its results, as a study's margins are
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)
                     and (": " not in k or k.split(": ", 1)[0] in ran))
    if changed:
        raise ValueError(f"{out}: the equivalence margins were declared before its results and may not "
                         f"change now ({', '.join(changed)} differ: "
                         + "; ".join(f"{k} {old.get(k, 'none')} -> {new.get(k, 'none')}" for k in changed)
                         + "); choose another --out, or --force to start again")


def run_study(
    study: Study,
    out: str | os.PathLike,
    runs: str | os.PathLike | None = None,
    *,
    jobs: int = 1,
    force: bool = False,
    progress: bool = True,
    only: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    report: bool = True,
    command: str | None = None,
    checks: bool = True,
    device: str | None = None,
    cache: bool = True,
    any_machine: bool = False,
    loader_workers: int | None = None,
    keep_going: bool = False,
) -> Path:
    """Run every (variant, seed) of ``study`` (``only``: these variant slugs; ``seeds``: these of the
    study's seeds), then the checks, then write the report; returns the report's path.

    Args:
        out: results folder (settings, per-run results, report).
        runs: training runs and the corruption cache (default ``<out>/runs``).
        jobs: runs in parallel processes, one thread each (two single-thread runs beat one
            two-thread run on small models); 1 runs in this process with its thread setting.
        force: delete earlier results and runs of this study first.
        command: the command line that regenerates the study (recorded in ``settings.json``).
        checks: run the study-wide checks (off: e.g. runs trained on a borrowed machine whose
            throughput should not be the study's; ``kpca-attention study NAME`` on the study's own
            machine runs them later, reusing every finished run).
        device: where the runs and existing models (``Variant.source``) are evaluated (default: where the
            recipe trains, the GPU when there is one: :func:`training_device`).
        cache: keep corrupted test images under ``<runs>/cache``.
        any_machine: train even where the study's finished runs were trained on another kind of machine
            (refused otherwise: :func:`check_machine_kind`).
        loader_workers: training-data loader processes per run in place of the recipe's (None: the
            recipe's; 0: in the run's process); the batches are the same with any number (each image's
            augmentation is seeded by its index), so finished runs stay valid. On a GPU the in-process loader
            is the limit (docs/benchmarks.md).
        keep_going: a run that fails does not stop the others; the call ends with
            :class:`~.schedule.RunsFailed` naming the failed runs, after the checks and the report (without
            it the first failure is raised once the runs already going have finished).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    if loader_workers is not None and (isinstance(loader_workers, bool) or not isinstance(loader_workers, int)
                                       or loader_workers < 0):
        raise ValueError(f"loader_workers must be None or an integer >= 0, got {loader_workers!r}")
    out = Path(out)
    runs = Path(runs) if runs is not None else out / "runs"
    todo = [(v, s) for v, s in study.runs()
            if (only is None or v.slug in only) and (seeds is None or s in seeds)
            and (v.source is None or s == study.seeds[0])]  # an existing model is evaluated once
    if seeds is not None and set(seeds) - set(study.seeds):
        raise ValueError(f"seeds {sorted(set(seeds) - set(study.seeds))} are not among the study's "
                         f"{list(study.seeds)}")
    if only is not None:
        unknown = set(only) - {v.slug for v in study.variants}
        if unknown:
            raise ValueError(f"unknown variant(s) {sorted(unknown)}; valid: "
                             f"{', '.join(v.slug for v in study.variants)}")
    # every file this call writes stays in its folder: a link leading out is refused before any work
    for v, s in todo:
        result_path(out, v, s)
    if cache or any(v.source is None for v, _ in todo):  # trained runs always use the cache
        cache_dir_of(runs)
    output_path(out, "settings.json", what="the settings file")
    if checks:
        output_path(out, "checks", what="the checks folder")
    if force:
        delete_runs([run_dir_of(runs, v, s) for v, s in todo])
        for v, s in todo:
            result_path(out, v, s).unlink(missing_ok=True)
        shutil.rmtree(out / "checks", ignore_errors=True)
    to_train = [(v, s) for v, s in todo if v.source is None and not RunDir(run_dir_of(runs, v, s)).finished()
                and not _nothing_to_train(study, v, s, out, runs)]
    if not any_machine and to_train:  # a run will train: refuse before settings.json changes, not midway
        check_machine_kind(out, device=training_device(study, *to_train[0], runs))
    out.mkdir(parents=True, exist_ok=True)
    _check_settings(study, out, force, command)
    print(f"[{study.name}] {len(todo)} run(s) of {len(study.variants)} variant(s) x seeds "
          f"{list(study.seeds)}; " + (f"results and runs in {out}" if Path(runs) == Path(out) else
                                       f"results in {out}, runs in {runs}")
          + (f", {jobs} in parallel" if jobs > 1 else ""), flush=True)
    # one thread each in parallel (the workers' processes), this process's setting for jobs=1; the report is
    # rewritten after each finished run (a long study's report stays current), except after the last one:
    # the final report below follows it at once
    options = dict(progress=progress and jobs == 1, threads=1 if jobs > 1 else None, device=device,
                   cache=cache, any_machine=any_machine, loader_workers=loader_workers)
    failed = run_all([f"{v.slug} s{s}" for v, s in todo],
                     [(study, v.slug, s, str(out), str(runs), options) for v, s in todo], _worker,
                     jobs=jobs, keep_going=keep_going,
                     after_each=lambda done: _report(out) if report and done < len(todo) else None)
    if checks:
        run_checks(study, out, runs)
    path = _report(out) if report else out / "report.md"
    if failed:  # keep_going: the others' results, checks and report are written; the failures end the call
        raise RunsFailed(failed, len(todo))
    return path


def run_checks(study: Study, out: Path, runs: Path) -> None:
    """The study-wide checks, each cached in ``<out>/checks/<name>.json`` under its key."""
    have = {(v.slug, s): run_dir_of(runs, v, s) for v, s in study.runs()
            if RunDir(run_dir_of(runs, v, s)).finished()}
    for check in study.checks:
        f = output_path(out, "checks", f"{check.name}.json", what="the checks file")
        key = normalise_key({**dict(check.key), "runs": sorted(f"{a}-s{b}" for a, b in have)})
        cached = read_json(f)
        if cached is not None and cached.get("key") == key:
            continue
        print(f"[{study.name}] {check.title}", flush=True)
        write_json_atomic(f, {"key": key, "title": check.title, "result": check.run(study, have)})


def _report(out: Path) -> Path:
    """Rewrite the report; a failure there must not stop a long study (the results are on disk)."""
    from ..report.study import write_study_report

    try:
        return write_study_report(out)
    except Exception as e:  # noqa: BLE001 - reported; `kpca-attention report` redoes it
        print(f"warning: report not written ({type(e).__name__}: {e}); the results are kept, "
              f"rerun `kpca-attention report {out}`", file=sys.stderr, flush=True)
        return out / "report.md"
