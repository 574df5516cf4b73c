"""The study's scheduler (studies/schedule.py): the first failure stops a study, unless --keep-going, which
runs every other run, reports each failure as it happens and ends with the list (exit code 1)."""
from __future__ import annotations

import dataclasses
import math
import os
import time

import pytest
import torch
from typer.testing import CliRunner

import kpca_attention.studies as studies
from kpca_attention.cli import app
from kpca_attention.studies import RunsFailed, ablation_study, run_study
from kpca_attention.studies.schedule import run_all
from kpca_attention.tasks.classification.suites import ImageSuites


@pytest.mark.parametrize("jobs", [1, 2])
def test_keep_going_runs_every_other_call_and_returns_the_failures(jobs, capsys) -> None:
    ended: list[int] = []
    # math.sqrt: picklable for the worker processes; -1 fails there as a run would (ValueError)
    failed = run_all(["a", "b", "c", "d"], [4.0, -1.0, 9.0, 16.0], math.sqrt, jobs=jobs, keep_going=True,
                     after_each=ended.append)
    assert [(name, type(e)) for name, e in failed] == [("b", ValueError)]
    assert len(ended) == 3 and max(ended) == 4  # after each run that finished, not after the failed one
    assert "[b] failed (ValueError: math domain error); the study goes on" in capsys.readouterr().err


def test_without_keep_going_the_first_failure_stops_the_runs_after_it() -> None:
    called: list[float] = []

    def run(x: float) -> float:
        called.append(x)
        return math.sqrt(x)

    with pytest.raises(ValueError, match="math domain error"):
        run_all(["a", "b", "c"], [4.0, -1.0, 9.0], run, jobs=1)
    assert called == [4.0, -1.0]  # c never started
    with pytest.raises(ValueError, match="math domain error"):
        run_all(["a", "b", "c"], [4.0, -1.0, 9.0], math.sqrt, jobs=2)


def _die_or_sqrt(x: float) -> float:
    """A run whose worker process dies at once (killed, out of memory) for x < 0."""
    if x < 0:
        os._exit(3)
    return math.sqrt(x)


def _dies_or_waits_beside(call: tuple[str, str]) -> str:
    """Two runs, ordered by a marker file: "beside" writes it and sleeps ten seconds, "dies" waits for it
    and then its worker dies, so "beside" is running when it does. Run again once the marker exists,
    "beside" finishes at once and "dies" dies at once."""
    role, marker = call
    if role == "beside":
        if not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(10)
        return role
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(3)


def test_keep_going_replaces_a_pool_whose_worker_died(capsys) -> None:
    # a dead worker breaks the pool: it fails the runs it holds and takes no more; the queue goes on in a
    # new pool, and the runs the broken pool held run again afterwards, each alone: a run whose worker dies
    # alone too is reported failed. The first two runs die, so c and d can only have run on a new pool
    ended: list[int] = []
    names = ["dies", "dies too", "c", "d"]
    failed = run_all(names, [-1.0, -1.0, 4.0, 9.0], _die_or_sqrt, jobs=2, keep_going=True,
                     after_each=ended.append)
    assert sorted(n for n, _ in failed) == ["dies", "dies too"]
    assert all(type(e).__name__ == "BrokenProcessPool" for _, e in failed)
    assert ended == [1, 2]
    err = capsys.readouterr().err
    assert "[dies] failed (BrokenProcessPool: A process in the process pool was terminated abruptly" in err
    with pytest.raises(Exception, match="terminated abruptly"):  # without keep_going: the study stops
        run_all(names[:2], [-1.0, 4.0], _die_or_sqrt, jobs=2)


def test_keep_going_a_run_beside_a_dead_worker_finishes(tmp_path, capsys) -> None:
    # "beside" is running when the other worker dies; the broken pool fails it too, without saying whose
    # worker died: run again alone, it finishes, and only the run that dies alone is reported. (CPython's
    # pool may notice a worker it spawned last only at its next event: then "beside" simply finishes its
    # sleep first, and the outcome is the same. The code before 5c0013b reported "beside" failed.)
    ended: list[int] = []
    marker = str(tmp_path / "beside-started")
    failed = run_all(["dies", "beside"], [("dies", marker), ("beside", marker)], _dies_or_waits_beside,
                     jobs=2, keep_going=True, after_each=ended.append)
    assert [n for n, _ in failed] == ["dies"]
    assert len(ended) == 1  # after "beside" finished (first or second of the two to end)
    err = capsys.readouterr().err
    assert "[beside] failed" not in err and "[dies] failed (BrokenProcessPool" in err


def _broken_study():
    """A study of two runs at toy size whose first run cannot build its model (lambda -1)."""
    s = ablation_study(seeds=(0,), variants=("rpc_no_dual",), quick=True, train_subset=64)
    s = s.replace(suites=ImageSuites(clean=32, corruptions=None, attacks=()), trace=0)
    sym, rpc = s.variants
    broken = dataclasses.replace(rpc, slug="broken", label="Broken",
                                 kwargs={**rpc.kwargs, "rpc_lambda": -1.0})
    return s.replace(name="broken", variants=(broken, sym))


def test_keep_going_study_keeps_the_other_runs_and_writes_the_report(tmp_path) -> None:
    with torch.inference_mode(False), pytest.raises(RunsFailed) as info:
        run_study(_broken_study(), tmp_path, progress=False, checks=False, keep_going=True)
    assert [name for name, _ in info.value.failed] == ["broken s0"] and info.value.total == 2
    assert "rpc_lambda: lam must be a finite number > 0" in str(info.value)
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["symvit-s0.json"]
    assert (tmp_path / "report.md").is_file()
    # without it, the study stops at the broken run: SymViT, after it, never trains
    with torch.inference_mode(False), pytest.raises(ValueError, match="rpc_lambda"):
        run_study(_broken_study(), tmp_path / "stop", progress=False, checks=False)
    assert not (tmp_path / "stop" / "results" / "symvit-s0.json").exists()


def test_cli_keep_going_exits_1_with_the_failed_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(studies.STUDIES, "broken", _broken_study)
    res = CliRunner().invoke(app, ["study", "broken", "--out", str(tmp_path / "o"), "--runs",
                                   str(tmp_path / "r"), "--keep-going", "--no-progress", "--no-checks"])
    assert res.exit_code == 1, res.output
    assert "error: 1 of 2 run(s) failed: broken s0 (ValueError: " in res.output
    assert (tmp_path / "o" / "results" / "symvit-s0.json").is_file()
