"""User errors on the command line: one line ``error: ...`` naming what is wrong and what is valid,
exit code 2, no traceback, and before any work is done."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.train.rundir import RunDir

CASES = [
    (["evaluate", "/missing/run"], "does not exist"),
    (["evaluate", "/missing/run", "--batch-size", "0"], "batch"),
    (["evaluate", "/missing/run", "--device", "foo"], "device"),
    (["robustness", "/missing/run", "-o", "{tmp}/r"], "no such checkpoint"),
    (["robustness", "/missing/run", "--baseline", "nope", "-o", "{tmp}/r"], "baseline 'nope'"),
    (["robustness", "/missing/run", "--suite", "attacks", "--method", "pgd", "--steps", "-3",
      "-o", "{tmp}/r"], "steps"),
    (["robustness", "/missing/run", "--suite", "weather", "-o", "{tmp}/r"], "unknown suite"),
    (["train", "--resume", "--overwrite", "-o", "{tmp}/t"], "cannot be combined"),
    (["train", "-o", "{tmp}/afile", "--epochs", "1"], "is a file"),
    (["train", "--set", "epochs=abc", "-o", "{tmp}/t"], "epochs"),
    (["train", "--set", "lr=fast", "-o", "{tmp}/t"], "lr"),
    (["train", "--set", "train_subset=1.5", "-o", "{tmp}/t"], "train_subset"),
    (["demo", "--quick", "--epochs", "2", "-o", "{tmp}/d"], "--quick sets its own budget"),
    (["demo", "--attack-images", "-1", "-o", "{tmp}/d"], "--attack-images"),
    (["study", "nope"], "unknown study 'nope'; valid: demo"),
    (["study", "vision", "--seeds", "0,x"], "comma-separated integers"),
    (["pap-trace", "/missing/path", "--out", "{tmp}/p"], "no such checkpoint"),
    (["report", "{tmp}"], "no study in"),
]


@pytest.mark.parametrize(("argv", "says"), CASES,
                         ids=[" ".join(a[:2]) + f" {i}" for i, (a, _) in enumerate(CASES)])
def test_user_errors_are_one_line_and_exit_2(argv, says, tmp_path) -> None:
    (tmp_path / "afile").write_text("not a folder")
    res = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert says in lines[0], lines[0]
    assert "Traceback" not in res.output


def test_a_busy_run_directory_is_one_line(tmp_path) -> None:
    with RunDir(tmp_path / "run").lock():
        res = CliRunner().invoke(app, ["train", "--preset", "digits-cpu", "-o", str(tmp_path / "run"),
                                       "--epochs", "1", "--no-progress"])
    assert res.exit_code == 2 and "being written by another process" in res.output
