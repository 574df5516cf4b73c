"""Robustness evaluation: common corruptions and mCE, ImageNet-A/R/O, adversarial attacks in pixel
space, and word-swap attacks on language models (see docs/robustness.md).

Heavy dependencies (imagecorruptions/numba, torchattacks, pyautoattack, scikit-learn) are imported
only when a function needs them.
"""

from .attacks import (
    DEFAULTS,
    METHODS,
    NORMS,
    attack,
    attack_settings,
    evaluate_attack,
    sparse_l1_descent,
)
from .corruptions import (
    ALL_CORRUPTIONS,
    COMMON_CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    CorruptedDataset,
    corrupt,
    imagenet_c_folder,
)
from .metrics import (
    ALEXNET_ERRORS,
    accuracy_table,
    corruption_errors,
    imagenet_o_aupr,
    masked_accuracy,
    mce,
    ood_aupr,
    relative_mce,
)
from .sweep import eps_sweep, plot_eps_sweep
from .wordswap import swap_words, wordswap_perplexity

__all__ = [
    "corrupt", "CorruptedDataset", "imagenet_c_folder",
    "COMMON_CORRUPTIONS", "EXTRA_CORRUPTIONS", "ALL_CORRUPTIONS",
    "mce", "relative_mce", "corruption_errors", "accuracy_table", "ALEXNET_ERRORS",
    "masked_accuracy", "imagenet_o_aupr", "ood_aupr",
    "attack", "attack_settings", "evaluate_attack", "eps_sweep", "plot_eps_sweep", "sparse_l1_descent",
    "METHODS", "NORMS", "DEFAULTS",
    "swap_words", "wordswap_perplexity",
]  # fmt: skip
