"""The ablation runner (kpca_attention.ablations) and its report (kpca_attention.ablation_report)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from kpca_attention.ablation_report import _bootstrap_ci, _mcnemar, load_results, write_ablation_report
from kpca_attention.ablations import VARIANTS, AblationSettings, candes_lambda, run_ablations
from kpca_attention.layers import RPCAttention
from kpca_attention.models import create_model

pytestmark = pytest.mark.usefixtures("single_thread")


def test_candes_lambda_of_the_mini_model() -> None:
    # 28 px / patch 4 = 49 patches + CLS = 50 tokens; head width 64 / 4 = 16
    assert candes_lambda() == pytest.approx(1 / math.sqrt(50))


def test_variants_build_what_they_say_with_the_same_init() -> None:
    weights = {}
    for slug, v in VARIANTS.items():
        torch.manual_seed(3)
        model = create_model(v.model, **v.kwargs)
        attn = model.blocks[0].attn
        weights[slug] = attn.in_proj.weight.detach().clone()
        if slug == "symvit":
            assert not isinstance(attn, RPCAttention)
            continue
        assert isinstance(attn, RPCAttention) and attn.n_iter == 4
        assert not any(isinstance(b.attn, RPCAttention) for b in model.blocks[1:])  # block 1 only
        assert attn.sparse == (slug != "rpc_no_sparse") and attn.dual == (slug != "rpc_no_dual")
        if slug.startswith("rpc_paper"):
            mult = float(slug.removeprefix("rpc_paper_x"))
            assert attn.threshold == "lambda_over_mu" and attn.mu_dim == 16
            assert attn.lam == pytest.approx(mult / math.sqrt(50))
        else:
            assert attn.threshold == "lambda_mu" and attn.lam == 4.0 and attn.mu_dim is None
    for slug, w in weights.items():  # K/V carried over: every variant starts from SymViT's weights
        torch.testing.assert_close(w, weights["symvit"], msg=slug)


def test_paired_statistics() -> None:
    a = np.array([True] * 30 + [False] * 10)
    b = np.array([True] * 10 + [False] * 30)
    n01, n10, p = _mcnemar(a, b)
    assert (n01, n10) == (20, 0) and p == pytest.approx(2 * 0.5**20)
    assert _mcnemar(a, a)[2] == 1.0
    rng = np.random.default_rng(0)
    lo, hi = _bootstrap_ci(a, b, rng)
    assert lo <= 0.5 <= hi and lo > 0.2  # true difference 0.5
    assert _bootstrap_ci(a, a, rng) == (0.0, 0.0)
    # corrupted views (views, images) are resampled per image with all their views
    lo, hi = _bootstrap_ci(np.stack([a, a]), np.stack([b, b]), rng)
    assert lo <= 0.5 <= hi


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown variant"):
        AblationSettings(variants=("symvit", "rpc_magic"))
    with pytest.raises(ValueError, match="at least one seed"):
        AblationSettings(seeds=())


def _tiny(**kw) -> AblationSettings:
    opts = dict(
        train_subset=128,
        eval_subset=64,
        clean_images=64,
        corrupt_images=8,
        corruptions=("gaussian_noise",),
        severities=(3,),
        attack_images=8,
        trace_images=16,
    )
    return AblationSettings.quick(**{**opts, **kw})


def test_end_to_end_resumable(tmp_path, capsys) -> None:
    settings = _tiny(seeds=(0, 1), variants=("symvit", "rpc_no_dual"))
    report = run_ablations(tmp_path, settings, progress=False)
    res = load_results(tmp_path)
    assert sorted(res) == ["rpc_no_dual", "symvit"] and sorted(res["symvit"]) == [0, 1]
    r = res["rpc_no_dual"][0]
    assert len(r["clean"]) == 64 and set(r["clean"]) <= {"0", "1"}
    assert len(r["corruptions"]["gaussian_noise"]["3"]) == 8 and len(r["attacks"]["pgd"]["2"]) == 8
    trace = r["trace"]["layers"]["model.blocks.0.attn"]
    assert trace["settings"]["dual"] is False and trace["quantities"]["dual_norm"]["max"] == [0.0] * 4
    assert "trace" not in res["symvit"][0]
    text = report.read_text()
    assert "| SymViT | 0,1 |" in text and "| RPC no dual | 0,1 |" in text
    assert "SymViT s1 - s0" in text and "McN p" in text and "PAP trace" in text
    tput = json.loads((tmp_path / "throughput.json").read_text())["images_per_s"]
    assert sorted(tput) == ["rpc_no_dual", "symvit"] and min(tput.values()) > 0
    assert f"{tput['rpc_no_dual']:.0f} ({tput['rpc_no_dual'] / tput['symvit']:.2f}x)" in text
    # SymViT's trained weights in the official-tau RPC layer without the dual compute SymViT's function
    swaps = json.loads((tmp_path / "swaps.json").read_text())["rows"]
    (row,) = [r for r in swaps if r["seed"] == 0 and r["what"].startswith("SymViT weights in the 'RPC no")]
    assert row["max_abs_logit_diff"] < 1e-4 and row["same_prediction"] == 1.0
    (row,) = [r for r in swaps if r["seed"] == 0 and r["what"].startswith("SymViT weights in the official")]
    assert row["max_abs_logit_diff"] > 1e-3  # the dual feedback does change the function
    assert "Trained weights with an ablation switched on" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["paired"]["rpc_no_dual"]["clean"]["diffs"]) == 2
    # the accuracy in the table is the mean of the per-image results
    acc = np.mean([np.mean([c == "1" for c in res["symvit"][s]["clean"]]) for s in (0, 1)])
    assert f"| SymViT | 0,1 | {100 * acc:.1f} ± " in text
    # a second call retrains and re-evaluates nothing
    capsys.readouterr()
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "results").glob("*.json")}
    run_ablations(tmp_path, settings, progress=False)
    log = capsys.readouterr().out
    assert log.count("not retrained") == 4 and log.count("evaluation cached") == 4
    assert "throughput" not in log and "switched on" not in log
    assert mtimes == {p: p.stat().st_mtime_ns for p in (tmp_path / "results").glob("*.json")}
    # other training settings in the same folder are refused, not silently mixed
    with pytest.raises(ValueError, match="trained with other settings"):
        run_ablations(tmp_path, _tiny(seeds=(0,), variants=("symvit",), train_subset=96), progress=False)
    assert write_ablation_report(tmp_path) == report


def test_report_needs_results(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no results"):
        write_ablation_report(tmp_path)
