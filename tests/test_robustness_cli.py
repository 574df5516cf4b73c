"""The ``robustness`` command on two tiny digits checkpoints: reports side by side, and a second run
reuses every finished item (nothing recomputed) while a changed parameter recomputes."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from kpca_attention import tasks
from kpca_attention.cli import app
from kpca_attention.robustness import run as R
from kpca_attention.train.checkpoint import save_checkpoint
from kpca_attention.train.config import get_preset

pytestmark = pytest.mark.usefixtures("single_thread_module")


def _checkpoint(run_dir, model_name, seed):
    cfg = get_preset("digits-cpu", model=model_name, output_dir=str(run_dir))
    torch.manual_seed(seed)
    model = tasks.get(cfg.task).build_model(cfg)
    save_checkpoint(run_dir, model=model, config=cfg,
                    state={"progress": {"epoch": 0, "step_in_epoch": 0, "global_step": 0}}, finished=True)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return [_checkpoint(root / "symvit", "symvit_mini_patch4_28", 0),
            _checkpoint(root / "rpc", "rpc_symvit_mini_patch4_28", 1)]


def _invoke(args):
    result = CliRunner().invoke(app, ["robustness", *map(str, args)])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def test_corruptions_and_attacks_side_by_side_and_resumed(runs, tmp_path, monkeypatch):
    out = tmp_path / "rob"
    common = [*runs, "--out", out, "--n", 24, "--corruptions", "gaussian_noise,fog", "--no-progress",
              "--device", "cpu", "--batch-size", 32]
    text = _invoke([*common, "--suite", "corruptions,attacks", "--method", "fgsm,pgd",
                    "--eps", "2/255,8/255", "--attack-n", 8, "--steps", 2])
    assert "mCE relative to symvit" in text and "| gaussian_noise |" in text
    summary = json.loads((out / "corruptions.json").read_text())
    assert summary["baseline"] == "symvit"
    assert summary["models"]["symvit"]["mce_vs_baseline"] == pytest.approx(100.0)
    rpc = summary["models"]["rpc"]
    assert set(rpc["per_corruption_top1"]) == {"gaussian_noise", "fog"} and rpc["items"]["clean"]["n"] == 24
    assert "mce_alexnet" not in rpc  # digits are not ImageNet-C
    for name in ("corruptions.md", "corruptions.png", "attacks.md", "attacks.png", "attacks.json"):
        assert (out / name).stat().st_size > 0
    sweeps = json.loads((out / "attacks.json").read_text())["sweeps"]
    assert [r["eps"] for r in sweeps["rpc"]["pgd"]] == pytest.approx([0, 2 / 255, 8 / 255])
    assert all(r["max_norm"] <= r["eps"] + 1e-6 for r in sweeps["rpc"]["pgd"])
    from kpca_attention.robustness.store import ResultStore

    items = ResultStore(out / "results" / "symvit.json").items()
    assert len([k for k in items if k.startswith("corruptions/")]) == 11
    assert len(items["corruptions/clean"]["correct"]) == 24  # per-example results
    assert list((out / "cache").glob("*.npy"))  # corrupted images cached once for both models

    # restart: everything is reused - make any recomputation fail loudly
    def boom(*a, **k):
        raise AssertionError("recomputed a finished item")

    monkeypatch.setattr(R, "collect_logits", boom)
    monkeypatch.setattr(R.A, "attack_logits", boom)
    again = _invoke([*common, "--suite", "corruptions,attacks", "--method", "fgsm,pgd",
                     "--eps", "2/255,8/255", "--attack-n", 8, "--steps", 2])
    assert "reused 11/11 finished corruption items" in again
    assert json.loads((out / "corruptions.json").read_text()) == summary
    # a changed parameter (another seed) is recomputed, not silently reused
    with pytest.raises(AssertionError, match="recomputed"):
        R.run_robustness([str(r) for r in runs], ["attacks"], out,
                         R.Options(n=24, methods=("fgsm",), eps=(2 / 255,), attack_n=8, seed=1,
                                   progress=False))


def test_bad_input_is_reported(runs, tmp_path):
    res = CliRunner().invoke(app, ["robustness", str(runs[0]), "--suite", "weather", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "unknown suite" in res.output
    with pytest.raises(ValueError, match="valid names"):
        R.run_robustness([str(runs[0])], ["corruptions"], tmp_path, R.Options(corruptions=("rain",)))
    with pytest.raises(FileNotFoundError):
        R.run_robustness([str(tmp_path / "missing")], ["corruptions"], tmp_path)
    with pytest.raises(ValueError, match="distinct label"):
        R.run_robustness([str(runs[0]), str(runs[0])], ["corruptions"], tmp_path, labels=["a", "a"])


def test_ood_skips_absent_sets_with_a_message(runs, tmp_path):
    res = R.run_robustness([str(runs[0])], ["ood"], tmp_path, R.Options(imagenet_a=str(tmp_path / "nope"),
                                                                         progress=False))
    skipped = res["ood"]["skipped"]
    assert any("imagenet-a: skipped" in s and "not found" in s for s in skipped)
    assert any("no --imagenet-r path given" in s for s in skipped)
    assert "skipped" in (tmp_path / "ood.md").read_text()


def test_wordswap_runner_with_a_stand_in_checkpoint(tmp_path, monkeypatch):
    from kpca_attention.data.text import TextCorpus, Vocab
    from kpca_attention.models.lm import create_lm
    from kpca_attention.train.config import TrainConfig

    names = ["abel", "jacob", "moses"] * 30
    text = "\n".join(f"the shepherd {w} kept the flock of {w} by night" for w in names)
    corpus = TextCorpus(train=text, valid=text, test=text, name="tiny")
    monkeypatch.setattr("kpca_attention.data.text.load_corpus", lambda name, root=None: corpus)
    vocab = Vocab.build(text)
    lm = create_lm("symlm", len(vocab), preset="small", n_layer=1, d_ff=32, context=16)
    lm.vocab = vocab
    ck = R.Checkpoint(str(tmp_path), "symlm")
    ck.__dict__.update(config=TrainConfig(task="lm", dataset="tiny", context=16), fingerprint="abc",
                       ckpt_dir=tmp_path)
    ck._loaded = (lm, None)
    opts = R.Options(lm_splits=("valid",), stride=8, max_tokens=120, rate=0.1, progress=False)
    res = R.run_wordswap([ck], tmp_path, opts)
    r = res["symlm"]["valid"]
    assert r["tokens"] == 120 and r["n_swapped"] > 0 and r["clean"] > 1 and r["attacked"] > 1
    assert "| symlm |" in (tmp_path / "wordswap.md").read_text()
    assert R.run_wordswap([ck], tmp_path, opts) == res  # reused


def test_imagenet_c_subset_follows_the_clean_subset():
    from torch.utils.data import Subset, TensorDataset

    val = TensorDataset(torch.arange(10))
    corrupted = TensorDataset(torch.arange(10) + 100)
    picked = R._same_images(corrupted, Subset(val, [1, 3, 7]))
    assert [int(picked[i][0]) for i in range(3)] == [101, 103, 107]
    assert R._same_images(corrupted, val) is corrupted
    with pytest.raises(ValueError, match="same images"):
        R._same_images(TensorDataset(torch.arange(9)), val)


def test_a_timm_model_with_a_local_weights_file(tmp_path):
    """One model specifier: a user's own timm classifier (NAME@weights file) through the suites."""
    import timm
    from safetensors.torch import save_file

    import kpca_attention  # noqa: F401  (registers the mini ViT sizes)

    torch.manual_seed(0)
    m = timm.create_model("vit_mini_patch4_28", num_classes=10)
    save_file(m.state_dict(), str(tmp_path / "w.safetensors"))
    spec = f"vit_mini_patch4_28@{tmp_path / 'w.safetensors'}"
    out = tmp_path / "rob"
    res = CliRunner().invoke(app, ["robustness", spec, "--dataset", "fashion-mnist", "--suite", "attacks",
                                   "--method", "fgsm", "--eps", "2/255", "--attack-n", "8", "--no-progress",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    sweeps = json.loads((out / "attacks.json").read_text())["sweeps"]
    clean = sweeps["vit_mini_patch4_28"]["fgsm"][0]
    # the same weights evaluated directly give the same clean accuracy on the same images
    from kpca_attention.data.images import build_image_dataset
    from kpca_attention.models.normalize import NormalizedModel

    ds = build_image_dataset("fashion-mnist", "test", subset=8)
    x = torch.stack([ds[i][0] for i in range(8)])
    y = torch.tensor([ds[i][1] for i in range(8)])
    cfg = m.pretrained_cfg
    with torch.no_grad():
        acc = (NormalizedModel(m.eval(), cfg["mean"], cfg["std"])(x).argmax(1) == y).float().mean().item()
    assert clean["top1"] == pytest.approx(acc)
    # without --dataset: one clear line
    res = CliRunner().invoke(app, ["robustness", spec, "--suite", "attacks", "-o", str(out)])
    assert res.exit_code == 2 and "give --dataset" in res.output
    res = CliRunner().invoke(app, ["robustness", "no/such/run", "-o", str(out)])
    assert res.exit_code == 2 and "no such checkpoint" in res.output


def test_evaluate_takes_the_same_model_specifier(tmp_path):
    import timm
    from safetensors.torch import save_file

    import kpca_attention  # noqa: F401

    torch.manual_seed(0)
    m = timm.create_model("vit_mini_patch4_28", num_classes=10)
    save_file(m.state_dict(), str(tmp_path / "w.safetensors"))
    spec = f"vit_mini_patch4_28@{tmp_path / 'w.safetensors'}"
    res = CliRunner().invoke(app, ["evaluate", spec, "--dataset", "fashion-mnist", "--split", "test",
                                   "--subset", "64", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["n"] == 64 and 0.0 <= out["top1"] <= 1.0
    res = CliRunner().invoke(app, ["evaluate", spec])
    assert res.exit_code == 2 and "give --dataset" in res.output
