"""The training loop of every task (it asks :mod:`kpca_attention.tasks` for the data, the model, the loss
and the held-out metrics), one process or DDP."""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..io import write_text_atomic
from ..models.sizing import check_fits, memory_bytes, meta_model
from ..modules import eval_mode
from ..tasks import get as get_task
from ..tasks import unused_settings
from ..tasks.base import autocast
from . import checkpoint as ckpt_mod
from .config import TrainConfig
from .data import build_loaders, preserved_rngs
from .distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    broadcast_buffers,
    cleanup_distributed,
    gather_objects,
    init_distributed,
    match_grad_layout,
)
from .logger import MetricLogger, read_csv
from .rundir import RESUMABLE_CHANGES, RunDir

__all__ = ["train", "TrainResult", "Callback", "RESUMABLE_CHANGES"]

#: signature of a training callback: ``callback(model, epoch, logger)`` (see the package docstring)
Callback = Callable[[nn.Module, int, MetricLogger], None]



@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path | None  # the last checkpoint written (None on ranks > 0)
    history: list[dict[str, Any]] = field(default_factory=list)  # epochs.csv rows of this process's view
    global_step: int = 0

    @property
    def final(self) -> dict[str, Any]:
        return self.history[-1] if self.history else {}


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _device_memory(dev: torch.device) -> int | None:
    """Bytes of memory the model trains in: the GPU's for CUDA, else this machine's."""
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    return memory_bytes()


def _check_resume_config(saved: TrainConfig, cfg: TrainConfig, where: Path) -> None:
    a, b = saved.to_dict(), cfg.to_dict()
    diff = {k: (a[k], b[k]) for k in a if k not in RESUMABLE_CHANGES and a[k] != b.get(k)}
    if diff:
        lines = ", ".join(f"{k}: checkpoint {v[0]!r} vs now {v[1]!r}" for k, v in sorted(diff.items()))
        why = ("; the lr schedule spans the epochs, so an extended run would not be a run of that length: "
               "stop a run early with max_steps and resume it, or train a new one") * ("epochs" in diff)
        raise ValueError(f"cannot resume from {where}: the config differs in {lines} "
                         f"(only {', '.join(sorted(RESUMABLE_CHANGES))} may change){why}")


def _is_training_folder(folder: Path) -> bool:
    """Whether ``folder`` may receive a run: it has no ``config.json``, or its ``config.json`` is a
    :class:`TrainConfig` (a run of this project, perhaps killed before its first checkpoint)."""
    f = folder / "config.json"
    if not f.is_file():
        return True
    try:
        TrainConfig.from_json(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError, TypeError, RecursionError):  # JSONDecodeError too
        return False
    return True


class _Trainer:
    def __init__(self, cfg: TrainConfig, dist: DistInfo, callbacks: Sequence[Callback],
                 resume: bool | str | Path, overwrite: bool) -> None:
        self.cfg, self.dist, self.callbacks = cfg, dist, list(callbacks)
        self.task = get_task(cfg.task)
        self.run_dir = Path(cfg.output_dir)
        self.rundir = RunDir(self.run_dir)
        self.overwrite = overwrite
        self.resume_from: Path | None = None
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other: resume continues the run, overwrite "
                             "deletes it")
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise NotADirectoryError(f"output directory {self.run_dir} is a file")
        if not self.rundir.has_checkpoint() and not _is_training_folder(self.run_dir):
            # a Hugging Face model folder, a results folder...: its config.json and logs would be replaced,
            # and --overwrite would delete its tb/ (a run killed before its first checkpoint passes)
            raise FileExistsError(f"{self.run_dir} holds a config.json that is not a training config of this "
                                  "project: train into a new or empty folder")
        if resume:
            self.resume_from = self.run_dir if resume is True else Path(resume)
            if resume is not True and self.rundir.has_checkpoint() and not self._same_run(self.resume_from):
                raise FileExistsError(  # its metric files would be continued with another run's rows
                    f"{self.run_dir} already holds a training run: resume {resume} into an empty output "
                    "directory, or continue this one with --resume alone")
        elif self.rundir.has_checkpoint() and not overwrite:
            raise FileExistsError(
                f"{self.run_dir} already holds a training run; pass resume=True (--resume) to continue it "
                "or overwrite=True (--overwrite) to start again"
            )

    def _same_run(self, path: Path) -> bool:
        """Whether ``path`` (a run or one of its checkpoints) lies in this run's directory."""
        try:
            return path.resolve().is_relative_to(self.run_dir.resolve())
        except OSError:
            return False

    # ------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Train, holding the run directory's lock on the writing rank (see :class:`RunDir`)."""
        if not self.dist.is_main:
            return self._run()
        with self.rundir.lock():
            if self.overwrite:
                self.rundir.clear()  # exactly the new run is left: no old checkpoints, no old metrics
            return self._run()

    def _run(self) -> TrainResult:
        cfg, dist = self.cfg, self.dist
        dev = dist.device
        state: dict[str, Any] | None = None
        ckpt_dir: Path | None = None
        if self.resume_from is not None:
            ckpt_dir, saved_cfg, state, marker = ckpt_mod.load_checkpoint(self.resume_from)
            _check_resume_config(saved_cfg, cfg, ckpt_dir)
        else:  # a run made before the check continues as it was trained
            unused = unused_settings(cfg)
            if unused:
                raise ValueError(f"{', '.join(unused)}: task {cfg.task!r} does not use "
                                 f"{'it' if len(unused) == 1 else 'them'} (another task's settings); leave "
                                 f"{'it' if len(unused) == 1 else 'them'} at the default")

        # data first (the LM's vocabulary sizes its model); building loaders draws no global random numbers
        task = self.task
        loaders = build_loaders(cfg, dist)
        # identical initial weights on every rank (DDP also broadcasts rank 0's)
        _seed_all(cfg.seed)
        shell = meta_model(lambda: task.build_model(cfg, loaders.info))
        if shell is not None:  # a size typo (img_size, embed_dim) is refused before gigabytes are allocated
            check_fits(shell, cfg.model, bytes_per_parameter=16, available=_device_memory(dev),
                       what="its float32 weights, gradients and two optimizer states")
        model = task.build_model(cfg, loaders.info).to(dev)
        updates_per_epoch = loaders.updates_per_epoch
        if updates_per_epoch < 1:
            raise ValueError("the training set gives no full batch per process; lower batch_size")

        import timm.optim
        import timm.scheduler

        cfg.check_schedule(dist.world_size)  # a derived peak, now that the processes are known
        lr = cfg.learning_rate(dist.world_size)
        opt_kw: dict[str, Any] = {}
        if cfg.opt_eps is not None:
            opt_kw["eps"] = cfg.opt_eps
        if cfg.opt_betas is not None:
            opt_kw["betas"] = tuple(cfg.opt_betas)
        optimizer = timm.optim.create_optimizer_v2(model, opt=cfg.opt, lr=lr, weight_decay=cfg.weight_decay,
                                                   **opt_kw)
        warmup_epochs = cfg.warmup_length(updates_per_epoch)
        note = cfg.warmup_note(updates_per_epoch)
        if note and dist.is_main:
            warnings.warn(note, stacklevel=2)
        on_steps = cfg.sched_on_steps or cfg.warmup_steps is not None
        scheduler, _ = timm.scheduler.create_scheduler_v2(
            optimizer, sched=cfg.sched, num_epochs=cfg.epochs, warmup_epochs=warmup_epochs,
            warmup_lr=cfg.warmup_lr, min_lr=cfg.min_lr, step_on_epochs=not on_steps,
            updates_per_epoch=updates_per_epoch, decay_rate=cfg.decay_rate,
        )
        amp = cfg.amp if cfg.amp is not None else dev.type == "cuda"
        scaler = torch.amp.GradScaler(dev.type, enabled=amp and dev.type == "cuda")

        ema = None
        if cfg.model_ema:
            from timm.utils import ModelEmaV3

            ema = ModelEmaV3(model, decay=cfg.model_ema_decay)

        objective = task.objective(cfg, loaders.info)  # the loss, and Mixup / CutMix for classifiers

        progress = {"epoch": 0, "step_in_epoch": 0, "global_step": 0,
                    "epoch_loss_sum": 0.0, "epoch_batches": 0, "epoch_samples": 0, "epoch_time": 0.0}
        if state is not None and ckpt_dir is not None:
            ckpt_mod.load_weights(model, ckpt_dir / ckpt_mod.MODEL_FILE)
            if ema is not None:
                ckpt_mod.load_weights(ema.module, ckpt_dir / ckpt_mod.EMA_FILE)
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            progress.update(state["progress"])
            rngs = state["rng"]
            if len(rngs) != dist.world_size:
                raise ValueError(f"{ckpt_dir} was written by {len(rngs)} processes, now {dist.world_size}: "
                                 "exact resume needs the same number")
            ckpt_mod.restore_rng(rngs[dist.rank])  # the lr itself is in the optimizer state
            progress["epoch_loss_sum"] = float(state["epoch_loss_sums"][dist.rank])  # this rank's own
        else:
            # per-rank streams for dropout / drop path / Mixup
            _seed_all(cfg.seed + 1000003 * dist.rank)

        net: nn.Module = model
        if dist.distributed:
            match_grad_layout(model)  # no stride warning from DDP for the 1-channel patch embedding
            net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        # the training steps' module: compiled (cfg.compile) or the same; evaluation uses the unwrapped model
        step_net: nn.Module = torch.compile(net) if cfg.compile else net

        total_steps = cfg.epochs * updates_per_epoch
        if cfg.max_steps is not None:
            total_steps = min(total_steps, cfg.max_steps)
        done = progress["global_step"] >= total_steps
        # a resumed run with nothing left to do writes nothing: its metrics files stay as they are (they were
        # cut back to the checkpoint's step and epoch, which drops a run's last eval row at max_steps)
        logger = MetricLogger(self.run_dir, enabled=dist.is_main and not done,
                              resume_epoch=progress["epoch"] if state is not None else None,
                              resume_step=progress["global_step"] if state is not None else None)
        if dist.is_main and not done:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.run_dir / "config.json", cfg.to_json())
        if dist.is_main and done:
            tqdm.write(f"[{cfg.model}] {self.run_dir} already finished at step {progress['global_step']} of "
                       f"{total_steps}: nothing to train (a larger --max-steps, or --set max_steps=None, "
                       "continues it)")
        last_ckpt: Path | None = ckpt_dir
        extra_files = task.checkpoint_files(loaders.info) or None  # e.g. the LM's vocabulary
        # resumed from another directory: its machines start this run's list (its own checkpoint has none)
        machines_before = ckpt_mod.training_machines(ckpt_dir) if ckpt_dir is not None else []

        def save(finished: bool) -> None:
            nonlocal last_ckpt
            # every rank's RNG state, so a DDP run resumes exactly too
            per_rank = gather_objects((ckpt_mod.capture_rng(), progress["epoch_loss_sum"]))
            if dist.is_main:
                st = {
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict(),
                    "progress": dict(progress),
                    "rng": [r for r, _ in per_rank],
                    "epoch_loss_sums": [s for _, s in per_rank],
                    "world_size": dist.world_size,
                }
                last_ckpt = ckpt_mod.save_checkpoint(self.run_dir, model=model, config=cfg, state=st,
                                                     ema=ema.module if ema is not None else None,
                                                     finished=finished, extra_files=extra_files,
                                                     machines_before=machines_before)
            barrier()

        tput_key = task.throughput_key  # throughput over all ranks: images/s, tokens/s
        epoch = progress["epoch"]
        while not done and epoch < cfg.epochs:
            sampler = loaders.sampler
            start = progress["step_in_epoch"]
            sampler.set_epoch(epoch, start=start * cfg.batch_size)
            if start == 0:
                progress.update(epoch_loss_sum=0.0, epoch_batches=0, epoch_samples=0, epoch_time=0.0)
            logger.epoch = epoch
            net.train()
            bar = tqdm(loaders.train, total=updates_per_epoch, initial=start, leave=False, dynamic_ncols=True,
                       disable=None if (cfg.progress and dist.is_main) else True,  # None: only on a terminal
                       desc=f"epoch {epoch + 1}/{cfg.epochs}")
            t0 = time.perf_counter()
            window_t, window_n = time.perf_counter(), 0
            for x, y in bar:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                n_local = task.count(y)  # images / tokens
                if objective.mix is not None:
                    x, y = objective.mix(x, y)
                with autocast(dev, amp):
                    loss = objective.loss(step_net, x, y)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {progress['global_step']} "
                                             f"(epoch {epoch}); lower the lr or check the data")
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if cfg.clip_grad is not None:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
                scaler.step(optimizer)
                scaler.update()
                progress["global_step"] += 1
                progress["step_in_epoch"] += 1
                if ema is not None:
                    ema.update(model, step=progress["global_step"])
                if on_steps:
                    scheduler.step_update(num_updates=progress["global_step"])
                loss_v = loss.item()
                progress["epoch_loss_sum"] += loss_v
                progress["epoch_batches"] += 1
                progress["epoch_samples"] += n_local * dist.world_size
                window_n += n_local * dist.world_size
                logger.step = progress["global_step"]
                if progress["global_step"] % cfg.log_every_steps == 0:
                    now = time.perf_counter()
                    ips = window_n / max(now - window_t, 1e-9)
                    window_t, window_n = now, 0
                    cur_lr = optimizer.param_groups[0]["lr"]
                    logger.log_step({"loss": loss_v, "lr": cur_lr, tput_key: ips})
                    bar.set_postfix(loss=f"{loss_v:.3f}", lr=f"{cur_lr:.2e}", ips=f"{ips:.0f}")
                stop = progress["global_step"] >= total_steps
                epoch_end = progress["step_in_epoch"] >= updates_per_epoch
                if (cfg.checkpoint_every_steps and progress["global_step"] % cfg.checkpoint_every_steps == 0
                        and not stop and not epoch_end):
                    progress["epoch_time"] += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    save(finished=False)
                if stop:
                    break
            bar.close()
            progress["epoch_time"] += time.perf_counter() - t0
            done = progress["global_step"] >= total_steps
            epoch_end = progress["step_in_epoch"] >= updates_per_epoch
            if not (epoch_end or done):  # loader ran dry early: should not happen with drop_last
                raise RuntimeError(f"epoch {epoch} ended after {progress['step_in_epoch']} of "
                                   f"{updates_per_epoch} batches")
            # mean training loss of the epoch over all ranks (each logged step shows rank 0's own)
            loss_sums = all_reduce_sum(torch.tensor([progress["epoch_loss_sum"], progress["epoch_batches"]],
                                                    dtype=torch.float64, device=dev))
            metrics: dict[str, float] = {
                "train_loss": loss_sums[0].item() / max(loss_sums[1].item(), 1.0),
                "lr": optimizer.param_groups[0]["lr"],
                tput_key: progress["epoch_samples"] / max(progress["epoch_time"], 1e-9),
                "epoch_time_s": progress["epoch_time"],
            }
            if epoch_end:
                # per-epoch schedulers (DeiT) step here; per-step ones ignore this call
                scheduler.step(epoch + 1)
            last_round = done or epoch + 1 >= cfg.epochs
            if loaders.eval is not None and ((epoch + 1) % cfg.eval_every_epochs == 0 or last_round):
                with preserved_rngs():
                    # the unwrapped model with rank 0's buffers: a DDP forward would wait on every rank,
                    # and a rank whose evaluation shard is empty never calls one
                    broadcast_buffers(model)
                    metrics.update(self._evaluate(model, loaders.eval, amp, prefix=""))
                    if ema is not None:
                        broadcast_buffers(ema.module)  # its BatchNorm statistics are each rank's own
                        metrics.update(self._evaluate(ema.module, loaders.eval, amp, prefix="ema_"))
            if self.callbacks and dist.is_main:
                with preserved_rngs():
                    self._run_callbacks(model, epoch, logger)
            row = logger.end_epoch(metrics)
            logger.step = progress["global_step"]
            if dist.is_main:  # one line per epoch: on a terminal and in a log file
                shown = ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k not in ("epoch", "step"))
                tqdm.write(f"[{cfg.model}] epoch {epoch + 1}/{cfg.epochs} "
                           f"step {progress['global_step']}: {shown}")
            if epoch_end:
                epoch += 1
                progress.update(epoch=epoch, step_in_epoch=0)
            save(finished=done or epoch >= cfg.epochs)
        if progress["global_step"] >= total_steps and last_ckpt is not None and dist.is_main:
            # a resumed run that had nothing left to do: make sure the marker says finished
            self.rundir.mark_finished(last_ckpt.name)
        logger.close()
        history = list(logger.epoch_rows)
        epochs_csv = self.run_dir / "epochs.csv"
        if not logger.enabled and dist.is_main and epochs_csv.exists():  # nothing trained: the run's own
            history = read_csv(epochs_csv)
        return TrainResult(run_dir=self.run_dir, checkpoint=last_ckpt if dist.is_main else None,
                           history=history, global_step=progress["global_step"])

    def _evaluate(self, net: nn.Module, loader: Any, amp: bool, prefix: str) -> dict[str, float]:
        res = self.task.evaluate(net, loader, self.dist.device, cfg=self.cfg, amp=amp,
                                 progress=self.cfg.progress and self.dist.is_main, desc=f"{prefix}eval")
        return {f"{prefix}eval_{k}": res[k] for k in self.task.held_out_metrics}

    def _run_callbacks(self, model: nn.Module, epoch: int, logger: MetricLogger) -> None:
        with eval_mode(model):
            for cb in self.callbacks:
                cb(model, epoch, logger)


def train(
    cfg: TrainConfig,
    *,
    callbacks: Sequence[Callback] = (),
    resume: bool | str | Path = False,
    overwrite: bool = False,
) -> TrainResult:
    """Train ``cfg`` (in this process, or as one rank of a ``torchrun`` job).

    Args:
        callbacks: called on rank 0 at the end of every epoch as ``cb(model, epoch, logger)``; see
            :mod:`kpca_attention.train`.
        resume: ``True`` continues the run in ``cfg.output_dir``; a path continues from that run or
            checkpoint directory (written to ``cfg.output_dir``).
        overwrite: start afresh even if ``cfg.output_dir`` already holds a run.
    """
    dist = init_distributed(cfg.device)
    owns_group = dist.distributed
    try:
        return _Trainer(cfg, dist, callbacks, resume, overwrite).run()
    finally:
        if owns_group:
            cleanup_distributed()

