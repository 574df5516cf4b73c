"""Shared test fixtures (kept tiny)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs one worker per core), one intra-op thread per worker: two
    workers at two threads each would put four busy threads on two cores, and every multi-threaded op
    would wait for the other worker's. Tests of two-thread behaviour set their count themselves
    (:func:`torch_threads`)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def single_thread():
    """Run a test with one intra-op thread. On a machine whose cores are busy with other work,
    every multi-threaded op on a tiny tensor can wait a scheduler tick for its second thread;
    with hundreds of small ops per test (gradcheck, tiny models, SVDs) that is 10-100x slower.
    Use it for a whole module with ``pytestmark = pytest.mark.usefixtures("single_thread")``."""
    with _threads(1):
        yield


@pytest.fixture
def torch_threads() -> Callable[[int], AbstractContextManager[None]]:
    """``with torch_threads(n):`` runs a block at ``n`` intra-op threads and restores the count after."""
    return _threads


@pytest.fixture(scope="module")
def single_thread_module():
    """:func:`single_thread` for a whole module, so module-scoped fixtures run single-threaded too."""
    with _threads(1):
        yield


@pytest.fixture
def copy_committed() -> Callable[[str, Path], Path]:
    """``copy(study, dst)``: the committed folder ``results/<study>`` copied to ``dst`` without the files git
    does not track. A study running on this checkout writes its unfinished runs' result files into that
    folder, and the committed folders never hold them; outside a git checkout every file is copied."""
    def copy(study: str, dst: Path) -> Path:
        src = REPO / "results" / study
        try:
            out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", f"results/{study}"],
                                 capture_output=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            out = b""
        tracked = [REPO / f for f in out.decode().split("\0") if f]
        if not tracked:  # not a git checkout (or nothing tracked): the folder as it is
            shutil.copytree(src, dst)
            return dst
        for f in tracked:
            if f.is_file():
                target = dst / f.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
        return dst
    return copy


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """``(study folder, report path)`` of the quick demo study run once per test module (one thread)."""
    from kpca_attention.studies import quick_demo_study, run_study

    out = tmp_path_factory.mktemp("demo")
    with torch.inference_mode(False), _threads(1):
        report = run_study(quick_demo_study(), out, progress=False)
    return out, report
