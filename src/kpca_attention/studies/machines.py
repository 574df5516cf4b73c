"""Which kind of machine trained a study's runs (one kind per study:
:func:`~kpca_attention.machine.machine_kind` says why): what a run's checkpoints recorded, what the study's
finished runs were trained on, and the check before a run trains or resumes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..machine import machine_info, machine_kind, run_machine_info
from ..robustness.store import ResultStore
from ..train.checkpoint import training_machines

__all__ = ["trained_on", "check_machine_kind", "run_machine", "kind_here"]


def trained_on(out: Path) -> dict[str, list[str]]:
    """``{machine kind: [run, ...]}`` of the finished runs in a study's results folder (``out``), runs taken
    from another study (references) included."""
    kinds: dict[str, list[str]] = {}
    for path in sorted((out / "results").glob("*-s*.json")):
        if not re.fullmatch(r".+-s\d+", path.stem):
            continue  # an existing model's file (<slug>.json) whose slug holds "-s"
        try:
            machine = ResultStore(path).items()["run"]["machine"]
        except (KeyError, TypeError):
            continue  # not finished, or an existing model (no training)
        kinds.setdefault(machine_kind(machine), []).append(path.stem)
    return kinds


def kind_here(device: str | None = None) -> str:
    """This machine's kind for a run on ``device`` ("cpu", "cuda", "cuda:0"; None: the GPU where there is
    one): a run pinned to the CPU of a GPU host is of its CPU's kind, as its checkpoints record it."""
    if device is None:
        return machine_kind()
    return machine_kind(run_machine_info(device))


def check_machine_kind(out: Path, any_machine: bool = False, run_dir: Path | None = None,
                       device: str | None = None) -> None:
    """Refuse to train a study's run on another kind of machine than its finished runs' (one kind per
    study: :func:`~kpca_attention.machine.machine_kind` says why), or to resume ``run_dir`` on another kind
    than the one that trained it so far, unless ``any_machine``. ``device``: where the run trains."""
    here = kind_here(device)
    before = training_machines(run_dir) if run_dir is not None else []
    if before and machine_kind(before[-1]) != here and not any_machine:
        raise ValueError(f"{run_dir} was trained so far on {machine_kind(before[-1])}, this machine is "
                         f"{here}: resume it there (one kind of machine per run), or pass --any-machine")
    others = {k: v for k, v in trained_on(out).items() if k != here}
    if others and not any_machine:
        where = "; ".join(f"{k} ({len(v)} run{'s' * (len(v) > 1)})" for k, v in others.items())
        raise ValueError(f"{out}: its runs were trained on {where}, this machine is {here}; a study trains "
                         "on one kind of machine (other floating-point paths): train it there, or measure "
                         "how far the two kinds end for one seed (benchmarks/machine_replica.py) and pass "
                         "--any-machine to mix them")


def run_machine(run_dir: Path) -> dict[str, Any]:
    """The run item's ``machine``: the machine its checkpoints say trained it (``machines`` too when it was
    resumed on another kind); this one for checkpoints written before they recorded it."""
    machines = training_machines(run_dir)
    if not machines:
        return {"machine": machine_info()}
    return {"machine": machines[0], **({"machines": machines} if len(machines) > 1 else {})}
