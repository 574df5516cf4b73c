"""``robustness`` (and ``study`` / ``ablate``: the same engine) refuse an output folder whose ``results/`` or
``cache/`` is a symbolic link leading out of it, before any work, with one line; nothing is written
through the link. A runs folder kept elsewhere on purpose (``--runs``, or ``<out>/runs`` linked to another
disk) still works."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_fixtures import untrained_run
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.studies.engine import cache_dir_of, result_path
from kpca_attention.studies.spec import Variant

pytestmark = pytest.mark.usefixtures("single_thread_module")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return untrained_run(tmp_path_factory.mktemp("runs") / "symvit", "symvit_mini_patch4_28", 0)


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


@pytest.mark.parametrize("linked", ["results", "cache"])
def test_robustness_refuses_a_link_leading_out_of_out(run, tmp_path, linked):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / linked).symlink_to(elsewhere, target_is_directory=True)
    res = CliRunner().invoke(app, ["robustness", str(run), "--out", str(out), "--n", "8", "--corruptions",
                                   "fog", "--severities", "1", "--no-progress", "--device", "cpu"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2, (res.output[-3000:], res.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "outside the output folder" in lines[0] and str(out) in lines[0]
    assert _files(elsewhere) == []  # nothing written through the link
    assert _files(out) == [Path(linked)]  # and nothing else either: refused before any work


def test_links_inside_the_folder_and_runs_elsewhere_are_kept(tmp_path):
    v = Variant("symvit", "SymViT", "symvit_mini_patch4_28")
    disk = tmp_path / "disk"
    (disk / "runs" / "cache").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs").symlink_to(disk / "runs", target_is_directory=True)  # the runs on another disk
    assert cache_dir_of(out / "runs") == out / "runs" / "cache"
    assert cache_dir_of(disk / "runs") == disk / "runs" / "cache"  # --runs elsewhere
    (out / "kept").mkdir()
    (out / "results").symlink_to(out / "kept", target_is_directory=True)  # a link that stays inside
    assert result_path(out, v, 0) == out / "results" / "symvit-s0.json"
    (out / "results").unlink()
    (out / "results").symlink_to(disk, target_is_directory=True)
    with pytest.raises(ValueError, match="would write outside the output folder"):
        result_path(out, v, 0)
    (disk / "runs" / "cache").rmdir()
    (disk / "runs" / "cache").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ValueError, match="corrupted-image cache 'cache' would write outside"):
        cache_dir_of(out / "runs")
