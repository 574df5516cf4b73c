"""The recipes of docs/architecture.md that are code a user runs: each block is executed as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("single_thread")


def test_a_study_of_your_own_runs_from_a_script(tmp_path, monkeypatch):
    # "Add a study" said only to edit the package (studies/__init__.py); a user's own study is a script
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"A study of your own.*?```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "recipe"}
    exec(compile(block, "docs/architecture.md", "exec"), namespace)  # noqa: S102 - our own docs
    out = tmp_path / "runs" / "my-study"
    assert (tmp_path / namespace["report"]).resolve() == out / "report.md" and (out / "report.md").is_file()
    verdicts = json.loads((out / "summary.json").read_text())["verdicts"]
    assert verdicts["margins"]["clean"]["value"] == 2.0
    assert verdicts["cells"]["twicing"]["clean"]["n"] == 3  # three paired seeds, a word from the engine
