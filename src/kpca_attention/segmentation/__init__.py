"""Semantic segmentation: mmseg-convention metrics streamed over a dataset, and evaluation under the
common image corruptions (labels unchanged), per image so a study can cache items (see
docs/segmentation.md). Models: :mod:`kpca_attention.models.segmenter`; data:
:mod:`kpca_attention.data.segmentation`; training: ``kpca_attention.train`` with ``task="segmentation"``.
"""

from .corruptions import CLEAN, CorruptedSegmentation, evaluate_corrupted_segmentation, segmentation_items
from .metrics import (
    SegmentationAccumulator,
    class_areas,
    confusion_matrix,
    item_record,
    metrics_from_areas,
    metrics_from_confusion,
    metrics_from_records,
    segmentation_metrics,
)

__all__ = [
    "SegmentationAccumulator",
    "segmentation_metrics",
    "metrics_from_confusion",
    "metrics_from_areas",
    "metrics_from_records",
    "item_record",
    "confusion_matrix",
    "class_areas",
    "CorruptedSegmentation",
    "segmentation_items",
    "evaluate_corrupted_segmentation",
    "CLEAN",
]
