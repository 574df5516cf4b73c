"""A recipe's values reach what they configure: the splits held-out numbers come from, the seeded sampler
order and per-item augmentation, the transform, Mixup / CutMix and smoothing settings, the optimizer,
schedule, clipping and EMA, resume, and the runs a study trains with their configs and seeds.

The existing tests compare two runs (resumed vs uninterrupted, DDP vs one process), which are blind to a
field both sides drop: a fourth mutation review (2026-11-30, /work/notes/review/mutation4.md) found 57
such mutants surviving. Each test here fails on at least one of them; expected values are computed by hand
or from torch / numpy / python primitives, not by the code under test. Tiny models on a few dozen digits
images."""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from kpca_attention.tasks import get as get_task
from kpca_attention.train import apply_overrides, get_preset, load_model, train
from kpca_attention.train.config import TrainConfig
from kpca_attention.train.logger import read_csv

TINY = dict(
    epochs=2, train_subset=96, eval_subset=48, batch_size=16, eval_batch_size=48, progress=False,
    log_every_steps=1, model_kwargs={"depth": 1, "embed_dim": 48}, num_workers=0,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(tmp_path, name="run", **kw) -> TrainConfig:
    return get_preset("digits-cpu", output_dir=str(tmp_path / name), **{**TINY, **kw})


def _hash(x: torch.Tensor) -> str:
    return hashlib.sha1(x.contiguous().numpy().tobytes()).hexdigest()


# --- which data: splits -----------------------------------------------------------------------

def test_legacy_held_out_set_is_the_test_split() -> None:
    """I01: without a validation split (val_size None) the per-epoch evaluation is documented to measure
    the test split; a held-out set drawn from the training images would report training accuracy."""
    cfg = get_preset("digits-cpu", val_size=None, eval_subset=None, output_dir="unused")
    task = get_task(cfg.task)
    held = task.datasets(cfg).held_out
    test = task.test_set(cfg)
    assert len(held) == len(test)
    assert {_hash(held[i][0]) for i in range(len(held))} == {_hash(test[i][0]) for i in range(len(test))}


def test_eval_subset_samples_the_validation_split() -> None:
    """I04: eval_subset N evaluates N of the validation images (as documented), not all of them."""
    cfg = get_preset("digits-cpu", eval_subset=50, output_dir="unused")  # val_size 200
    held = get_task(cfg.task).datasets(cfg).held_out
    full = get_task(cfg.task).datasets(
        get_preset("digits-cpu", eval_subset=None, output_dir="unused")).held_out
    assert len(held) == 50 and len(full) == 200 and set(held.indices) < set(full.indices)


def test_the_validation_split_is_the_val_seed_draw() -> None:
    """I05: the validation split (training's held-out set and ``evaluate --split val``) is val_size indices
    of torch.randperm under val_seed, for any val_seed."""
    cfg = get_preset("digits-cpu", val_seed=7, output_dir="unused")
    task = get_task(cfg.task)
    n = len(task.builder(cfg)("train", False, None))
    expected = sorted(torch.randperm(n, generator=torch.Generator().manual_seed(7))[:200].tolist())
    assert list(task.validation_set(cfg).indices) == expected
    assert list(task.datasets(cfg).held_out.indices) == expected


def test_language_held_out_windows_are_the_valid_split_and_offsets_follow_augment() -> None:
    """L01, L02: the LM's per-epoch evaluation reads the corpus's valid split (not test); the training
    windows take a random offset exactly when ``augment``."""
    from kpca_attention.tasks.language import build_vocab, corpus

    cfg = get_preset("bible-cpu", output_dir="unused", context=32, eval_subset=2, train_subset=8)
    splits = get_task("lm").datasets(cfg)
    text = corpus(cfg.dataset, cfg.data_root)
    ids = build_vocab(cfg).encode(text.valid)
    x, y = splits.held_out[0]
    assert torch.equal(x, ids[:32]) and torch.equal(y, ids[1:33])
    assert splits.train.random_offset is True
    off = get_task("lm").datasets(get_preset("bible-cpu", output_dir="unused", context=32, train_subset=8,
                                             augment=False), with_eval=False)
    assert off.train.random_offset is False


# --- how: augmentation and Mixup wiring --------------------------------------------------------

def _folder(root):
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(2):
                Image.fromarray((torch.rand(40, 40, 3, generator=g) * 255).to(torch.uint8).numpy()).save(
                    d / f"{i}.png")
    return root


def _transforms(tf):
    out = [tf]
    for t in getattr(tf, "transforms", []):
        out += _transforms(t)
    inner = getattr(tf, "inner", None)
    return out + ([inner] if inner is not None else [])


def test_the_recipes_transform_options_reach_the_folder_training_transform(tmp_path) -> None:
    """C01-C03: the DeiT recipe's RandAugment and random erasing reach the ImageFolder training transform,
    and a recipe that turns them off gets none (the transform's own defaults are DeiT's)."""
    from timm.data.auto_augment import RandAugment
    from timm.data.random_erasing import RandomErasing

    root = _folder(tmp_path / "data")
    kw = dict(dataset="imagefolder", data_root=str(root), img_size=32, model="symvit_mini_patch4_32",
              output_dir="unused")
    deit = get_preset("deit", **kw)
    parts = _transforms(get_task("vision").builder(deit)("train", True, None).transform)
    ra = [t for t in parts if isinstance(t, RandAugment)]
    erase = [t for t in parts if isinstance(t, RandomErasing)]
    assert len(ra) == 1 and ra[0].num_layers == 2  # rand-m9-mstd0.5-inc1: two ops
    assert len(erase) == 1 and erase[0].probability == 0.25
    plain = get_preset("deit", **kw, auto_augment=None, reprob=0.0)
    parts = _transforms(get_task("vision").builder(plain)("train", True, None).transform)
    assert not [t for t in parts if isinstance(t, (RandAugment, RandomErasing))]


def test_the_segmentation_recipes_flip_probability_reaches_its_training_scenes() -> None:
    """S02: hflip 1 flips every training scene (image and label), hflip 0 none (scenes' only augmentation)."""
    for p, flipped in ((1.0, True), (0.0, False)):
        cfg = get_preset("fmnist-seg-cpu", hflip=p, train_subset=8, val_size=64, output_dir="unused")
        task = get_task(cfg.task)
        train_set = task.datasets(cfg, with_eval=False).train
        plain = task.builder(cfg)("train", False, None)
        for i in range(8):
            x, y = train_set[i]
            x0, y0 = plain[train_set.indices[i]]
            if flipped:
                x0, y0 = x0.flip(-1), y0.flip(-1)
            assert torch.equal(x, x0) and torch.equal(y, y0), (p, i)


def test_segmentation_loss_applies_the_recipes_smoothing_and_ignores_255() -> None:
    """S03: per-pixel cross-entropy with smoothing s over the labelled pixels, by hand."""
    s = 0.2
    cfg = get_preset("fmnist-seg-cpu", smoothing=s, output_dir="unused")
    loss = get_task("segmentation").objective(cfg, {}).loss
    logits = torch.tensor([[[[2.0, 0.0]], [[0.0, 1.0]], [[-1.0, 0.5]]]])  # (1, 3 classes, 1, 2)
    y = torch.tensor([[[1, 255]]])
    logp = logits[0, :, 0, 0].log_softmax(0)
    expected = (1 - s) * -logp[1] + s * -logp.mean()
    assert loss(lambda x: x, logits, y).item() == pytest.approx(expected.item(), rel=1e-6)


def test_mixup_cutmix_settings_reach_timms_mixup() -> None:
    """C05-C08: every Mixup/CutMix field of the recipe reaches timm's Mixup; CutMix alone still mixes."""
    cfg = get_preset("digits-cpu", output_dir="x", mixup=0.3, cutmix=0.7, mixup_prob=0.6,
                     mixup_switch_prob=0.2, smoothing=0.15, mixup_mode="pair")
    mix = get_task("vision").objective(cfg, {"num_classes": 10}).mix
    assert (mix.mixup_alpha, mix.cutmix_alpha, mix.mix_prob, mix.switch_prob) == (0.3, 0.7, 0.6, 0.2)
    assert (mix.label_smoothing, mix.mode, mix.num_classes) == (0.15, "pair", 10)
    only = get_task("vision").objective(get_preset("digits-cpu", output_dir="x", cutmix=1.0),
                                        {"num_classes": 10})
    assert only.mix is not None and (only.mix.mixup_alpha, only.mix.cutmix_alpha) == (0.0, 1.0)


def test_label_smoothing_value_is_the_recipes() -> None:
    """C09: the loss with smoothing s is (1 - s) NLL + s mean(-log p), by hand."""
    s = 0.3
    cfg = get_preset("digits-cpu", output_dir="x", smoothing=s)
    loss = get_task("vision").objective(cfg, {"num_classes": 3}).loss
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    y = torch.tensor([0, 2])
    logp = logits.log_softmax(-1)
    expected = ((1 - s) * -logp[torch.arange(2), y] + s * -logp.mean(-1)).mean()
    assert loss(lambda x: x, logits, y).item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_sampler_order_is_the_seeded_epoch_permutation(tmp_path) -> None:
    """D04-D06: in one process the order of epoch e is torch.randperm(n) under seed + e (DistributedSampler's
    rule), so it changes with the epoch and with the training seed."""
    from kpca_attention.train.data import build_loaders
    from kpca_attention.train.distributed import DistInfo

    for seed in (0, 3):
        loaders = build_loaders(tiny(tmp_path, seed=seed), DistInfo(), with_eval=False)
        for epoch in (0, 1):
            loaders.sampler.set_epoch(epoch)
            order = [i for i, _ in loaders.sampler]
            expected = torch.randperm(96, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
            assert order == expected, (seed, epoch)


def test_augmentation_seeds_depend_on_the_training_seed_and_the_epoch(tmp_path) -> None:
    """D01, D02: the per-item augmentation seeds of two training seeds, or of two epochs, never coincide (the
    crops of seed 1 / epoch 1 are not those of seed 0 / epoch 0 at the same positions)."""
    from kpca_attention.train.data import build_loaders
    from kpca_attention.train.distributed import DistInfo

    seeds = []
    for seed, epoch in ((0, 0), (1, 0), (0, 1)):
        loaders = build_loaders(tiny(tmp_path, seed=seed), DistInfo(), with_eval=False)
        loaders.sampler.set_epoch(epoch)
        seeds.append([s for _, s in loaders.sampler])
    assert len(set(seeds[0])) == 96
    assert not set(seeds[0]) & set(seeds[1])  # another training seed: other crops
    assert not set(seeds[0]) & set(seeds[2])  # another epoch: other crops of every image


def test_in_memory_batches_drop_the_incomplete_last_batch(tmp_path) -> None:
    """D14: 100 training images in batches of 16 are 6 full batches an epoch (drop_last, as the loop's step
    count assumes), the 4 images left over are not a 7th batch."""
    from kpca_attention.train.data import DeviceBatches, build_loaders
    from kpca_attention.train.distributed import DistInfo

    loaders = build_loaders(tiny(tmp_path, train_subset=100), DistInfo(), with_eval=False)
    assert isinstance(loaders.train, DeviceBatches)
    loaders.sampler.set_epoch(0)
    assert [len(y) for _, y in loaders.train] == [16] * 6


class _RandomItems(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.rand(3), random.random(), float(np.random.rand())


def test_per_item_augmentation_follows_the_items_seed() -> None:
    """D09, D10: ``SeededAugmentation`` runs an item under its seed: python, numpy and torch draw what
    generators seeded with it draw; another seed for the same index gives other values."""
    from kpca_attention.train.data import SeededAugmentation

    ds = SeededAugmentation(_RandomItems())
    t, p, n = ds[(1, 12345)]
    assert torch.equal(t, torch.rand(3, generator=torch.Generator().manual_seed(12345)))
    assert p == random.Random(12345).random()
    assert n == np.random.RandomState(12345).rand()
    assert ds[(1, 777)][1] != p and ds[(2, 12345)][1] == p


def test_preserved_rngs_restores_every_global_generator() -> None:
    """D11: code inside ``preserved_rngs`` (evaluation, callbacks) leaves python's, numpy's and torch's
    generators where they were (numpy feeds timm's Mixup)."""
    from kpca_attention.train.data import preserved_rngs

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with preserved_rngs():
        random.random(), np.random.rand(5), torch.rand(5)
    after = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    assert after == (random.random(), float(np.random.rand()), float(torch.rand(1)))


def test_repeated_augmentation_repeats_as_many_times_as_asked() -> None:
    """D07: under DDP repeated_aug=r yields each index r times over the ranks (timm's RepeatAugSampler)."""
    from kpca_attention.train.data import _base_sampler
    from kpca_attention.train.distributed import DistInfo

    s = _base_sampler(list(range(600)), get_preset("digits-cpu", output_dir="x", repeated_aug=2),
                      DistInfo(rank=0, world_size=2))
    assert s.num_repeats == 2


# --- recipes -----------------------------------------------------------------------------------

def test_recipe_values_of_the_presets() -> None:
    """F04, F06: the DeiT preset's EMA decay and the LM preset's schedule ends (docs: cosine to 0)."""
    deit, lm = get_preset("deit"), get_preset("lm")
    assert deit.model_ema_decay == 0.99996
    assert (lm.warmup_lr, lm.min_lr) == (1e-7, 0.0)


def test_zero_warmup_steps_is_no_warmup() -> None:
    """F02: warmup_steps=0 is no warm-up (validate() reads it so), not the preset's warmup_epochs."""
    assert get_preset("lm", warmup_steps=0).warmup_length(100) == 0.0
    assert get_preset("fmnist-cpu", warmup_steps=0).warmup_length(100) == 0.0  # preset warmup_epochs 0.5


def test_warmup_lr_above_lr_is_refused() -> None:
    """F03."""
    with pytest.raises(ValueError, match="warmup_lr"):
        get_preset("digits-cpu", lr=1e-3, warmup_lr=2e-3, warmup_epochs=1.0, output_dir="x")


def test_a_dotted_override_keeps_the_presets_other_model_kwargs() -> None:
    """F07: --set model_kwargs.n_layer=1 on bible-cpu changes one entry and keeps preset 'small'."""
    cfg = apply_overrides(get_preset("bible-cpu"), ["model_kwargs.n_layer=1"])
    assert cfg.model_kwargs == {"preset": "small", "n_layer": 1}


# --- how: the training loop ----------------------------------------------------------------------

def test_optimizer_settings_reach_the_optimizer(tmp_path) -> None:
    """P04-P06: opt_eps, opt_betas and weight_decay are in the optimizer state the checkpoint holds."""
    res = train(tiny(tmp_path, max_steps=1, opt_eps=1e-3, opt_betas=(0.8, 0.9), weight_decay=0.07))
    groups = torch.load(res.checkpoint / "state.pt", weights_only=True)["optimizer"]["param_groups"]
    assert all(g["eps"] == 1e-3 and tuple(g["betas"]) == (0.8, 0.9) for g in groups)
    assert max(g["weight_decay"] for g in groups) == 0.07


@pytest.mark.filterwarnings("ignore:.*outlasts epochs")
def test_warmup_steps_are_steps_and_update_the_lr_every_step(tmp_path) -> None:
    """P08, P09: warmup_steps=3 is a linear warm-up over 3 optimizer steps, stepped per update even when
    sched_on_steps is False (the field's comment: it implies per-step scheduling)."""
    train(tiny(tmp_path, lr=1e-3, warmup_steps=3, warmup_lr=1e-5, min_lr=1e-5, sched_on_steps=False))
    lrs = [r["lr"] for r in read_csv(tmp_path / "run" / "steps.csv")]
    assert len(lrs) == 12
    for t in (1, 2):
        assert lrs[t - 1] == pytest.approx(1e-5 + t * (1e-3 - 1e-5) / 3, rel=1e-6)
    for t in (3, 7, 12):  # timm's cosine over the 12 updates after the warm-up
        want = 1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * t / 12))
        assert lrs[t - 1] == pytest.approx(want, rel=1e-6)


def test_ema_decay_zero_makes_the_ema_the_weights(tmp_path) -> None:
    """P11, P22, K03: with model_ema_decay 0 the EMA after every step is the model itself."""
    res = train(tiny(tmp_path, max_steps=3, model_ema=True, model_ema_decay=0.0))
    model = load_file(str(res.checkpoint / "model.safetensors"))
    ema = load_file(str(res.checkpoint / "ema.safetensors"))
    assert model.keys() == ema.keys()
    for k in model:
        assert torch.equal(model[k], ema[k]), k


def test_resume_is_exact_for_the_ema_weights(tmp_path) -> None:
    """P12: a resumed run's EMA continues from the checkpoint's EMA, to the bit."""
    kw = dict(model_ema=True, model_ema_decay=0.9)
    full = train(tiny(tmp_path, "full", **kw))
    train(tiny(tmp_path, "part", max_steps=3, **kw))
    resumed = train(tiny(tmp_path, "part", **kw), resume=True)
    a = load_file(str(full.checkpoint / "ema.safetensors"))
    b = load_file(str(resumed.checkpoint / "ema.safetensors"))
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_the_ema_metrics_measure_the_ema_weights(tmp_path) -> None:
    """P17: ema_eval_* of the last epoch are the EMA weights' numbers on the validation split."""
    from torch.utils.data import DataLoader

    from kpca_attention.train import evaluate_vision

    train(tiny(tmp_path, model_ema=True, eval_subset=None))
    row = read_csv(tmp_path / "run" / "epochs.csv")[-1]
    model, cfg = load_model(tmp_path / "run", ema=True)
    res = evaluate_vision(model, DataLoader(get_task(cfg.task).validation_set(cfg), batch_size=100))
    assert row["ema_eval_loss"] == pytest.approx(res["loss"], rel=1e-5)
    assert row["ema_eval_loss"] != pytest.approx(row["eval_loss"], rel=1e-3)  # not the raw weights'


def test_gradient_clipping_bounds_the_first_step(tmp_path) -> None:
    """P14: with clip_grad c the first SGD step (Nesterov momentum 0.9: 1.9 x the gradient) moves the weights
    by at most 1.9 lr c in norm; unclipped, the same step moves them far more."""
    from kpca_attention.train.resolve import resolve_model, untrained_copy

    kw = dict(max_steps=1, epochs=1, opt="sgd", lr=0.5, weight_decay=0.0, warmup_epochs=0.0, min_lr=0.0)
    for name, clip in (("clipped", 1e-4), ("free", None)):
        res = train(tiny(tmp_path, name, clip_grad=clip, **kw))
        loaded = resolve_model(str(res.run_dir), pretrained=False)
        w1, w0 = loaded.model.state_dict(), untrained_copy(loaded).model.state_dict()
        moved = math.sqrt(sum(float(((w1[k] - w0[k]).double() ** 2).sum())
                              for k in w1 if w1[k].is_floating_point()))
        if clip is not None:
            assert moved <= 1.9 * 0.5 * clip * 1.01 + 1e-6
        else:
            assert moved > 100 * 1.9 * 0.5 * 1e-4


def test_the_loop_passes_each_epoch_to_the_sampler(tmp_path, monkeypatch) -> None:
    """P15: epoch e's batches come from the sampler set to epoch e (its shuffle and augmentation seeds)."""
    from kpca_attention.train import data

    calls = []
    original = data.SeededSampler.set_epoch

    def spy(self, epoch, start=0):
        calls.append((epoch, start))
        return original(self, epoch, start)

    monkeypatch.setattr(data.SeededSampler, "set_epoch", spy)
    train(tiny(tmp_path, epochs=3))
    assert calls == [(0, 0), (1, 0), (2, 0)]


def test_the_last_epoch_is_evaluated_whatever_eval_every_epochs(tmp_path) -> None:
    """P18: the run's final numbers exist even when eval_every_epochs does not divide the epochs."""
    train(tiny(tmp_path, epochs=3, eval_every_epochs=2))
    rows = read_csv(tmp_path / "run" / "epochs.csv")
    assert [math.isfinite(r.get("eval_top1", math.nan)) for r in rows] == [False, True, True]


def test_resume_refuses_another_seed(tmp_path) -> None:
    """P19: the seed fixes init, order and augmentation: a checkpoint of seed 0 is not continued as seed 1."""
    train(tiny(tmp_path, max_steps=1))
    with pytest.raises(ValueError, match="seed"):
        train(tiny(tmp_path, seed=1), resume=True)


def test_checkpoint_every_steps_is_the_cadence(tmp_path) -> None:
    """P21: checkpoints at steps 2 and 4 and the stop at 5; the last two are kept."""
    train(tiny(tmp_path, max_steps=5, checkpoint_every_steps=2))
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir())
    assert names == ["e0000-s00000004", "e0000-s00000005"]


# --- checkpoints -------------------------------------------------------------------------------

def test_weights_missing_a_tensor_are_refused(tmp_path) -> None:
    """K05: a weights file without one of the model's tensors is refused, never loaded leaving it at init."""
    from safetensors.torch import save_file

    from kpca_attention.train.checkpoint import CheckpointError, load_weights

    res = train(tiny(tmp_path, max_steps=1))
    model, _ = load_model(tmp_path / "run")
    w = load_file(str(res.checkpoint / "model.safetensors"))
    dropped = sorted(w)[0]
    del w[dropped]
    save_file(w, str(tmp_path / "partial.safetensors"))
    with pytest.raises(CheckpointError, match="missing"):
        load_weights(model, tmp_path / "partial.safetensors")


# --- studies -------------------------------------------------------------------------------------

def _lm_study(**kw):
    from kpca_attention.studies import Study, Variant
    from kpca_attention.tasks.language.suites import LMSuites

    opts = dict(name="mine", title="t", preset="bible-cpu", seeds=(0, 1, 2), baseline="a", suites=LMSuites(),
                variants=(Variant("a", "A", "symlm"),
                          Variant("b", "B", "symlm", seeds=(1,),
                                  recipe={"lr": 2e-3, "model_kwargs": {"n_layer": 1}})),
                recipe={"lr": 5e-4, "epochs": 2})
    return Study(**{**opts, **kw})


def test_a_runs_config_is_preset_then_study_recipe_then_variant_recipe_and_its_own_seed() -> None:
    """E01-E05: the variant's recipe wins over the study's, which wins over the preset's; its model_kwargs
    are merged; each run trains with its own seed; a variant restricted to some seeds runs only those."""
    study = _lm_study()
    a, b = study.variants
    cfg_a, cfg_b = study.train_config(a, 2, "x"), study.train_config(b, 1, "y")
    assert (cfg_a.lr, cfg_a.epochs, cfg_a.seed, cfg_a.model_kwargs) == (5e-4, 2, 2, {"preset": "small"})
    assert (cfg_b.lr, cfg_b.epochs, cfg_b.seed) == (2e-3, 2, 1)
    assert cfg_b.model_kwargs == {"preset": "small", "n_layer": 1}
    assert [(v.slug, s) for v, s in study.runs()] == [("a", 0), ("a", 1), ("b", 1), ("a", 2)]


def test_the_run_key_names_the_seed(tmp_path) -> None:
    """E11: the key of a run's stored items holds its own seed (seed 1's items are not seed 0's)."""
    from kpca_attention.studies.engine import _run_key

    study = _lm_study()
    k0, k1 = (_run_key(study, study.variants[0], s, tmp_path) for s in (0, 1))
    assert k0["train"]["seed"] == 0 and k1["train"]["seed"] == 1


def test_a_folder_refuses_another_recipe_for_the_study_or_a_variant(tmp_path) -> None:
    """E06, E07: settings.json pins the study's recipe and each variant's: another one is refused."""
    from kpca_attention.studies import Variant
    from kpca_attention.studies.engine import _check_settings

    _check_settings(_lm_study(), tmp_path, force=False)
    with pytest.raises(ValueError, match="recipe"):
        _check_settings(_lm_study(recipe={"lr": 1e-3, "epochs": 2}), tmp_path, force=False)
    other = (Variant("a", "A", "symlm"), Variant("b", "B", "symlm", seeds=(1,), recipe={"lr": 3e-3}))
    with pytest.raises(ValueError, match="variant b"):
        _check_settings(_lm_study(variants=other), tmp_path, force=False)


def test_another_studys_results_under_another_key_are_not_taken(tmp_path) -> None:
    """E08: Study.reuse refers to another study's results only when they hold this run's items with this
    study's key; a file made with another recipe is left alone."""
    from kpca_attention.robustness.store import ResultStore
    from kpca_attention.studies.engine import _run_key, _take_from_other_studies, result_path

    other = _lm_study(name="other", recipe={"lr": 1e-3, "epochs": 2})
    mine = _lm_study(reuse=("other",))
    a = mine.variants[0]
    theirs = result_path(tmp_path / "other", a, 0)
    ResultStore(theirs).put("run", _run_key(other, a, 0, tmp_path / "runs"), {"steps": 1})
    logs = []
    _take_from_other_studies(mine, a, 0, tmp_path / "mine", tmp_path / "runs", logs.append)
    assert not result_path(tmp_path / "mine", a, 0).exists()
    assert any("not reused" in m for m in logs)


def test_the_training_streams_after_init_are_seeded_by_the_training_seed(tmp_path, monkeypatch) -> None:
    """P02: dropout, drop path and Mixup draw from generators seeded by the run's seed (rank 0: the seed
    itself), not by a constant: the first training forward sees torch's generator seeded with it."""
    task = get_task("vision")
    original = type(task).build_model
    seen = []

    def build(self, cfg, info=None):
        model = original(self, cfg, info)
        model.register_forward_pre_hook(
            lambda m, a: seen.append(torch.initial_seed()) if m.training else None)
        return model

    monkeypatch.setattr(type(task), "build_model", build)
    train(tiny(tmp_path, seed=5, max_steps=1))
    assert seen[0] == 5


def test_ddp_scales_the_derived_learning_rate_by_the_number_of_processes(tmp_path) -> None:
    """P07: lr None is lr_base x global batch / lr_base_size: 2 processes of batch 8 are a global batch of
    16."""
    import os
    import subprocess
    import sys

    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "kpca_attention.cli", "train", "--preset", "digits-cpu", "-o", str(out), "--no-progress",
           "--device", "cpu", "--batch-size", "8", "--max-steps", "1"]
    for kv in ("lr=None", "lr_base=0.004", "lr_base_size=512", "min_lr=0.0", "warmup_lr=0.0", "epochs=1",
               "train_subset=32", "eval_subset=8", "model_kwargs={'depth': 1, 'embed_dim': 48}"):
        cmd += ["--set", kv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    from kpca_attention.train.checkpoint import resolve_checkpoint

    groups = torch.load(resolve_checkpoint(out) / "state.pt", weights_only=True)["optimizer"]["param_groups"]
    assert groups[0]["initial_lr"] == pytest.approx(0.004 * 8 * 2 / 512)


def test_a_ddp_run_resumes_each_rank_with_its_own_generators(tmp_path) -> None:
    """P13, P20 (slow: three 2-process runs, ~17 s): Mixup draws from each rank's numpy generator; a DDP run
    stopped after 2 of 4 steps and resumed ends where the uninterrupted DDP run ends, to the bit, only if
    every rank gets back its own generator states (not rank 0's)."""
    import os
    import subprocess
    import sys

    def torchrun(out, *extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "kpca_attention.cli", "train", "--preset", "digits-cpu", "-o", str(out), "--no-progress",
               "--device", "cpu", "--batch-size", "8", *extra]
        for kv in ("epochs=1", "train_subset=64", "eval_subset=8", "mixup=0.8", "cutmix=1.0",
                   "model_kwargs={'depth': 1, 'embed_dim': 48}"):
            cmd += ["--set", kv]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    from kpca_attention.train.checkpoint import resolve_checkpoint

    torchrun(tmp_path / "full")
    torchrun(tmp_path / "part", "--max-steps", "2")
    torchrun(tmp_path / "part", "--resume", "--set", "max_steps=None")  # the checkpoint's config had 2
    a = load_file(str(resolve_checkpoint(tmp_path / "full") / "model.safetensors"))
    b = load_file(str(resolve_checkpoint(tmp_path / "part") / "model.safetensors"))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # P20: the epoch's mean training loss over both ranks includes each rank's own steps before the stop
    full, part = read_csv(tmp_path / "full" / "epochs.csv"), read_csv(tmp_path / "part" / "epochs.csv")
    assert full[-1]["train_loss"] == part[-1]["train_loss"]


def test_a_state_file_holding_a_pickled_object_is_refused_even_with_valid_hashes(tmp_path) -> None:
    """K04: state.pt is read with weights_only=True: an object outside tensors and plain values (here a
    datetime.date, with COMPLETE's size and hash updated to match) is refused, never unpickled."""
    import datetime
    import json

    from kpca_attention.train.checkpoint import CheckpointError, load_checkpoint

    res = train(tiny(tmp_path, max_steps=1))
    ckpt = res.checkpoint
    torch.save({"progress": {"epoch": 0}, "when": datetime.date(2020, 1, 1)}, ckpt / "state.pt")
    marker = json.loads((ckpt / "COMPLETE").read_text())
    data = (ckpt / "state.pt").read_bytes()
    marker["files"]["state.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "COMPLETE").write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match="pickled"):
        load_checkpoint(tmp_path / "run")


def test_a_study_trains_each_run_with_its_own_seed(tmp_path, monkeypatch) -> None:
    """E14: ensure_trained trains (variant, seed) with that seed: the config handed to train() says it."""
    from kpca_attention.studies import runs as runs_mod

    got = []
    monkeypatch.setattr(runs_mod, "train", lambda cfg, resume=False: got.append((cfg.seed, cfg.output_dir)))
    study = _lm_study()
    runs_mod.ensure_trained(study, study.variants[0], 2, tmp_path, progress=False, log=lambda m: None)
    assert got == [(2, str(tmp_path / "a-s2"))]


def test_run_study_runs_only_the_seeds_asked_for(tmp_path, monkeypatch) -> None:
    """E09: run_study(seeds=(1,)) trains and evaluates seed 1 of every variant that has it, nothing else."""
    from kpca_attention.studies import engine

    done = []
    monkeypatch.setattr(engine, "run_one", lambda study, slug, seed, *a, **k: done.append((slug, seed)))
    engine.run_study(_lm_study(), tmp_path / "out", seeds=(1,), report=False, checks=False, progress=False)
    assert done == [("a", 1), ("b", 1)]
