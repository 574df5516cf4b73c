"""Capturing q, k, v from project layers, timm and Hugging Face models; the whole-model analysis."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer

from kpca_attention.attention import RPCAttention, ScaledAttention, SymmetricAttention, configure
from kpca_attention.kpca.analysis import AnalysisConfig
from kpca_attention.kpca.callback import ProjectionLossCallback
from kpca_attention.kpca.capture import QKVCapture, find_attention_sites
from kpca_attention.kpca.load import load_for_analysis
from kpca_attention.kpca.run import analyze_model
from kpca_attention.tasks import get as get_task

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good.",
    "And God called the light Day, and the darkness he called Night.",
]


def _vit(attn_layer=Attention, **kw) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(
        img_size=16,
        patch_size=4,
        in_chans=1,
        num_classes=3,
        embed_dim=24,
        depth=2,
        num_heads=2,
        attn_layer=attn_layer,
        **kw,
    ).eval()


def _check_reproduces_output(model: torch.nn.Module, x: torch.Tensor) -> None:
    """q, k, v captured must give each layer's output through softmax attention + the output proj."""
    outs = {}
    handles = [
        s.module.register_forward_hook(lambda m, i, o, n=s.name: outs.__setitem__(n, o))
        for s in find_attention_sites(model)
    ]
    with QKVCapture(model) as cap, torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    for site, rec in cap:
        q, k, v = rec["q"], rec["k"], rec["v"]
        b, h, n, d = q.shape
        assert (h, d) == (site.num_heads, site.head_dim)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, h * d)
        torch.testing.assert_close(site.module.proj(y), outs[site.name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_timm_attention_capture(qk_norm):
    model = _vit(qk_norm=qk_norm)
    if qk_norm:  # make the norms non-trivial so applying them matters
        for blk in model.blocks:
            torch.nn.init.normal_(blk.attn.q_norm.weight, 1.0, 0.5)
    sites = find_attention_sites(model)
    assert [s.kind for s in sites] == ["timm", "timm"]
    _check_reproduces_output(model, torch.rand(2, 1, 16, 16))


def test_project_symmetric_capture():
    model = _vit(SymmetricAttention)
    sites = find_attention_sites(model)
    assert [s.kind for s in sites] == ["project", "project"]
    _check_reproduces_output(model, torch.rand(2, 1, 16, 16))


def test_scaled_attention_uses_effective_values():
    model = _vit(configure(ScaledAttention, mode="scalar"))
    for blk in model.blocks:
        blk.attn.alpha.data.fill_(0.7)
    res = analyze_model(
        _loaded(model),
        images=torch.rand(3, 1, 16, 16),
        progress=False,
        config=AnalysisConfig(detail_samples=1),
    )
    s = res["summary"]
    assert "raw_v_linear_cka" in s and s["raw_v_linear_cka"] != pytest.approx(s["linear_cka"])
    assert res["model"]["attention_types"] == [type(model.blocks[0].attn).__name__]


def test_rpc_trace_and_restores_flag():
    model = _vit(configure(RPCAttention, n_iter=3, lam=4.0))
    res = analyze_model(
        _loaded(model),
        images=torch.rand(2, 1, 16, 16),
        progress=False,
        config=AnalysisConfig(detail_samples=0),
    )
    assert len(res["pap"]) == 2 and all(len(v) == 3 for v in res["pap"].values())
    assert 0.0 <= res["summary"]["pap_s_density_max"] <= 1.0
    assert all(blk.attn.pap_hooks() is None for blk in model.blocks)  # the trace's hooks removed


def _loaded(model):
    from kpca_attention.kpca.load import LoadedModel

    return LoadedModel(name="tiny", model=model, task=get_task("vision"), input_size=(1, 16, 16),
                       normalize=None)


@pytest.fixture(scope="module")
def minilm():
    return load_for_analysis("all-MiniLM-L6-v2")


def test_minilm_capture_matches_attention_and_respects_padding(minilm):
    enc = minilm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    sites = find_attention_sites(minilm.model)
    assert len(sites) == 6 and all(s.kind == "hf" and s.num_heads == 12 and s.head_dim == 32 for s in sites)
    outs = {}
    hook = sites[0].module.register_forward_hook(lambda m, i, o: outs.__setitem__("y", o[0]))
    with QKVCapture(minilm.model, sites) as cap, torch.no_grad():
        minilm.model(**enc)
    hook.remove()
    q, k, v = (cap.records[0][key] for key in ("q", "k", "v"))
    mask = enc["attention_mask"].bool()
    logits = q @ k.mT / math.sqrt(32) + torch.where(mask, 0.0, -1e9)[:, None, None, :]
    y = (logits.softmax(-1) @ v).transpose(1, 2).reshape(len(TEXTS), -1, 384)
    torch.testing.assert_close(y[mask], outs["y"][mask], atol=1e-5, rtol=1e-4)

    res = analyze_model(minilm, texts=TEXTS, progress=False, config=AnalysisConfig(detail_samples=2))
    tokens = res["records"]["tokens"]
    lengths = enc["attention_mask"].sum(1).tolist()
    assert sorted(set(tokens)) == sorted(set(lengths))  # only real tokens analysed
    res2 = analyze_model(
        minilm, texts=TEXTS, progress=False, special_tokens=False, config=AnalysisConfig(detail_samples=0)
    )
    assert sorted(set(res2["records"]["tokens"])) == sorted({n - 2 for n in lengths})  # no [CLS]/[SEP]
    s = res["summary"]
    for key in (
        "linear_cka",
        "kernel_cka",
        "optimal_cosine",
        "direct_cosine",
        "j_proj",
        "phi_norm_sq",
        "h_norm_sq",
    ):
        assert key in s and math.isfinite(s[key])
    assert 0 <= s["linear_cka"] <= 1 and -1 <= s["optimal_cosine"] <= 1


def test_callback_logs_both_variants():
    model = _vit(SymmetricAttention)
    logged = []

    class Logger:
        def log(self, metrics):
            logged.append(dict(metrics))

    cb = ProjectionLossCallback((torch.rand(4, 1, 16, 16), torch.zeros(4)))
    cb(model, 0, Logger())
    m = logged[0]
    for prefix in ("kpca/", "kpca_official/"):
        for key in ("j_proj", "phi_norm_sq", "h_norm_sq"):
            assert math.isfinite(m[prefix + key])
        assert m[prefix + "j_proj"] == pytest.approx(m[prefix + "phi_norm_sq"] - m[prefix + "h_norm_sq"])
    assert "kpca_official/log_j_proj" in m
    assert not model.training


def test_loading_a_hugging_face_model_draws_no_bar_into_a_log(capsys) -> None:
    # stderr is no terminal under capsys, as in a log file: transformers' "Loading weights" bar stays out
    # of it (README: progress bars on a terminal only), and the user's setting is restored afterwards
    import transformers.utils.logging as hf_logging

    from kpca_attention.kpca.load import load_for_analysis

    assert hf_logging.is_progress_bar_enabled()
    load_for_analysis("all-MiniLM-L6-v2")
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err
    assert hf_logging.is_progress_bar_enabled()


def test_train_logs_j_proj_from_the_command_line_and_a_resume_keeps_its_batch(tmp_path) -> None:
    # P2 ("J_proj falls during training") was n/a for every run trained with the CLI: only Python's
    # train(cfg, callbacks=[...]) or a benchmarks script could log it (user-journey review)
    import csv

    from typer.testing import CliRunner

    from kpca_attention.cli import app

    run = tmp_path / "run"
    args = ["train", "--preset", "digits-cpu", "-o", str(run), "--epochs", "2", "--threads", "1",
            "--set", "train_subset=64", "--set", "eval_subset=32", "--set", "batch_size=16",
            "--set", "model_kwargs.depth=1", "--no-progress"]
    res = CliRunner().invoke(app, [*args, "--log-jproj", "8"])
    assert res.exit_code == 0, res.output
    with open(run / "epochs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(float(r["kpca/j_proj"]) == float(r["kpca/j_proj"]) for r in rows)
    mark = (run / "jproj_batch.sha256").read_text()
    (run / "jproj_batch.sha256").write_text("0" * 64 + "\n")  # as if logged on other images
    res = CliRunner().invoke(app, ["train", "-o", str(run), "--resume", "--max-steps", "8",
                                   "--log-jproj", "8"])
    assert res.exit_code == 2 and "logged J_proj on another batch" in res.output, res.output
    assert len(mark) == 65
    res = CliRunner().invoke(app, [*args, "--log-jproj", "0", "--overwrite"])
    assert res.exit_code == 2 and "--log-jproj must be an integer >= 1" in res.output, res.output
