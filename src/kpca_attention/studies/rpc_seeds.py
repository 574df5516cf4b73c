"""RPC-Attention's image claims over enough seeds to decide them (the verdicts' study).

The ``vision`` study's three seeds left every image effect of the paper inside its intervals: "not
detected at this scale", never "absent". This study trains the four main variants - SymViT, RPC-SymViT
(official setting), RPC with S forced to 0 and the ordinary asymmetric ViT - on as many seeds as the
verdict engine says are needed to decide against the paper's own effects (at least 8; past 16 a cell
is reported ``inconclusive`` with the seeds it would take), plus the paper's settings with 3 seeds:
lambda 3 with 2 PAP iterations in every block (paper Sec. 4: "lambda = 3 ... for models with 2
iterations per layer") and the paper's threshold convention tau = lambda / mu with the paper's lambda 4
and mu = N D / (4 ||K||_1) (Definition 1, D the head width).

Every choice is made on the validation split (2,000 of the 60,000 training images, the same for every
seed; the models train on the other 58,000): the recipe is the ``vision`` study's (chosen there on
held-out images of the TEST split - see docs/results.md; this study keeps it unchanged and re-checks it on
the validation split, so nothing here is selected on test data). The test split is evaluated once, at the
end, by the suites: clean; 15 corruptions x 5 severities on 500 fixed images; FGSM and PGD-20 at 1, 2, 4,
8 / 255; APGD-CE and Square at 4/255 on 500 images for every seed; SPSA and CW (the slowest) on seed 0
only, as the report says.

Verdicts against SymViT and, in the same Holm family, against the official RPC-SymViT (``also_against``), so
that RPC with S = 0 is compared with RPC directly (the question "does S matter?").

``rpc-depth12`` puts PAP in the first of 12 blocks, as in the paper's ViT-tiny (1 of 12), against its own
12-block SymViT.
"""

from __future__ import annotations

from .demo import RPC_OFFICIAL
from .margins import image_margins
from .spec import Study, Variant
from .vision import SIZE, VISION_RECIPE, image_suites

__all__ = ["rpc_seeds_study", "rpc_depth12_study", "MAIN_SEEDS", "MIN_SEEDS", "SEED_CAP", "PAPER_LAMBDA"]

#: the fewest and the most seeds the verdicts issue allows for the main rows (past SEED_CAP a cell is reported
#: ``inconclusive`` with the seeds it would take)
MIN_SEEDS = 8
SEED_CAP = 16
#: the seeds of the main rows (the verdict engine's planning numbers decide whether more are run, up to
#: SEED_CAP):
#: 8 at first; at eight the report's planning numbers put equivalence in the FGSM 8/255 cells at 9-10 seeds
#: and the observed PGD 8/255 and FGSM 8/255 differences (RPC-SymViT below SymViT, the ViT above
#: RPC-SymViT, every seed) at 12-14 seeds under Holm over the family (the clean cells decided, the
#: corrupted ones past 16), so 14; at eleven pairs the PGD 8/255 difference of RPC-SymViT below SymViT
#: (the paper's main comparison, lower in all eleven) needs 16 to be detected under Holm, so the cap
MAIN_SEEDS = tuple(range(SEED_CAP))
assert MIN_SEEDS <= len(MAIN_SEEDS) <= SEED_CAP
#: the paper's lambda for PAP in the first layer (Sec. 4, Definition 1; the official README's too)
PAPER_LAMBDA = 4.0
#: the paper's lambda for 2 iterations in every layer
PAPER_LAMBDA_ALL_LAYERS = 3.0
#: the 12-block mini model: the mini ViT's width (64) and heads (4) at the paper's depth
DEPTH12 = {"depth": 12}


def _head_dim(arch: dict | None = None) -> int:
    from ..models.vit import ARCHS

    full = {**ARCHS[SIZE]["arch"], **(arch or {})}
    return full["embed_dim"] // full["num_heads"]


def rpc_seeds_study(*, seeds: tuple[int, ...] = MAIN_SEEDS, corrupt_images: int = 500,
                    attack_images: int = 500) -> Study:
    seeds = tuple(seeds)
    few = seeds[:3]
    sym, rpc = f"symvit_{SIZE}", f"rpc_symvit_{SIZE}"
    variants = (
        Variant("symvit", "SymViT", sym, {}, "symmetric softmax attention in every block"),
        Variant("rpc_official", "RPC-SymViT 4 it.", rpc, dict(RPC_OFFICIAL),
                "PAP in block 1, 4 iterations, lambda 4, tau = lambda * mu, mu from the full width "
                "(official code)"),
        Variant("rpc_no_sparse", "RPC S = 0", rpc, {**RPC_OFFICIAL, "rpc_sparse": False},
                "the official setting with S forced to zero"),
        Variant("vit", "ViT (asymmetric)", f"vit_{SIZE}", {}, "ordinary softmax attention with queries"),
        Variant("rpc_all2_l3", "RPC 2 it. all, lambda 3", rpc,
                {**RPC_OFFICIAL, "rpc_iters": 2, "rpc_layers": "all", "rpc_lambda": PAPER_LAMBDA_ALL_LAYERS},
                "PAP in every block, 2 iterations, lambda 3 (the paper's setting for all layers)", seeds=few),
        Variant("rpc_paper_tau", "RPC paper tau, lambda 4", rpc,
                {**RPC_OFFICIAL, "rpc_lambda": PAPER_LAMBDA, "rpc_threshold": "lambda_over_mu",
                 "rpc_mu_dim": _head_dim()},
                "the paper's convention: tau = lambda / mu, lambda 4, mu = N D / (4 ||K||_1), D the head "
                "width",
                seeds=few),
    )
    return Study(
        name="rpc-seeds",
        title="RPC-Attention's image claims over 8-16 seeds, chosen on a validation split "
              "(paper Tables 1, 2)",
        description="Fashion-MNIST stands in for ImageNet: 28 px grayscale images, the 64-wide 4-block mini "
                    "ViT, trained on 58,000 images with 2,000 held out for validation. Every variant of one "
                    "seed starts from the same weights and sees the same batches.",
        variants=variants, seeds=seeds, preset="fmnist-cpu", recipe=VISION_RECIPE,
        suites=image_suites(seeds, corrupt_images, attack_images),
        baseline="symvit", trace=512, also_against=("rpc_official",), margins=image_margins(),
    )


def rpc_depth12_study(*, seeds: tuple[int, ...] = (0, 1, 2), corrupt_images: int = 500,
                      attack_images: int = 500) -> Study:
    seeds = tuple(seeds)
    sym, rpc = f"symvit_{SIZE}", f"rpc_symvit_{SIZE}"
    variants = (
        Variant("symvit12", "SymViT 12 blocks", sym, dict(DEPTH12), "symmetric attention in 12 blocks"),
        Variant("rpc12_official", "RPC-SymViT 12 blocks, PAP in block 1", rpc, {**DEPTH12, **RPC_OFFICIAL},
                "PAP in the first of 12 blocks (as in the paper's ViT-tiny), 4 iterations, lambda 4"),
    )
    return Study(
        name="rpc-depth12",
        title="PAP in 1 of 12 blocks, as in the paper, against its 12-block SymViT",
        description="The mini ViT (64 wide, 4 heads) at the paper's depth of 12 blocks on Fashion-MNIST, the "
                    "rpc-seeds recipe and evaluation, validation split of 2,000 training images.",
        variants=variants, seeds=seeds, preset="fmnist-cpu", recipe=VISION_RECIPE,
        suites=image_suites(seeds, corrupt_images, attack_images),
        baseline="symvit12", trace=512, margins=image_margins(),
    )
