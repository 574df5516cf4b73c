"""How a study's runs are scheduled: one after another in this process (``jobs=1``), or ``jobs`` at a time in
worker processes, one thread each. By default the first run that fails stops the study (the runs already
going finish); with ``keep_going`` a failed run is reported as it fails, the other runs go on, and the study
ends with :class:`RunsFailed` naming every failed run - a long background study is not lost to one run.

A worker process that dies (killed, out of memory) breaks its pool, which then fails every run it holds
without saying whose worker died. With ``keep_going`` those runs are run again afterwards, each alone in a
pool of its own (resuming from its last checkpoint): the run whose worker dies again alone is the one
reported failed; a run that merely stood beside it finishes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..checks import error_line

__all__ = ["RunsFailed", "run_all"]


class RunsFailed(RuntimeError):
    """Some of a study's runs failed (``keep_going``); the others' results are kept. ``failed``: (run name,
    exception) pairs, ``total``: the runs the call had."""

    def __init__(self, failed: Sequence[tuple[str, BaseException]], total: int) -> None:
        self.failed, self.total = list(failed), total
        what = "; ".join(f"{name} ({_one_line(e)})" for name, e in self.failed)
        super().__init__(f"{len(self.failed)} of {total} run(s) failed: {what}; the other runs' results are "
                         "kept - fix the cause and run the same command again (finished runs are reused)")


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {error_line(e)}"


def _stop_on_sigterm() -> None:
    """A worker process's initializer: SIGTERM (the study stopping its runs) raises ``KeyboardInterrupt``, so
    the run unwinds as on Ctrl-C - its data loader and locks released, its semaphores unregistered - rather
    than dying where it stands (the resource tracker then warned of leaked semaphores)."""
    import signal

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def run_all(names: Sequence[str], calls: Sequence[Any], fn: Callable[[Any], Any], *, jobs: int,
            keep_going: bool = False,
            after_each: Callable[[int], None] | None = None) -> list[tuple[str, BaseException]]:
    """Call ``fn(call)`` for every call (``names``: the runs' names, for messages), ``jobs`` at a time in
    worker processes (``fn`` then must be picklable: a module-level function) or here for ``jobs=1``;
    ``after_each(n)`` after the n-th run to end, when it finished (not after a failed one). Returns the
    failed runs (``keep_going``; without it the first failure is raised, after the runs already going have
    finished). Ctrl-C or SIGTERM stops every worker at once: their last whole checkpoints and finished items
    stay."""
    failed: list[tuple[str, BaseException]] = []

    def failure(name: str, e: Exception) -> None:
        if not keep_going:
            raise e
        print(f"[{name}] failed ({_one_line(e)}); the study goes on (--keep-going)", file=sys.stderr,
              flush=True)
        failed.append((name, e))

    if jobs == 1:
        for i, (name, call) in enumerate(zip(names, calls, strict=True)):
            try:
                fn(call)
            except Exception as e:  # noqa: BLE001 - reported, or raised without keep_going
                failure(name, e)
                continue
            if after_each is not None:
                after_each(i + 1)
        return failed
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    # one thread each, OpenMP waiting passively: set before the workers start their runtimes
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    queue = list(zip(names, calls, strict=True))
    # keep_going: the runs a broken pool failed, each to run again alone (whose worker died is not known)
    suspects: list[tuple[str, Any]] = []
    ended = 0  # runs that have ended, failed or not

    def drain(pool: Any, todo: list[tuple[str, Any]], slots: int, alone: bool) -> None:
        """Run ``todo`` on ``pool`` until it is empty or the pool breaks (a worker died: killed, out of
        memory); the pool then fails the runs it holds and takes no more. ``alone``: the pool runs one
        suspect by itself, so a broken pool is that run's own failure."""
        # at most `slots` runs submitted at a time: the pool queues one more than it runs, and a worker
        # stopped by SIGTERM went on to that queued run while the stopped study waited for it
        running: dict[Any, tuple[str, Any]] = {}

        def submit() -> None:
            if todo:
                try:
                    running[pool.submit(fn, todo[0][1])] = todo[0]
                except BrokenProcessPool:  # the next pool takes it
                    return
                todo.pop(0)

        nonlocal ended
        for _ in range(slots):
            submit()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                name, call = running.pop(fut)
                try:
                    fut.result()
                except BrokenProcessPool as e:
                    if keep_going and not alone:
                        print(f"[{name}] stopped: a worker process of its pool died; it runs again alone "
                              "when the others are done (from its last checkpoint)", file=sys.stderr,
                              flush=True)
                        suspects.append((name, call))
                        continue
                    ended += 1
                    failure(name, e)
                    continue
                except Exception as e:  # noqa: BLE001 - reported, or raised without keep_going
                    ended += 1
                    failure(name, e)
                    submit()
                    continue
                ended += 1
                submit()
                if after_each is not None:
                    after_each(ended)

    # one pool for the queue (with keep_going a new one for the runs left after a worker died), then each
    # suspect alone
    while queue or suspects:
        todo, slots, alone = (queue, jobs, False) if queue else ([suspects.pop(0)], 1, True)
        with ProcessPoolExecutor(max_workers=slots, mp_context=mp.get_context("spawn"),
                                 initializer=_stop_on_sigterm) as pool:
            try:
                drain(pool, todo, slots, alone)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the runs, not wait for them (a SIGTERM
                # reaches this process only; their last whole checkpoints and finished items stay)
                pool.shutdown(wait=False, cancel_futures=True)
                for child in mp.active_children():
                    child.terminate()
                raise
    return failed
