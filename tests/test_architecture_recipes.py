"""The recipes of docs/architecture.md that are code a user runs: each block is executed as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("single_thread")


def run_recipe(doc: str, after: str, cwd: Path, monkeypatch) -> dict:
    """Execute, in ``cwd``, the first python block of ``docs/<doc>`` after the text ``after``; its names."""
    text = (REPO / "docs" / doc).read_text()
    block = re.search(re.escape(after) + r".*?```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(cwd)
    namespace: dict = {"__name__": "recipe"}
    exec(compile(block, f"docs/{doc}", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def test_a_study_of_your_own_runs_from_a_script(tmp_path, monkeypatch):
    # "Add a study" said only to edit the package (studies/__init__.py); a user's own study is a script
    namespace = run_recipe("architecture.md", "A study of your own", tmp_path, monkeypatch)
    out = tmp_path / "runs" / "my-study"
    assert (tmp_path / namespace["report"]).resolve() == out / "report.md" and (out / "report.md").is_file()
    verdicts = json.loads((out / "summary.json").read_text())["verdicts"]
    assert verdicts["margins"]["clean"]["value"] == 2.0
    assert verdicts["cells"]["twicing"]["clean"]["n"] == 3  # three paired seeds, a word from the engine


def test_a_segmentation_study_of_your_own_runs_from_a_script(tmp_path, monkeypatch):
    # a user found no documented way to run the segmentation suites on Segmenters of their own
    namespace = run_recipe("segmentation.md", "## Comparing your own Segmenters", tmp_path, monkeypatch)
    out = tmp_path / "runs" / "my-seg"
    report = (out / "report.md").read_text()
    assert (tmp_path / namespace["report"]).resolve() == out / "report.md"
    summary = json.loads((out / "summary.json").read_text())
    cells = summary["verdicts"]["cells"]["rpc"]
    assert cells["clean:miou"]["n"] == 2 and cells["corrupted:miou"]["n"] == 2  # two paired seeds
    assert "gaussian_noise" in report and "contrast" in report
