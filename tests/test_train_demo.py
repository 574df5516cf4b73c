"""The demo end to end on tiny subsets (DemoSettings.quick): trains both models, evaluates clean,
corrupted and attacked accuracy, writes the report and plots; a second call reuses everything."""

from __future__ import annotations

import json

import pytest

from kpca_attention.demo import DemoSettings, run_demo

pytestmark = pytest.mark.usefixtures("single_thread")


def test_quick_demo_writes_report_and_resumes(tmp_path, capsys):
    out = tmp_path / "demo"
    report = run_demo(out, DemoSettings.quick(), progress=False)
    assert report == out / "report.md"
    text = report.read_text()
    for png in ("training_curves.png", "corruption_accuracy.png", "severity.png", "attacks.png"):
        assert (out / png).stat().st_size > 1000 and f"]({png})" in text
    res = json.loads((out / "results.json").read_text())["results"]
    assert set(res["clean"]) == {"SymViT", "RPC-SymViT"}
    for lab in ("SymViT", "RPC-SymViT"):
        acc = res["clean"][lab]["top1"]
        assert 0.0 <= acc <= 1.0 and res["clean"][lab]["n"] == 256
        assert set(res["corruptions"][lab]) == {"gaussian_noise", "contrast"}
        assert set(res["corruptions"][lab]["contrast"]) == {"1", "3", "5"}
        pgd = res["attacks"][lab]["pgd"][str(2 / 255)]
        assert pgd["max_norm"] <= 2 / 255 + 1e-6 and pgd["top1"] <= 1.0
        # the table shows the measured numbers
        assert f"{100 * acc:.2f}" in text
    # both models trained the same number of steps from the same seed: same initial weights, so the
    # RPC model differs only through its first block
    assert res["training"]["SymViT"]["steps"] == res["training"]["RPC-SymViT"]["steps"] == 8

    capsys.readouterr()
    run_demo(out, DemoSettings.quick(), progress=False)
    said = capsys.readouterr().out
    assert said.count("not retrained") == 2 and "evaluation results for these checkpoints found" in said

    # other settings: both models are trained again rather than silently reused
    other = DemoSettings.quick()
    other.seed = 1
    capsys.readouterr()
    run_demo(out, other, progress=False)
    said = capsys.readouterr().out
    assert said.count("trained with other settings (seed differ); training again") == 2
