"""The paper's language experiment (Table 3) in shape: Symlm vs RPC-Symlm vs the ordinary LM on the
word-level King James Bible, trained to a plateau on the CPU, over seeds.

The paper trains 16-layer, 8-head, d_model 128 models with context 256 on WikiText-103 (500k steps)
and puts PAP in layers 1-4 (a quarter of the depth), 4 iterations, lambda 4. Scaled down here (the
``small`` LM preset): 4 layers, 4 heads of width 16 (the paper's head width), d_model 64, feed-forward
256, dropout 0.1, context 128, PAP in layer 1 (a quarter of the depth), 4 iterations, lambda 4,
tau = lambda * mu with the prefix mu of the causal mask (mu_i from keys j <= i: nothing from later
tokens reaches position i). Full tied softmax over the 13,354-word training vocabulary (the paper's
adaptive softmax is for WikiText-103's 267k words). Adam, lr 1e-3, 200 warm-up steps, cosine decay to
0, batch 16 windows (2,048 tokens), 6 epochs over the 852k training tokens (about 2,500 steps).

Evaluated on the first 20,000 tokens of the valid and test splits with the paper's sliding window
(stride 1), clean and word-swapped (1.5% of the non-stopwords -> ``AAA``), per token; the PAP trace
and mu / tau along the sequence of every RPC-Symlm on 256 windows of the valid split.
"""

from __future__ import annotations

from typing import Any

from ..tasks.language.suites import LMSuites
from .margins import language_margins
from .spec import Study, Variant

__all__ = ["language_study", "quick_language_study", "LANGUAGE_RECIPE", "LM_RPC"]

#: the paper's RPC setting for its LMs, scaled: PAP in the first quarter of the layers (layer 1 of 4)
LM_RPC: dict[str, Any] = {"rpc_layers": [0], "rpc_iters": 4, "rpc_lambda": 4.0}

#: The recipe (overrides of the ``lm`` preset). Sized from a pilot on the loaded 2-core machine
#: (docs/results.md, Language): about 4,000 training tokens per CPU-second, so 6 epochs (5.1 M tokens)
#: take about 21 minutes of a core per run and the 9 runs, evaluation included, about 1 h 50 min as
#: two single-thread runs in parallel on otherwise idle cores. The per-epoch held-out perplexity is measured
#: on the corpus's own valid split (whole chapters, disjoint from train and test: the language task's
#: validation split, so ``val_size`` stays None); the suites score valid and test at the end.
LANGUAGE_RECIPE: dict[str, Any] = dict(
    dataset="bible-kjv", vocab="word", context=128, batch_size=16, eval_batch_size=32, eval_subset=None,
    lr=1e-3, warmup_steps=200, epochs=6, log_every_steps=50, checkpoint_every_steps=200,
)


def language_variants(size: dict[str, Any]) -> tuple[Variant, ...]:
    return (
        Variant("symlm", "Symlm", "symlm", dict(size), "causal symmetric softmax attention in every layer"),
        Variant("rpc_symlm", "RPC-Symlm", "rpc_symlm", {**size, **LM_RPC},
                "PAP in layer 1 of 4, 4 iterations, lambda 4, prefix mu (causal)"),
        Variant("lm", "LM (asymmetric)", "lm", dict(size), "ordinary causal softmax attention with queries"),
    )


def language_study(*, seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5), epochs: int = 6,
                   tokens: int | None = 20000, positions: int = 256) -> Study:
    """The language study (defaults: 6 seeds, the least the paper's perplexity claims were given; 6 epochs;
    20k evaluation tokens per split)."""
    return Study(
        name="language",
        title="Symlm vs RPC-Symlm vs the ordinary LM on the word-level King James Bible "
              "(paper Table 3 in shape)",
        description="The paper's WikiText-103 models scaled down for a CPU: 4 layers of 4 heads (width "
                    "16), d_model 64, context 128, PAP in the first layer. The runs of one seed share the "
                    "seed and see the same batches.",
        variants=language_variants({"preset": "small"}), seeds=tuple(seeds), preset="lm",
        recipe={**LANGUAGE_RECIPE, "epochs": epochs},
        suites=LMSuites(tokens=tokens, positions=positions),
        baseline="symlm", trace=positions, margins=language_margins(),
    )


def quick_language_study() -> Study:
    """A minute-scale smoke run (tests): a 2-layer 32-wide model, 4 training steps, 300-token slices."""
    tiny = {"preset": "small", "n_layer": 2, "d_model": 32, "n_head": 2, "d_ff": 64}
    return Study(
        name="language",
        title="Symlm vs RPC-Symlm vs the ordinary LM (quick smoke run)",
        variants=language_variants(tiny), seeds=(0,), preset="lm",
        recipe={**LANGUAGE_RECIPE, "context": 16, "epochs": 1, "train_subset": 64, "eval_subset": 8,
                "warmup_steps": 2, "log_every_steps": 2},
        suites=LMSuites(tokens=300, positions=4, batch_size=32),
        baseline="symlm", trace=4,
    )
