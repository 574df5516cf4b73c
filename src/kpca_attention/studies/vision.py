"""The paper's image experiments in shape (Tables 1, 2, 4, 5 and 11) on Fashion-MNIST, trained until
clean accuracy plateaus, over seeds.

Variants: SymViT; RPC-SymViT with 4 and 6 PAP iterations in block 1 and 2 iterations in all blocks
(lambda 4, official conventions); RPC with S forced to 0; the paper's threshold convention
(tau = lambda / mu, mu from the head width, Candes' lambda); the ordinary (asymmetric) ViT and the
Scaled-Attention ViT. Three seeds for SymViT, RPC official, RPC S = 0 and the asymmetric ViT, one for
the others. Evaluated on the same images for every model: clean; the 15 ImageNet-C corruptions x 5
severities (mCE and relative mCE against SymViT); FGSM and PGD-20 at 1, 2, 4, 8 / 255; APGD-CE and
Square (1000 queries) at 4/255 on 500 images; SPSA and CW at reduced budgets on seed 0; the PAP trace
of every RPC variant; training throughput side by side.
"""

from __future__ import annotations

from ..robustness.corruptions import COMMON_CORRUPTIONS
from ..tasks.classification.suites import Attack, Corruptions, ImageSuites
from .ablations import candes_lambda
from .checks import throughput_check
from .demo import DEMO_RECIPE, RPC_OFFICIAL
from .margins import image_margins
from .spec import Study, Variant

__all__ = ["vision_study", "vision_large_study", "image_suites", "VISION_RECIPE", "LEGACY_VISION_RECIPE",
           "LARGE_RECIPE", "LARGE_ARCH"]

SIZE = "mini_patch4_28"
#: The demo's recipe (no crop/flip, no label smoothing; see kpca_attention.studies.demo) for four
#: times as long: 12 epochs over all 60k images. At 6 epochs SymViT reached 86.8 +- 0.1 % with the
#: held-out loss still falling (0.36 -> 0.35 in the last epoch, train loss 0.30): not yet a plateau.
#: float32 throughout (``amp`` off), so a run trained on a GPU and one trained on the CPU differ only
#: by the order of floating-point sums. The per-epoch held-out numbers (and any choice made on them) come
#: from a validation split of 2,000 training images (seeded, the same for every seed; the models train on
#: the other 58,000); the test images are evaluated only by the suites at the end.
VISION_RECIPE = {**DEMO_RECIPE, "epochs": 12, "train_subset": None, "val_size": 2000,
                 "warmup_epochs": 0.5, "amp": False}
#: What the committed ``vision`` study (results/vision, 3 seeds) was trained with: all 60,000 training images,
#: the per-epoch held-out numbers on 2,000 images of the TEST split (and the recipe chosen on them). Kept so
#: that the folder and its definition agree; ``rpc-seeds`` supersedes it with the validation split.
LEGACY_VISION_RECIPE = {**VISION_RECIPE, "val_size": None, "eval_subset": 2000}

#: The larger model of ``vision-large``: DeiT-Tiny's width and depth (192 wide, 12 blocks, 3 heads of
#: 64, MLP ratio 4; 5.4 M parameters) on 28 px images in 4 px patches (50 tokens).
LARGE_ARCH = {"embed_dim": 192, "depth": 12, "num_heads": 3, "mlp_ratio": 4.0}
#: Its recipe: 40 epochs with the preset's crop / flip augmentation, label smoothing 0.1 and stochastic
#: depth 0.1 (a 5 M-parameter model overfits 60k images without them), AdamW at 1e-3, float32.
LARGE_RECIPE = {"epochs": 40, "train_subset": None, "val_size": 2000, "lr": 1e-3, "warmup_epochs": 2.0,
                "drop_path": 0.1, "amp": False, "log_every_steps": 50, "checkpoint_every_steps": 1000}


def vision_variants(seeds: tuple[int, ...], arch: dict | None = None) -> tuple[Variant, ...]:
    """The study's variants; ``arch`` overrides the mini architecture (``vision-large``)."""
    from ..models.vit import ARCHS

    first = seeds[:1]
    sym, rpc = f"symvit_{SIZE}", f"rpc_symvit_{SIZE}"
    a = dict(arch or {})
    full = {**ARCHS[SIZE]["arch"], **a}
    head_dim = full["embed_dim"] // full["num_heads"]  # the paper's mu_dim
    lam = candes_lambda(SIZE, **a)
    return (
        Variant("symvit", "SymViT", sym, {**a}, "symmetric softmax attention in every block"),
        Variant("rpc_official", "RPC-SymViT 4 it.", rpc, {**a, **RPC_OFFICIAL},
                "PAP in block 1, 4 iterations, lambda 4, tau = lambda * mu (official code)"),
        Variant("rpc_6iter", "RPC-SymViT 6 it.", rpc, {**a, **RPC_OFFICIAL, "rpc_iters": 6},
                "PAP in block 1, 6 iterations", seeds=first),
        Variant("rpc_all2", "RPC-SymViT 2 it. all", rpc,
                {**a, **RPC_OFFICIAL, "rpc_iters": 2, "rpc_layers": "all"},
                "PAP in every block, 2 iterations", seeds=first),
        Variant("rpc_no_sparse", "RPC S = 0", rpc, {**a, **RPC_OFFICIAL, "rpc_sparse": False},
                "official setting with S forced to zero"),
        Variant("rpc_paper", "RPC paper tau, Candès lambda", rpc,
                {**a, **RPC_OFFICIAL, "rpc_lambda": lam, "rpc_threshold": "lambda_over_mu",
                 "rpc_mu_dim": head_dim},
                "the paper's threshold tau = lambda / mu, mu_dim = D, lambda = 1/sqrt(max(N, D))",
                seeds=first),
        Variant("vit", "ViT (asymmetric)", f"vit_{SIZE}", {**a}, "ordinary softmax attention with queries"),
        Variant("scaled_vit", "Scaled-Attention ViT", f"scaled_vit_{SIZE}", {**a, "scaled": "scalar"},
                "Scaled Attention A (I - alpha) V", seeds=first),
    )


def image_suites(seeds: tuple[int, ...], corrupt_images: int, attack_images: int) -> ImageSuites:
    """Every image study's evaluation (the same images for every model and both studies)."""
    linf = tuple(k / 255 for k in (1, 2, 4, 8))
    first = seeds[:1]
    attacks = (
        Attack("fgsm", linf, n=attack_images),
        Attack("pgd", linf, n=attack_images),
        Attack("autoattack", (4 / 255,), n=attack_images, options={"attacks": ("apgd-ce",)},
               label="apgd-ce"),
        Attack("square", (4 / 255,), n=attack_images, options={"n_queries": 1000},
               label="square"),
        Attack("spsa", (4 / 255,), n=200, options={"nb_iter": 20, "nb_sample": 64},
               seeds=first, label="spsa"),
        Attack("cw", (0.5, 1.0), n=200, options={"steps": 50}, seeds=first, label="cw"),
    )
    corruptions = Corruptions(COMMON_CORRUPTIONS, (1, 2, 3, 4, 5), corrupt_images)
    return ImageSuites(clean=None, corruptions=corruptions, attacks=attacks)


def vision_study(*, seeds: tuple[int, ...] = (0, 1, 2), corrupt_images: int = 500,
                 attack_images: int = 500) -> Study:
    return Study(
        name="vision",
        title="Image robustness of RPC-Attention on Fashion-MNIST, trained to a plateau "
              "(paper Tables 1, 2, 4, 5, 11)",
        description="Fashion-MNIST stands in for ImageNet: 28 px grayscale images, the 64-wide 4-block mini "
                    "ViT. Every variant of one seed starts from the same weights and sees the same batches.",
        variants=vision_variants(tuple(seeds)), seeds=tuple(seeds), preset="fmnist-cpu",
        recipe=LEGACY_VISION_RECIPE,
        suites=image_suites(tuple(seeds), corrupt_images, attack_images),
        baseline="symvit", trace=512, checks=(throughput_check(7),), margins=image_margins(),
    )


def vision_large_study(*, seeds: tuple[int, ...] = (0, 1, 2, 3, 4), corrupt_images: int = 500,
                       attack_images: int = 500) -> Study:
    """The vision study at GPU scale: DeiT-Tiny's width and depth (:data:`LARGE_ARCH`), 40 epochs with
    augmentation (:data:`LARGE_RECIPE`), five seeds of the four main variants, the same evaluation on
    the same images. A few minutes per run on one GPU; days on two CPU cores."""
    variants = tuple(v for v in vision_variants(tuple(seeds), LARGE_ARCH)
                     if v.slug in ("symvit", "rpc_official", "rpc_no_sparse", "vit"))
    return Study(
        name="vision-large",
        title="Image robustness of RPC-Attention on Fashion-MNIST at DeiT-Tiny size, trained on a GPU "
              "(paper Tables 1, 2, 4, 5, 11)",
        description="The vision study with DeiT-Tiny's width and depth (192 wide, 12 blocks, 3 heads) on "
                    "28 px images in 4 px patches, 40 epochs with crop / flip, label smoothing and "
                    "stochastic depth. Every variant of one seed starts from the same weights and sees the "
                    "same batches.",
        variants=variants, seeds=tuple(seeds), preset="fmnist-cpu", recipe=LARGE_RECIPE,
        suites=image_suites(tuple(seeds), corrupt_images, attack_images),
        baseline="symvit", trace=512, margins=image_margins(),
    )
