"""The robust-attention family side by side on one harness (``zoo``, ``zoo-language``).

Each mechanism of this line of work was published with its own code, protocol and one run per number.
Here every one is trained with the same recipe, on the same batches (the runs of one seed share the seed),
and evaluated on the same images with the same attacks, over seeds, so the paired differences - against
the asymmetric ViT (the baseline these papers use) and against SymViT - can be given verdicts.

``zoo``: the ``rpc-seeds`` harness (the mini ViT on Fashion-MNIST, 2,000 training images held out for
validation, its recipe and its suites: clean; 15 corruptions x 5 severities with mCE; FGSM / PGD-20 at
1, 2, 4, 8 / 255; APGD-CE and Square at 4/255; SPSA and CW on seed 0). SymViT, ViT and RPC-SymViT are
the same variants with the same settings as in ``rpc-seeds``: their results are taken from there
(identical keys) instead of being trained again. Every mechanism at its paper's defaults (asymmetric,
as their papers train them), 8 seeds (:data:`ZOO_SEEDS`: 3 at first, as the family issue asked; raised to
the verdicts issue's minimum for a main answer when three seeds left every cell undecided).

Margins (studies/margins.py, ZOO_MARGINS; docs/verdicts.md has the table of sources): each mechanism's
OWN paper's reported gain, per (variant, metric); a mechanism whose numbers could not be found has none.
Verdicts against the ViT (the baseline) and against SymViT (``also_against``), and RPC-FAN against FAN
(``pairs``: the comparison of the RPC paper's Tables 9-10, whose gain is RPC-FAN's margin there and only
there), one Holm family over all.
The report adds a leaderboard (clean, corrupted and the 4/255 attacks) and a plot of clean against PGD
4/255 accuracy. ``kpca-attention study zoo`` (and ``zoo-language``, in tokens/s) without ``--no-checks``
measures training throughput and peak memory of every mechanism side by side (checks.cost_check).

``rpc-fan``: RPC-FAN against the baseline of the RPC paper's Tables 9-10, on the zoo's harness. The paper
trains FAN-tiny "with a symmetric attention" and replaces the first layer's attention with RPC; the zoo's
``fan`` (FAN's own paper: attention with queries) and ``rpc_fan`` (symmetric RPC in block 1, queries in the
others) differ in two things. Here both models are symmetric in every block, so the pair differs in PAP only,
and the paper's gains are the margins of that one comparison (declared before its first run).

``zoo-language``: the ``language`` study's harness (the small causal LM on the King James Bible, clean and
word-swap perplexity) with the mechanisms that apply to a causal LM (FAN is vision only), 3 seeds.
"""

from __future__ import annotations

from ..attention import get_mechanism, mechanisms
from .checks import cost_check
from .demo import RPC_OFFICIAL
from .language import LANGUAGE_RECIPE, LM_RPC
from .margins import rpc_fan_margins, zoo_language_margins, zoo_margins
from .rpc_seeds import MAIN_SEEDS, MIN_SEEDS
from .spec import Leaderboard, Margin, Study, Variant
from .vision import LARGE_ARCH, LARGE_RECIPE, SIZE, VISION_RECIPE, image_suites

__all__ = ["zoo_study", "zoo_large_study", "zoo_language_study", "rpc_fan_study", "ZOO_MECHANISMS",
           "ATTENTION_MECHANISMS", "LM_MECHANISMS",
           "ZOO_LEADERBOARD", "ZOO_LM_LEADERBOARD", "ZOO_SEEDS"]

#: the zoo's seeds. 3 at first (the family issue's plan); at three, no cell of the 282-test Holm family could
#: be decided (2 degrees of freedom: the largest effects - FAN and RPC-FAN under attack, RKDE-Huber below the
#: ViT under every attack in every seed - reach raw p 0.0002-0.02, Holm 1), and the report's planning numbers
#: put most of them at 4-9 seeds. So the plan was raised, for every mechanism alike (no cell chosen), to the
#: verdicts issue's minimum for a main answer, before any seed past 2 was trained. The look at three seeds
#: rejected nothing, so no word was kept because it came out early: the words at eight are read once, at the
#: plan, like rpc-seeds'. SymViT, the ViT and RPC-SymViT come from rpc-seeds (16 seeds there): only the
#: mechanisms train (45 runs, 15-45 min each on one CPU thread).
ZOO_SEEDS = MAIN_SEEDS[:MIN_SEEDS]

#: slug -> (label, registered family name prefix, what). Each at its paper's defaults (attention/ modules).
ZOO_MECHANISMS: dict[str, tuple[str, str, str]] = {
    "twicing": ("Twicing", "twicing", "(2A - A^2) V in every block (ICLR 2025)"),
    "neutreno": ("NeuTRENO", "neutreno", "A V + 0.6 (V^0 - V^l) after the first block (NeurIPS 2023)"),
    "pid": ("PIDformer", "pid",
            "PID control of V^0 - V^l across blocks (ICML 2024; gains: attention/pid.py)"),
    "elliptical": ("Elliptical", "elliptical", "queries scaled by the per-dimension change of the values "
                   "between blocks, no gradient through the metric (NeurIPS 2024)"),
    "kde": ("KDE", "kde", "softmax(-||q - k/||k|| ||^2 / sqrt d) V (robust_transformer)"),
    "rkde": ("RKDE-Huber", "rkde", "Huber-reweighted KDE, a = 0.2, the paper's norm (robust_transformer)"),
    "rvt": ("RVT scaling", "rvt",
            "position-aware attention scaling sigmoid(W_p) in the first blocks (CVPR 2022)"),
    "fan": ("FAN", "fan", "channel-attention MLP blocks (ICML 2022)"),
    "rpc_fan": ("RPC-FAN", "rpc_fan", "FAN with RPC-Attention in block 1, 4 iterations, lambda 4 "
                "(RPC paper Tables 9-10)"),
}
#: the zoo's attention layers: its registered attention mechanisms (FAN's channel attention is a block
#: of its own, not a mechanism of the attention registry)
ATTENTION_MECHANISMS: tuple[str, ...] = tuple(m for m in ZOO_MECHANISMS if m in mechanisms())
#: mechanisms with a causal LM: those that apply to LMs (FAN is defined on an image grid only)
LM_MECHANISMS: tuple[str, ...] = tuple(m for m in ATTENTION_MECHANISMS if "lm" in get_mechanism(m).applies_to)
#: the zoo's leaderboard: clean, corrupted, the attacks at 4/255; the plot: clean against PGD 4/255
ZOO_LEADERBOARD = Leaderboard(("clean", "corrupted", "fgsm@4", "pgd@4", "apgd-ce@4", "square@4"),
                              plot=("clean", "pgd@4"))
ZOO_LM_LEADERBOARD = Leaderboard(("ppl/valid", "ppl/test", "wordswap/valid", "wordswap/test"),
                                 plot=("ppl/test", "wordswap/test"))


def _flat(per_variant: dict[str, dict[str, Margin]], slugs: set[str]) -> dict[tuple[str, str], Margin]:
    """``{(slug, metric): Margin}`` of the variants a study has."""
    return {(s, k): m for s, d in per_variant.items() if s in slugs for k, m in d.items()}


def zoo_study(*, seeds: tuple[int, ...] = ZOO_SEEDS, corrupt_images: int = 500,
              attack_images: int = 500) -> Study:
    seeds = tuple(seeds)
    variants = (
        Variant("symvit", "SymViT", f"symvit_{SIZE}", {}, "symmetric softmax attention in every block"),
        Variant("vit", "ViT (asymmetric)", f"vit_{SIZE}", {}, "ordinary softmax attention with queries"),
        Variant("rpc_official", "RPC-SymViT 4 it.", f"rpc_symvit_{SIZE}", dict(RPC_OFFICIAL),
                "PAP in block 1, 4 iterations, lambda 4, tau = lambda * mu (official code)"),
        *(Variant(slug, label, f"{prefix}_vit_{SIZE}", {}, what)
          for slug, (label, prefix, what) in ZOO_MECHANISMS.items()),
    )
    return Study(
        name="zoo",
        title="The robust-attention family on one harness: every mechanism against the ViT and SymViT "
              "over seeds",
        description="The rpc-seeds harness: the 64-wide 4-block mini ViT on Fashion-MNIST (58,000 training "
                    "images, 2,000 held out for validation), the same recipe, batches and test images for "
                    "every mechanism; 8 seeds (3 at first, raised when three decided nothing).",
        variants=variants, seeds=seeds, preset="fmnist-cpu", recipe=VISION_RECIPE,
        suites=image_suites(seeds, corrupt_images, attack_images),
        baseline="vit", trace=512, also_against=("symvit",), pairs=(("rpc_fan", "fan"),),
        reuse=("rpc-seeds",),
        margins=_flat(zoo_margins(), {v.slug for v in variants}), leaderboard=ZOO_LEADERBOARD,
        checks=(cost_check(7),),
    )


def rpc_fan_study(*, seeds: tuple[int, ...] = ZOO_SEEDS, corrupt_images: int = 500,
                  attack_images: int = 500) -> Study:
    """The RPC paper's FAN comparison (Tables 9-10) as the paper makes it: symmetric attention in every block
    of both models, RPC-Attention (4 iterations, lambda 4) in the first block of one; the zoo's recipe, seeds,
    suites and images, so its numbers sit beside the zoo's."""
    zoo = zoo_study(seeds=seeds, corrupt_images=corrupt_images, attack_images=attack_images)
    variants = (
        Variant("fan_sym", "FAN (symmetric)", f"fan_symvit_{SIZE}", {},
                "FAN's channel-attention blocks, symmetric attention (keys only) in every block: the RPC "
                "paper's FAN-tiny"),
        Variant("rpc_fan_sym", "RPC-FAN (symmetric)", f"rpc_fan_symvit_{SIZE}", {},
                "the same with RPC-Attention in block 1, 4 iterations, lambda 4: the RPC paper's "
                "RPC-FAN-tiny"),
    )
    return zoo.replace(
        name="rpc-fan",
        title="RPC-FAN against its paper's baseline: FAN with symmetric attention in every block",
        description="The zoo's harness (the 64-wide 4-block mini ViT with FAN's channel-attention blocks on "
                    "Fashion-MNIST, 2,000 training images held out for validation, the zoo's recipe, seeds "
                    "and test images); both models symmetric in every block, as the RPC paper's Tables 9-10.",
        variants=variants, baseline="fan_sym", also_against=(), pairs=(), reuse=(),
        margins={("rpc_fan_sym", k): m for k, m in rpc_fan_margins("fan_sym").items()},
        leaderboard=Leaderboard(("clean", "corrupted", "fgsm@8", "pgd@8", "apgd-ce@4", "square@4"),
                                plot=("clean", "pgd@8")),
        checks=())


def zoo_large_study(*, seeds: tuple[int, ...] = (0, 1, 2, 3, 4), corrupt_images: int = 500,
                    attack_images: int = 500) -> Study:
    """The zoo at GPU scale, as ``vision-large`` is the vision study's: every variant at DeiT-Tiny's width
    and depth (:data:`~.vision.LARGE_ARCH`) with ``vision-large``'s recipe (40 epochs, augmentation), five
    seeds, the same suites on the same images; SymViT, ViT and RPC-SymViT are taken from ``vision-large``
    where it has them (identical settings). Margins and verdicts as ``zoo``. Minutes per run on one GPU,
    days on two CPU cores (on a lent GPU: ``--variants`` / ``--seeds`` pick what fits the time)."""
    small = zoo_study(seeds=seeds, corrupt_images=corrupt_images, attack_images=attack_images)
    variants = tuple(Variant(v.slug, v.label, v.model, {**v.kwargs, **LARGE_ARCH}, v.what)
                     for v in small.variants)
    return small.replace(
        name="zoo-large",
        title="The robust-attention family at DeiT-Tiny size, trained on a GPU",
        description="The zoo with DeiT-Tiny's width and depth (192 wide, 12 blocks, 3 heads) on 28 px images "
                    "in 4 px patches, vision-large's recipe (40 epochs with crop / flip, label smoothing, "
                    "stochastic depth); the runs of one seed share the seed and the batches.",
        variants=variants, recipe=LARGE_RECIPE, reuse=("vision-large",))


def zoo_language_study(*, seeds: tuple[int, ...] = (0, 1, 2), epochs: int = 6, tokens: int | None = 20000,
                       positions: int = 256) -> Study:
    from ..tasks.language.suites import LMSuites

    size = {"preset": "small"}
    variants = (
        Variant("symlm", "Symlm", "symlm", dict(size), "causal symmetric softmax attention in every layer"),
        Variant("lm", "LM (asymmetric)", "lm", dict(size), "ordinary causal softmax attention with queries"),
        Variant("rpc_symlm", "RPC-Symlm", "rpc_symlm", {**size, **LM_RPC},
                "PAP in layer 1 of 4, 4 iterations, lambda 4, prefix mu (causal)"),
        *(Variant(slug, ZOO_MECHANISMS[slug][0], f"{ZOO_MECHANISMS[slug][1]}_lm", dict(size),
                  ZOO_MECHANISMS[slug][2]) for slug in LM_MECHANISMS),
    )
    return Study(
        name="zoo-language",
        title="The robust-attention family in the causal LM on the King James Bible (clean and word-swap "
              "perplexity)",
        description="The language study's harness: 4 layers of 4 heads (width 16), d_model 64, context "
                    "128, every mechanism at its LM defaults; the runs of one seed share the seed and the "
                    "batches.",
        variants=variants, seeds=tuple(seeds), preset="lm", recipe={**LANGUAGE_RECIPE, "epochs": epochs},
        suites=LMSuites(tokens=tokens, positions=positions), baseline="lm", trace=positions,
        also_against=("symlm",), margins=_flat(zoo_language_margins(), {v.slug for v in variants}),
        leaderboard=ZOO_LM_LEADERBOARD, reuse=("language",), checks=(cost_check(7),),
    )
