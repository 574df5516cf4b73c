"""The one owner of a run directory: its files, whether it is finished, which config fields change
what it trains, and who may write to it.

Layout (see :mod:`kpca_attention.train.checkpoint` for one checkpoint's files)::

    <run>/
      .lock            advisory lock (fcntl) of the process writing this run; holds its pid
      config.json      the TrainConfig of the run
      steps.csv, epochs.csv, tb/     metrics (kpca_attention.train.logger)
      checkpoints/latest.json        {"name": ..., "finished": bool}
      checkpoints/e0003-s00001234/   checkpoints (atomic directories)

Concurrency: :meth:`RunDir.lock` takes an exclusive ``fcntl.flock`` on ``<run>/.lock``. A second
writer (another ``train`` with the same ``-o``) gets :class:`RunDirBusy` at once, naming the pid that
holds it. The kernel drops the lock when its process dies (even on SIGKILL), so a stale lock never
blocks: the next writer simply takes it over. While the lock is held no other writer exists, so
temporary checkpoint folders left in ``checkpoints/`` are orphans of a killed writer and are removed
(:meth:`RunDir.remove_orphans`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .config import TrainConfig

__all__ = ["RunDir", "RunDirBusy", "CheckpointError", "read_config", "TRAJECTORY_FREE", "RESUMABLE_CHANGES",
           "LEGACY_VALUES", "trajectory_settings", "LATEST_FILE", "CHECKPOINTS", "entry_in"]

CHECKPOINTS = "checkpoints"
LATEST_FILE = "latest.json"
LOCK_FILE = ".lock"
METRIC_FILES = ("steps.csv", "epochs.csv", "tb", "config.json")

#: config fields that do not change the trained weights: a finished run stays valid when they differ
TRAJECTORY_FREE = frozenset({
    "output_dir", "progress", "num_workers", "log_every_steps", "checkpoint_every_steps",
    "eval_every_epochs", "eval_batch_size", "eval_subset", "device", "preset",
})
#: fields that may differ between a checkpoint and the run resuming it: the trajectory-free ones, and
#: ``max_steps``, which stops a run early (resumed without it, the run ends where one never stopped does).
#: Not ``epochs``: the lr schedule spans them, so a run extended from 1 to 2 epochs is not a 2-epoch run
RESUMABLE_CHANGES = TRAJECTORY_FREE | {"max_steps"}
#: config fields added after runs were committed, with the value an older ``config.json`` (which lacks
#: them) means: at that value a field is left out of :func:`trajectory_settings`, so older runs keep the
#: key their stored results were made under (and still count as reusable)
LEGACY_VALUES: dict[str, Any] = {"val_size": None, "val_seed": 0, "compile": False}


def trajectory_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The config fields that change the trained weights (all but :data:`TRAJECTORY_FREE`, and the fields
    of :data:`LEGACY_VALUES` at their legacy value): what identifies a run's weights."""
    return {k: v for k, v in cfg.to_dict().items()
            if k not in TRAJECTORY_FREE and not (k in LEGACY_VALUES and v == LEGACY_VALUES[k])}


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, or does not match the run."""


def entry_in(folder: Path, name: Any, listed_in: Path) -> Path:
    """``folder / name`` for a name read from a file of a run (``latest.json``, ``COMPLETE``): a plain
    name - no separator, not ``..``, not a link - so a downloaded run cannot point the loader at files
    outside its folder (``/dev/zero``, another run's checkpoint)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise CheckpointError(f"{listed_in} names {name!r}: expected a plain file or folder name inside "
                              f"{folder}")
    path = folder / name
    if path.is_symlink():
        raise CheckpointError(f"{path} (named in {listed_in}) is a symbolic link: a checkpoint holds none")
    return path


class RunDirBusy(RuntimeError):
    """Another live process is writing this run directory."""


def read_config(ckpt: Path) -> TrainConfig:
    """The :class:`TrainConfig` stored in checkpoint directory ``ckpt`` (``config.json``)."""
    f = Path(ckpt) / "config.json"
    try:
        return TrainConfig.from_json(f.read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint config {f} is missing") from e
    except (json.JSONDecodeError, ValueError, TypeError, RecursionError) as e:  # RecursionError: nested deep
        raise CheckpointError(f"checkpoint config {f} is invalid: {type(e).__name__}: {e}") from e


class RunDir:
    """A training run's directory. Cheap to create; nothing is read or written until asked."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # --- files -------------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def latest_file(self) -> Path:
        return self.checkpoints / LATEST_FILE

    def latest(self) -> dict[str, Any] | None:
        """The contents of ``checkpoints/latest.json`` (``None`` when the run has no checkpoint)."""
        try:
            data = json.loads(self.latest_file.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(
                f"{self.latest_file} is corrupt ({e}); delete it to pick a checkpoint by hand") from e
        return data if isinstance(data, dict) else None

    def has_checkpoint(self) -> bool:
        """Whether a run was started here (it has a checkpoint to resume from)."""
        return self.latest_file.exists()

    def finished(self) -> bool:
        """Whether the run's last checkpoint is marked finished (a corrupt marker counts as not)."""
        try:
            latest = self.latest()
        except RuntimeError:
            return False
        return bool(latest and latest.get("finished"))

    def checkpoint(self) -> Path:
        """The latest checkpoint directory (``checkpoints/<latest.json name>``)."""
        latest = self.latest()
        if latest is None:
            raise FileNotFoundError(f"no checkpoint in {self.path}: {self.latest_file} is missing")
        ckpt = entry_in(self.checkpoints, latest.get("name"), self.latest_file)
        if not ckpt.is_dir():
            raise CheckpointError(f"{self.latest_file} points to {ckpt}, which does not exist")
        return ckpt

    def config(self) -> TrainConfig:
        """The config of the latest checkpoint."""
        return read_config(self.checkpoint())

    def mark_finished(self, name: str) -> None:
        from ..io import write_json_atomic

        write_json_atomic(self.latest_file, {"name": name, "finished": True})

    # --- which settings differ -----------------------------------------------------------------
    def changed_fields(self, cfg: TrainConfig, allowed: frozenset[str] = TRAJECTORY_FREE) -> dict[str, tuple]:
        """``{field: (saved, now)}`` for config fields outside ``allowed`` that differ from the run's
        latest checkpoint (empty when there is no checkpoint)."""
        if not self.has_checkpoint():
            return {}
        saved = self.config().to_dict()
        now = cfg.to_dict()
        return {k: (saved.get(k), now[k]) for k in now if k not in allowed and saved.get(k) != now[k]}

    # --- ownership ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self) -> Iterator[RunDir]:
        """Hold the run directory exclusively for the ``with`` block (see the module docstring)."""
        import fcntl

        created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self.refuse_links()
        lock_path = self.path / LOCK_FILE
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunDirBusy(f"{self.path} is being written by another process (pid {holder}); wait for it "
                             "to finish or choose another output directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        try:
            self.remove_orphans()
            yield self
        finally:
            self._lock_fd = None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            if created and [p.name for p in self.path.iterdir()] == [LOCK_FILE]:  # failed before writing
                with contextlib.suppress(OSError):  # anything: leave no empty run folder behind
                    lock_path.unlink()
                    self.path.rmdir()

    def refuse_links(self) -> None:
        """Refuse a run folder that holds a symbolic link (among its files, its checkpoints or their
        files): this project writes none there, and writing, truncating or pruning through one (a
        downloaded run resumed, a ``--runs`` tree) would reach files outside the folder. The folder
        itself may be a link (a run kept on another disk)."""
        folders = [self.path]
        if self.checkpoints.is_dir() and not self.checkpoints.is_symlink():
            folders += [self.checkpoints, *(p for p in self.checkpoints.iterdir()
                                            if p.is_dir() and not p.is_symlink())]
        for folder in folders:
            for p in folder.iterdir():
                if p.is_symlink():
                    raise ValueError(f"{p} is a symbolic link (to {os.readlink(p)}): a run folder of this "
                                     "project holds no links, and none is written through; remove it or "
                                     "copy the run without links")

    def remove_orphans(self) -> list[Path]:
        """Remove temporary checkpoint folders and files (``.<name>.tmp-<pid>``) whose writer is not
        this process: with the lock held, they belong to a writer that died. Returns what was removed."""
        removed: list[Path] = []
        if not self.checkpoints.is_dir():
            return removed
        for p in self.checkpoints.iterdir():
            if not (p.name.startswith(".") and ".tmp" in p.name):
                continue
            if p.name.endswith(f".tmp-{os.getpid()}"):
                continue
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
        return removed

    def clear(self) -> None:
        """Delete the run (checkpoints and metrics) so that exactly a new run is left after
        ``--overwrite``; the lock file is kept (it is held by the caller)."""
        if not self.path.exists():
            return
        for name in (CHECKPOINTS, *METRIC_FILES):
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
