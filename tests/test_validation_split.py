"""The validation split every task carves from its training data (``TrainConfig.val_size``, ``val_seed``):
disjoint from the training images the loader yields and from the test set, the same across calls and
processes, recorded in the run's config, measured by the per-epoch evaluation; older configs without the
fields load as the legacy setting and keep their trajectory key."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from kpca_attention.tasks import get as get_task
from kpca_attention.tasks import seeded_sample, validation_split
from kpca_attention.train import evaluate_vision, get_preset, load_model, train
from kpca_attention.train.config import TrainConfig
from kpca_attention.train.data import build_loaders
from kpca_attention.train.distributed import DistInfo
from kpca_attention.train.logger import read_csv
from kpca_attention.train.rundir import TRAJECTORY_FREE, trajectory_settings

pytestmark = pytest.mark.usefixtures("single_thread")


def _hash(x: torch.Tensor) -> str:
    return hashlib.sha1(x.contiguous().numpy().tobytes()).hexdigest()


def test_validation_split_partitions_the_training_indices() -> None:
    train_idx, val_idx = validation_split(1000, 150, seed=3)
    assert len(val_idx) == 150 and len(train_idx) == 850
    assert not set(train_idx) & set(val_idx) and set(train_idx) | set(val_idx) == set(range(1000))
    assert train_idx == sorted(train_idx) and val_idx == sorted(val_idx)
    assert validation_split(1000, 150, seed=3) == (train_idx, val_idx)  # the same on every call
    assert validation_split(1000, 150, seed=4)[1] != val_idx  # the seed chooses it
    # not the first or last 150: a draw over the whole training set
    assert val_idx != list(range(150)) and val_idx != list(range(850, 1000))
    with pytest.raises(ValueError, match="val_size"):
        validation_split(10, 10)


def test_validation_split_is_the_same_in_another_process() -> None:
    code = ("import json; from kpca_attention.tasks import validation_split; "
            "print(json.dumps(validation_split(60000, 2000, 0)[1]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == validation_split(60000, 2000, 0)[1]


def test_seeded_sample_draws_from_the_given_indices() -> None:
    pool = list(range(10, 110))
    pick = seeded_sample(pool, 20)
    assert len(pick) == 20 and set(pick) <= set(pool) and pick == sorted(pick)
    assert seeded_sample(pool, 20) == pick and seeded_sample(pool, None) == pool
    assert seeded_sample(pool, 500) == pool


def test_image_validation_is_disjoint_from_training_and_test_images() -> None:
    cfg = get_preset("fmnist-cpu", val_size=300, train_subset=900, eval_subset=None, augment=False,
                     batch_size=100, output_dir="unused")
    task = get_task(cfg.task)
    loaders = build_loaders(cfg, DistInfo())
    held = loaders.eval.dataset
    # the indices the training loader yields (its sampler's positions in the training subset) over an epoch
    subset = loaders.train.dataset.base
    loaders.sampler.set_epoch(0)
    yielded = {subset.indices[pos] for pos, _seed in loaders.sampler}
    assert len(yielded) == 900 and not yielded & set(held.indices)
    # the validation images are training images (the dataset's train split), none of them in the test set
    full = held.dataset
    val_images = {_hash(full[i][0]) for i in held.indices}
    train_images = {_hash(img) for xb, _ in loaders.train for img in xb}  # an epoch of the real loader
    test_images = {_hash(img) for xb, _ in DataLoader(task.test_set(cfg), batch_size=1000) for img in xb}
    assert len(train_images) == 900
    assert len(val_images) == 300
    assert not val_images & train_images and not val_images & test_images
    # the same validation images for every training seed, and from another call
    other = build_loaders(TrainConfig.from_dict({**cfg.to_dict(), "seed": 5}), DistInfo())
    assert other.eval.dataset.indices == held.indices
    # a different val_seed chooses another split
    moved = build_loaders(TrainConfig.from_dict({**cfg.to_dict(), "val_seed": 1}), DistInfo())
    assert moved.eval.dataset.indices != held.indices


def test_segmentation_validation_scenes_are_held_out() -> None:
    cfg = get_preset("fmnist-seg-cpu", val_size=64, train_subset=256, eval_subset=None, output_dir="unused")
    splits = get_task(cfg.task).datasets(cfg)
    assert len(splits.held_out) == 64 and len(splits.train) == 256
    assert not set(splits.held_out.indices) & set(splits.train.indices)
    x, y = splits.held_out[0]
    assert torch.equal(x, splits.held_out.dataset[splits.held_out.indices[0]][0])  # not augmented


def test_language_task_validates_on_the_corpus_valid_split() -> None:
    with pytest.raises(ValueError, match="val_size must be None"):
        get_preset("bible-cpu", val_size=10)
    # val_seed seeds no draw here: it was accepted, ignored, and entered the run's identity key
    with pytest.raises(ValueError, match="val_seed must be 0, got 3"):
        get_preset("bible-cpu", val_seed=3)


def test_the_per_epoch_evaluation_measures_the_validation_split(tmp_path) -> None:
    cfg = get_preset("fmnist-cpu", model="symvit_mini_patch4_28", model_kwargs={"depth": 1}, epochs=1,
                     train_subset=256, val_size=128, eval_subset=None, batch_size=64, eval_batch_size=128,
                     augment=False, progress=False, output_dir=str(tmp_path / "run"))
    train(cfg)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["val_size"] == 128 and saved["val_seed"] == 0  # the run's config records the split
    row = read_csv(tmp_path / "run" / "epochs.csv")[-1]
    model, loaded = load_model(tmp_path / "run")
    assert loaded.val_size == 128
    task = get_task(loaded.task)
    on_val = evaluate_vision(model, DataLoader(task.validation_set(loaded), batch_size=128))
    assert on_val["n"] == 128 and row["eval_top1"] == pytest.approx(on_val["top1"], abs=1e-9)
    assert row["eval_loss"] == pytest.approx(on_val["loss"], rel=1e-5)


def test_configs_without_the_fields_load_as_the_legacy_setting_with_their_old_key() -> None:
    old = get_preset("fmnist-cpu", output_dir="x").to_dict()
    del old["val_size"], old["val_seed"], old["compile"]  # a config.json written before these fields
    cfg = TrainConfig.from_json(json.dumps(old))
    assert cfg.val_size is None and cfg.val_seed == 0
    # the key of its weights is what it was: every field but the trajectory-free ones
    assert trajectory_settings(cfg) == {k: v for k, v in old.items() if k not in TRAJECTORY_FREE}
    new = TrainConfig.from_dict({**cfg.to_dict(), "val_size": 2000})
    assert trajectory_settings(new)["val_size"] == 2000
    assert trajectory_settings(TrainConfig.from_dict({**new.to_dict(), "val_seed": 1}))["val_seed"] == 1


def test_the_cpu_image_presets_hold_out_a_validation_split() -> None:
    """The presets a user starts from choose on a validation split, not on the test images; the papers'
    recipes keep their protocol and say where their held-out numbers come from."""
    for name, size in (("fmnist-cpu", 2000), ("digits-cpu", 200), ("fmnist-seg-cpu", 1000)):
        cfg = get_preset(name)
        assert cfg.val_size == size and get_task(cfg.task).held_out_note(cfg) is None, name
    cfg = get_preset("digits-cpu")
    splits = get_task(cfg.task).datasets(cfg)
    full = len(get_task(cfg.task).builder(cfg)("train", False, None))
    assert len(splits.held_out) == 200 and len(splits.train) == full - 200
    note = get_task("vision").held_out_note(get_preset("deit"))
    assert note is not None and "test split of imagenet" in note and "val_size=N" in note
    assert get_task("lm").held_out_note(get_preset("bible-cpu")) is None  # the corpus's own valid split


def test_a_run_without_a_validation_split_warns_and_evaluates_its_val_as_test(tmp_path) -> None:
    from typer.testing import CliRunner

    from kpca_attention.cli import app
    from kpca_attention.train.evaluate import evaluate_checkpoint

    run = tmp_path / "run"
    args = ["train", "--preset", "digits-cpu", "--max-steps", "2", "--batch-size", "16", "--no-progress",
            "--set", "model_kwargs.depth=1", "--set", "eval_subset=32", "--set", "train_subset=64"]
    with pytest.warns(UserWarning, match=r"no validation split \(val_size is None\).*test split of digits"):
        res = CliRunner().invoke(app, [*args, "--set", "val_size=None", "-o", str(run)])
    assert res.exit_code == 0, res.output
    out = evaluate_checkpoint(run, split="val", subset=20, device="cpu")
    assert out["split"] == "test" and "no validation split" in out["split_note"]
    assert evaluate_checkpoint(run, split="test", subset=20, device="cpu")["top1"] == out["top1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning with the preset's validation split
        res = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "val")])
    assert res.exit_code == 0, res.output
    out = evaluate_checkpoint(tmp_path / "val", split="val", subset=20, device="cpu")
    assert out["split"] == "val" and "split_note" not in out
