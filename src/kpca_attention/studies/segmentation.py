"""The paper's segmentation experiment (Table 6) in shape: a Segmenter with a SymViT encoder against the
same Segmenter with an RPC-SymViT encoder (PAP in block 1, 4 iterations, lambda 4: the official
setting), on the embedded Fashion-MNIST scenes, over three seeds; clean and corrupted mIoU, mean
accuracy and pixel accuracy with per-image pixel counts, paired statistics in the report.

Budget. The ``fmnist-seg-cpu`` preset (Segmenter-mini, linear decoder, 32-px scenes, AdamW 3e-3,
cosine) trained for 4 epochs over all 60,000 training scenes (240k scenes, 3,748 steps of 64): the
preset's own 2 x 30k-scene run reached mIoU 0.258 and was still rising, a 1 x 30k-scene pilot of this
study 0.20. Measured in that pilot on one thread of this project's 2-core Xeon under load average 8:
SymViT-mini trained at 137 scenes/s, RPC-SymViT-mini at 111 (0.80), and the evaluation below took 3-6
min per run. The six runs thus take about 3 x (29 + 36 + 10) min = 3.8 h of one core, about 1.9 h of
wall time with ``--jobs 2`` (3 epochs: about 1.5 h).

Evaluation (:class:`~kpca_attention.tasks.segmentation.suites.SegmentationSuites`): clean on 2,000 fixed test
scenes; the paper's 15 ImageNet-C corruptions at severities 1-5 on the first 500 of them (corrupting a
32-px scene takes about 2 ms, glass blur and frost up to 14 and 6 ms). The per-image pixel counts take
about 0.63 MB per run (pilot), so the study's committed results stay under 5 MB.
"""

from __future__ import annotations

from ..robustness.corruptions import COMMON_CORRUPTIONS
from ..tasks.images import Corruptions
from ..tasks.segmentation.suites import SegmentationSuites
from .demo import RPC_OFFICIAL
from .margins import segmentation_margins
from .spec import Study, Variant

__all__ = ["segmentation_study", "quick_segmentation_study", "SEGMENTATION_RECIPE", "SEGMENTATION_VARIANTS"]

SIZE = "mini_patch4_32"
#: the preset's decoder, stated in each variant (a variant's kwargs replace the preset's model_kwargs)
DECODER = {"decoder": "linear"}

SEGMENTATION_VARIANTS = (
    Variant("symvit", "Segmenter-SymViT", f"segmenter_symvit_{SIZE}", dict(DECODER),
            "SymViT-mini encoder (symmetric softmax attention), linear decoder"),
    Variant("rpc_symvit", "Segmenter-RPC-SymViT", f"segmenter_rpc_symvit_{SIZE}",
            {**DECODER, **RPC_OFFICIAL},
            "RPC-SymViT-mini encoder: PAP in block 1, 4 iterations, lambda 4 (official code), "
            "linear decoder"),
)

#: fmnist-seg-cpu for 4 epochs over the training scenes (module docstring); 1,000 of the 60k training scenes
#: (seeded, the same for every seed) are the validation split of the per-epoch evaluation, the test scenes
#: are left to the suites (before the split: all 60k trained on, held-out numbers on 1,000 test scenes)
SEGMENTATION_RECIPE = {"epochs": 4, "train_subset": None, "val_size": 1000, "eval_subset": None,
                       "warmup_epochs": 0.1, "log_every_steps": 20, "checkpoint_every_steps": 200}


def segmentation_study(*, seeds: tuple[int, ...] = (0, 1, 2), epochs: int = 4, clean_images: int = 2000,
                       corrupt_images: int = 500) -> Study:
    """Segmenter-SymViT vs Segmenter-RPC-SymViT on the Fashion-MNIST scenes (paper Table 6 in shape)."""
    return Study(
        name="segmentation",
        title="Segmentation: Segmenter-SymViT vs Segmenter-RPC-SymViT on Fashion-MNIST scenes "
              "(paper Table 6 in shape)",
        description="The embedded dense task stands in for ADE20K: 32-px grayscale canvases with 2-4 "
                    "Fashion-MNIST items, 11 classes (background + 10), the 64-wide 4-block mini encoder "
                    "with patch 4 and the linear decoder, trained from scratch (the paper's encoders were "
                    "ImageNet pre-trained). Both variants of one seed start from the same weights and see "
                    "the same batches.",
        variants=SEGMENTATION_VARIANTS, seeds=tuple(seeds), preset="fmnist-seg-cpu",
        recipe={**SEGMENTATION_RECIPE, "epochs": epochs},
        suites=SegmentationSuites(
            clean=clean_images, corruptions=Corruptions(COMMON_CORRUPTIONS, (1, 2, 3, 4, 5), corrupt_images)),
        baseline="symvit", trace=256, margins=segmentation_margins(),
    )


def quick_segmentation_study() -> Study:
    """A minute-scale smoke run of the same path (tests): a few steps on 256 scenes, two corruptions."""
    return Study(
        name="segmentation",
        title="Segmentation: Segmenter-SymViT vs Segmenter-RPC-SymViT (quick smoke run)",
        variants=SEGMENTATION_VARIANTS, seeds=(0, 1), preset="fmnist-seg-cpu",
        recipe={"epochs": 1, "train_subset": 256, "val_size": 64, "eval_subset": None, "batch_size": 64,
                "warmup_epochs": 0.25, "log_every_steps": 2, "checkpoint_every_steps": 100},
        suites=SegmentationSuites(clean=48, batch_size=32,
                                  corruptions=Corruptions(("gaussian_noise", "contrast"), (1, 5), 24)),
        baseline="symvit", trace=16,
    )
