"""Word swap: deterministic 1.5% of non-stopword words -> AAA, and perplexity clean vs attacked."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kpca_attention.data.text import Vocab
from kpca_attention.models.lm import create_lm
from kpca_attention.robustness.wordswap import default_stopwords, perplexity_table, swap_words

pytestmark = pytest.mark.usefixtures("single_thread_module")


TEXT = "\n".join(
    f"and the king {w} went unto the city of {w}s , and he said {i} times : behold the {w} ."
    for i, w in enumerate(["david", "saul", "jonathan", "samuel", "absalom", "joab"] * 20)
)


def test_swap_is_seeded_counted_and_spares_stopwords_and_punctuation():
    attacked, stats = swap_words(TEXT, rate=0.1, seed=0)
    assert attacked == swap_words(TEXT, rate=0.1, seed=0)[0]
    assert attacked != swap_words(TEXT, rate=0.1, seed=1)[0]
    clean_toks, att_toks = TEXT.split(), attacked.split()
    assert len(clean_toks) == len(att_toks) == stats["n_tokens"]
    assert attacked.count("\n") == TEXT.count("\n")
    changed = [(a, b) for a, b in zip(clean_toks, att_toks, strict=True) if a != b]
    assert len(changed) == stats["n_swapped"] == round(0.1 * stats["n_candidates"])
    stop = default_stopwords()
    assert all(b == "AAA" and a.lower() not in stop and a.isalnum() and not a.isdigit() for a, b in changed)
    candidates = {t for t in clean_toks if t.lower() not in stop and any(c.isalpha() for c in t)}
    assert stats["n_candidates"] == sum(t in candidates for t in clean_toks)


def test_default_rate_and_zero_rate():
    attacked, stats = swap_words(TEXT)
    assert stats["n_swapped"] == round(0.015 * stats["n_candidates"]) > 0
    assert swap_words(TEXT, rate=0.0)[0] == "\n".join(" ".join(line.split()) for line in TEXT.split("\n"))


class _Unigram(nn.Module):
    """A unigram LM: the same next-token distribution everywhere (the train counts, add-one)."""

    def __init__(self, counts: torch.Tensor):
        super().__init__()
        self.logp = nn.Parameter(torch.log(counts / counts.sum()))

    def forward(self, idx, targets=None):
        return self.logp.expand(*idx.shape, -1), None


def test_attack_raises_perplexity_of_a_fitted_model():
    vocab = Vocab.build(TEXT)
    ids = vocab.encode(TEXT)
    counts = torch.bincount(ids, minlength=len(vocab)).float() + 1.0
    model = _Unigram(counts)
    from kpca_attention.robustness.wordswap import wordswap_perplexity

    res = wordswap_perplexity(model, vocab.encode, TEXT, context=8, rate=0.05, batch_size=64, progress=False)
    assert res["attacked"] > res["clean"] > 1
    assert res["tokens"] == len(ids) and res["n_swapped"] > 0
    # a real causal LM runs through the same path
    lm = create_lm("symlm", len(vocab), preset="small", n_layer=1, d_ff=32, context=16)
    res_lm = wordswap_perplexity(lm, vocab.encode, TEXT, context=16, batch_size=64, stride=8,
                                 max_tokens=200, progress=False)
    assert res_lm["tokens"] == 200 and res_lm["clean"] > 1 and res_lm["attacked"] > 1
    table = perplexity_table({"unigram": {"valid": res, "test": res}})
    header = "| model | valid ppl | test ppl | valid ppl (attacked) | test ppl (attacked) |"
    assert table.splitlines()[0] == header
    assert f"{res['attacked']:.2f}" in table
    # a model name holding a pipe stays one cell
    assert perplexity_table({"lm|rpc": {"test": res}}).splitlines()[2].startswith("| lm\\|rpc | ")
