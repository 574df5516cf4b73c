"""A finished, untrained run directory for the CLI tests (the model at its initial weights, digits preset)."""

from __future__ import annotations

import torch

from kpca_attention import tasks
from kpca_attention.train.checkpoint import save_checkpoint
from kpca_attention.train.config import get_preset


def untrained_run(run_dir, model_name: str = "symvit_mini_patch4_28", seed: int = 0):
    """Write a finished checkpoint of ``model_name`` (seed ``seed``) into ``run_dir`` and return it."""
    cfg = get_preset("digits-cpu", model=model_name, output_dir=str(run_dir))
    torch.manual_seed(seed)
    model = tasks.get(cfg.task).build_model(cfg)
    save_checkpoint(run_dir, model=model, config=cfg,
                    state={"progress": {"epoch": 0, "step_in_epoch": 0, "global_step": 0}}, finished=True)
    return run_dir
