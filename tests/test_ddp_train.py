"""A 2-process ``torchrun`` training on the CPU (gloo): only rank 0 writes, and with augmentation off
the DDP run equals the one-process run with the same global batch (gradients are averaged over ranks,
DistributedSampler splits each global batch of the same permutation between the ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from kpca_attention.train import get_preset, train
from kpca_attention.train.checkpoint import resolve_checkpoint
from kpca_attention.train.logger import read_csv

ARGS = dict(epochs=2, train_subset=128, eval_subset=40, progress=False, augment=False, smoothing=0.0,
            model_kwargs={"depth": 1, "embed_dim": 48}, log_every_steps=1)


def test_ddp_two_processes_match_one_process_with_the_global_batch(tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "kpca_attention.cli", "train", "--preset", "digits-cpu", "-o", str(out), "--no-progress",
           "--device", "cpu", "--batch-size", "8"]
    for k, v in ARGS.items():
        cmd += ["--set", f"{k}={v!r}" if isinstance(v, dict) else f"{k}={v}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ckpt = resolve_checkpoint(out)
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["finished"]
    state = torch.load(ckpt / "state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2  # both ranks' RNG states, for resume
    steps = read_csv(out / "steps.csv")
    assert [r["step"] for r in steps] == list(range(1, 17))  # rank 0 alone writes: no duplicate rows

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = train(get_preset("digits-cpu", output_dir=str(tmp_path / "one"), batch_size=16, **ARGS))
    finally:
        torch.set_num_threads(n)
    w_ddp = load_file(str(ckpt / "model.safetensors"))
    w_one = load_file(str(ref.checkpoint / "model.safetensors"))
    for k in w_one:
        torch.testing.assert_close(w_ddp[k], w_one[k], rtol=0, atol=1e-4, msg=f"{k}: DDP != one process")
    # sharded evaluation sums counts over ranks: same accuracy as one process on the same 40 images
    ddp_rows, one_rows = read_csv(out / "epochs.csv"), read_csv(tmp_path / "one" / "epochs.csv")
    assert ddp_rows[-1]["eval_top1"] == one_rows[-1]["eval_top1"]
    assert abs(ddp_rows[-1]["train_loss"] - one_rows[-1]["train_loss"]) < 1e-4


def test_ddp_with_fewer_evaluation_images_than_processes_finishes(tmp_path):
    """Evaluation ran through the DDP wrapper, whose forward waits on every rank: with one evaluation image
    and two processes, the rank with none never joined and training hung (gloo's 30-minute timeout)."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "kpca_attention.cli", "train", "--preset", "digits-cpu", "-o", str(out), "--no-progress",
           "--device", "cpu", "--batch-size", "8", "--set", "epochs=1", "--set", "train_subset=32",
           "--set", "eval_subset=1", "--set", "model_kwargs={'depth': 1, 'embed_dim': 48}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # with augmentation the 1-channel patch embedding's weight gradient came with other strides on its
    # size-1 dimension, and DDP warned on every rank; match_grad_layout re-strides it like the weight
    assert "Grad strides do not match" not in done.stderr, done.stderr[-2000:]
    row = read_csv(out / "epochs.csv")[-1]
    assert row["eval_top1"] in (0.0, 1.0)  # one image, counted once over the two ranks


class _OtherStrides(torch.autograd.Function):
    """``w.sum()`` whose backward writes the gradient with stride 1 on the size-1 dimension, as the
    convolution's backward did under DDP (strides (16, 1, 4, 1) for a (48, 1, 4, 4) weight)."""

    @staticmethod
    def forward(ctx, w):
        return w.sum()

    @staticmethod
    def backward(ctx, g):
        return (g * torch.arange(96.0).view(6, 4, 4)).as_strided((6, 1, 4, 4), (16, 1, 4, 1))


def test_match_grad_layout_gives_a_size_1_weight_its_own_strides():
    """Autograd keeps a gradient whose strides differ from its parameter's only on a size-1 dimension (the
    same memory order), which DDP's reducer warned about; the hook re-strides it like the parameter, values
    unchanged, and hooks only parameters with a size-1 dimension."""
    from kpca_attention.train.distributed import match_grad_layout

    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(6, 1, 4, 4))
    model.b = torch.nn.Parameter(torch.zeros(6, 4))
    _OtherStrides.apply(model.w).backward()
    raw = model.w.grad
    assert raw.stride() == (16, 1, 4, 1) != model.w.stride()  # what DDP's reducer warned about
    model.w.grad = None
    assert match_grad_layout(model) == 1
    _OtherStrides.apply(model.w).backward()
    assert model.w.grad.stride() == model.w.stride()
    torch.testing.assert_close(model.w.grad, raw, rtol=0, atol=0)
