"""Ablations of RPC-Attention on Fashion-MNIST: where does its robustness come from?

SymViT, the official RPC setting, the paper's threshold convention with a lambda sweep, RPC with the
sparse part S forced to zero, RPC without the dual update; over seeds, on the demo's corruptions and
FGSM / PGD-20, with the PAP trace of every RPC variant, training throughput side by side, and swap
checks (trained weights with an ablation switched on at inference).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..tasks.classification.suites import Attack, Corruptions, ImageSuites
from .checks import throughput_check
from .demo import DEMO_CORRUPTIONS, RPC_OFFICIAL
from .spec import Check, Study, Variant

__all__ = ["candes_lambda", "ablation_variants", "ablation_study", "SWAPS", "swap_checks"]

MODEL_SIZE = "mini_patch4_28"


def candes_lambda(size: str = MODEL_SIZE, **arch_overrides: Any) -> float:
    """Candes et al.'s robust-PCA lambda ``1 / sqrt(max(N, D))`` for the key matrix of one head
    (N tokens incl. the class token, D head width) of a size in :data:`kpca_attention.models.vit.ARCHS`,
    with the model kwargs that change it (``embed_dim``, ``num_heads``, ...) applied."""
    from ..models.vit import ARCHS

    arch = {**ARCHS[size]["arch"], **arch_overrides}
    n = (arch["img_size"] // arch["patch_size"]) ** 2 + 1
    d = arch["embed_dim"] // arch["num_heads"]
    return 1.0 / math.sqrt(max(n, d))


def ablation_variants(size: str = MODEL_SIZE) -> tuple[Variant, ...]:
    from ..models.vit import ARCHS

    sym, rpc = f"symvit_{size}", f"rpc_symvit_{size}"
    arch = ARCHS[size]["arch"]
    d = arch["embed_dim"] // arch["num_heads"]
    lam_c = candes_lambda(size)
    out = [
        Variant("symvit", "SymViT", sym, {}, "symmetric softmax attention in every block"),
        Variant("rpc_official", "RPC official", rpc, dict(RPC_OFFICIAL),
                "PAP in block 1, 4 iterations, tau = lam * mu, lam = 4, mu_dim = H*D (official code)"),
    ]
    for mult in (0.5, 1.0, 2.0):
        out.append(Variant(
            f"rpc_paper_x{mult:g}", f"RPC paper lam x{mult:g}", rpc,
            {**RPC_OFFICIAL, "rpc_lambda": mult * lam_c, "rpc_threshold": "lambda_over_mu", "rpc_mu_dim": d},
            f"tau = lam / mu, mu_dim = D, lam = {mult:g} x 1/sqrt(max(N, D)) = {mult * lam_c:.4g}"))
    out.append(Variant("rpc_no_sparse", "RPC S = 0", rpc, {**RPC_OFFICIAL, "rpc_sparse": False},
                       "official, S forced to zero: iterated attention with dual feedback"))
    out.append(Variant("rpc_no_dual", "RPC no dual", rpc, {**RPC_OFFICIAL, "rpc_dual": False},
                       "official, dual update removed (Y = 0)"))
    return tuple(out)


#: (trained variant, ablation switched on at inference, what it tests)
SWAPS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("rpc_official", {"rpc_sparse": False}, "official RPC weights, S forced to zero"),
    ("rpc_official", {"rpc_dual": False}, "official RPC weights, dual update removed"),
    ("symvit", {**RPC_OFFICIAL, "rpc_dual": False}, "SymViT weights in the 'RPC no dual' layer"),
    ("symvit", dict(RPC_OFFICIAL), "SymViT weights in the official RPC layer"),
)


@torch.no_grad()
def swap_checks(study: Study, runs: dict[tuple[str, int], Path],
                n_images: int = 2000) -> list[dict[str, Any]]:
    """Does an ablation change the function a *trained* model computes? For each pair of :data:`SWAPS`
    the trained weights are loaded unchanged into the model with the ablation switched on (the
    symmetric RPC layer has SymViT's parameters, so the state dicts match) and compared with the
    original on the first ``n_images`` test images: max |logit difference|, fraction of equal
    predictions, and both accuracies."""
    from torch.utils.data import Subset

    from ..data.images import build_image_dataset
    from ..robustness.common import collect_logits
    from ..train import load_model

    rpc_model = next(v.model for v in study.variants if v.model.startswith("rpc_"))
    test = Subset(build_image_dataset("fashion-mnist", "test"), range(n_images))
    rows = []
    for seed in study.seeds:
        for slug, switch, what in SWAPS:
            if (slug, seed) not in runs:
                continue
            model, cfg = load_model(runs[(slug, seed)])
            cfg2 = type(cfg).from_dict({**cfg.to_dict(), "model": rpc_model,
                                        "model_kwargs": {**cfg.model_kwargs, **switch}})
            swapped = study.task.build_model(cfg2)
            swapped.load_state_dict(model.state_dict())
            swapped.eval()
            a, labels = collect_logits(model, test, batch_size=500, progress=False)
            b, _ = collect_logits(swapped, test, batch_size=500, progress=False)
            rows.append({
                "seed": seed, "trained": slug, "what": what,
                "max_abs_logit_diff": float((a - b).abs().max()),
                "same_prediction": float((a.argmax(1) == b.argmax(1)).float().mean()),
                "acc_trained": float((a.argmax(1) == labels).float().mean()),
                "acc_swapped": float((b.argmax(1) == labels).float().mean()), "n": n_images,
            })
    return rows


def ablation_study(*, seeds: tuple[int, ...] = (0, 1), variants: tuple[str, ...] | None = None,
                   epochs: int = 2, train_subset: int | None = 15000, clean_images: int | None = None,
                   corrupt_images: int = 300, attack_images: int = 400, quick: bool = False) -> Study:
    """The ablation study. The default budget (2 epochs over 15k images, batch 128) is the one the
    first ablation report used; far from convergence, which the report says. ``quick``: a
    minute-scale smoke run (tests)."""
    all_v = ablation_variants()
    if variants is not None:
        known = {v.slug for v in all_v}
        bad = [v for v in variants if v not in known]
        if bad:
            raise ValueError(f"unknown variant(s) {bad}; valid: {', '.join(sorted(known))}")
        chosen = tuple(v for v in all_v if v.slug in variants or v.slug == "symvit")
    else:
        chosen = all_v
    recipe: dict[str, Any] = {"epochs": epochs, "train_subset": train_subset, "batch_size": 128,
                              "warmup_epochs": min(0.5, 0.2 * epochs), "log_every_steps": 10,
                              "val_size": 1000, "checkpoint_every_steps": 50, "device": "cpu"}
    corr = Corruptions(DEMO_CORRUPTIONS, (1, 2, 3, 4, 5), corrupt_images)
    eps = (2 / 255, 4 / 255)
    trace = 512
    checks: tuple[Check, ...] = (throughput_check(7),
                                 Check("swaps", "Trained weights with an ablation switched on at inference",
                                       swap_checks))
    if quick:
        recipe.update(epochs=1, train_subset=train_subset if train_subset != 15000 else 256, val_size=128,
                      batch_size=64, log_every_steps=2, warmup_epochs=0.2)
        clean_images = clean_images or 128
        corr = Corruptions(("gaussian_noise", "contrast"), (1, 5), 16)
        attack_images, eps, trace = 16, (2 / 255,), 32
        checks = (throughput_check(1), checks[1])
    return Study(
        name="ablations",
        title="RPC-Attention ablations on Fashion-MNIST",
        description="Which part of RPC-Attention matters: the sparse component S, the dual update, the "
                    "threshold convention? Every variant of one seed starts from SymViT's weights (the RPC "
                    "layer is swapped in after timm's init and keeps K/V).",
        variants=chosen, seeds=tuple(seeds), preset="fmnist-cpu", recipe=recipe,
        suites=ImageSuites(clean=clean_images, corruptions=corr,
                           attacks=tuple(Attack(m, eps, n=attack_images) for m in ("fgsm", "pgd"))),
        baseline="symvit", trace=trace, checks=checks,
    )
