"""Segmentation through the training loop: presets, exact resume, load_model / evaluate_checkpoint, and the
ADE20K path (poly schedule, variable-size validation images) on a synthetic ADEChallengeData2016 folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from test_segmentation_data import write_ade

from kpca_attention.models import NormalizedModel, Segmenter
from kpca_attention.train import evaluate_checkpoint, get_preset, load_model, train
from kpca_attention.train.checkpoint import resolve_checkpoint
from kpca_attention.train.logger import read_csv

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = dict(epochs=2, train_subset=96, eval_subset=32, batch_size=16, eval_batch_size=32, img_size=16,
            progress=False, log_every_steps=1, drop_path=0.1,
            model_kwargs={"depth": 1, "embed_dim": 32, "decoder_layers": 1})


def weights(result) -> dict[str, torch.Tensor]:
    return load_file(str(result.checkpoint / "model.safetensors"))


def test_presets_hold_the_recipes():
    ade = get_preset("ade20k-segmenter")
    assert (ade.task, ade.dataset, ade.img_size, ade.batch_size) == ("segmentation", "ade20k", 512, 8)
    assert (ade.opt, ade.lr, ade.weight_decay, ade.sched, ade.decay_rate, ade.min_lr) == (
        "sgd", 1e-3, 0.0, "poly", 0.9, 1e-5)
    assert ade.warmup_epochs == 0 and ade.drop_path == 0.1 and ade.epochs == 64
    cpu = get_preset("fmnist-seg-cpu")
    assert cpu.task == "segmentation" and cpu.dataset == "fashion-mnist-scenes"
    with pytest.raises(ValueError, match="Mixup"):
        get_preset("fmnist-seg-cpu", mixup=0.8)


def test_resume_is_exact_and_the_checkpoint_rebuilds_the_segmenter(tmp_path):
    full = train(get_preset("fmnist-seg-cpu", output_dir=str(tmp_path / "full"), **TINY))
    part = train(get_preset("fmnist-seg-cpu", output_dir=str(tmp_path / "part"), max_steps=3,
                            checkpoint_every_steps=2, **TINY))
    assert part.global_step == 3
    resumed = train(get_preset("fmnist-seg-cpu", output_dir=str(tmp_path / "part"), **TINY), resume=True)
    assert resumed.global_step == full.global_step == 12
    wa, wb = weights(full), weights(resumed)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)
    last = full.history[-1]
    assert 0 <= last["eval_miou"] <= 1 and 0 <= last["eval_pixel_accuracy"] <= 1
    assert last["eval_pixel_accuracy"] > 0.5  # background alone is ~3/4 of the pixels: it learned that much

    model, cfg = load_model(tmp_path / "full")
    assert isinstance(model, NormalizedModel) and isinstance(model.model, Segmenter)
    assert model(torch.rand(2, 1, 16, 16)).shape == (2, 11, 16, 16)
    res = evaluate_checkpoint(str(tmp_path / "full"), subset=32, device="cpu", progress=False)
    assert res["miou"] == pytest.approx(last["eval_miou"])
    assert res["pixel_accuracy"] == pytest.approx(last["eval_pixel_accuracy"])


def test_ade20k_training_path_with_poly_schedule(tmp_path):
    root = write_ade(tmp_path / "ade", sizes=((40, 64), (48, 36), (36, 36), (40, 56)), split="training")
    write_ade(root, sizes=((30, 50), (44, 40)), split="validation")
    cfg = get_preset("ade20k-segmenter", model="segmenter_symvit_mini_patch4_32", data_root=str(root),
                     output_dir=str(tmp_path / "run"), img_size=32, batch_size=2, epochs=2, num_workers=0,
                     eval_every_epochs=1, progress=False, model_kwargs={"depth": 1, "embed_dim": 32})
    res = train(cfg)
    assert res.global_step == 4
    first = res.history[0]
    # timm's poly schedule with power decay_rate=0.9, per step: after 2 of 4 updates
    expected = 1e-5 + (1e-3 - 1e-5) * (1 - 2 / 4) ** 0.9
    assert first["lr"] == pytest.approx(expected, rel=1e-6)
    assert 0 <= first["eval_miou"] <= 1  # validation images of other sizes, labels at full resolution


def test_ddp_two_processes_match_one_process_with_the_global_batch(tmp_path):
    """torchrun, 2 CPU processes (gloo): with no augmentation, no dropout and no ignored pixels (every rank
    averages the loss over the same number of pixels) the DDP run equals one process with the global batch,
    and the sharded evaluation (confusion matrices summed over ranks) gives the same mIoU."""
    args = dict(epochs=1, train_subset=64, eval_subset=20, img_size=16, progress=False, augment=False,
                model_kwargs={"depth": 1, "embed_dim": 32, "decoder": "linear"}, log_every_steps=1)
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "kpca_attention.cli", "train", "--preset", "fmnist-seg-cpu", "-o", str(out), "--no-progress",
           "--device", "cpu", "--batch-size", "8"]
    for k, v in args.items():
        cmd += ["--set", f"{k}={v!r}" if isinstance(v, dict) else f"{k}={v}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ref = train(get_preset("fmnist-seg-cpu", output_dir=str(tmp_path / "one"), batch_size=16, **args))
    w_ddp = load_file(str(resolve_checkpoint(out) / "model.safetensors"))
    w_one = weights(ref)
    for k in w_one:
        torch.testing.assert_close(w_ddp[k], w_one[k], rtol=0, atol=1e-4, msg=f"{k}: DDP != one process")
    ddp_rows, one_rows = read_csv(out / "epochs.csv"), read_csv(tmp_path / "one" / "epochs.csv")
    assert ddp_rows[-1]["eval_miou"] == pytest.approx(one_rows[-1]["eval_miou"], abs=1e-9)
