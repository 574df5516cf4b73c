"""Bad command-line inputs of the last audit: one line ``error: ...`` naming what is wrong and what is
valid, exit code 2, before any work; and nothing written outside ``--out`` whatever a label, a model
name or a path used as a name says."""

from __future__ import annotations

import json
import shutil

import pytest
from run_fixtures import untrained_run
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.io import output_path

pytestmark = pytest.mark.usefixtures("single_thread_module")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return untrained_run(tmp_path_factory.mktemp("runs") / "run")


@pytest.fixture
def hf_folder(tmp_path):
    """What a Hugging Face model folder looks like from outside: config.json and weights, no COMPLETE."""
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def _one_line_error(res, says: str) -> str:
    assert res.exit_code == 2, (res.output, res.exception)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert says in lines[0], lines[0]
    return lines[0]


def _invoke(argv):
    return CliRunner().invoke(app, [str(a) for a in argv])


def _no_study_runs(monkeypatch):
    """A command refused before any work never reaches the study engine."""
    def boom(*a, **k):
        raise AssertionError("the study started")

    monkeypatch.setattr("kpca_attention.studies.run_study", boom)
    monkeypatch.setattr("kpca_attention.studies.engine.run_study", boom)


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


# --- nothing written outside --out -------------------------------------------------------------

@pytest.mark.parametrize("name", ["..", "../x.json", "a/../../x", "/tmp/abs.json", "", "sub/../.."])
def test_output_path_refuses_names_that_leave_the_folder(tmp_path, name) -> None:
    with pytest.raises(ValueError, match="output folder"):
        output_path(tmp_path / "out", name)


def test_output_path_refuses_a_link_pointing_out(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="outside the output folder"):
        output_path(out, "link", "x.json")
    assert output_path(out, "results", "a.json") == out / "results" / "a.json"
    assert output_path(out, "a..b.json") == out / "a..b.json"


def test_robustness_labels_stay_inside_out(run, tmp_path) -> None:
    out = tmp_path / "x" / "y" / "OUT"
    res = _invoke(["robustness", run, "--labels", "../../escaped", "-o", out, "--n", 8,
                   "--corruptions", "fog", "--severities", 1, "--no-progress", "--device", "cpu"])
    assert res.exit_code == 0, (res.output[-2000:], res.exception)
    outside = [p for p in tmp_path.rglob("*") if out not in p.parents and p != out and p.is_file()]
    assert outside == [], outside


def test_claims_on_a_path_ending_in_dotdot_writes_inside_out(run, tmp_path) -> None:
    parent = tmp_path / "parent"
    out = parent / "OUT"
    res = _invoke(["claims", run / "checkpoints" / "..", "-o", out, "--max-samples", 4, "--detail-samples", 0,
                   "--null-samples", 0, "--control-samples", 0, "--threads", 1])
    assert res.exit_code == 0, (res.output[-2000:], res.exception)
    assert _files(parent)[0] == out.relative_to(parent)
    assert all(out in p.parents or p == out for p in parent.rglob("*")), _files(parent)
    assert (out / "claims.md").is_file() and (out / "run" / "report.md").is_file()


def test_benchmark_name_cannot_leave_out(run, tmp_path) -> None:
    out = tmp_path / "b" / "c" / "bench"
    res = _invoke(["benchmark", run, "--name", "../../bx", "-o", out, "--n", 2, "--device", "cpu"])
    _one_line_error(res, "--name")
    assert not (tmp_path / "b").exists()


# --- every input checked before any work ---------------------------------------------------------

def test_claims_checks_every_model_before_analysing_any(run, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    weights = next(broken.rglob("model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    out = tmp_path / "claims"
    res = _invoke(["claims", run, broken, "-o", out, "--max-samples", 4, "--detail-samples", 0,
                   "--null-samples", 0, "--control-samples", 0])
    _one_line_error(res, "broken")
    assert not out.exists() or _files(out) == []


def test_claims_refuses_two_models_with_the_same_name(run, tmp_path) -> None:
    other = untrained_run(tmp_path / "elsewhere" / "run", seed=1)
    res = _invoke(["claims", run, other, "-o", tmp_path / "c", "--max-samples", 4])
    _one_line_error(res, "same name")


@pytest.mark.parametrize(("option", "value"), [("--batch-size", 0), ("--max-length", 0), ("--max-samples", 0),
                                               ("--prefixes", 0), ("--threads", 0)])
def test_analyze_options_are_checked_before_loading(option, value, tmp_path) -> None:
    res = _invoke(["analyze", "/missing/run", option, value, "--json", tmp_path / "a.json"])
    _one_line_error(res, f"{option} must be an integer >= 1")


def test_analyze_refuses_dataset_with_images(run, tmp_path) -> None:
    (tmp_path / "imgs").mkdir()
    res = _invoke(["analyze", run, "--dataset", "digits", "--images", tmp_path / "imgs",
                   "--json", tmp_path / "a.json"])
    _one_line_error(res, "--images or --dataset")


@pytest.mark.parametrize("option", ["--n", "--attack-n"])
def test_robustness_counts_are_bounded_by_the_split(run, tmp_path, option, monkeypatch) -> None:
    _no_study_runs(monkeypatch)
    res = _invoke(["robustness", run, option, 10**9, "--suite", "corruptions,attacks", "--corruptions", "fog",
                   "-o", tmp_path / "r"])
    line = _one_line_error(res, f"{option} must be an integer in [1, 360]")
    assert "test split of digits" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("command", "option"), [("demo", "--corrupt-images"), ("demo", "--attack-images"),
                                                 ("demo", "--train-subset"), ("ablate", "--corrupt-images"),
                                                 ("ablate", "--attack-images"), ("ablate", "--clean-images"),
                                                 ("ablate", "--train-subset")])
def test_demo_and_ablate_counts_are_bounded_by_the_dataset(command, option, tmp_path, monkeypatch) -> None:
    _no_study_runs(monkeypatch)
    res = _invoke([command, option, 10**9, "-o", tmp_path / "d"])
    _one_line_error(res, f"{option} must be an integer in")
    assert not (tmp_path / "d").exists()


# --- one line, not a traceback ---------------------------------------------------------------------

@pytest.mark.parametrize(("preset", "model", "sets", "says"), [
    ("digits-cpu", "symlm", [], "is a causal language modelling model (task 'lm') but preset 'digits-cpu'"),
    ("bible-cpu", "symvit_mini_patch4_28", [], "is an image classification model"),
    ("bible-cpu", "symlm", ["--set", "task=vision"], "but the config trains image classification"),
])
def test_train_refuses_a_model_of_another_task(preset, model, sets, says, tmp_path) -> None:
    res = _invoke(["train", "--preset", preset, "--model", model, "-o", tmp_path / "t", "--epochs", 1, *sets])
    line = _one_line_error(res, says)
    assert "task" in line and model in line


@pytest.mark.parametrize(("preset", "sets", "says"), [
    ("digits-cpu", ["context=64"], "context=64: task 'vision' does not use it"),
    ("bible-cpu", ["drop_path=0.1", "hflip=0.0"], "drop_path=0.1, hflip=0.0: task 'lm' does not use them"),
    ("fmnist-seg-cpu", ["mixup_mode=pair"], "mixup_mode='pair': task 'segmentation' does not use it"),
])
def test_train_refuses_settings_only_another_task_reads(preset, sets, says, tmp_path) -> None:
    argv = ["train", "--preset", preset, "-o", tmp_path / "t", "--epochs", 1]
    for item in sets:
        argv += ["--set", item]
    _one_line_error(_invoke(argv), says)
    assert not (tmp_path / "t").exists()


def test_evaluate_refuses_an_option_the_checkpoints_task_does_not_read(run, tmp_path) -> None:
    """``evaluate --stride 4`` on an image classifier (a run of this project or a timm name) evaluated as if
    the option were not given; the stride is a language model's sliding window."""
    says = "--stride 4 applies to the models of task 'lm' (causal language modelling) only"
    line = _one_line_error(_invoke(["evaluate", run, "--stride", 4, "--subset", 4]), says)
    assert f"{run} is a model of task 'vision' (image classification)" in line
    _one_line_error(_invoke(["evaluate", "vit_tiny_patch16_224", "--dataset", "digits", "--stride", 2]),
                    "--stride 2 applies to the models of task 'lm'")
    res = _invoke(["evaluate", run, "--stride", 1, "--subset", 4, "--json", tmp_path / "m.json"])
    assert res.exit_code == 0, res.output


def test_unread_options_names_what_a_task_would_ignore() -> None:
    from kpca_attention.tasks import get, unread_options

    assert unread_options(get("vision"), {"stride": 1}) == []
    assert unread_options(get("vision"), {"stride": 3}) == ["stride"]
    assert unread_options(get("lm"), {"stride": 3}) == []
    assert unread_options(get("lm"), {"window": 3}) == ["window"]  # no task reads it


@pytest.mark.parametrize(("key", "says"), [("act_layer", "valid: celu, elu, gelu"),
                                           ("norm_layer", "valid: batchnorm")])
def test_train_names_timms_layer_names_for_an_unknown_one(key, says, tmp_path) -> None:
    res = _invoke(["train", "--preset", "digits-cpu", "-o", tmp_path / "t",
                   "--set", f"model_kwargs.{key}=os.system"])
    line = _one_line_error(res, says)
    assert f"{key}='os.system' is not a name timm knows" in line
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("command", ["evaluate", "robustness"])
def test_a_hugging_face_folder_is_not_called_an_incomplete_run(command, hf_folder, tmp_path) -> None:
    res = _invoke([command, hf_folder, *(["-o", tmp_path / "r"] if command == "robustness" else [])])
    line = _one_line_error(res, "Hugging Face model folder")
    assert "COMPLETE" not in line and "NAME@FILE" in line


@pytest.mark.parametrize("command", [["study", "demo"], ["ablate"]])
def test_empty_seed_list_is_refused(command, tmp_path, monkeypatch) -> None:
    _no_study_runs(monkeypatch)
    res = _invoke([*command, "--seeds", "", "-o", tmp_path / "s", "--runs", tmp_path / "r"]
                  if command[0] == "study" else [*command, "--seeds", "", "-o", tmp_path / "s"])
    _one_line_error(res, "--seeds")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("eps", ["1e309", "2/0", "abc"])
def test_robustness_budgets_that_are_no_number_are_one_line(run, tmp_path, eps) -> None:
    """1e309 overflows a float: it raised OverflowError through to a traceback."""
    res = CliRunner().invoke(app, ["robustness", str(run), "--suite", "attacks", "--eps", eps, "-o",
                                   str(tmp_path / "out")])
    assert res.exit_code == 2 and "expected comma-separated numbers" in res.output, res.output
    assert "Traceback" not in res.output



@pytest.mark.parametrize(("argv", "says"), [
    (["robustness", "x", "--n", "abc"], "Invalid value for '--n'"),
    (["robustness"], "Missing argument 'checkpoints'"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_parse_errors_are_one_line_from_the_entry_point(argv, says, capsys) -> None:
    """What click rejects while parsing (a bad value, a missing argument, an unknown command) printed
    click's four lines (usage, hint, blank, error); the entry point now prints one, as for the commands'
    own errors, with exit code 2."""
    from kpca_attention.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert says in lines[0] and "--help" in lines[0], lines[0]


def test_system_errors_say_what_in_words() -> None:
    """An OSError's line was "[Errno 20] Not a directory: 'x/y'": now the path and the system's words."""
    from kpca_attention.checks import error_line

    assert error_line(NotADirectoryError(20, "Not a directory", "/etc/passwd/x")) == \
        "/etc/passwd/x: not a directory"
    assert error_line(ValueError("--n must be >= 1")) == "--n must be >= 1"
    assert error_line(ValueError("first\nsecond")) == "first" and error_line(KeyError()) == "KeyError"


@pytest.mark.parametrize(("args", "says"), [
    (["--suite", "attacks", "--method", "fgsm,pgd,fgsm"], "--method: fgsm given twice"),
    (["--severities", "1,2,01"], "--severities: 1 given twice"),
    (["--suite", "attacks", "--eps", "4/255,0.01568627450980392"], "--eps: 0.0156862745"),
    (["--corruptions", "fog,fog"], "--corruptions: fog given twice"),
])
def test_an_item_given_twice_is_refused(run, tmp_path, args, says) -> None:
    """Duplicates reached settings.json and ran twice (--method fgsm,fgsm recorded the attack twice)."""
    res = CliRunner().invoke(app, ["robustness", str(run), *args, "-o", str(tmp_path / "rob")])
    _one_line_error(res, says)
    assert not (tmp_path / "rob" / "results").exists()


def test_a_file_that_is_not_an_image_is_one_line(tmp_path) -> None:
    """A text file named a.png under --images gave PIL's 50-line UnidentifiedImageError traceback."""
    from kpca_attention.kpca.load import load_image_folder

    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_text("hi")
    with pytest.raises(ValueError, match=r"a.png is not a readable image \(UnidentifiedImageError"):
        load_image_folder(tmp_path / "imgs", (1, 28, 28))


def test_json_output_cannot_replace_the_runs_own_files(run, tmp_path) -> None:
    """evaluate --json RUN/checkpoints/latest.json left a run nothing could load, analyze --json
    RUN/config.json replaced the run's config; both are refused before any work, and a name of the user's
    own in the run folder still works."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    latest = next(copy.rglob("latest.json"))
    ckpt = next(p for p in (copy / "checkpoints").iterdir() if p.is_dir())  # a checkpoint folder as MODEL
    for args in (["evaluate", str(copy), "--subset", "8", "--json", str(latest)],
                 ["analyze", str(copy), "--json", str(copy / "config.json"), "--max-samples", "2",
                  "--dataset", "digits"],
                 ["evaluate", str(ckpt), "--subset", "8", "--json", str(latest)],
                 ["evaluate", str(ckpt), "--subset", "8", "--json", str(copy / "config.json")]):
        res = CliRunner().invoke(app, args)
        _one_line_error(res, "would replace a file of the run")
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before
    ok = CliRunner().invoke(app, ["evaluate", str(copy), "--subset", "8", "--json", str(copy / "eval.json")])
    assert ok.exit_code == 0, ok.output
    assert json.loads((copy / "eval.json").read_text())


def test_the_eigensolver_error_names_its_option(run, tmp_path) -> None:
    """--eigensolver x said "unknown method 'x'" (the config's field), not the option the user typed."""
    res = CliRunner().invoke(app, ["analyze", str(run), "--eigensolver", "x", "--json",
                                   str(tmp_path / "a.json"), "--dataset", "digits", "--max-samples", "2"])
    _one_line_error(res, "--eigensolver must be one of auto, dense, lowrank")


@pytest.mark.parametrize("argv", [["pap-trace", "x", "-o", ""], ["analyze", "x", "--json="],
                                  ["robustness", "x", "--out", ""]])
def test_an_empty_option_value_is_refused(argv, tmp_path, monkeypatch, capsys) -> None:
    """-o "" (an unset variable) was taken for the current folder: report.md and plots were written there."""
    from kpca_attention.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "is given an empty value" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_three_unclear_messages_of_the_fuzz_review(run, tmp_path) -> None:
    """leaderboard --markdown FOLDER named an internal temporary file; report FILE said FILE/settings.json
    was missing; benchmark --threat-model corruptions --version rand dropped --version without a word."""
    (tmp_path / "board").mkdir()
    _one_line_error(CliRunner().invoke(app, ["leaderboard", "--markdown", str(tmp_path / "board"), "-o",
                                             str(tmp_path / "lb")]), "--markdown")
    (tmp_path / "notes.json").write_text("{}")
    _one_line_error(CliRunner().invoke(app, ["report", str(tmp_path / "notes.json")]), "is a file")
    _one_line_error(CliRunner().invoke(app, ["benchmark", str(run), "--threat-model", "corruptions",
                                             "--version", "rand", "-o", str(tmp_path / "bm")]),
                    "corruptions run no attack")
    assert not (tmp_path / "lb").exists() and not (tmp_path / "bm").exists()


def test_study_status_refuses_options_that_would_run_something(tmp_path) -> None:
    """study NAME --status --force printed the status and ignored --force without a word."""
    for extra in ("--force", "--any-machine", "--keep-going"):
        res = CliRunner().invoke(app, ["study", "rpc-depth12", "--status", extra, "--out",
                                       str(tmp_path / "o"), "--runs", str(tmp_path / "r")])
        _one_line_error(res, f"--status only reports and runs nothing: {extra}")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ["train", "-o", "OUT/t"], ["evaluate", "RUN"], ["robustness", "RUN", "-o", "OUT/r"],
    ["benchmark", "RUN", "-o", "OUT/b"], ["study", "demo", "--out", "OUT/s"],
    ["analyze", "RUN", "--json", "OUT/a.json"], ["pap-trace", "RUN", "-o", "OUT/p"]])
def test_every_command_that_computes_takes_threads_and_refuses_zero(args, run, tmp_path) -> None:
    # docs/robustness.md: one thread is many times faster on a busy machine; train, evaluate, robustness
    # and benchmark had no --threads (a user exported OMP_NUM_THREADS by hand), and two commands checked it
    # apart from the rest
    args = [a.replace("RUN", str(run)).replace("OUT", str(tmp_path)) for a in args]
    res = CliRunner().invoke(app, [*args, "--threads", "0"])
    _one_line_error(res, "--threads must be an integer >= 1; got 0")


def test_set_threads_sets_torch_s_threads() -> None:
    import torch

    from kpca_attention.cli import set_threads

    before = torch.get_num_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1
        set_threads(None)  # torch's default stays as it is
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_segmentation_run_given_to_robustness_is_one_line_naming_its_study(tmp_path) -> None:
    # it failed with "task 'segmentation' is evaluated with SegmentationSuites, got ImageSuites"
    import torch

    from kpca_attention import tasks
    from kpca_attention.train import get_preset
    from kpca_attention.train.checkpoint import save_checkpoint

    seg = tmp_path / "seg"
    cfg = get_preset("fmnist-seg-cpu", output_dir=str(seg))
    torch.manual_seed(0)
    save_checkpoint(seg, model=tasks.get(cfg.task).build_model(cfg), config=cfg,
                    state={"progress": {"epoch": 0, "step_in_epoch": 0, "global_step": 0}}, finished=True)
    res = CliRunner().invoke(app, ["robustness", str(seg), "--suite", "attacks", "-o", str(tmp_path / "o")])
    _one_line_error(res, "robustness evaluates image classifiers and language models, not a semantic "
                         "segmentation model")
    assert "kpca-attention study segmentation" in res.output


def test_a_large_linf_budget_warns_in_one_line(tmp_path) -> None:
    # --eps 0.5 (an L2 habit, or half a grey level meant) ran PGD at 127.5/255 without a word
    import warnings

    from kpca_attention.robustness.attacks import check_pixel_budget

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check_pixel_budget("Linf", 0.5, "--eps")
        check_pixel_budget("Linf", 16 / 255, "--eps")
        check_pixel_budget("L2", 0.5, "--eps")
    assert [str(w.message).split(",")[0] for w in seen] == [
        "--eps 0.5 is an Linf budget of 127.5/255 in pixel units (images in [0"]


def test_train_refuses_a_folder_that_is_not_a_run(hf_folder, tmp_path) -> None:
    """A security review trained into a Hugging Face model folder: its config.json was replaced, and with
    --overwrite its tb/ (a user file in it) deleted. Refused now, with or without --overwrite, nothing
    touched; a folder whose config.json is a training config (a run killed before its first checkpoint)
    still takes the run."""
    (hf_folder / "tb").mkdir()
    (hf_folder / "tb" / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in hf_folder.rglob("*") if p.is_file()}
    args = ["train", "--preset", "digits-cpu", "--max-steps", "1", "--no-progress", "--set",
            "model_kwargs.depth=1", "--set", "train_subset=64", "--set", "eval_subset=16",
            "-o", str(hf_folder)]
    for extra in ([], ["--overwrite"]):
        _one_line_error(CliRunner().invoke(app, [*args, *extra]), "is not a training config of this project")
    assert {p: p.read_bytes() for p in hf_folder.rglob("*") if p.is_file()} == before
    killed = tmp_path / "killed"  # what a run leaves before its first checkpoint: its config and logs
    killed.mkdir()
    from kpca_attention.train import get_preset

    (killed / "config.json").write_text(get_preset("digits-cpu", output_dir=str(killed)).to_json())
    ok = CliRunner().invoke(app, [*args[:-1], str(killed)])
    assert ok.exit_code == 0, ok.output


def test_robustness_refuses_n_where_it_would_be_ignored(run, tmp_path) -> None:
    """With --suite attacks alone the clean accuracy is measured on the attacked images: --n was dropped
    in silence (and never range-checked)."""
    res = _invoke(["robustness", run, "-o", tmp_path / "r", "--suite", "attacks", "--n", 100000,
                   "--attack-n", 4, "--method", "fgsm", "--eps", "1/255"])
    _one_line_error(res, "--n counts the clean and corrupted images; with --suite attacks and no corruptions")


def test_a_diverging_run_is_one_line(tmp_path) -> None:
    res = _invoke(["train", "--preset", "digits-cpu", "--max-steps", 12, "--lr", "1e30", "-o", tmp_path / "t",
                   "--no-progress"])
    _one_line_error(res, "loss is nan at step")


@pytest.mark.parametrize(("extra", "says"), [
    (["--suite", "attacks", "--method", "fgsm", "--eps", "1/255", "--steps", 5, "--attack-n", 4],
     "--steps sets the iterations of pgd, sld, cw; --method fgsm runs none of them"),
])
def test_robustness_refuses_options_that_would_run_nothing(run, tmp_path, extra, says) -> None:
    res = _invoke(["robustness", run, "-o", tmp_path / "r", *extra])
    _one_line_error(res, says)
    assert not (tmp_path / "r" / "results").exists()
