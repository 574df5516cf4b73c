"""A model's size is checked on the meta device before its weights are allocated: a downloaded run whose
config.json asks for another (bigger) model than its weights, and a size typo at training, are refused in one
line without building the model for real."""

from __future__ import annotations

import json

import pytest
import torch
from run_fixtures import untrained_run

import kpca_attention  # noqa: F401  (registers the models in timm)
from kpca_attention.models import create_model
from kpca_attention.models.sizing import check_fits, meta_model, parameter_count
from kpca_attention.tasks import get as get_task
from kpca_attention.train import CheckpointError, get_preset, load_model, train
from kpca_attention.train import loop as loop_mod
from kpca_attention.train.checkpoint import resolve_checkpoint, verify_checkpoint
from kpca_attention.train.rundir import RunDir

pytestmark = pytest.mark.usefixtures("single_thread")


def _spy_builds(monkeypatch, task) -> list[str]:
    """Record the device of every model ``task`` builds."""
    devices: list[str] = []
    build = type(task).build_model

    def spy(self, cfg, info=None):
        model = build(self, cfg, info)
        devices.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(type(task), "build_model", spy)
    return devices


def _rewrite_config(run, **model_kwargs) -> None:
    """Give the run's checkpoint another model size, with a COMPLETE marker that still verifies (as a crafted
    download would)."""
    import hashlib

    ckpt = resolve_checkpoint(run)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_kwargs"] = {**cfg["model_kwargs"], **model_kwargs}
    data = json.dumps(cfg).encode()
    (ckpt / "config.json").write_bytes(data)
    marker = json.loads((ckpt / "COMPLETE").read_text())
    marker["files"]["config.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (ckpt / "COMPLETE").write_text(json.dumps(marker))
    verify_checkpoint(ckpt)


def test_a_run_whose_config_asks_for_another_model_size_is_refused_before_it_is_built(tmp_path,
                                                                                      monkeypatch) -> None:
    run = untrained_run(tmp_path / "run")
    _rewrite_config(run, embed_dim=1024, depth=8)
    devices = _spy_builds(monkeypatch, get_task("vision"))
    shapes = r"other shapes: .*\[64\] in the file, \[1024\] in the model"
    with pytest.raises(CheckpointError, match=r"do not match the model: .*" + shapes):
        load_model(run)
    assert devices == ["meta"]  # only the dry build: nothing the size of the model was allocated


def test_a_matching_run_loads_after_its_dry_build(tmp_path, monkeypatch) -> None:
    run = untrained_run(tmp_path / "run", "rpc_symvit_mini_patch4_28")
    devices = _spy_builds(monkeypatch, get_task("vision"))
    model, _ = load_model(run)
    assert devices == ["meta", "cpu"]
    assert next(model.parameters()).device.type == "cpu"


def test_training_refuses_a_model_larger_than_memory_before_building_it(tmp_path, monkeypatch) -> None:
    cfg = get_preset("digits-cpu", output_dir=str(tmp_path / "big"), progress=False, max_steps=1)
    monkeypatch.setattr(loop_mod, "memory_bytes", lambda: 10**6)  # 1 MB: the 122k-parameter model needs ~2 MB
    devices = _spy_builds(monkeypatch, get_task("vision"))
    with pytest.raises(ValueError, match=r"symvit_mini_patch4_28 has [\d,]+ parameters: .* need .* GiB and "
                                         r"this machine has 0\.0 GiB; check the model's size settings"):
        train(cfg)
    assert devices == ["meta"]
    assert not (tmp_path / "big").exists()  # the run folder it created is not left behind, empty


def test_a_run_folder_that_existed_is_kept_when_training_fails(tmp_path, monkeypatch) -> None:
    (tmp_path / "big").mkdir()
    cfg = get_preset("digits-cpu", output_dir=str(tmp_path / "big"), progress=False, max_steps=1)
    monkeypatch.setattr(loop_mod, "memory_bytes", lambda: 10**6)
    with pytest.raises(ValueError, match="parameters"):
        train(cfg)
    assert (tmp_path / "big").is_dir()


def test_a_failed_lock_keeps_a_folder_with_files(tmp_path) -> None:
    rd = RunDir(tmp_path / "new")
    with rd.lock():
        (tmp_path / "new" / "config.json").write_text("{}")
    assert (tmp_path / "new" / "config.json").exists()


@pytest.mark.parametrize("name", ["segmenter_rpc_symvit_mini_patch4_32", "rpc_symvit_mini_patch4_28",
                                  "twicing_vit_mini_patch4_28"])
def test_dry_builds_have_the_real_models_shapes_and_leave_the_random_state(name) -> None:
    kw = {"num_classes": 5} if name.startswith("segmenter") else {}
    before = torch.get_rng_state()
    shell = meta_model(lambda: create_model(name, **kw))
    assert torch.equal(torch.get_rng_state(), before)
    assert shell is not None and {p.device.type for p in shell.parameters()} == {"meta"}
    real = create_model(name, **kw)
    shapes = {k: v.shape for k, v in real.state_dict().items()}
    assert {k: v.shape for k, v in shell.state_dict().items()} == shapes
    assert parameter_count(shell) == parameter_count(real)


def test_a_model_that_cannot_be_built_on_meta_gives_none() -> None:
    def build():
        torch.zeros(1).item()  # needs a real value
        return torch.nn.Linear(2, 2)

    assert meta_model(build) is None


def test_check_fits_counts_tied_parameters_once() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(10, 10, bias=False), torch.nn.Linear(10, 10, bias=False))
    model[1].weight = model[0].weight
    assert parameter_count(model) == 100
    check_fits(model, "m", bytes_per_parameter=4, what="weights", available=400)
    with pytest.raises(ValueError, match="m has 100 parameters: weights need"):
        check_fits(model, "m", bytes_per_parameter=4, what="weights", available=399)


def test_load_weights_refuses_names_or_shapes_before_loading_anything(tmp_path) -> None:
    from kpca_attention.train.checkpoint import MODEL_FILE, load_weights

    run = untrained_run(tmp_path / "run")
    narrower = get_task("vision").build_model(get_preset("digits-cpu", model_kwargs={"embed_dim": 32}))
    before = {k: v.clone() for k, v in narrower.state_dict().items()}
    shapes = r"other shapes: .*\[64\] in the file, \[32\] in the model"
    with pytest.raises(CheckpointError, match=r"do not match the model: .*" + shapes):
        load_weights(narrower, resolve_checkpoint(run) / MODEL_FILE)
    assert all(torch.equal(v, narrower.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize(("device", "says"), [("tpu", "device must be one of auto, cpu, cuda"),
                                              ("cuda:7", "CUDA device")])
def test_load_model_checks_the_device_before_building_anything(tmp_path, monkeypatch, device, says) -> None:
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("a machine with eight GPUs has cuda:7")
    run = untrained_run(tmp_path / "run")
    devices = _spy_builds(monkeypatch, get_task("vision"))
    with pytest.raises(ValueError, match=says):
        load_model(run, device=device)
    assert devices == []
