"""Checkpoints: weights_only-loadable state, RNG round trip, and clear errors (never a silent restart)
for missing, truncated or corrupt files."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from kpca_attention.train import CheckpointError, get_preset, load_checkpoint, load_model, train
from kpca_attention.train.checkpoint import capture_rng, resolve_checkpoint, restore_rng

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One finished tiny run (2 checkpoints kept); tests copy it before breaking anything."""
    out = tmp_path_factory.mktemp("ckpt") / "run"
    cfg = get_preset("digits-cpu", output_dir=str(out), epochs=2, train_subset=64, eval_subset=32,
                     batch_size=16, progress=False, model_kwargs={"depth": 1, "embed_dim": 48},
                     model_ema=True, model_ema_decay=0.9)
    train(cfg)
    return out


@pytest.fixture
def copy_run(run_dir, tmp_path):
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(run_dir, dst)
    return dst


def test_layout_and_weights_only_state(run_dir):
    ckpt = resolve_checkpoint(run_dir)
    assert ckpt.name == "e0002-s00000008"
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text()) == {"name": ckpt.name,
                                                                                 "finished": True}
    for f in ("model.safetensors", "ema.safetensors", "state.pt", "config.json", "COMPLETE"):
        assert (ckpt / f).is_file()
    state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    assert state["progress"]["global_step"] == 8 and len(state["rng"]) == 1
    assert set(state) >= {"optimizer", "scheduler", "scaler", "progress", "rng"}
    # only the newest `keep=2` checkpoints stay
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["e0001-s00000004", "e0002-s00000008"]


def test_load_model_raw_and_ema_weights_differ(run_dir):
    raw, cfg = load_model(run_dir)
    ema, _ = load_model(run_dir, ema=True)
    x = torch.rand(3, 1, 28, 28)
    assert raw(x).shape == (3, 10)
    assert not torch.equal(raw(x), ema(x))


def test_rng_round_trip():
    state = capture_rng()
    a = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng(state)
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


@pytest.mark.parametrize("damage", ["truncate", "flip", "drop_marker", "drop_file"])
def test_damaged_checkpoint_is_a_clear_error(copy_run, damage):
    ckpt = resolve_checkpoint(copy_run)
    target = ckpt / "model.safetensors"
    if damage == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[-10] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "drop_marker":
        (ckpt / "COMPLETE").unlink()
        target = ckpt / "COMPLETE"
    else:
        target = ckpt / "state.pt"
        target.unlink()
    with pytest.raises(CheckpointError, match=str(target)):
        load_checkpoint(copy_run)
    with pytest.raises(CheckpointError, match=str(target)):
        load_model(copy_run)
    # resuming must fail loudly too, not restart from scratch
    cfg = get_preset("digits-cpu", output_dir=str(copy_run), epochs=3, train_subset=64, eval_subset=32,
                     batch_size=16, progress=False, model_kwargs={"depth": 1, "embed_dim": 48},
                     model_ema=True, model_ema_decay=0.9)
    with pytest.raises(CheckpointError, match=str(target)):
        train(cfg, resume=True)


def test_missing_and_dangling_paths(copy_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_model(tmp_path / "empty")
    (copy_run / "checkpoints" / "latest.json").write_text(json.dumps({"name": "e9999-s00000000"}))
    with pytest.raises(CheckpointError, match="e9999-s00000000"):
        load_model(copy_run)
    (copy_run / "checkpoints" / "latest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="latest.json is corrupt"):
        load_model(copy_run)
    # JSON without the checkpoint's name: said in words, not as the bare KeyError "('name')"
    (copy_run / "checkpoints" / "latest.json").write_text(json.dumps({"epoch": 3}))
    with pytest.raises(CheckpointError, match=r'latest.json is corrupt \(no "name" of a checkpoint in it\)'):
        load_model(copy_run)


def test_an_interrupted_write_leaves_the_previous_checkpoint_usable(copy_run):
    """A crash mid-write leaves a hidden temporary directory; latest.json still names the old one."""
    tmp = copy_run / "checkpoints" / ".e0003-s00000012.tmp-999"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"partial")
    model, _ = load_model(copy_run)
    assert resolve_checkpoint(copy_run).name == "e0002-s00000008"


def test_the_documented_recipe_hands_a_run_s_weights_to_timm(run_dir, tmp_path):
    # docs/training.md: model.safetensors holds the NormalizedModel (mean, std, model.<timm key>), which
    # timm's checkpoint_path does not read as it is; model.model's state dict does
    import timm
    from safetensors.torch import save_file

    model, cfg = load_model(run_dir)
    save_file(model.model.state_dict(), tmp_path / "x-timm.safetensors")
    vit = timm.create_model(cfg.model, checkpoint_path=str(tmp_path / "x-timm.safetensors"),
                            **cfg.model_kwargs).eval()
    images = torch.rand(2, *model.model.patch_embed.img_size).unsqueeze(1).expand(2, vit.in_chans, -1, -1)
    with torch.no_grad():
        torch.testing.assert_close(vit((images - model.mean) / model.std), model(images))


@pytest.mark.parametrize("marker", [{"files": ["model.safetensors"]}, {"files": "abc"}, {"files": {}},
                                    "no_size"], ids=["list", "string", "empty", "no_size"])
def test_an_odd_completion_marker_is_a_clear_error(copy_run, marker):
    """A security review's COMPLETE markers of the wrong type gave AttributeError / KeyError tracebacks, and
    one that listed no files verified nothing."""
    ckpt = resolve_checkpoint(copy_run)
    if marker == "no_size":
        marker = json.loads((ckpt / "COMPLETE").read_text())
        marker["files"]["model.safetensors"].pop("size")
    (ckpt / "COMPLETE").write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match="COMPLETE|model.safetensors"):
        load_model(copy_run)


@pytest.mark.parametrize("settings", ['{"a": 1}', '"abc"', "[1, 2]", "null", "[" * 100000])
def test_odd_recorded_attention_settings_are_a_clear_error(run_dir, tmp_path, settings):
    """Attention settings in a weights file's metadata of the wrong type (or nested past the parser's
    depth) gave tracebacks from inside the comparison."""
    import safetensors.torch

    from kpca_attention.train.checkpoint import SETTINGS_KEY, check_settings

    model, _ = load_model(run_dir)
    f = tmp_path / "w.safetensors"
    safetensors.torch.save_model(model.model, str(f), metadata={SETTINGS_KEY: settings})
    with pytest.raises(CheckpointError, match="recorded settings"):
        check_settings(model.model, f)


def test_a_config_nested_past_the_parser_depth_is_a_clear_error(tmp_path):
    """A security review's config.json of 200,000 "[" gave a RecursionError traceback (a checkpoint's own
    config is hash-checked first; one whose marker was rewritten to match reaches the parser)."""
    from kpca_attention.train.rundir import read_config

    (tmp_path / "config.json").write_text("[" * 200000)
    with pytest.raises(CheckpointError, match="config.json is invalid: RecursionError"):
        read_config(tmp_path)
