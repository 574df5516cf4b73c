"""A study's run folders: where a (variant, seed) is trained (:func:`run_dir_of`), training, resuming or
reusing it (:func:`ensure_trained`), what its results record of the training (:func:`training_summary`,
with the weights' SHA-256), the check that a run trained again - its checkpoint gone, its results kept -
has those weights bit for bit (:func:`check_retrained`), and ``--force``'s deletion (:func:`delete_runs`).
The engine (:mod:`.engine`) evaluates what these train."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..modules import weights_sha256
from ..tasks import Task
from ..train import CheckpointError, load_model, train
from ..train.rundir import RunDir
from .machines import run_machine
from .spec import Study, Variant

__all__ = ["run_dir_of", "ensure_trained", "training_summary", "check_retrained", "delete_runs",
           "unreadable_run_error"]


def run_dir_of(runs: Path, variant: Variant, seed: int) -> Path:
    return Path(runs) / f"{variant.slug}-s{seed}"


def delete_runs(paths: list[Path]) -> None:
    """``--force``: delete run folders under their locks, all taken first, so a run another process is
    training is refused (:class:`~kpca_attention.train.rundir.RunDirBusy`, naming its pid) before anything
    is deleted. A folder is renamed away under its lock and then removed (a writer arriving meanwhile starts a
    new folder, never one half deleted); a folder that is a link (a run kept on another disk) keeps its link
    and loses its contents."""
    existing = [p for p in paths if p.is_dir()]
    with contextlib.ExitStack() as locks:
        for p in existing:
            locks.enter_context(RunDir(p).lock())
        for p in existing:
            if p.is_symlink():
                for child in p.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            else:
                gone = p.with_name(f".{p.name}.deleted-{os.getpid()}")
                p.rename(gone)
                shutil.rmtree(gone)


def unreadable_run_error(run_dir: Path, err: Exception) -> ValueError:
    """The error for a run whose checkpoint the engine cannot read: its stored results were computed from
    those weights under the same key, so training again in their place would mix two trainings in one
    row - it is left to the user (the checkpoint module never falls back to a fresh start either)."""
    return ValueError(f"the checkpoint in {run_dir} does not load ({err}); the study's results of this run "
                      "were computed from it: repair it, or move the run folder and its result file aside "
                      "to train it again")


def ensure_trained(study: Study, variant: Variant, seed: int, runs: Path, *, progress: bool,
                   log: Callable[[str], None], before_training: Callable[[], None] | None = None,
                   loader_workers: int | None = None) -> Path:
    """Train, resume or reuse the run of (variant, seed); returns its run directory. ``before_training``
    is called before a run is trained or resumed (not when a finished one is reused); ``loader_workers``:
    the training loader's processes in place of the recipe's (the batches are the same with any number)."""
    run_dir = run_dir_of(runs, variant, seed)
    cfg = study.train_config(variant, seed, str(run_dir))
    cfg.progress = progress
    if loader_workers is not None:
        cfg.num_workers = loader_workers
    rd = RunDir(run_dir)
    if rd.has_checkpoint():
        try:
            changed = rd.changed_fields(cfg)
        except (CheckpointError, FileNotFoundError) as e:
            raise unreadable_run_error(run_dir, e) from e
        if changed:  # another run's weights (its items have another key: each is computed again)
            log(f"{run_dir} was trained with other settings ({', '.join(sorted(changed))} differ): "
                "training again")
            shutil.rmtree(run_dir)
        elif rd.finished():
            try:
                load_model(run_dir)
            except CheckpointError as e:
                raise unreadable_run_error(run_dir, e) from e
            log(f"finished checkpoint in {run_dir}: not retrained")
            return run_dir
    if before_training is not None:
        before_training()
    resume = rd.has_checkpoint()
    log(f"{'resuming' if resume else 'training'} {cfg.model} {dict(cfg.model_kwargs) or ''} "
        f"({cfg.epochs} epochs, {cfg.train_subset or 'all'} {study.task.unit}, seed {seed}, "
        f"{torch.get_num_threads()} thread(s))")
    train(cfg, resume=resume)
    return run_dir


def training_summary(task: Task, run_dir: Path, model: nn.Module) -> dict[str, Any]:
    """What a study's results record of a run's training (its ``run`` item): time, throughput, steps, the
    per-epoch log, the parameter count, the machine, and the SHA-256 of the weights every item of the run
    was computed from (:func:`check_retrained`)."""
    rows = _epoch_rows(run_dir)
    t = sum(r["epoch_time_s"] for r in rows)
    unit = task.throughput_key  # images/s, tokens/s
    done = sum(r.get(unit, 0.0) * r["epoch_time_s"] for r in rows)
    return {
        "train_time_s": t, unit: done / max(t, 1e-9), "steps": rows[-1]["step"],
        "final_train_loss": rows[-1]["train_loss"], "epochs": rows,
        "params": sum(p.numel() for p in model.parameters()),
        "weights_sha256": weights_sha256(model),
        **run_machine(run_dir),
    }


def _epoch_rows(run_dir: Path) -> list[dict[str, Any]]:
    from ..train.logger import read_csv

    rows = read_csv(run_dir / "epochs.csv")
    return [{k: v for k, v in r.items() if isinstance(v, (int, float))} for r in rows]


def _trajectory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-epoch numbers training determines (losses, metrics, steps, learning rate), not its clock."""
    return [{k: v for k, v in r.items() if "time" not in k and "per_s" not in k} for r in rows]


def check_retrained(model: nn.Module, summary: dict[str, Any], results: Path, run_dir: Path) -> None:
    """A run was trained here while its results file already holds items computed from an earlier training
    of it (its checkpoint was gone): go on only when the new weights are those, bit for bit - training is
    deterministic on one kind of machine - else two trainings would share one row. The weights' SHA-256
    in ``summary`` (the ``run`` item) decides; results stored before it was recorded are judged by the
    per-epoch log instead: every loss and metric of every epoch equal to the bit."""
    stored = summary.get("weights_sha256")
    if stored is not None:
        if stored == weights_sha256(model):
            return
        why = "its weights differ from the ones the stored results were computed from"
    else:
        if _trajectory(_epoch_rows(run_dir)) == _trajectory(summary.get("epochs") or []):
            return
        why = ("its per-epoch losses and metrics differ from those recorded with the stored results (which "
               "predate weight fingerprints)")
    raise ValueError(f"{run_dir} was trained again (its checkpoint was gone) and {why}: restore the original "
                     f"run folder, or move {results} aside to evaluate the new training from scratch")
