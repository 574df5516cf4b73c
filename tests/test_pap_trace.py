"""The PAP trace over a model and data (kpca_attention.kpca.pap_trace), its report and the pap-trace
command."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from typer.testing import CliRunner

from kpca_attention.attention import RPCAttention, SymmetricAttention, replace_attention
from kpca_attention.cli import app
from kpca_attention.kpca.pap_trace import rpc_layers, trace_model, trace_statement
from kpca_attention.pap import pap
from kpca_attention.report.pap_trace import write_trace_report

pytestmark = pytest.mark.usefixtures("single_thread")

DIM, HEADS = 32, 2


def tiny(seed: int = 0, **rpc) -> VisionTransformer:
    """A 2-block ViT on 16 px gray images (16 patches + CLS) with RPC in both blocks."""
    torch.manual_seed(seed)
    model = VisionTransformer(img_size=16, patch_size=4, in_chans=1, embed_dim=DIM, depth=2, num_heads=HEADS,
                              num_classes=3, attn_layer=SymmetricAttention)
    replace_attention(model, RPCAttention, "all", n_iter=3, **rpc)
    return model.eval()


def batches(sizes: tuple[int, ...], seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(n, 1, 16, 16, generator=g) for n in sizes]


def direct_info(model: VisionTransformer, x: torch.Tensor, block: int, lam: float, **kw) -> dict:
    """pap(return_info=True) on the k, v the layer sees (read through its hook points)."""
    seen = {}
    attn = model.blocks[block].attn
    hooks = [attn.hook_k.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o)),
             attn.hook_v.register_forward_hook(lambda m, i, o: seen.__setitem__("v", o))]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return pap(seen["k"], seen["v"], 3, lam, return_info=True, **kw)[1]


def test_single_batch_equals_pap_info() -> None:
    model = tiny(lam=0.05, threshold="lambda_over_mu")
    (x,) = batches((6,))
    tr = trace_model(model, [x])
    assert tr["n_samples"] == 6 and list(tr["layers"]) == ["blocks.0.attn", "blocks.1.attn"]
    for b, name in enumerate(tr["layers"]):
        info = direct_info(model, x, b, 0.05, threshold="lambda_over_mu")
        q = tr["layers"][name]["quantities"]
        for key in ("s_density", "tau", "k_abs_max", "primal_residual", "dual_norm"):
            np.testing.assert_allclose(q[key]["mean"], info[key], rtol=1e-5)
            np.testing.assert_allclose(q[key]["per_head"], torch.stack(info[key + "_per_head"]).T, rtol=1e-5)
        assert q["s_density"]["mean"][0] > 0.1  # small lam: S active, so the comparison means something
    assert tr["summary"]["s_active"]


def test_batches_are_weighted_by_size() -> None:
    model = tiny(lam=0.05, threshold="lambda_over_mu")
    xs = batches((2, 7))
    both = trace_model(model, xs)
    parts = [trace_model(model, [x]) for x in xs]
    for key in ("s_density", "dual_norm"):
        m = [np.asarray(p["layers"]["blocks.1.attn"]["quantities"][key]["mean"]) for p in parts]
        np.testing.assert_allclose(both["layers"]["blocks.1.attn"]["quantities"][key]["mean"],
                                   (2 * m[0] + 7 * m[1]) / 9, rtol=1e-10)
        lo = both["layers"]["blocks.1.attn"]["quantities"][key]["min"]
        assert np.all(np.asarray(lo) <= np.minimum(m[0], m[1]) + 1e-12)
    assert both["n_batches"] == 2 and both["n_samples"] == 9


def test_official_threshold_never_active_and_statement() -> None:
    model = tiny(lam=4.0)  # official tau = lam * mu: far above |K| at init
    tr = trace_model(model, batches((4, 4)))
    assert not tr["summary"]["s_active"] and tr["summary"]["s_density_max"] == 0.0
    assert tr["summary"]["tau_over_kmax_min"] > 1.0
    text = trace_statement(tr)
    assert "never active" in text and "8 inputs" in text


def test_ablated_layers_report_what_they_do() -> None:
    model = tiny(lam=0.05, threshold="lambda_over_mu", sparse=False)
    tr = trace_model(model, batches((3,)))
    layer = tr["layers"]["blocks.0.attn"]
    assert layer["settings"]["sparse"] is False and not layer["s_active"]
    assert math.isinf(layer["quantities"]["tau"]["mean"][0])
    model = tiny(lam=0.05, threshold="lambda_over_mu", dual=False)
    tr = trace_model(model, batches((3,)))
    assert tr["layers"]["blocks.0.attn"]["quantities"]["dual_norm"]["max"] == [0.0, 0.0, 0.0]
    assert tr["summary"]["s_active"]


def test_flags_and_modes_restored_and_errors() -> None:
    model = tiny().train()
    trace_model(model, batches((2,)))
    assert model.training and all(m.pap_hooks() is None for m in rpc_layers(model).values())  # hooks removed
    with pytest.raises(ValueError, match="no RPCAttention layer"):
        trace_model(torch.nn.Linear(2, 2), [torch.zeros(1, 2)])
    with pytest.raises(ValueError, match="no batches"):
        trace_model(tiny(), [])


def test_report_files(tmp_path) -> None:
    model = tiny(lam=4.0, sparse=False)
    tr = trace_model(model, batches((3,)))
    report = write_trace_report(tr, tmp_path, source="tiny", inputs="noise")
    text = report.read_text()
    assert "never active" in text and "| 3 |" in text
    assert (tmp_path / "blocks_0_attn.png").stat().st_size > 1000

    def strict(c: str) -> float:
        raise AssertionError(f"non-standard JSON constant {c}")

    data = json.loads((tmp_path / "pap_trace.json").read_text(), parse_constant=strict)
    assert data["layers"]["blocks.0.attn"]["quantities"]["tau"]["mean"][0] is None  # inf -> null
    assert data["statement"] == trace_statement(tr)


def test_cli_on_a_model_name_and_image_folder(tmp_path) -> None:
    from PIL import Image

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    g = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(g.integers(0, 255, (28, 28), dtype=np.uint8)).save(imgs / f"{i}.png")
    out = tmp_path / "trace"
    r = CliRunner().invoke(app, ["pap-trace", "rpc_symvit_mini_patch4_28", "--images", str(imgs), "--out",
                                 str(out), "--batch-size", "2"])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "pap_trace.json").read_text())
    assert data["n_samples"] == 5 and data["n_batches"] == 3
    assert list(data["layers"]) == ["blocks.0.attn"]
    assert "sparse component" in r.output
    r = CliRunner().invoke(app, ["pap-trace", "symvit_mini_patch4_28", "--images", str(imgs), "--out",
                                 str(out)])
    assert r.exit_code == 2 and "no RPCAttention layer" in r.output
