"""Training and evaluation: presets, the loop, checkpoints, torchrun/DDP.

Entry points::

    from kpca_attention.train import get_preset, train, load_model
    cfg = get_preset("fmnist-cpu", model="rpc_symvit_mini_patch4_28", output_dir="runs/rpc")
    result = train(cfg)                       # or: kpca-attention train --preset fmnist-cpu ...
    model, cfg = load_model("runs/rpc")       # NormalizedModel (vision) or the LM, eval mode

Training callbacks (``train(cfg, callbacks=[...])``): each is a callable
``callback(model, epoch, logger) -> None`` called at the end of every epoch, after evaluation, on rank 0
only, with

* ``model`` - the unwrapped model (no DDP wrapper; for vision the ``NormalizedModel`` that takes
  images (B, C, H, W) in [0, 1]), put in eval mode for the call and back in train mode afterwards;
* ``epoch`` - the 0-based index of the epoch that just ended;
* ``logger`` - a :class:`~kpca_attention.train.logger.MetricLogger`: ``logger.log({"name": value})``
  writes TensorBoard scalars at the current global step (``logger.step``) and adds columns to this
  epoch's row of ``epochs.csv``.

Callbacks run under :func:`~kpca_attention.train.data.preserved_rngs`, so whatever random numbers
they draw do not change the training trajectory (exact resume holds with callbacks too). Compute
under ``torch.no_grad()`` yourself if you need to; the loop does not impose it.
"""

from .checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from .config import PRESETS, TrainConfig, apply_overrides, get_preset
from .evaluate import evaluate_checkpoint, evaluate_lm, evaluate_vision
from .logger import MetricLogger
from .loop import Callback, TrainResult, train

__all__ = [
    "TrainConfig",
    "PRESETS",
    "get_preset",
    "apply_overrides",
    "train",
    "TrainResult",
    "Callback",
    "MetricLogger",
    "load_model",
    "load_checkpoint",
    "save_checkpoint",
    "CheckpointError",
    "evaluate_vision",
    "evaluate_lm",
    "evaluate_checkpoint",
]
