"""Word-swap attack on language models (the paper's Table 3): replace 1.5% of the non-stopword words
of the evaluation text with the token ``AAA`` and compare perplexity on clean and attacked text.

Protocol as implemented here:

* the text is the corpus format of :mod:`kpca_attention.data.text` (whitespace-separated tokens,
  one line per verse/paragraph); swapping is 1-for-1, so token positions do not move;
* candidate words are tokens with at least one letter, made only of letters, digits, ``'`` and ``-``,
  whose lower case is not in scikit-learn's ``ENGLISH_STOP_WORDS`` (318 words; nltk's list would need
  a download) and that are not special tokens like ``<unk>``; punctuation and pure numbers are never
  swapped;
* ``round(rate * n_candidates)`` of them are chosen uniformly without replacement by
  ``numpy.random.default_rng(seed)``: the same text and seed give the same attacked text everywhere;
* ``AAA`` is encoded by the model's vocabulary like any other token; if it is not in the vocabulary it
  becomes ``<unk>`` (as in a word-level WikiText-103 model). The attacked text is scored as a whole,
  the swapped positions included, with the same perplexity function as the clean text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
from torch import nn

from ..checks import check_int, check_real
from ..tables import table_row

_CANDIDATE = re.compile(r"(?=.*[A-Za-z])[A-Za-z0-9'-]+")


def default_stopwords() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def swap_words(
    text: str,
    rate: float = 0.015,
    seed: int = 0,
    replacement: str = "AAA",
    stopwords: Collection[str] | None = None,
) -> tuple[str, dict[str, int]]:
    """Replace ``rate`` of the candidate (non-stopword) words of ``text`` by ``replacement``.

    Returns:
        ``(attacked_text, {"n_candidates": ..., "n_swapped": ..., "n_tokens": ...})``. Line breaks and
        token counts are preserved (tokens are re-joined with single spaces).

    Raises:
        ValueError: ``rate`` not a number in [0, 1], ``seed`` not an integer >= 0, ``replacement`` not
            one token, ``text`` not a string.
    """
    check_real(rate, "rate", min=0, max=1)
    check_int(seed, "seed", min=0)
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    if not isinstance(replacement, str) or not replacement or any(c.isspace() for c in replacement):
        raise ValueError(f"replacement must be one token without spaces, got {replacement!r}")
    stop = default_stopwords() if stopwords is None else frozenset(w.lower() for w in stopwords)
    lines = [line.split() for line in text.split("\n")]
    positions = [
        (i, j)
        for i, toks in enumerate(lines)
        for j, tok in enumerate(toks)
        if _CANDIDATE.fullmatch(tok) and tok.lower() not in stop
    ]
    k = int(round(rate * len(positions)))
    chosen = np.random.default_rng(seed).choice(len(positions), size=k, replace=False) if k else []
    for p in chosen:
        i, j = positions[int(p)]
        lines[i][j] = replacement
    stats = {"n_candidates": len(positions), "n_swapped": k, "n_tokens": sum(len(t) for t in lines)}
    return "\n".join(" ".join(toks) for toks in lines), stats


def wordswap_perplexity(
    model: nn.Module,
    encode: Callable[[str], Any],
    text: str,
    context: int,
    rate: float = 0.015,
    seed: int = 0,
    batch_size: int = 1,
    stride: int = 1,
    progress: bool = True,
    max_tokens: int | None = None,
) -> dict[str, float]:
    """Perplexity of ``model`` on ``text`` and on its word-swapped version.

    Args:
        encode: text -> 1-D token ids (e.g. ``Vocab.encode``).
        context, batch_size, stride: passed to :func:`kpca_attention.models.lm.perplexity` (stride 1 is
            the paper's protocol).
        max_tokens: score only the first ``max_tokens`` ids of both texts (quick runs; the swap is
            done on the whole text first, so it is the same attack, truncated).

    Raises:
        ValueError: before any work, for ``context``, ``batch_size``, ``stride`` not integers >= 1,
            ``stride`` > ``context``, ``max_tokens`` not an integer >= 2 (or None), or a bad ``rate``
            or ``seed`` (see :func:`swap_words`).
    """
    from ..models.lm import perplexity

    check_int(context, "context", min=1)
    check_int(batch_size, "batch_size", min=1)
    check_int(stride, "stride", min=1, max=context)
    check_int(max_tokens, "max_tokens", min=2, allow_none=True)
    check_real(rate, "rate", min=0, max=1)
    check_int(seed, "seed", min=0)

    attacked, stats = swap_words(text, rate=rate, seed=seed)
    clean_ids, attacked_ids = encode(text), encode(attacked)
    if max_tokens is not None:
        clean_ids, attacked_ids = clean_ids[:max_tokens], attacked_ids[:max_tokens]
    kw = {"context": context, "batch_size": batch_size, "stride": stride, "progress": progress}
    return {
        "clean": perplexity(model, clean_ids, **kw),
        "attacked": perplexity(model, attacked_ids, **kw),
        "tokens": int(len(clean_ids)),
        "rate": rate,
        "seed": seed,
        "stride": stride,
        **stats,
    }


def perplexity_table(results: Mapping[str, Mapping[str, Mapping[str, float]]], digits: int = 2) -> str:
    """Markdown table in the shape of the paper's Table 3: one row per model, clean and attacked
    perplexity per split. ``results[model][split]`` = :func:`wordswap_perplexity` output."""
    splits = list(dict.fromkeys(s for r in results.values() for s in r))
    head = [f"{s} ppl" for s in splits] + [f"{s} ppl (attacked)" for s in splits]
    lines = [table_row(["model", *head]), "|---|" + "---:|" * len(head)]
    for model, per_split in results.items():
        cells = [f"{per_split[s]['clean']:.{digits}f}" if s in per_split else "-" for s in splits]
        cells += [f"{per_split[s]['attacked']:.{digits}f}" if s in per_split else "-" for s in splits]
        lines.append(table_row([model, *cells]))
    return "\n".join(lines)
