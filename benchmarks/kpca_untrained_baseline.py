"""What the KPCA chance tests say about a network that learned nothing: all-MiniLM-L6-v2 against the same
architecture with random weights, on the same Bible texts, every measure against its null.

The token-permutation null asks whether V depends on the keys token by token. In any transformer V = X W_V
and K = X W_K are maps of the same token inputs, so it does, trained or not: if an untrained copy beats
the null by as much as (or more than) the trained model, "above chance" says nothing about kernel PCA.
The optimal cosine's Gaussian null keeps no structure of V's rows, so a V with other row geometry can come
out "below chance" whatever its relation to the keys; the rotated null (V R, R random orthogonal) keeps
that geometry. docs/kpca.md ("What the chance tests can say") reads
this script's output.

    .venv/bin/python benchmarks/kpca_untrained_baseline.py [--texts 8] [--json out.json]
"""

from __future__ import annotations

import argparse

import torch

from kpca_attention.io import write_json_atomic
from kpca_attention.kpca.analysis import CHANCE_MEASURES, AnalysisConfig, Analyzer
from kpca_attention.kpca.capture import QKVCapture
from kpca_attention.kpca.chance import chance_word, model_family
from kpca_attention.kpca.load import bible_texts, load_for_analysis
from kpca_attention.machine import cpu_model
from kpca_attention.train.resolve import untrained_copy


def measure(model: torch.nn.Module, enc: dict, n: int) -> dict[str, dict]:
    """Each measure's chance test (the null its verdict uses) for one model on the encoded texts."""
    cfg = AnalysisConfig(detail_samples=n, null_samples=n, null_draws=5, control_samples=0)
    with QKVCapture(model) as cap, torch.no_grad():
        model(**enc)
        an = Analyzer(cap.sites, cfg)
        an.add(cap.records, enc["attention_mask"].bool())
    s = an.result()["summary"]
    family = model_family(s, CHANCE_MEASURES)  # the words the claims table gives (Holm over the family)
    out = {m: family[m] for m in ("linear_cka", "kernel_cka")}
    out["optimal_cosine (Gaussian null, descriptive)"] = s["chance"]["optimal_cosine"]["gauss"]
    out["optimal_cosine (rotated null)"] = family["optimal_cosine"]
    out["gamma (tokens permuted)"] = family["gamma"]
    out["gamma (random control, descriptive)"] = s["gamma_vs_control"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=8, help="Bible texts (inputs)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}; torch {torch.__version__}; {args.texts} texts, seed {args.seed}")
    loaded = load_for_analysis("all-MiniLM-L6-v2", device="cpu")
    untrained = untrained_copy(loaded, seed=args.seed).model  # what `claims --untrained-baseline` compares
    enc = loaded.tokenizer(bible_texts(args.texts), truncation=True, max_length=128, padding=True,
                           return_tensors="pt")
    results = {}
    for name, model in (("trained", loaded.model.eval()), ("random weights", untrained)):
        results[name] = measure(model, enc, args.texts)
        for key, t in results[name].items():
            null = "null" if "(" in key else "perm. null"
            print(f"{name:15s} {key:30s} {t['measured']:.3f} vs {null} {t['null']:.3f} "
                  f"(diff {t['diff']:+.3f}, d_z {t['d_z']:.2f}, {t['n']} heads): {chance_word(t)}")
    if args.json:
        write_json_atomic(args.json, {"cpu": cpu_model(), "texts": args.texts, "seed": args.seed,
                                      "results": results})


if __name__ == "__main__":
    main()
