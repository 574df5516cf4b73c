"""Metrics to CSV and TensorBoard (rank 0 only).

Files in the run directory: ``steps.csv`` (step, epoch, loss, lr, images/s every ``log_every_steps``),
``epochs.csv`` (one row per epoch: train loss, eval metrics, throughput, and whatever callbacks logged
through :meth:`MetricLogger.log`), ``tb/`` (TensorBoard event files). On resume, rows after the
checkpoint are dropped so the files read as one uninterrupted run.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..io import atomic_path

__all__ = ["MetricLogger", "read_csv"]


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics CSV with numbers parsed (empty cells -> NaN). A last row without its line end is
    a row whose append was cut off (a full disk, a power cut: rows are appended in place) and is left out,
    so a run stays resumable; a row with fewer cells than the header elsewhere is a ValueError."""
    rows = []
    with open(path, newline="") as f:
        text = f.read()
    raw = list(csv.DictReader(io.StringIO(text, newline="")))
    if raw and not text.endswith(("\n", "\r")):
        warnings.warn(f"{path}: its last row has no line end (an append cut off): left out", stacklevel=2)
        raw = raw[:-1]
    for i, row in enumerate(raw):
        if None in row.values() or None in row:  # csv's filler for a short row, its key for a long one's rest
            raise ValueError(f"{path}: row {i + 2} has another number of cells than the header (the file is "
                             "damaged)")
        parsed: dict[str, Any] = {}
        for k, v in row.items():
            try:
                parsed[k] = float(v) if v != "" else math.nan
            except ValueError:
                parsed[k] = v
        rows.append(parsed)
    return rows


#: columns that hold counts: written as integers also when rows come back from :func:`read_csv` (floats)
INT_COLUMNS = ("step", "epoch")


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:  # replaces a link, never writes through
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows({k: int(v) if k in INT_COLUMNS and isinstance(v, float) and v.is_integer() else v
                     for k, v in r.items()} for r in rows)


class MetricLogger:
    """The ``logger`` given to training callbacks.

    ``log({"name": value, ...}, step=None)`` writes TensorBoard scalars at ``step`` (default: the
    current global step) and adds the values to the current epoch's row of ``epochs.csv``.
    ``step`` and ``epoch`` are readable attributes. Does nothing on ranks other than 0.
    """

    def __init__(self, run_dir: str | Path, *, enabled: bool = True, resume_epoch: int | None = None,
                 resume_step: int | None = None, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.step = resume_step or 0
        self.epoch = resume_epoch or 0
        self._pending: dict[str, Any] = {}
        self.epoch_rows: list[dict[str, Any]] = []
        self._steps_path = self.run_dir / "steps.csv"
        self._epochs_path = self.run_dir / "epochs.csv"
        self._step_rows: list[dict[str, Any]] = []
        self._tb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:  # keep the history up to the checkpoint, drop what came after
            if self._epochs_path.exists():
                self.epoch_rows = [r for r in read_csv(self._epochs_path) if r["epoch"] < (resume_epoch or 0)]
            if self._steps_path.exists():
                self._step_rows = [r for r in read_csv(self._steps_path) if r["step"] <= resume_step]
        _write_rows(self._epochs_path, self.epoch_rows) if self.epoch_rows else self._epochs_path.unlink(
            missing_ok=True)
        _write_rows(self._steps_path, self._step_rows) if self._step_rows else self._steps_path.unlink(
            missing_ok=True)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step or None)

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record scalars (callbacks use this; see the class docstring)."""
        if not self.enabled:
            return
        s = self.step if step is None else step
        for k, v in metrics.items():
            v = float(v)
            self._pending[k] = v
            if self._tb is not None:
                self._tb.add_scalar(k, v, s)

    def log_step(self, metrics: Mapping[str, float]) -> None:
        """A row of ``steps.csv`` (and TensorBoard ``train/*``) at the current step."""
        if not self.enabled:
            return
        row = {"step": self.step, "epoch": self.epoch, **{k: float(v) for k, v in metrics.items()}}
        new_file = not self._steps_path.exists()
        with open(self._steps_path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            if new_file:
                w.writeheader()
            w.writerow(row)
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(f"train/{k}", float(v), self.step)

    def end_epoch(self, metrics: Mapping[str, float]) -> dict[str, Any]:
        """Close the epoch's row: ``metrics`` plus anything logged since the last call."""
        row = {"epoch": self.epoch, "step": self.step, **{k: float(v) for k, v in metrics.items()},
               **self._pending}
        self._pending = {}
        if self.enabled:
            self.epoch_rows.append(row)
            _write_rows(self._epochs_path, self.epoch_rows)
            if self._tb is not None:
                for k, v in metrics.items():
                    self._tb.add_scalar(f"epoch/{k}", float(v), self.step)
                self._tb.flush()
        return row

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
