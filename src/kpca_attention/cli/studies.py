"""``kpca-attention demo``, ``study``, ``ablate`` and ``report``: studies run by the one engine."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..checks import Int, check_count, check_parameters
from ..io import check_output
from . import parse_ints, parse_list, set_threads

__all__ = ["demo_cmd", "study_cmd", "ablate_cmd", "report_cmd", "regenerate_command"]


def _passive_openmp(command: str) -> None:
    """libgomp threads spin while waiting; on a shared, busy CPU that makes small-model training many
    times slower. Passive waiting must be set before OpenMP starts, so re-run this command with it."""
    if "OMP_WAIT_POLICY" not in os.environ and command in sys.argv[1:3]:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "kpca_attention.cli", *sys.argv[1:]])


#: the budget options of demo and ablate (0 where the help says it means "none" or "all")
DEMO_OPTIONS = {"epochs": Int(min=1, allow_none=True), "train_subset": Int(min=1, allow_none=True),
                "corrupt_images": Int(min=1, allow_none=True), "attack_images": Int(min=0, allow_none=True),
                "jobs": Int(min=1)}
ABLATE_OPTIONS = {"epochs": Int(min=1), "train_subset": Int(min=0), "clean_images": Int(min=0),
                  "corrupt_images": Int(min=1), "attack_images": Int(min=1), "jobs": Int(min=1),
                  "threads": Int(min=1)}
#: counts of training images (the others count test images)
_TRAIN_COUNTS = ("train_subset",)


def check_study_counts(study: Any, counts: dict[str, int | None]) -> None:
    """Image counts bounded by the study's dataset, before any work: ``train_subset`` by the training
    images left after the validation split, the others by the test split (0 or None: all / none)."""
    if not any(counts.values()):
        return
    trained = next(v for v in study.variants if v.source is None)
    cfg = study.train_config(trained, study.seeds[0], "runs/check")
    task = study.task
    n_test = len(task.test_set(cfg))
    n_train = len(task.builder(cfg)("train", False, None)) - (cfg.val_size or 0)
    for key, value in counts.items():
        if not value:
            continue
        if key in _TRAIN_COUNTS:
            check_count(value, f"--{key.replace('_', '-')}", n_train,
                        f"the training images of {cfg.dataset} less the {cfg.val_size or 0} held out")
        else:
            check_count(value, f"--{key.replace('_', '-')}", n_test, f"the test images of {cfg.dataset}")


def _seeds(text: str) -> tuple[int, ...]:
    """``--seeds``: at least one integer >= 0."""
    seeds = parse_ints(text, "--seeds")
    if not seeds:
        raise ValueError(f"--seeds: give at least one seed, comma-separated integers such as 0,1,2; got {text!r}")
    for s in seeds:
        Int(min=0)(s, "--seeds")
    return seeds


#: options that do not change a study's results: left out of the recorded command (value count)
_NO_EFFECT = {"--runs": 1, "--threads": 1, "--loader-workers": 1, "--progress": 0, "--no-progress": 0,
              "--force": 0, "--no-force": 0, "--checks": 0, "--no-checks": 0, "--keep-going": 0,
              "--no-keep-going": 0}


def regenerate_command(argv: list[str], out: Path) -> str:
    """The command a report names to regenerate ``out``: ``argv`` without options that do not change
    results (``--runs``, ``--threads``, progress, ``--force``), and ``--out`` relative to the repository
    holding it (so a study run from another checkout still names ``results/NAME``)."""
    keep: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        key, has_value = a.split("=", 1)[0], "=" in a
        if key in _NO_EFFECT or key in ("--out", "-o"):
            i += 1 + (0 if has_value else _NO_EFFECT.get(key, 1))
            continue
        keep.append(a)
        i += 1
    shown = out
    resolved = out.resolve()
    for parent in resolved.parents:
        if (parent / ".git").exists():
            shown = resolved.relative_to(parent)
            break
    lead = 0
    while lead < len(keep) and not keep[lead].startswith("-"):
        lead += 1
    keep[lead:lead] = ["--out", str(shown)]
    return "kpca-attention " + " ".join(shlex.quote(a) for a in keep)


def _run(study: Any, out: Path, runs: Path | None, jobs: int, force: bool, progress: bool,
         only: tuple[str, ...] | None = None, seeds: tuple[int, ...] | None = None,
         record: bool = True, checks: bool = True, any_machine: bool = False,
         loader_workers: int | None = None, keep_going: bool = False) -> None:
    from ..studies import RunsFailed, run_study

    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not a folder")
    # the command that regenerates the whole study (a run restricted to some variants is not one)
    command = regenerate_command(sys.argv[1:], out) if record else None
    try:
        report = run_study(study, out, runs, jobs=jobs, force=force, progress=progress, only=only,
                           seeds=seeds, command=command, checks=checks, any_machine=any_machine,
                           loader_workers=loader_workers, keep_going=keep_going)
    except RunsFailed as e:  # --keep-going: each failure was reported as it happened; the report is written
        typer.echo(str(out / "report.md"))
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(str(report))


def _status(study: Any, out: Path, runs: Path, only: list[str] | None, seeds: tuple[int, ...] | None) -> None:
    """``study NAME --status``: one line per (variant, seed) of the study (``--variants`` / ``--seeds``
    narrow it), then the kinds of machine its finished runs were trained on and this one's."""
    from ..studies.engine import run_state, training_device
    from ..studies.machines import kind_here, trained_on

    for slug in only or ():
        study.variant(slug)  # an unknown slug: one line naming the valid ones
    rows = [(v.label, str(seed), run_state(study, v, seed, out, runs)) for v, seed in study.runs()
            if (only is None or v.slug in only) and (seeds is None or seed in seeds)]
    width = [max(len(r[i]) for r in rows + [("variant", "seed", "")]) for i in range(2)]
    typer.echo(f"{study.name}: {out} (runs in {runs})")
    for label, seed, state in [("variant", "seed", "state"), *rows]:
        typer.echo(f"  {label:<{width[0]}}  {seed:>{width[1]}}  {state}")
    done = sum(r[2].startswith("finished") for r in rows)
    kinds = "; ".join(f"{k} ({len(v)})" for k, v in trained_on(out).items()) if out.is_dir() else ""
    first = next(iter(study.runs()), None)
    here = kind_here(training_device(study, *first, runs) if first and first[0].source is None else None)
    typer.echo(f"{done} of {len(rows)} finished. Trained on: {kinds or 'nothing yet'}; this machine: {here}.")


def demo_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the runs, results, plots and report.")] = Path(
        "runs/demo"),
    epochs: Annotated[int | None, typer.Option(help="Training epochs per model (default 3).")] = None,
    train_subset: Annotated[int | None, typer.Option(
        help="Train on this many images (default: all 58000; 2000 are held out for validation).")] = None,
    corrupt_images: Annotated[int | None, typer.Option(help="Test images per corruption (default 500).")] = None,
    attack_images: Annotated[int | None, typer.Option(
        help="Test images attacked (default 200; 0: no attacks).")] = None,
    quick: Annotated[bool, typer.Option(help="A one-minute smoke run on tiny subsets.")] = False,
    jobs: Annotated[int, typer.Option(help="Models trained in parallel, one thread each.")] = 2,
    force: Annotated[bool, typer.Option(help="Retrain and re-evaluate even if results exist.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars (only shown on a terminal).")] = True,
) -> None:
    """Train SymViT and RPC-SymViT on Fashion-MNIST (CPU), evaluate clean / corrupted / attacked
    accuracy, write OUT/report.md with tables and plots (its path is printed last)."""
    from ..studies import demo_study, quick_demo_study

    given = {k: v for k, v in dict(epochs=epochs, train_subset=train_subset, corrupt_images=corrupt_images,
                                   attack_images=attack_images).items() if v is not None}
    if quick and given:
        raise ValueError(f"--quick sets its own budget; drop {', '.join('--' + k.replace('_', '-') for k in given)}")
    check_parameters({**given, "jobs": jobs}, DEMO_OPTIONS, cli=True)
    _passive_openmp("demo")
    study = quick_demo_study() if quick else demo_study(**given)
    check_study_counts(study, {k: v for k, v in given.items() if k != "epochs"})
    _run(study, out, out / "runs", jobs, force, progress)


def study_cmd(
    name: Annotated[str, typer.Argument(
        help="Study to run: demo | ablations | vision | vision-large | rpc-seeds | rpc-depth12 | zoo | rpc-fan | "
             "zoo-large | zoo-language | language | segmentation (kpca_attention.studies.STUDIES).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Results folder (default results/NAME).")] = None,
    runs: Annotated[Path | None, typer.Option(
        help="Folder for training runs and caches (default runs/studies/NAME).")] = None,
    seeds: Annotated[str | None, typer.Option(help="Comma-separated training seeds (default: the study's).")] = None,
    variants: Annotated[str | None, typer.Option(help="Comma-separated variant slugs to run (default all).")] = None,
    jobs: Annotated[int, typer.Option(help="Runs in parallel, one thread each.")] = 1,
    threads: Annotated[int | None, typer.Option(help="torch threads with --jobs 1.")] = None,
    loader_workers: Annotated[int | None, typer.Option(
        help="Training-data loader processes per run (default: the recipe's; 0: in the run's process). The "
             "batches stay the same; on a GPU the loader is the limit (docs/benchmarks.md).")] = None,
    force: Annotated[bool, typer.Option(help="Delete this study's results and runs first.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars (only shown on a terminal).")] = True,
    checks: Annotated[bool, typer.Option(
        help="Run the study-wide checks (throughput side by side) on this machine.")] = True,
    any_machine: Annotated[bool, typer.Option(
        help="Train here even if the study's finished runs were trained on another kind of machine "
             "(CPU model or GPU; refused by default: other floating-point paths).")] = False,
    keep_going: Annotated[bool, typer.Option(
        help="A run that fails does not stop the study: the other runs go on, and the study ends with the "
             "list of failed runs (exit code 1); runs stopped by a worker process dying beside them run "
             "again alone. Default: the first failure stops it.")] = False,
    status: Annotated[bool, typer.Option(
        help="Only say where each (variant, seed) stands - finished, evaluating, training (its "
             "checkpoint), not started - and which machines trained it; run nothing.")] = False,
) -> None:
    """Run a registered study: train every (variant, seed), evaluate, write OUT/report.md. Finished runs
    and evaluations (also committed ones) are reused; killed runs resume exactly."""
    from ..studies import STUDIES, get_study

    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; valid: {', '.join(STUDIES)}")
    set_threads(threads)
    Int(min=1)(jobs, "--jobs")
    Int(min=0, allow_none=True)(loader_workers, "--loader-workers")
    _passive_openmp("study")
    check_output(out, "--out", folder=True)
    check_output(runs, "--runs", folder=True)
    study = get_study(name)
    chosen = None
    whole = True  # the run covers the whole study: its command regenerates the results
    if seeds is not None:
        # These seeds of the same study: its definition (which variants run on the first seed only,
        # which attacks run on the first seed) stays as it is; new seeds are added to it.
        chosen = _seeds(seeds)
        whole = set(chosen) >= set(study.seeds)
        study = study.replace(seeds=tuple(sorted(set(study.seeds) | set(chosen))))
    only = parse_list(variants, "--variants") or None
    if status:
        given = [opt for opt, on in (("--force", force), ("--any-machine", any_machine),
                                     ("--keep-going", keep_going)) if on]
        if given:  # --status runs nothing: an option that would change a run is a mistake, not a no-op
            raise ValueError(f"--status only reports and runs nothing: {', '.join(given)} would do nothing "
                             "with it; leave it out")
        _status(study, out or Path("results") / name, runs or Path("runs/studies") / name, only, chosen)
        return
    _run(study, out or Path("results") / name, runs or Path("runs/studies") / name, jobs, force, progress,
         only=only, seeds=chosen, record=only is None and whole, checks=checks, any_machine=any_machine,
         loader_workers=loader_workers, keep_going=keep_going)


def ablate_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for runs, results and report.md.")] = Path(
        "runs/ablations"),
    seeds: Annotated[str, typer.Option(help="Comma-separated training seeds.")] = "0,1",
    variants: Annotated[str | None, typer.Option(
        help="Comma-separated subset of the variants (SymViT is always included).")] = None,
    epochs: Annotated[int, typer.Option(help="Training epochs per run.")] = 2,
    train_subset: Annotated[int, typer.Option(
        help="Training images (0: all 59000; 1000 are held out for validation).")] = 15000,
    clean_images: Annotated[int, typer.Option(help="Clean test images (0: all 10000).")] = 0,
    corrupt_images: Annotated[int, typer.Option(help="Test images per corruption and severity.")] = 300,
    attack_images: Annotated[int, typer.Option(help="Test images attacked.")] = 400,
    quick: Annotated[bool, typer.Option(help="A minute-scale smoke run on tiny subsets.")] = False,
    jobs: Annotated[int, typer.Option(help="Runs in parallel, one thread each.")] = 1,
    threads: Annotated[int, typer.Option(help="torch threads with --jobs 1 (1 is fastest on a shared CPU).")] = 1,
    force: Annotated[bool, typer.Option(help="Retrain and re-evaluate everything.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars (only shown on a terminal).")] = True,
) -> None:
    """Ablations of RPC-Attention on Fashion-MNIST (SymViT, official RPC, the paper's threshold with a
    lambda sweep, S forced to zero, no dual update) over seeds: clean / corrupted / FGSM / PGD accuracy,
    throughput, PAP trace, paired tests. Resumable; writes OUT/report.md."""
    from ..studies import ablation_study

    counts = dict(train_subset=train_subset, clean_images=clean_images, corrupt_images=corrupt_images,
                  attack_images=attack_images)
    check_parameters({**counts, "epochs": epochs, "jobs": jobs, "threads": threads}, ABLATE_OPTIONS, cli=True)
    chosen = _seeds(seeds)
    fixed = {"epochs": (epochs, 2), "corrupt_images": (corrupt_images, 300),
             "attack_images": (attack_images, 400)}  # what --quick sets itself
    if quick and (given := [k for k, (v, default) in fixed.items() if v != default]):
        drop = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"--quick sets its own budget; drop {drop}")
    set_threads(threads)
    _passive_openmp("ablate")
    study = ablation_study(seeds=chosen, variants=parse_list(variants, "--variants") or None,
                           epochs=epochs, train_subset=train_subset or None, clean_images=clean_images or None,
                           corrupt_images=corrupt_images, attack_images=attack_images, quick=quick)
    check_study_counts(study, counts if not quick else {"train_subset": train_subset})
    _run(study, out, out / "runs", jobs, force, progress)


def report_cmd(
    out: Annotated[Path, typer.Argument(help="A study's results folder (holding settings.json).")],
) -> None:
    """Rewrite a study's report.md, summary.json and plots from its results (no checkpoints needed)."""
    from ..report.study import write_study_report

    typer.echo(str(write_study_report(out)))
