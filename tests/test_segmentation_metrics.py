"""Segmentation metrics against hand-made cases and a brute-force numpy computation of mmseg's rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kpca_attention.segmentation import (
    SegmentationAccumulator,
    item_record,
    metrics_from_records,
    segmentation_metrics,
)


def brute_force(pred: np.ndarray, target: np.ndarray, k: int, ignore: int = 255) -> dict:
    """mmseg's rules written out pixel by pixel: per-class IoU / accuracy, NaN when undefined, nanmean."""
    ious, accs = [], []
    pairs = [(int(p), int(t)) for p, t in zip(pred.ravel(), target.ravel(), strict=True) if t != ignore]
    for c in range(k):
        inter = sum(1 for p, t in pairs if p == c and t == c)
        n_pred = sum(1 for p, _ in pairs if p == c)
        n_lab = sum(1 for _, t in pairs if t == c)
        union = n_pred + n_lab - inter
        ious.append(inter / union if union else math.nan)
        accs.append(inter / n_lab if n_lab else math.nan)
    hit = sum(1 for p, t in pairs if p == t)
    total = len(pairs)
    return {"miou": np.nanmean(ious), "mean_accuracy": np.nanmean(accs), "pixel_accuracy": hit / total,
            "iou": ious, "accuracy": accs}


def test_hand_made_case():
    pred = torch.tensor([[0, 1, 1], [2, 2, 0]])
    target = torch.tensor([[0, 1, 2], [2, 255, 255]])
    m = segmentation_metrics(pred, target, num_classes=4)
    # class 0: I=1 U=1; class 1: I=1, pred 2, label 1 -> U=2; class 2: I=1, pred 1, label 2 -> U=2;
    # class 3: absent from prediction and ground truth -> left out
    assert m["iou"][:3] == [1.0, 0.5, 0.5] and math.isnan(m["iou"][3])
    assert m["miou"] == pytest.approx(2.0 / 3.0)
    assert m["accuracy"][:3] == [1.0, 1.0, 0.5] and math.isnan(m["accuracy"][3])
    assert m["mean_accuracy"] == pytest.approx(2.5 / 3)
    assert m["pixel_accuracy"] == pytest.approx(3 / 4)  # ignored pixels (incl. the predicted 2) excluded
    assert m["pixels"] == 4


def test_class_predicted_but_absent_from_ground_truth_counts_with_iou_zero_as_mmseg():
    pred = torch.tensor([0, 0, 1, 1])
    target = torch.tensor([0, 0, 0, 0])
    m = segmentation_metrics(pred, target, num_classes=3)
    assert m["iou"][:2] == [0.5, 0.0] and math.isnan(m["iou"][2])
    assert m["miou"] == pytest.approx(0.25)
    assert math.isnan(m["accuracy"][1])  # no ground-truth pixel: left out of mean accuracy
    assert m["mean_accuracy"] == pytest.approx(0.5)


def test_all_ignored_gives_nan_not_a_crash():
    m = segmentation_metrics(torch.zeros(3, 3, dtype=torch.long), torch.full((3, 3), 255), num_classes=2)
    assert math.isnan(m["miou"]) and math.isnan(m["pixel_accuracy"]) and m["pixels"] == 0


@pytest.mark.parametrize("seed", range(4))
def test_matches_brute_force_and_streaming_equals_one_shot(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 7))
    pred = rng.integers(0, k, size=(5, 7, 6))
    target = np.where(rng.random((5, 7, 6)) < 0.15, 255, rng.integers(0, k, size=(5, 7, 6)))
    if seed == 0:
        target[target == k - 1] = 0  # a class only predicted
    ref = brute_force(pred, target, k)
    m = segmentation_metrics(torch.from_numpy(pred), torch.from_numpy(target), k)
    for key in ("miou", "mean_accuracy", "pixel_accuracy"):
        assert m[key] == pytest.approx(ref[key])
    np.testing.assert_allclose(m["iou"], ref["iou"])
    np.testing.assert_allclose(m["accuracy"], ref["accuracy"])

    acc = SegmentationAccumulator(k)
    records = []
    for i in range(5):  # image by image, logits or indices
        logits = torch.nn.functional.one_hot(torch.from_numpy(pred[i : i + 1]), k).permute(0, 3, 1, 2).float()
        batch = logits if i % 2 else torch.from_numpy(pred[i : i + 1])
        conf = acc.update(batch, torch.from_numpy(target[i : i + 1]))
        records.append(item_record(conf))
    streamed = acc.compute()
    from_records = metrics_from_records(records, k)
    for key in ("miou", "mean_accuracy", "pixel_accuracy"):
        assert streamed[key] == pytest.approx(ref[key])
        assert from_records[key] == pytest.approx(ref[key])
    # records are compact: only the classes an image touches
    assert all(len(r["classes"]) <= k for r in records)


def test_clear_errors():
    with pytest.raises(ValueError, match="outside 0..2"):
        segmentation_metrics(torch.tensor([3]), torch.tensor([0]), num_classes=3)
    with pytest.raises(ValueError, match="outside 0..2"):
        segmentation_metrics(torch.tensor([0]), torch.tensor([7]), num_classes=3)
    with pytest.raises(ValueError, match="shape"):
        segmentation_metrics(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long), 3)
    with pytest.raises(TypeError, match="integer"):
        segmentation_metrics(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="ignore_index"):
        zeros = torch.zeros(2, dtype=torch.long)
        segmentation_metrics(zeros, zeros, 3, ignore_index=1)
    with pytest.raises(ValueError, match="logits"):
        SegmentationAccumulator(3).update(torch.zeros(1, 4, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long))


# --- found by mutation testing (/work/notes/review/mutation.md): each fails on its mutant ---------------


def test_class_areas_union_is_prediction_plus_label_minus_intersection() -> None:
    from kpca_attention.segmentation.metrics import class_areas

    a = class_areas(torch.tensor([[3, 1], [2, 4]]))
    assert a["union"].tolist() == [3 + 1 + 2, 4 + 2 + 1]
