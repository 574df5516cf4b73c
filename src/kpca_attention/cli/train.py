"""``kpca-attention train`` and ``kpca-attention evaluate``.

Several processes / GPUs: ``torchrun --nproc_per_node 4 -m kpca_attention.cli train --preset deit ...``
(NCCL on GPUs, gloo on CPU; only rank 0 writes).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from ..checks import check_count, option_name
from ..train.config import FIELD_CHECKS, PRESETS, apply_overrides, get_preset, parse_override
from . import THREADS_HELP, set_threads

__all__ = ["train_cmd", "evaluate_cmd"]


def _check_model_task(cfg: Any, preset: str) -> None:
    """Refuse a model of another task than the preset's, before anything is built."""
    from ..tasks import get as get_task
    from ..tasks import of_model_name

    task, owner = get_task(cfg.task), of_model_name(cfg.model)
    if owner is None:  # before --print-config prints a config nothing can train (it exited 0)
        import difflib

        import timm

        from ..models import list_models

        names = sorted(set(list_models()) | set(timm.list_models()))
        close = difflib.get_close_matches(cfg.model, names, n=3, cutoff=0.75)
        raise ValueError(f"unknown model {cfg.model!r}: neither this package's (kpca_attention.models."
                         "list_models()) nor timm's" + (f"; close names: {', '.join(close)}" if close else ""))
    if owner is not None and owner is not task:
        def a(title: str) -> str:
            return f"{'an' if title[0] in 'aeiou' else 'a'} {title}"

        from_preset = cfg.task == PRESETS.get(preset, {}).get("task")  # not changed with --set task=
        trains = f"preset {preset!r} trains" if from_preset else "the config trains"
        raise ValueError(f"model {cfg.model!r} is {a(owner.title)} model (task {owner.name!r}) but {trains} "
                         f"{task.title} (task {task.name!r}): give {a(task.title)} model with --model, or a "
                         f"preset of task {owner.name!r}")


def _saved_config(output_dir: str) -> Any:
    """The saved config of the run in ``output_dir`` (None without a checkpoint there: ``train`` then says
    there is nothing to resume)."""
    from ..train.rundir import RunDir

    rd = RunDir(output_dir)
    return rd.config() if rd.has_checkpoint() else None


def train_cmd(
    preset: Annotated[str | None, typer.Option(
        help=f"Recipe to start from: {', '.join(PRESETS)} (default fmnist-cpu; --resume starts from the "
             "run's saved config instead).")] = None,
    model: Annotated[str | None, typer.Option(help="Model name, e.g. rpc_symvit_mini_patch4_28.")] = None,
    dataset: Annotated[str | None, typer.Option(
        help="Dataset name (fashion-mnist, digits, imagenet, ...).")] = None,
    data_root: Annotated[str | None, typer.Option(
        help="Dataset folder (ImageNet, CIFAR, WikiText-103).")] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs (the lr schedule spans them).")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many optimizer steps.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size per process.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (default: the preset's rule).")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    output_dir: Annotated[str | None, typer.Option(
        "--out", "-o", "--output-dir", help="Run directory.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda.")] = None,
    threads: Annotated[int | None, typer.Option(help=THREADS_HELP)] = None,
    log_jproj: Annotated[int | None, typer.Option(
        help="Log J_proj, ||phi(q)||^2 and ||h||^2 every epoch on the first N held-out examples (the paper's "
             "Fig. 1; what `kpca-attention claims` judges P2 on).")] = None,
    num_workers: Annotated[int | None, typer.Option(help="DataLoader worker processes.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Any config field, key=value (repeatable): --set model_kwargs.rpc_iters=6.")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue the run in the output directory exactly, from its saved config (options given now "
             "change only themselves, e.g. --max-steps).")] = False,
    resume_from: Annotated[str | None, typer.Option(
        help="Continue from this run or checkpoint directory.")] = None,
    overwrite: Annotated[bool, typer.Option(
        help="Start afresh even if the output directory holds a run.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars and per-epoch lines.")] = True,
    print_config: Annotated[bool, typer.Option(help="Print the resolved config and exit.")] = False,
) -> None:
    """Train a model with a named preset plus overrides; metrics to CSV/TensorBoard, atomic checkpoints."""
    from ..train.loop import train

    set_threads(threads)
    explicit = {"model": model, "dataset": dataset, "data_root": data_root, "epochs": epochs,
                "max_steps": max_steps, "batch_size": batch_size, "lr": lr, "seed": seed,
                "output_dir": output_dir, "device": device, "num_workers": num_workers}
    if resume and (overwrite or resume_from):
        raise ValueError("--resume cannot be combined with --overwrite or --resume-from")
    if overwrite and resume_from:
        raise ValueError("--overwrite and --resume-from exclude each other")
    given = {k: v for k, v in explicit.items() if v is not None}
    for key, value in given.items():  # named as typed (--max-steps), before the config names its field
        FIELD_CHECKS[key](value, option_name(key, cli=True))
    both = sorted({parse_override(item)[0].split(".")[0] for item in set_ or []} & set(given))
    if both:
        raise ValueError(f"{', '.join(both)} given both as an option and with --set: give it once")
    saved = _saved_config(output_dir or get_preset(preset or "fmnist-cpu").output_dir) if resume else None
    if saved is not None:  # the run's own settings, and only what is given now on top
        if preset is not None and preset != saved.preset:
            raise ValueError(f"--resume continues the run with its saved config (preset {saved.preset!r}): drop "
                             f"--preset {preset} (give only what may change, e.g. --max-steps)")
        cfg = apply_overrides(saved, given)
        preset = cfg.preset or "the run's"
    else:
        preset = preset or "fmnist-cpu"
        cfg = get_preset(preset, **given)
    cfg = apply_overrides(cfg, list(set_ or []))
    _check_model_task(cfg, preset)
    if not progress:
        cfg.progress = False
    if print_config:
        typer.echo(cfg.to_json())
        return
    from ..tasks import get as get_task

    note = get_task(cfg.task).held_out_note(cfg)
    if note and os.environ.get("RANK", "0") == "0":  # under torchrun: once, from the rank that writes
        warnings.warn(note, stacklevel=1)
    callbacks = []
    if log_jproj is not None:
        from ..kpca.callback import held_out_callback

        callbacks.append(held_out_callback(cfg, log_jproj, resume=bool(resume or resume_from)))
    result = train(cfg, resume=resume_from or resume, overwrite=overwrite, callbacks=callbacks)
    if result.checkpoint is not None:
        final = {k: v for k, v in result.final.items() if isinstance(v, float)}
        summary = {"checkpoint": str(result.checkpoint), "global_step": result.global_step, **final}
        typer.echo(json.dumps(summary, indent=2))


def evaluate_cmd(
    checkpoint: Annotated[str, typer.Argument(help="Run or checkpoint directory of this project, or an image "
                                              "classifier as a timm name with an optional weights file "
                                              "(NAME@FILE; then give --dataset).")],
    dataset: Annotated[str | None, typer.Option(help="Dataset (default: the one trained on).")] = None,
    split: Annotated[str, typer.Option(
        help="train | val | test (valid: the same as val, the language corpora's name).")] = "val",
    data_root: Annotated[str | None, typer.Option(help="Dataset folder.")] = None,
    subset: Annotated[int | None, typer.Option(
        help="Evaluate on this many examples (LMs: tokens) only.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size.")] = None,
    ema: Annotated[bool, typer.Option(help="Use the EMA weights.")] = False,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "auto",
    stride: Annotated[int, typer.Option(
        help="LMs: sliding-window stride (1 = the paper's protocol; larger is a faster approximation).")] = 1,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write the metrics to this JSON file.")] = None,
    threads: Annotated[int | None, typer.Option(help=THREADS_HELP)] = None,
) -> None:
    """Top-1/top-5 accuracy (vision), mIoU, mean and pixel accuracy (segmentation) or perplexity (language
    models) of a checkpoint or model."""
    from ..io import check_output, write_text_atomic
    from ..studies.sources import LoadedSource
    from ..studies.spec import Source
    from ..train.evaluate import evaluate_checkpoint
    from . import refuse_hf_folder, refuse_inside_run

    check_output(json_out, "--json", folder=False)
    refuse_inside_run(json_out, checkpoint, "--json")
    refuse_hf_folder(checkpoint, "evaluate")
    set_threads(threads)
    ref = LoadedSource(Source(checkpoint, dataset=dataset, data_root=data_root))
    is_name = "@" in checkpoint or ("/" not in checkpoint and not Path(checkpoint).exists())
    if is_name and not dataset:
        raise ValueError(f"{checkpoint} is a model name, not a run directory: give --dataset (and --data-root) "
                         "to evaluate it")
    if ref.is_project or not dataset:
        res = evaluate_checkpoint(checkpoint, dataset=dataset, split=split, data_root=data_root, subset=subset,
                                  batch_size=batch_size, ema=ema, device=device, stride=stride)
    else:  # one model specifier: a timm classifier (with its weights file) on a dataset of this package
        from torch.utils.data import DataLoader

        from ..data.images import build_image_dataset
        from ..train.distributed import resolve_device
        from ..train.evaluate import evaluate_vision

        if batch_size is not None and batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
        from ..tasks import get as get_task
        from ..tasks.classification import ImageClassification
        from ..train.evaluate import refuse_unread_options

        refuse_unread_options(get_task(ImageClassification.name), {"stride": stride}, what=checkpoint)
        ref.device = str(resolve_device(device))
        cfg = ref.config
        data = build_image_dataset(dataset, split, root=data_root, img_size=cfg.img_size, subset=subset)
        if subset is not None and len(data) < subset:  # as for a run of this project (ImageTask.split_set)
            check_count(subset, "subset", len(data), f"the images of the {split} split of {dataset}")
        res = evaluate_vision(ref.load(), DataLoader(data, batch_size=batch_size or 256), ref.device,
                              progress=True, desc="eval")
        res = {"model": checkpoint, "dataset": dataset, "split": split, **res}
    text = json.dumps(res, indent=2)
    if json_out is not None:
        write_text_atomic(json_out, text + "\n")
    typer.echo(text)
