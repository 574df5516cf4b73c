"""Studies: comparisons declared as data (:class:`Study`) and one engine that runs any of them
(:func:`run_study`): train each (variant, seed) through :mod:`kpca_attention.train`, evaluate through
the suites of the study's task (:mod:`kpca_attention.tasks`) with per-example results, write the report
through :mod:`kpca_attention.report.study`.

Registered studies (``kpca-attention study NAME``): ``demo``, ``ablations``, ``vision``,
``vision-large``, ``rpc-seeds``, ``rpc-depth12``, ``zoo``, ``rpc-fan``, ``zoo-large``, ``zoo-language``,
``language``, ``segmentation``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .ablations import ablation_study
from .demo import demo_study, quick_demo_study
from .engine import run_one, run_study
from .language import language_study
from .rpc_seeds import rpc_depth12_study, rpc_seeds_study
from .schedule import RunsFailed
from .segmentation import segmentation_study
from .spec import Check, Margin, Study, Variant
from .vision import vision_large_study, vision_study
from .zoo import rpc_fan_study, zoo_language_study, zoo_large_study, zoo_study

__all__ = ["Study", "Variant", "Check", "Margin", "run_study", "run_one", "RunsFailed", "STUDIES",
           "get_study", "demo_study", "quick_demo_study", "ablation_study", "vision_study",
           "vision_large_study", "rpc_seeds_study", "rpc_depth12_study",
           "zoo_study", "zoo_large_study", "zoo_language_study", "rpc_fan_study"]

#: name -> function building the study from keyword options
STUDIES: dict[str, Callable[..., Study]] = {
    "demo": demo_study,
    "ablations": ablation_study,
    "vision": vision_study,
    "vision-large": vision_large_study,
    "rpc-seeds": rpc_seeds_study,
    "rpc-depth12": rpc_depth12_study,
    "zoo": zoo_study,
    "zoo-large": zoo_large_study,
    "zoo-language": zoo_language_study,
    "rpc-fan": rpc_fan_study,
    "language": language_study,
    "segmentation": segmentation_study,
}


def get_study(name: str, **options: Any) -> Study:
    """The registered study ``name`` built with ``options``."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; valid: {', '.join(STUDIES)}")
    return STUDIES[name](**options)
