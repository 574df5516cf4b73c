"""Training loop: presets and overrides, exact (mid-epoch) resume, the lr schedule, callbacks,
evaluation and load_model. Tiny models (one block) on a few hundred scikit-learn digits."""

from __future__ import annotations

import math
import random

import pytest
import torch
from safetensors.torch import load_file

from kpca_attention.models import NormalizedModel
from kpca_attention.train import (
    PRESETS,
    TrainConfig,
    apply_overrides,
    evaluate_checkpoint,
    get_preset,
    load_model,
    train,
)
from kpca_attention.train.logger import read_csv

TINY = dict(
    epochs=2, train_subset=96, eval_subset=48, batch_size=16, eval_batch_size=48, progress=False,
    log_every_steps=1, model_kwargs={"depth": 1, "embed_dim": 48}, num_workers=0,
)


pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(tmp_path, name="run", **kw) -> TrainConfig:
    opts = {**TINY, **kw}
    return get_preset("digits-cpu", output_dir=str(tmp_path / name), **opts)


def weights(result) -> dict[str, torch.Tensor]:
    return load_file(str(result.checkpoint / "model.safetensors"))


def assert_same_weights(a, b, atol=0.0):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=atol, msg=f"tensor {k} differs")


# --- config -----------------------------------------------------------------------------------

def test_presets_build_and_deit_recipe():
    for name in PRESETS:
        cfg = get_preset(name)
        assert cfg.preset == name
    deit = get_preset("deit")
    assert (deit.opt, deit.weight_decay, deit.sched, deit.warmup_epochs) == ("adamw", 0.05, "cosine", 5.0)
    assert (deit.warmup_lr, deit.min_lr, deit.drop_path, deit.smoothing) == (1e-6, 1e-5, 0.1, 0.1)
    assert (deit.mixup, deit.cutmix, deit.reprob, deit.repeated_aug) == (0.8, 1.0, 0.25, 3)
    assert deit.auto_augment == "rand-m9-mstd0.5-inc1" and deit.model_ema and deit.epochs == 300
    # linear scaling rule: 5e-4 * global batch / 512
    assert deit.learning_rate(world_size=8) == pytest.approx(5e-4 * deit.batch_size * 8 / 512)
    lm = get_preset("lm")
    assert (lm.opt, lm.lr, lm.warmup_steps, lm.batch_size, lm.context) == ("adam", 2.5e-4, 2000, 96, 256)


def test_overrides_parse_and_reject_unknown():
    cfg = apply_overrides(get_preset("fmnist-cpu"), [
        "lr=3e-3", "amp=false", "img_size=None", "model_kwargs.rpc_iters=6", "opt_betas=(0.9, 0.95)",
        "model=rpc_symvit_mini_patch4_28",
    ])
    assert cfg.lr == 3e-3 and cfg.amp is False and cfg.img_size is None
    assert cfg.model_kwargs == {"rpc_iters": 6} and cfg.opt_betas == (0.9, 0.95)
    assert cfg.model == "rpc_symvit_mini_patch4_28"
    with pytest.raises(ValueError, match="unknown config key 'learning_rate'"):
        apply_overrides(cfg, ["learning_rate=1"])
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("imagenet-fast")
    with pytest.raises(ValueError, match="batch_size"):
        apply_overrides(cfg, ["batch_size=0"])
    assert TrainConfig.from_json(cfg.to_json()) == cfg


# --- exact resume -----------------------------------------------------------------------------

def test_resume_mid_epoch_equals_uninterrupted_run(tmp_path):
    """Mixup/CutMix, drop path and random crops all draw random numbers: a run stopped after 3 steps
    (mid-epoch: 6 steps per epoch) and resumed must still end bitwise where the uninterrupted run ends."""
    aug = dict(mixup=0.8, cutmix=1.0, drop_path=0.1, smoothing=0.1)
    full = train(tiny(tmp_path, "full", **aug))
    part = train(tiny(tmp_path, "part", max_steps=3, checkpoint_every_steps=2, **aug))
    assert part.global_step == 3 and part.checkpoint.name == "e0000-s00000003"
    resumed = train(tiny(tmp_path, "part", **aug), resume=True)
    assert resumed.global_step == full.global_step == 12
    assert_same_weights(full, resumed)
    # the metric files read as one uninterrupted run
    h_full, h_res = read_csv(tmp_path / "full" / "epochs.csv"), read_csv(tmp_path / "part" / "epochs.csv")
    assert [r["epoch"] for r in h_res] == [0, 1]
    for a, b in zip(h_full, h_res, strict=True):
        assert a["train_loss"] == b["train_loss"] and a["eval_top1"] == b["eval_top1"]
    steps = read_csv(tmp_path / "part" / "steps.csv")
    assert [r["step"] for r in steps] == list(range(1, 13))


def test_a_torn_last_row_of_the_step_log_leaves_the_run_resumable(tmp_path):
    """steps.csv is appended in place: a full disk or a power cut leaves a short last row, and resuming then
    failed in read_csv (float(None)). The cut row is left out; a short row inside the file is an error."""
    train(tiny(tmp_path, "run", max_steps=3))
    steps = tmp_path / "run" / "steps.csv"
    text = steps.read_text()
    steps.write_text(text[:-12])  # the last row cut off mid-way
    with pytest.warns(UserWarning, match="no line end"):
        assert len(read_csv(steps)) == 2
    with pytest.warns(UserWarning, match="no line end"):
        resumed = train(tiny(tmp_path, "run"), resume=True)
    assert resumed.global_step == 12
    # the cut row's step came before the checkpoint: its log line is the one thing lost
    assert [r["step"] for r in read_csv(steps)] == [1, 2, *range(4, 13)]
    lines = steps.read_text().splitlines()
    steps.write_text("\n".join([*lines[:2], lines[2][:5], *lines[3:]]) + "\n")
    with pytest.raises(ValueError, match="row 3 has another number of cells than the header"):
        read_csv(steps)
    steps.write_text("\n".join([*lines[:2], lines[2] + ",7", *lines[3:]]) + "\n")
    with pytest.raises(ValueError, match="row 3 has another number of cells"):  # a row too long
        read_csv(steps)


def test_resume_refuses_changed_recipe_and_fresh_start_over_existing_run(tmp_path):
    train(tiny(tmp_path, max_steps=1))
    with pytest.raises(ValueError, match="lr"):
        train(tiny(tmp_path, lr=0.5), resume=True)
    with pytest.raises(FileExistsError, match="resume"):
        train(tiny(tmp_path))


def test_resume_refuses_other_epochs(tmp_path):
    """timm's scheduler state holds the schedule's length: a run resumed with more epochs kept the old
    schedule (the new epochs at the minimum lr) while its config said it was a run of the new length."""
    train(tiny(tmp_path, max_steps=1))
    cfg = tiny(tmp_path)
    with pytest.raises(ValueError, match="epochs: checkpoint .* the lr schedule spans the epochs"):
        train(tiny(tmp_path, epochs=cfg.epochs + 1), resume=True)


# --- schedule, callbacks, evaluation ----------------------------------------------------------

def test_warm_up_longer_than_the_schedule_is_named():
    cfg = get_preset("fmnist-cpu", epochs=2, warmup_steps=30)
    assert cfg.warmup_length(10) == 3.0 and cfg.warmup_note(15) is None  # 2 epochs of warm-up: it ends
    assert "warmup_steps 30 (3 epochs at 10 updates an epoch) outlasts epochs 2" in cfg.warmup_note(10)
    assert get_preset("fmnist-cpu", epochs=2, warmup_epochs=2.0).warmup_note(10) is None


def test_scheduler_is_stepped_warmup_then_cosine(tmp_path):
    cfg = tiny(tmp_path, epochs=3, lr=1e-3, warmup_epochs=1.0, warmup_lr=1e-5, min_lr=1e-5)
    train(cfg)
    lrs = [r["lr"] for r in read_csv(tmp_path / "run" / "steps.csv")]  # lr after each of 18 steps
    assert len(lrs) == 18
    # linear warm-up from 1e-5 over epoch 1 (6 steps), then timm's cosine (warm-up inside the cosine span)
    for t in range(1, 6):
        assert lrs[t - 1] == pytest.approx(1e-5 + t * (1e-3 - 1e-5) / 6, rel=1e-6)
    for t in range(6, 19):
        cosine = 1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * t / 18))
        assert lrs[t - 1] == pytest.approx(cosine, rel=1e-6)
    assert lrs[-1] == pytest.approx(1e-5)


def test_callbacks_log_and_do_not_change_the_trajectory(tmp_path):
    calls = []

    def cb(model, epoch, logger):
        assert isinstance(model, NormalizedModel) and not model.training
        x = torch.rand(4, 1, 28, 28)  # draws from the global RNG on purpose
        random.random()
        with torch.no_grad():
            logger.log({"probe_mean_logit": model(x).mean().item()})
        calls.append((epoch, logger.step))

    plain = train(tiny(tmp_path, "plain"))
    with_cb = train(tiny(tmp_path, "cb"), callbacks=[cb])
    assert calls == [(0, 6), (1, 12)]
    assert_same_weights(plain, with_cb)
    rows = read_csv(tmp_path / "cb" / "epochs.csv")
    assert all(math.isfinite(r["probe_mean_logit"]) for r in rows)
    assert (tmp_path / "cb" / "tb").is_dir()


def test_load_model_and_evaluate_checkpoint(tmp_path):
    res = train(tiny(tmp_path, eval_subset=None, epochs=1))
    model, cfg = load_model(tmp_path / "run")
    assert isinstance(model, NormalizedModel) and not model.training and cfg.model == "symvit_mini_patch4_28"
    out = evaluate_checkpoint(str(tmp_path / "run"), progress=False)
    assert out["n"] == 200 and out["split"] == "val"  # digits-cpu: a validation split of 200 training images
    # the loop's last evaluation used the same weights and the same held-out set
    assert out["top1"] == pytest.approx(res.final["eval_top1"])
    assert 0.0 <= out["top1"] <= out["top5"] <= 1.0


@pytest.mark.filterwarnings("ignore:.*outlasts epochs")  # a recipe shortened for the test
def test_language_model_trains_and_reloads_with_its_vocabulary(tmp_path):
    cfg = get_preset("bible-cpu", output_dir=str(tmp_path / "lm"), model="rpc_symlm", train_subset=48,
                     eval_subset=4, batch_size=8, context=32, progress=False,
                     model_kwargs={"preset": "small", "n_layer": 1, "rpc_layers": [0]})
    res = train(cfg)
    row = res.final
    assert row["eval_ppl"] == pytest.approx(math.exp(row["eval_loss"]))
    assert row["tokens_per_s"] > 0 and row["eval_ppl"] < 64  # below uniform over the char vocabulary
    model, cfg2 = load_model(tmp_path / "lm")
    assert cfg2.task == "lm" and len(model.vocab) == 64 and model.vocab.level == "char"
    out = evaluate_checkpoint(str(tmp_path / "lm"), subset=200, stride=32, batch_size=8, progress=False)
    assert math.isfinite(out["ppl"]) and out["tokens"] == 200
    # counts are integers (evaluate --json wrote "tokens": 200.0, "stride": 32.0)
    assert all(type(out[k]) is int for k in ("tokens", "stride", "context"))


@pytest.mark.filterwarnings("ignore:repeated_aug=3 is not applied")  # one process: DeiT's repeats need DDP
def test_deit_recipe_runs_on_an_image_folder(tmp_path):
    """The DeiT preset end to end on a tiny ImageFolder tree: timm's RandAugment + random erasing
    transform, Mixup/CutMix with SoftTargetCrossEntropy, drop path, EMA, per-epoch lr schedule."""
    from PIL import Image

    rng = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            d = tmp_path / "data" / split / cls
            d.mkdir(parents=True)
            for i in range(8):
                arr = (torch.rand(40, 40, 3, generator=rng) * 255).to(torch.uint8).numpy()
                Image.fromarray(arr).save(d / f"{i}.png")
    cfg = get_preset("deit", dataset="imagefolder", data_root=str(tmp_path / "data"), img_size=32,
                     model="symvit_mini_patch4_32", model_kwargs={"depth": 1, "embed_dim": 48},
                     batch_size=8, epochs=2, num_workers=0, output_dir=str(tmp_path / "run"), progress=False,
                     log_every_steps=1, model_ema_decay=0.9, min_lr=1e-6)  # batch 8: peak lr 7.8e-6
    with pytest.warns(UserWarning, match=r"warmup_epochs 5 outlasts epochs 2: .* about 40% of the way"):
        res = train(cfg)  # the recipe shortened for a test: said, not refused
    rows = read_csv(tmp_path / "run" / "epochs.csv")
    assert [r["epoch"] for r in rows] == [0, 1] and all(math.isfinite(r["ema_eval_top1"]) for r in rows)
    # per-epoch schedule: lr constant within an epoch, warm-up from 1e-6 (5 warm-up epochs)
    lrs = [r["lr"] for r in read_csv(tmp_path / "run" / "steps.csv")]
    assert lrs[0] == lrs[1] == pytest.approx(1e-6) and lrs[2] == lrs[3] > lrs[0]
    model, _ = load_model(tmp_path / "run", ema=True)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 2) and res.global_step == 4


def test_loader_workers_give_the_same_batches(tmp_path):
    """Where the training batches are made changes nothing: the digits preset crops at random; its
    in-memory dataset is batched in one step on the device (``DeviceBatches``), and a ``DataLoader`` with
    two loader processes over the same items (each seeded by its index, in any process) gives the same
    batches, to the bit; ``num_workers`` stays out of the run's key, and the weights equal."""
    from torch.utils.data import DataLoader

    from kpca_attention.train.data import DeviceBatches, build_loaders
    from kpca_attention.train.distributed import DistInfo
    from kpca_attention.train.rundir import trajectory_settings

    loaders = build_loaders(tiny(tmp_path, "b"), DistInfo(), with_eval=False)
    assert isinstance(loaders.train, DeviceBatches) and len(loaders.train) == 6
    loaders.sampler.set_epoch(1)
    batched = list(loaders.train)
    loaders.sampler.set_epoch(1)
    processes = list(DataLoader(loaders.train.dataset, batch_size=16, sampler=loaders.sampler, drop_last=True,
                                num_workers=2))
    assert len(batched) == len(processes) == 6
    for (xb, yb), (xp, yp) in zip(batched, processes, strict=True):
        assert torch.equal(xb, xp) and torch.equal(yb, yp)
    loaders.sampler.set_epoch(2)
    assert not torch.equal(next(iter(loaders.train))[0], batched[0][0])  # another epoch, other crops
    base = train(tiny(tmp_path, "in-process"))
    workers = train(tiny(tmp_path, "workers", num_workers=2))
    assert workers.global_step == base.global_step == 12
    assert_same_weights(base, workers, atol=0.0)
    assert trajectory_settings(tiny(tmp_path, "a", num_workers=2)) == trajectory_settings(tiny(tmp_path, "a"))


def test_compiled_training_steps_follow_the_eager_run(tmp_path):
    """``compile=True`` (torch.compile of the training steps' module, inductor's C++ on the CPU) trains the
    same model: the same weights to float32 rounding after 12 steps, the same keys in the checkpoint (no
    ``_orig_mod.`` prefix), and a run without the field keeps its trajectory key (older runs stay
    reusable)."""
    from kpca_attention.train.rundir import trajectory_settings

    eager = train(tiny(tmp_path, "eager"))
    compiled = train(tiny(tmp_path, "compiled", compile=True))
    assert compiled.global_step == eager.global_step == 12
    assert_same_weights(eager, compiled, atol=1e-4)
    assert "compile" not in trajectory_settings(tiny(tmp_path, "x"))
    assert trajectory_settings(tiny(tmp_path, "x", compile=True))["compile"] is True


def test_repeated_augmentation_shuffles_by_seed_and_epoch():
    """timm's RepeatAugSampler (DeiT's repeated augmentation under DDP) seeds its shuffle with the epoch
    alone: every training seed saw the same data order, and the seed-to-seed spread was underestimated."""
    from kpca_attention.train.data import _base_sampler
    from kpca_attention.train.distributed import DistInfo

    data = list(range(60))
    two = DistInfo(rank=0, world_size=2)

    def order(seed, epoch):
        s = _base_sampler(data, get_preset("digits-cpu", output_dir="x", seed=seed, repeated_aug=3), two)
        s.set_epoch(epoch)
        return list(s)

    from timm.data.distributed_sampler import RepeatAugSampler

    assert isinstance(_base_sampler(data, get_preset("digits-cpu", output_dir="x", repeated_aug=3), two),
                      RepeatAugSampler)
    assert order(0, 0) == order(0, 0) and order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0) and order(0, 1) != order(1, 1)
    # one process: not applied (as timm's train.py), and said - the DeiT preset sets repeated_aug 3
    with pytest.warns(UserWarning, match="repeated_aug=3 is not applied: .* this run has one"):
        one = _base_sampler(data, get_preset("digits-cpu", output_dir="x", repeated_aug=3), DistInfo())
    assert not isinstance(one, RepeatAugSampler)


def test_resume_from_another_run_needs_an_empty_output_directory(tmp_path, monkeypatch):
    """resume=OTHER into a directory holding a run continued that directory's metric files with the other
    run's history (its rows up to the resume step stayed); now refused. An empty directory, or a checkpoint
    of the run itself, resumes."""
    from kpca_attention.train import checkpoint as ckpt_mod

    train(tiny(tmp_path, "a", max_steps=3))
    monkeypatch.setattr(ckpt_mod, "run_machine_info",  # b's machine
                        lambda device: {"cpu": "Another CPU", "device": device})
    copy = train(tiny(tmp_path, "b"), resume=tmp_path / "a")  # the run continued in a new directory
    assert copy.global_step == 12
    with pytest.raises(FileExistsError, match="already holds a training run: resume .* into an empty"):
        train(tiny(tmp_path, "b"), resume=tmp_path / "a")
    first = ckpt_mod.training_machines(tmp_path / "a")
    assert ckpt_mod.training_machines(tmp_path / "b") == [*first, {"cpu": "Another CPU", "device": "cpu"}]
    own = sorted(p for p in (tmp_path / "b" / "checkpoints").iterdir() if p.is_dir())[0]
    assert train(tiny(tmp_path, "b"), resume=own).global_step == 12  # a checkpoint of its own run


def test_untrained_copy_of_a_run_is_its_initial_weights_and_runs_of_one_recipe_share_it(tmp_path):
    """The KPCA baseline "the same network before training": a run's untrained copy is built under the run's
    training seed exactly as training builds its model, so one optimizer step of learning rate lr (Adam's
    first update is at most lr per weight, plus decoupled weight decay) separates it from the run's first
    checkpoint, while another seed's copy is far from it. ``run_identity`` gives seeds of one recipe the same
    digest and another learning rate another."""
    from kpca_attention.train.resolve import resolve_model, run_identity, untrained_copy

    lr = 1e-6
    cfg = tiny(tmp_path, seed=3, max_steps=1, epochs=1, lr=lr, warmup_epochs=0.0, min_lr=0.0)
    result = train(cfg)
    loaded = resolve_model(str(result.run_dir), pretrained=False)
    stepped = loaded.model.state_dict()
    copy = untrained_copy(loaded)
    assert copy.info["init_seed"] == 3 and loaded.info["train_seed"] == 3
    start, other = copy.model.state_dict(), untrained_copy(loaded, seed=4).model.state_dict()
    moved = far = 0
    for name, w1 in stepped.items():
        if not w1.is_floating_point():
            continue
        w0 = start[name]
        # one step, and the float32 rounding of storing w0 - step (a few units in the last place of w)
        bound = lr * (1 + cfg.weight_decay * w0.abs()) + 4 * torch.finfo(w0.dtype).eps * (w0.abs() + lr)
        assert ((w1 - w0).abs() <= bound).all(), name
        moved += int(not torch.equal(w1, w0))
        far += int((other[name] - w0).abs().max() > 100 * lr)
    assert moved > 0 and far > 0  # training took a step; another seed starts elsewhere
    ident = run_identity(cfg)
    other_seed = tiny(tmp_path, "b", seed=9, max_steps=1, epochs=1, lr=lr, warmup_epochs=0.0, min_lr=0.0)
    assert ident == {**run_identity(other_seed), "train_seed": 3}
    other_lr = tiny(tmp_path, seed=3, max_steps=1, epochs=1, lr=2 * lr, warmup_epochs=0.0, min_lr=0.0)
    assert run_identity(other_lr)["recipe"] != ident["recipe"]


def test_resuming_a_finished_run_changes_none_of_its_files_and_counts_stay_integers(tmp_path, capsys):
    # user-journey review: `train --resume` on a run finished at max_steps deleted its epochs.csv (the eval
    # row of its last, part-done epoch) and rewrote steps.csv's step and epoch columns as 20.0, 0.0
    part = train(tiny(tmp_path, "run", max_steps=3, checkpoint_every_steps=2))
    run = tmp_path / "run"
    before = {f: (run / f).read_bytes() for f in ("epochs.csv", "steps.csv", "config.json")}
    again = train(tiny(tmp_path, "run", max_steps=3), resume=True)
    assert again.global_step == part.global_step == 3
    assert {f: (run / f).read_bytes() for f in before} == before  # nothing to train: nothing rewritten
    assert "already finished at step 3 of 3: nothing to train" in capsys.readouterr().out
    assert [r["epoch"] for r in again.history] == [0]  # the run's own history
    resumed = train(tiny(tmp_path, "run", max_steps=5), resume=True)  # continued: rows cut back and appended
    assert resumed.global_step == 5
    lines = (run / "steps.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in lines[1:]] == ["1", "2", "3", "4", "5"]  # not 1.0, 2.0 ...
    assert all(line.split(",")[1] == "0" for line in lines[1:])


def test_a_derived_peak_learning_rate_below_min_lr_is_refused_when_training_starts(tmp_path):
    """lr None derives the peak from the global batch (DeiT's linear scaling rule): batch 8 on the deit preset
    gives 5e-4 x 8 / 512 = 7.8e-6, below its min_lr 1e-5, so the "decay" would rise past the peak. A given lr
    of that value was refused; the derived one trained. It is refused before any step now, naming the rule,
    and two processes' doubled batch (1.6e-5) pass."""
    cfg = get_preset("deit", batch_size=8, output_dir=str(tmp_path / "run"))
    assert cfg.learning_rate(1) == pytest.approx(7.8125e-6) and cfg.learning_rate(1) < cfg.min_lr
    with pytest.raises(ValueError, match=r"min_lr 1e-05 is above the learning rate 7.81e-06 that lr None "
                                         r"derives \(lr_base 0.0005 x global batch 8 / lr_base_size 512\)"):
        cfg.check_schedule(1)
    cfg.check_schedule(2)
    with pytest.raises(ValueError, match="min_lr 1e-05 is above lr 7.8125e-06"):
        get_preset("deit", batch_size=8, lr=7.8125e-06)
    with pytest.raises(ValueError, match="above the learning rate 7.81e-06 that lr None derives"):
        train(get_preset("digits-cpu", lr=None, lr_base=5e-4, lr_base_size=512, batch_size=8, max_steps=1,
                         train_subset=16, eval_subset=8, progress=False, output_dir=str(tmp_path / "t")))
    assert not (tmp_path / "t" / "checkpoints").exists()  # refused before the first step
