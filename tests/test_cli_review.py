"""What a review of the command line as a user found, each now one line and exit code 2 before any work (or
the right behaviour): sealing a file that is not a result file, resuming from the run's own config, unknown
devices and model keywords, outputs that cannot be written, options that --quick or --set would ignore."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kpca_attention.cli import app

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "digits-cpu", "--max-steps", "2", "--epochs", "3", "--no-progress"]


def _run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_error(res, *words: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("name", ["settings.json", "summary.json"])
def test_results_seal_refuses_a_json_file_that_is_not_a_result_file(tmp_path, name) -> None:
    folder = tmp_path / "study"
    shutil.copytree(ROOT / "results" / "elliptical-adaptive", folder)
    before = (folder / name).read_bytes()
    for cmd in ("seal", "verify"):
        _one_line_error(_run("results", cmd, folder / name), "not a result file")
    assert (folder / name).read_bytes() == before


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    res = _run("train", *TINY, "--model", "rpc_symvit_mini_patch4_28", "-o", out)
    assert res.exit_code == 0, res.output
    return out


def _saved(out: Path) -> dict:
    return json.loads(sorted((out / "checkpoints").glob("e*/config.json"))[-1].read_text())


def test_resume_starts_from_the_runs_saved_config(run, tmp_path) -> None:
    """Without --preset or --epochs the run keeps its model, dataset and epochs (the preset's default
    fmnist-cpu and its 10 epochs used to replace them); what is given now changes only itself."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    res = _run("train", "-o", copy, "--resume", "--max-steps", "4", "--no-progress")
    assert res.exit_code == 0, res.output
    saved = _saved(copy)
    assert (saved["model"], saved["dataset"], saved["epochs"], saved["max_steps"]) == (
        "rpc_symvit_mini_patch4_28", "digits", 3, 4)
    _one_line_error(_run("train", "-o", copy, "--resume", "--preset", "fmnist-cpu"), "saved config",
                    "digits-cpu")


def test_an_option_given_twice_is_refused() -> None:
    _one_line_error(_run("train", "--epochs", "3", "--set", "epochs=7", "--print-config"), "epochs",
                    "give it once")


def test_an_unknown_model_keyword_is_one_line(tmp_path) -> None:
    _one_line_error(_run("train", *TINY, "--set", "model_kwargs.nope=1", "-o", tmp_path / "r"),
                    "unexpected keyword argument 'nope'")


@pytest.mark.parametrize("device", ["tpu", "cuda:7", "gpu"])
def test_an_unknown_or_missing_device_is_refused_everywhere(run, tmp_path, device) -> None:
    _one_line_error(_run("analyze", run, "--json", tmp_path / "a.json", "--device", device,
                         "--max-samples", "2"), "device")
    _one_line_error(_run("robustness", run, "-o", tmp_path / "rb", "--device", device, "--n", "2",
                         "--corruptions", "fog", "--severities", "1"), "device")
    assert not (tmp_path / "rb").exists()


def test_outputs_that_cannot_be_written_are_refused_before_the_work(run, tmp_path) -> None:
    folder = tmp_path / "a_folder"
    folder.mkdir()
    _one_line_error(_run("analyze", run, "--json", folder, "--max-samples", "2"), "--json", "is a folder")
    _one_line_error(_run("evaluate", run, "--json", folder), "--json", "is a folder")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    _one_line_error(_run("robustness", run, "-o", a_file, "--n", "2"), "--out", "is a file")
    _one_line_error(_run("robustness", run, "-o", tmp_path / "rb", "--seed", "-1"), "--seed")
    assert not (tmp_path / "rb").exists()


def test_ablate_quick_refuses_the_options_it_would_ignore(tmp_path) -> None:
    _one_line_error(_run("ablate", "--quick", "--epochs", "3", "-o", tmp_path / "ab"), "--quick", "--epochs")
    _one_line_error(_run("ablate", "--quick", "--train-subset", "1000000000", "-o", tmp_path / "ab"),
                    "--train-subset")
    assert not (tmp_path / "ab").exists()


@pytest.mark.parametrize("size", ["0", "-1"])
def test_benchmark_checks_its_batch_size(run, tmp_path, size) -> None:
    _one_line_error(_run("benchmark", run, "--n", "2", "--batch-size", size, "-o", tmp_path / "bm"),
                    "--batch-size")


def test_checkpoint_weights_are_readable_like_the_other_files(run) -> None:
    ckpt = sorted((run / "checkpoints").glob("e*"))[-1]
    modes = {f.name: f.stat().st_mode & 0o777 for f in ckpt.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"], modes


def test_folders_that_are_files_are_named_in_one_line(run, tmp_path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    _one_line_error(_run("study", "demo", "--runs", a_file, "-o", tmp_path / "d"), "--runs", "is a file")
    _one_line_error(_run("study", "demo", "-o", a_file, "--status"), "--out", "is a file")
    _one_line_error(_run("pap-trace", run, "-o", a_file), "--out", "is a file")
    _one_line_error(_run("leaderboard", "--results", tmp_path / "missing", "-o", tmp_path / "lb"),
                    "--results")


def test_the_leaderboard_refuses_a_folder_without_studies_before_writing(tmp_path) -> None:
    """One study's folder (or an empty one) wrote an empty leaderboard and reset the results page's tables."""
    study = tmp_path / "results" / "vision"
    study.mkdir(parents=True)
    shutil.copy(ROOT / "results" / "vision" / "settings.json", study / "settings.json")
    page = tmp_path / "results.md"
    page.write_text("kept\n")
    lb = ["-o", tmp_path / "lb", "--markdown", tmp_path / "lb.md", "--results-page", page]
    _one_line_error(_run("leaderboard", "--results", study, *lb), "holds no study folders", "give its parent")
    (tmp_path / "empty").mkdir()
    _one_line_error(_run("leaderboard", "--results", tmp_path / "empty", *lb), "holds no study folders")
    _one_line_error(_run("leaderboard", "--results", tmp_path / "results", "-o", tmp_path / "lb",
                         "--markdown", tmp_path / "lb.md", "--results-page", tmp_path / "nope.md"),
                    "--results-page", "does not exist")
    assert page.read_text() == "kept\n" and not (tmp_path / "lb.md").exists()


def test_a_misspelt_model_name_is_unknown_with_close_names() -> None:
    _one_line_error(_run("evaluate", "symvit_mini_patch4_82", "--dataset", "digits"), "unknown model",
                    "symvit_mini_patch4_28")


@pytest.mark.parametrize("args, words", [
    (["train", "--preset", "digits-cpu", "--max-steps", "0"], ["--max-steps must be an integer >= 1; got 0"]),
    (["train", "--preset", "digits-cpu", "--epochs", "0"], ["--epochs must be"]),
    (["study", "demo", "--jobs", "0", "--status"], ["--jobs must be an integer >= 1; got 0"]),
])
def test_option_errors_name_the_option_as_typed_without_none(args, words, tmp_path) -> None:
    """An option's None is leaving it out: the message names --max-steps, not the field max_steps, and
    does not offer "or None" (which the command line cannot give)."""
    res = _run(*args, "-o", tmp_path / "out")
    _one_line_error(res, *words)
    assert "None" not in res.output


def test_the_config_field_keeps_its_name_with_set(tmp_path) -> None:
    _one_line_error(_run("train", "--preset", "digits-cpu", "--set", "max_steps=0", "-o", tmp_path / "o"),
                    "max_steps must be an integer >= 1 or None")


@pytest.mark.parametrize("suite, option, value", [
    ("corruptions", "--n", "0"), ("wordswap", "--rate", "2"), ("wordswap", "--max-tokens", "1"),
    ("attacks", "--attack-n", "0"), ("corruptions", "--batch-size", "0")])
def test_robustness_numeric_options_name_themselves(run, tmp_path, suite, option, value) -> None:
    res = _run("robustness", run, "-o", tmp_path / "rb", "--suite", suite, option, value)
    _one_line_error(res, option + " must be")
    assert "None" not in res.output and not (tmp_path / "rb").exists()


@pytest.mark.parametrize("args, words", [
    (["--method", "pgd", "--eps", "8/255"], ["--method, --eps only apply to --suite attacks"]),
    (["--suite", "attacks", "--rate", "0.1"], ["--rate only applies to --suite wordswap"]),
    (["--suite", "attacks", "--severities", "1"], ["--severities only applies to --suite corruptions"]),
    (["--suite", "corruptions", "--stride", "4"], ["--stride only applies to --suite wordswap"]),
])
def test_robustness_refuses_options_of_a_suite_that_does_not_run(run, tmp_path, args, words) -> None:
    """`--method pgd --eps 8/255` without `--suite attacks` used to run the corruptions and no attack."""
    _one_line_error(_run("robustness", run, "-o", tmp_path / "rb", *args), *words)
    assert not (tmp_path / "rb").exists()


def test_evaluate_refuses_a_subset_larger_than_the_split(run, tmp_path) -> None:
    """It used to shrink to the split in silence (robustness, demo and ablate refuse such counts)."""
    for split in ("val", "test"):
        _one_line_error(_run("evaluate", run, "--split", split, "--subset", "100000"),
                        "subset must be an integer in [1, ", f"the images of the {split} split of digits")
    res = _run("evaluate", run, "--subset", "5", "--json", tmp_path / "m.json")
    assert res.exit_code == 0, res.output
    n = json.loads((tmp_path / "m.json").read_text())["n"]
    assert n == 5 and isinstance(n, int)  # a count, not 5.0


def test_paths_of_the_wrong_kind_say_so(run, tmp_path) -> None:
    a_file = tmp_path / "a_file.png"
    a_file.write_text("x")
    _one_line_error(_run("analyze", run, "--images", a_file, "--json", tmp_path / "a.json"), "is a file")
    _one_line_error(_run("evaluate", f"vit_mini_patch4_28@{tmp_path}", "--dataset", "digits"), "is a folder")


def test_one_short_name_for_a_model_everywhere(run) -> None:
    """benchmark named `RUN/checkpoints/..` `..` (and wrote `.../4_255/...json`), claims resolved it to the
    run, robustness named a checkpoint folder by its run: one rule now (studies.sources.model_label)."""
    from kpca_attention.studies.sources import default_labels, model_label

    ckpt = sorted((run / "checkpoints").glob("e*"))[-1]
    assert model_label(str(run / "checkpoints" / "..")) == run.name
    assert model_label(str(ckpt)) == run.name and model_label(str(run) + "/") == run.name
    assert model_label("vit_mini_patch4_28@/nowhere/w.safetensors") == "vit_mini_patch4_28"
    assert model_label("org/some_model") == "some_model"
    assert default_labels([str(run), str(ckpt), "vit_mini_patch4_28"]) == [run.name, f"{run.name}-2",
                                                                           "vit_mini_patch4_28"]


def test_a_model_names_its_task_through_the_task_registry() -> None:
    """train's check that a model fits its preset's task asks each task (Task.owns_name) instead of a list
    of model names kept in the command line; the image models no other task claims are classification's."""
    from kpca_attention.tasks import of_model_name

    assert of_model_name("rpc_symlm").name == "lm" and of_model_name("neutreno_lm").name == "lm"
    assert of_model_name("segmenter_rpc_symvit_mini_patch4_32").name == "segmentation"
    for name in ("vit_tiny_patch16_224", "rpc_fan_symvit_mini_patch4_28", "twicing_vit_mini_patch4_28"):
        assert of_model_name(name).name == "vision", name
    assert of_model_name("no_such_model") is None
    _one_line_error(_run("train", "--preset", "digits-cpu", "--model", "rpc_symlm", "--print-config"),
                    "is a causal language modelling model", "task 'lm'")
    # a name no task knows: --print-config printed its config with exit 0 (training then failed)
    _one_line_error(_run("train", "--model", "symvit_mini_patch4_2", "--print-config"),
                    "unknown model 'symvit_mini_patch4_2'", "close names: symvit_mini_patch4_32")


def test_robustness_attacks_a_small_split_whole_by_default(run) -> None:
    """--attack-n defaulted to 500, more than digits' 360 test images: every attack run on digits failed
    unless --attack-n was given. The default is now 500 or all of a smaller split; a count given is
    still bounded by the split."""
    from kpca_attention.cli.robustness import robustness_study

    study = robustness_study([str(run)], ("attacks",), methods=("fgsm",), eps=(2 / 255,))
    assert {a.n for a in study.suites.attacks} == {360}
    with pytest.raises(ValueError, match=r"--attack-n must be an integer in \[1, 360\]"):
        robustness_study([str(run)], ("attacks",), methods=("fgsm",), eps=(2 / 255,), attack_n=500)
