"""The ``robustness`` command on two tiny digits checkpoints: a study without training (the study
engine, the one result store, the one study report), models side by side; a second run reuses every
finished item (nothing recomputed, no model loaded) while a changed parameter recomputes."""

from __future__ import annotations

import json

import pytest
import torch
from run_fixtures import untrained_run
from typer.testing import CliRunner

from kpca_attention import tasks
from kpca_attention.cli import app
from kpca_attention.cli.robustness import robustness_study
from kpca_attention.robustness.store import ResultStore
from kpca_attention.studies.engine import run_study
from kpca_attention.studies.sources import LoadedSource
from kpca_attention.tasks.classification.suites import same_images
from kpca_attention.tasks.images import structure_items
from kpca_attention.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.usefixtures("single_thread_module")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return [untrained_run(root / "symvit", "symvit_mini_patch4_28", 0),
            untrained_run(root / "rpc", "rpc_symvit_mini_patch4_28", 1)]


def _invoke(args):
    result = CliRunner().invoke(app, ["robustness", *map(str, args)])
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    return result.output


def _results(out, label):
    return structure_items(ResultStore(out / "results" / f"{label}.json").items())


def _forbid_computing(monkeypatch):
    """Make any model forward of the suites, any attack and any model loading fail loudly."""
    def boom(*a, **k):
        raise AssertionError("recomputed a finished item")

    monkeypatch.setattr("kpca_attention.robustness.common.collect_logits", boom)
    monkeypatch.setattr("kpca_attention.robustness.attacks.attack_logits", boom)
    monkeypatch.setattr(LoadedSource, "load", boom)


def test_corruptions_and_attacks_side_by_side_and_resumed(runs, tmp_path, monkeypatch):
    out = tmp_path / "rob"
    common = [*runs, "--out", out, "--n", 24, "--corruptions", "gaussian_noise,fog", "--no-progress",
              "--device", "cpu", "--batch-size", 32]
    shown = _invoke([*common, "--suite", "corruptions,attacks", "--method", "fgsm,pgd",
                     "--eps", "2/255,8/255", "--attack-n", 8, "--steps", 2])
    text = (out / "report.md").read_text()
    # the terminal gets the main table and where the report is, not the report's 70 lines
    assert "| variant |" in shown and f"report: {out / 'report.md'}" in shown and "## " not in shown
    assert "results and runs in" in shown  # one folder, named once
    assert "mCE vs symvit" in text and "relative to symvit" in text and "| gaussian_noise |" in text
    summary = json.loads((out / "summary.json").read_text())
    # existing models evaluated once each: no table of one-seed verdict cells, one line saying why
    assert "None: a verdict word needs two or more paired training seeds" in text
    assert "inconclusive" not in text and summary["verdicts"]["none"]
    assert summary["baseline"] == "symvit"
    assert summary["mce"]["symvit"]["mce"] == [pytest.approx(100.0)]
    rpc = _results(out, "rpc")
    assert set(rpc["corruptions"]) == {"gaussian_noise", "fog"} and rpc["clean_corrupt_subset"]["n"] == 24
    assert "mce_alexnet" not in summary["mce"]["rpc"]  # digits are not ImageNet-C
    for name in ("report.md", "severity.png", "accuracy.png", "attacks.png", "summary.json"):
        assert (out / name).stat().st_size > 0
    pgd = rpc["attacks"]["pgd-steps2"]  # named with its options
    assert sorted(pgd, key=float) == ["2", "8"] and rpc["clean_attack_subset"]["n"] == 8
    assert all(r["max_norm"] <= float(e) / 255 + 1e-6 for e, r in pgd.items())
    items = ResultStore(out / "results" / "symvit.json").items()
    assert len([k for k in items if k.startswith("corruptions/")]) == 11
    assert len(items["corruptions/clean"]["correct"]) == 24  # per-example results
    assert list((out / "cache").glob("*.npy"))  # corrupted images cached once for both models
    settings = json.loads((out / "settings.json").read_text())
    assert [v["source"]["path"] for v in settings["variants"]] == [str(r) for r in runs]  # not trained

    # restart: everything is reused - make any recomputation (or loading a model) fail loudly
    _forbid_computing(monkeypatch)
    again = _invoke([*common, "--suite", "corruptions,attacks", "--method", "fgsm,pgd",
                     "--eps", "2/255,8/255", "--attack-n", 8, "--steps", 2])
    assert again.count("results found: nothing to train or evaluate") == 2
    assert json.loads((out / "summary.json").read_text()) == summary
    assert ResultStore(out / "results" / "symvit.json").items() == items
    # a changed parameter (another seed) is recomputed, not silently reused
    study = robustness_study([str(r) for r in runs], ("attacks",), methods=("fgsm",), eps=(2 / 255,),
                             attack_n=8, seed=1)
    with pytest.raises(AssertionError, match="recomputed"):
        run_study(study, out, runs=out, progress=False, checks=False)
    # the same study on another split: other images, so never the test split's items
    same = dict(n=24, corruptions=("gaussian_noise", "fog"), methods=("fgsm", "pgd"), eps=(2 / 255, 8 / 255),
                attack_n=8, attack_options={"pgd": {"steps": 2}}, batch_size=32)
    suites = ("corruptions", "attacks")
    run_study(robustness_study([str(r) for r in runs], suites, **same), out, runs=out, progress=False,
              checks=False)  # the test split: every item reused
    with pytest.raises(AssertionError, match="recomputed"):
        run_study(robustness_study([str(r) for r in runs], suites, split="val", **same), out, runs=out,
                  progress=False, checks=False)


def test_autoattack_and_imagenet_c_are_refused_on_another_split():
    from kpca_attention.tasks.classification.suites import AutoAttackSuite, ImageSuites

    with pytest.raises(ValueError, match="test split only, not split='val'"):
        ImageSuites(split="val", autoattack=AutoAttackSuite(eps=(4 / 255,), n=8))
    with pytest.raises(ValueError, match="imagenet_c .* test split only"):
        ImageSuites(split="train", imagenet_c="/data/imagenet-c")
    assert ImageSuites(split="val").split == "val"


def test_bad_input_is_reported(runs, tmp_path):
    res = CliRunner().invoke(app, ["robustness", str(runs[0]), "--suite", "weather", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "unknown suite" in res.output
    with pytest.raises(ValueError, match="valid names"):
        robustness_study([str(runs[0])], ("corruptions",), corruptions=("rain",))
    with pytest.raises(FileNotFoundError):
        robustness_study([str(tmp_path / "missing")], ("corruptions",), corruptions=("fog",))
    with pytest.raises(ValueError, match="distinct label"):
        robustness_study([str(runs[0]), str(runs[0])], ("corruptions",), labels=("a", "a"),
                         corruptions=("fog",))
    with pytest.raises(ValueError, match="'a/b', 'a_b' name the same result file"):  # distinct, one file
        robustness_study([str(runs[0]), str(runs[1])], ("corruptions",), labels=("a/b", "a_b"),
                         corruptions=("fog",))
    with pytest.raises(ValueError, match="baseline"):
        robustness_study([str(runs[0])], ("corruptions",), baseline="nope", corruptions=("fog",))
    res = CliRunner().invoke(app, ["robustness", str(runs[0]), "--suite", "wordswap", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "wordswap needs a language-model checkpoint" in res.output
    assert not (tmp_path / "results").exists()  # refused before anything was evaluated


def test_ood_skips_sets_not_given_and_refuses_a_missing_folder(runs, tmp_path):
    out = tmp_path / "rob"
    text = _invoke([runs[0], "--suite", "ood", "--n", 16, "--no-progress", "-o", out])
    assert "no --imagenet-r path given" in text and "no --imagenet-a path given" in text
    assert "skipped" in (out / "report.md").read_text()
    # a folder named on the command line that is not there is the user's mistake, not a set to skip (it
    # was skipped with exit 0 before)
    res = CliRunner().invoke(app, ["robustness", str(runs[0]), "--suite", "ood", "--imagenet-a",
                                   str(tmp_path / "nope"), "-o", str(tmp_path / "rob2")])
    assert res.exit_code == 2 and "--imagenet-a" in res.output and "no such folder" in res.output
    assert not (tmp_path / "rob2" / "results").exists()


def test_dataset_options_refused_for_the_projects_runs(runs, tmp_path):
    """A run of this project records its dataset: --dataset cifar10 was ignored (the run was evaluated on
    its own data with exit 0); now it is refused before any work, as is a --data-root it would ignore."""
    for extra in (["--dataset", "cifar10"], ["--data-root", str(tmp_path)]):
        res = CliRunner().invoke(app, ["robustness", str(runs[0]), *extra, "--corruptions", "fog",
                                       "--severities", "1", "--n", "4", "-o", str(tmp_path / "rob")])
        assert res.exit_code == 2 and "is a run of this project" in res.output, res.output
    assert not (tmp_path / "rob" / "results").exists()


def _lmuntrained_run(run_dir, monkeypatch, vocab_level: str = "word"):
    from kpca_attention.data.text import TextCorpus, Vocab
    from kpca_attention.train.config import TrainConfig

    names = ["abel", "jacob", "moses"] * 30
    text = "\n".join(f"the shepherd {w} kept the flock of {w} by night" for w in names)
    corpus = TextCorpus(train=text, valid=text, test=text, name="tiny")
    monkeypatch.setattr("kpca_attention.data.text.load_corpus", lambda name, root=None: corpus)
    vocab = Vocab.build(text, level=vocab_level)
    cfg = TrainConfig(task="lm", model="symlm", dataset="tiny", context=16, output_dir=str(run_dir),
                      vocab=vocab_level,
                      model_kwargs={"preset": "small", "n_layer": 1, "d_ff": 32})
    task = tasks.get(cfg.task)
    torch.manual_seed(0)
    lm = task.build_model(cfg, {"vocab": vocab})
    save_checkpoint(run_dir, model=lm, config=cfg, state={"progress": {"epoch": 0, "step_in_epoch": 0,
                                                                       "global_step": 0}},
                    finished=True, extra_files=task.checkpoint_files({"vocab": vocab}))
    return run_dir


def test_wordswap_through_the_study_engine(tmp_path, monkeypatch):
    run = _lmuntrained_run(tmp_path / "symlm", monkeypatch)
    out = tmp_path / "rob"
    args = [run, "--suite", "wordswap", "--lm-splits", "valid", "--stride", 8, "--max-tokens", 120,
            "--rate", 0.1, "--no-progress", "-o", out]
    _invoke(args)
    res = _results(out, "symlm")
    clean, attacked = res["ppl/valid"], res["wordswap/valid"]
    assert clean["tokens"] == attacked["tokens"] == 119 and clean["stride"] == 8  # 120 tokens: 119 predicted
    assert len(attacked["swapped"]) > 0 and attacked["n_swapped"] > 0
    assert clean["ppl"] > 1 and attacked["ppl"] > 1
    report = (out / "report.md").read_text()
    assert "| symlm |" in report
    # the context is the models' (16), read from their items: this study has no recipe, and the report said
    # "context 256" - also the token bootstrap's block length - for every model (user-journey review)
    assert "(context 16," in report and "(context 256," not in report
    items = ResultStore(out / "results" / "symlm.json").items()
    _forbid_computing(monkeypatch)
    monkeypatch.setattr("kpca_attention.tasks.language.suites.token_nll", lambda *a, **k: 1 / 0)
    assert "nothing to train or evaluate" in _invoke(args)  # reused
    assert ResultStore(out / "results" / "symlm.json").items() == items


def test_imagenet_c_subset_follows_the_clean_subset():
    from torch.utils.data import Subset, TensorDataset

    val = TensorDataset(torch.arange(10))
    corrupted = TensorDataset(torch.arange(10) + 100)
    picked = same_images(corrupted, Subset(val, [1, 3, 7]))
    assert [int(picked[i][0]) for i in range(3)] == [101, 103, 107]
    assert same_images(corrupted, val) is corrupted
    with pytest.raises(ValueError, match="same images"):
        same_images(TensorDataset(torch.arange(9)), val)


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
    clean = _results(out, "vit_mini_patch4_28")["clean_attack_subset"]
    # the same weights evaluated directly give the same clean accuracy on the same images
    from kpca_attention.data.images import build_image_dataset
    from kpca_attention.models.normalize import NormalizedModel
    from kpca_attention.tasks.classification.suites import fixed_subset

    # the attacked images: 8 drawn once with data seed (--seed 0) + 1, the same for every model
    ds = fixed_subset(build_image_dataset("fashion-mnist", "test"), 8, 1)
    x = torch.stack([ds[i][0] for i in range(8)])
    y = torch.tensor([ds[i][1] for i in range(8)])
    cfg = m.pretrained_cfg
    with torch.no_grad():
        acc = (NormalizedModel(m.eval(), cfg["mean"], cfg["std"])(x).argmax(1) == y).float().mean().item()
    assert clean["top1"] == pytest.approx(acc)
    # the items' key names the model (its normalisation and input size) and, when given, the data folder
    from kpca_attention.studies.spec import Source

    def key(dataset="imagefolder", **kw):
        return LoadedSource(Source(spec, dataset=dataset, **kw)).key()

    assert key()["model"] == "vit_mini_patch4_28" and "data_root" not in key()
    assert key(data_root="/data/a")["data_root"] == "/data/a" and key(data_root="/data/b") != key(
        data_root="/data/a")
    # another dataset's root is only where a copy lives (another machine, another mount): not keyed
    assert "data_root" not in key("fashion-mnist", data_root="/data/a")
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


def test_adaptive_twins_each_gradient_attack_and_the_report_checks_it(tmp_path, monkeypatch):
    """``--adaptive``: beside FGSM and PGD their adaptive twins (Square has none); the report's attack
    checks compare each twin with its plain attack on the same images; the command is recorded."""
    run = untrained_run(tmp_path / "ell", "elliptical_vit_mini_patch4_28", 0)
    out = tmp_path / "rob"
    args = [run, "--out", out, "--suite", "attacks", "--method", "fgsm,pgd,square", "--eps", "8/255",
            "--attack-n", 8, "--steps", 2, "--adaptive", "--no-progress", "--device", "cpu"]
    monkeypatch.setattr("sys.argv", ["kpca-attention", "robustness", *map(str, args)])
    _invoke(args)
    text = (out / "report.md").read_text()
    assert f"Regenerate: `kpca-attention robustness {run} --out {out} --suite attacks" in text
    attacks = _results(out, "ell")["attacks"]
    assert sorted(attacks) == ["fgsm", "fgsm-adaptive", "pgd-adaptive", "pgd-steps2", "square"]
    summary = json.loads((out / "summary.json").read_text())
    twins = {(c["stronger"], c["weaker"]) for c in summary["attack_checks"]["checks"]
             if c["rule"] == "adaptive >= plain"}
    assert twins == {("FGSM-ADAPTIVE", "FGSM"), ("PGD-ADAPTIVE", "PGD-STEPS2")}
    assert "adaptive >= plain" in text and "nor an adaptive one" not in text
    settings = json.loads((out / "settings.json").read_text())
    assert {a["label"]: a["options"] for a in settings["suites"]["attacks"] if a["label"]} == {
        "fgsm-adaptive": {"adaptive": True}, "pgd-adaptive": {"steps": 2, "adaptive": True}}
    bad = CliRunner().invoke(app, ["robustness", str(run), "--suite", "attacks", "--method", "square",
                                   "--adaptive", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--adaptive twins the gradient attacks" in bad.output


def test_a_character_language_model_is_refused_before_any_perplexity(tmp_path, monkeypatch):
    # the bible-cpu preset is character level: word swap changed its token count and crashed with a traceback
    # after minutes of clean perplexity (user-journey review)
    run = _lmuntrained_run(tmp_path / "symlm", monkeypatch, vocab_level="char")
    monkeypatch.setattr("kpca_attention.tasks.language.suites.token_nll", lambda *a, **k: 1 / 0)
    res = CliRunner().invoke(app, ["robustness", str(run), "--suite", "wordswap", "--max-tokens", "50",
                                   "--no-progress", "-o", str(tmp_path / "rob")])
    assert res.exit_code == 2, (res.output, res.exception)
    assert "needs a word-level vocabulary" in res.output and "--set vocab=word" in res.output
