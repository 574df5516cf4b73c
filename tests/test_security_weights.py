"""Weights carry the settings of the model they were trained in: every attention layer's options
(PAP's iterations, lambda, threshold, ...; the layer class) are written into the safetensors metadata,
and loading them into a model built with other settings is refused, naming the fields that differ,
unless an override is asked for. (PAP's settings change no parameter shape, so a strict load alone
accepts them silently.)"""

from __future__ import annotations

import pytest
import safetensors
import timm
import torch

import kpca_attention  # noqa: F401  (registers the models in timm)
from kpca_attention.tasks import get as get_task
from kpca_attention.train import CheckpointError, get_preset, load_model
from kpca_attention.train.checkpoint import SETTINGS_KEY, load_weights, save_checkpoint, save_weights
from kpca_attention.train.resolve import resolve_model

pytestmark = pytest.mark.usefixtures("single_thread")

MODEL = "rpc_symvit_mini_patch4_28"


def _cfg(out, **kw):
    return get_preset("digits-cpu", output_dir=str(out), model=MODEL,
                      model_kwargs={"depth": 1, "embed_dim": 48, **kw}, progress=False)


def _saved_run(tmp_path, **kw):
    cfg = _cfg(tmp_path / "run", **kw)
    torch.manual_seed(0)
    model = get_task(cfg.task).build_model(cfg)
    state = {"progress": {"epoch": 1, "step_in_epoch": 0, "global_step": 1}}
    ckpt = save_checkpoint(tmp_path / "run", model=model, config=cfg, state=state, finished=True)
    return ckpt, cfg


def test_checkpoint_weights_record_the_attention_settings(tmp_path) -> None:
    ckpt, _ = _saved_run(tmp_path, rpc_iters=2, rpc_lambda=3.0)
    with safetensors.safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    assert '"n_iter": 2' in meta[SETTINGS_KEY] and '"lam": 3.0' in meta[SETTINGS_KEY]
    model, _ = load_model(tmp_path / "run")  # the same settings: loads
    assert model.model.blocks[0].attn.n_iter == 2


@pytest.mark.parametrize(("kw", "field"), [({"rpc_iters": 6}, "n_iter"), ({"rpc_lambda": 1.0}, "lam"),
                                            ({"rpc_threshold": "lambda_over_mu"}, "threshold")])
def test_weights_into_a_model_with_other_settings_are_refused(tmp_path, kw, field) -> None:
    ckpt, cfg = _saved_run(tmp_path, rpc_iters=2)
    other = get_task(cfg.task).build_model(_cfg(tmp_path / "x", **{"rpc_iters": 2, **kw}))
    with pytest.raises(CheckpointError, match=field) as e:
        load_weights(other, ckpt / "model.safetensors")
    assert "override" in str(e.value)
    load_weights(other, ckpt / "model.safetensors", override_settings=True)  # asked for: loads


def test_a_timm_name_with_weights_of_other_settings_is_refused(tmp_path) -> None:
    net = timm.create_model("rpc_vit_mini_patch4_32", rpc_iters=2)
    f = tmp_path / "w.safetensors"
    save_weights(net, f)
    with pytest.raises(ValueError, match="n_iter"):
        resolve_model(f"rpc_vit_mini_patch4_32@{f}", pretrained=False)  # built with the default 4
    loaded = resolve_model(f"rpc_vit_mini_patch4_32@{f}", pretrained=False, override_settings=True)
    assert loaded.model.blocks[0].attn.n_iter == 4


def test_weights_without_recorded_settings_still_load(tmp_path) -> None:
    """Files written before the settings were recorded (or by other tools) load as before."""
    from safetensors.torch import save_model

    net = timm.create_model("rpc_vit_mini_patch4_32")
    f = tmp_path / "w.safetensors"
    save_model(net, str(f))
    assert resolve_model(f"rpc_vit_mini_patch4_32@{f}", pretrained=False).model is not None


def _rewrite_settings(f, edit) -> None:
    """Rewrite the recorded attention settings of weights file ``f`` with ``edit(list of layer dicts)``."""
    import json

    from safetensors.torch import load_file, save_file

    with safetensors.safe_open(str(f), "pt") as h:
        meta = dict(h.metadata())
    settings = json.loads(meta[SETTINGS_KEY])
    edit(settings)
    meta[SETTINGS_KEY] = json.dumps(settings, sort_keys=True)
    save_file(load_file(str(f)), str(f), metadata=meta)


def test_weights_recorded_before_an_option_was_renamed_or_added_still_load(tmp_path) -> None:
    """NeuTRENO's weights recorded ``apply`` (now ``applied``: it hid nn.Module.apply), and weights written
    before an option existed do not record it: both load into a model holding the option's default, which
    is what they were trained with. A value other than the default is still refused."""
    net = timm.create_model("neutreno_vit_mini_patch4_28")
    f = tmp_path / "w.safetensors"
    save_weights(net, f)

    def old_names(settings):
        for layer in settings:
            layer["apply"] = layer.pop("applied")
            layer.pop("symmetric")  # as if the option had been added since

    _rewrite_settings(f, old_names)
    resolve_model(f"neutreno_vit_mini_patch4_28@{f}", pretrained=False)  # loads
    with pytest.raises(ValueError, match="symmetric"):  # the default is False: True is another model
        resolve_model(f"neutreno_symvit_mini_patch4_28@{f}", pretrained=False)

    def turned_off(settings):
        settings[1]["apply"] = False

    _rewrite_settings(f, turned_off)
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.applied: False \(weights\) vs True"):
        resolve_model(f"neutreno_vit_mini_patch4_28@{f}", pretrained=False)


def test_weights_of_every_registered_model_recorded_before_the_renames_still_load() -> None:
    """The attention settings every mini model and small LM recorded at commit bc89f80 (before ``apply``
    became ``applied`` and the registry's RPC options gained ``mu_dim``) must still pass against the models
    built today: a configured class's name lists its options, so the class is compared by its base name and
    the options one by one. (``rvt_lm`` is left out: its W_p spans the context now, another shape.)"""
    import json
    import warnings
    from pathlib import Path

    from kpca_attention.models import create_model
    from kpca_attention.train.checkpoint import _option_defaults, _settings_differ, attention_settings

    saved = json.loads((Path(__file__).parent / "data" / "attention_settings_bc89f80.json").read_text())
    assert len(saved) >= 60
    for name, settings in saved.items():
        if name.endswith(("lm", "symlm")) and "_vit" not in name:
            kw = dict(vocab_size=20, preset="small")
        else:
            kw = {"num_classes": 3, "in_chans": 1} if name.startswith("segmenter") else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = create_model(name, **kw)
        assert _settings_differ(settings, attention_settings(model), _option_defaults(model)) == [], name
