"""Evaluation of a checkpoint: ``kpca-attention evaluate CHECKPOINT [--dataset NAME] [--split val] [--ema]``
rebuilds the model with :func:`kpca_attention.train.load_model` and asks its task for the metrics of a
split (top-1 / top-5 for classifiers, mIoU / mean accuracy / pixel accuracy for segmentation models,
sliding-window perplexity for language models).

The held-out metrics themselves belong to the tasks (:func:`evaluate_vision`, :func:`evaluate_lm`,
:func:`evaluate_segmentation`, re-exported here).
"""

from __future__ import annotations

from typing import Any

from ..checks import check_choice, check_int
from ..tasks import TASKS, Task, unread_options
from ..tasks import get as get_task
from ..tasks.classification import evaluate_vision
from ..tasks.language import evaluate_lm
from ..tasks.segmentation import evaluate_segmentation
from .config import check_device

__all__ = ["evaluate_vision", "evaluate_lm", "evaluate_segmentation", "evaluate_checkpoint",
           "refuse_unread_options"]


def refuse_unread_options(task: Task, options: dict[str, Any], *, what: str) -> None:
    """A ``ValueError`` for evaluation options that ``task`` does not read set to other than their default
    (:func:`kpca_attention.tasks.unread_options`), naming the tasks that read them: they would be ignored."""
    unread = unread_options(task, options)
    if unread:
        def readers(k: str) -> str:
            names = [f"{t.name!r} ({t.title})" for t in TASKS.values() if k in t.evaluate_options]
            return f"the models of task {' and '.join(names)} only" if names else "no task's models"

        said = "; ".join(f"--{k.replace('_', '-')} {options[k]} applies to {readers(k)}" for k in unread)
        raise ValueError(f"{said}: {what} is a model of task {task.name!r} ({task.title}); leave "
                         f"{'it' if len(unread) == 1 else 'them'} out")


def evaluate_checkpoint(
    path: str,
    *,
    dataset: str | None = None,
    split: str = "val",
    data_root: str | None = None,
    subset: int | None = None,
    batch_size: int | None = None,
    ema: bool = False,
    device: str = "auto",
    progress: bool = True,
    stride: int = 1,
) -> dict[str, Any]:
    """Metrics of a checkpoint on a dataset (default: the one it was trained on).

    Vision: top-1/top-5 on ``split``; segmentation: mIoU, mean and pixel accuracy; ``subset`` = number of
    images (a seeded sample; ``val`` of a run with a validation split is that split). LMs: sliding-window
    perplexity (window = training context, ``stride`` 1 = the paper's protocol); ``subset`` = first N tokens.

    Raises:
        ValueError: before the checkpoint is loaded, for a ``split`` other than train / val / valid /
            test, a ``subset``, ``batch_size`` or ``stride`` that is not an integer >= 1 (None: all /
            the config's ``eval_batch_size``), or a ``device`` other than auto / cpu / cuda; before any
            evaluation, for a ``stride`` other than 1 and a checkpoint that is not a language model's."""
    from .checkpoint import load_model
    from .distributed import resolve_device

    check_choice(split, "split", ("train", "val", "valid", "test"))
    check_int(subset, "subset", min=1, allow_none=True)
    check_int(batch_size, "batch_size", min=1, allow_none=True)
    check_int(stride, "stride", min=1)
    check_device(device)

    dev = resolve_device(device)
    model, cfg = load_model(path, dev, ema=ema)
    if dataset is not None:
        cfg.dataset = dataset
    if data_root is not None:
        cfg.data_root = data_root
    bs = cfg.eval_batch_size if batch_size is None else batch_size
    task = get_task(cfg.task)
    options = {"stride": stride}
    refuse_unread_options(task, options, what=path)
    metrics = task.evaluate_split(model, cfg, split, subset=subset, batch_size=bs, device=dev,
                                  progress=progress, **{k: options[k] for k in task.evaluate_options})
    used = task.split_name(cfg, split)
    note = {} if used == split else {"split_note": f"{split} asked: this run has no validation split "
                                                   f"(val_size None), so its {split} is the {used} split"}
    return {"checkpoint": str(path), "model": cfg.model, "dataset": cfg.dataset, "split": used, **note,
            **metrics}
