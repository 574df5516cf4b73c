"""Corrupted segmentation: labels unchanged, deterministic images, per-image records that add up."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from kpca_attention.models import NormalizedModel, create_model
from kpca_attention.segmentation import (
    CorruptedSegmentation,
    SegmentationAccumulator,
    evaluate_corrupted_segmentation,
    metrics_from_records,
    segmentation_items,
)

pytestmark = pytest.mark.usefixtures("single_thread")


class Blobs(Dataset):
    """Gray images with a bright square on a dark background; label 1 on the square, 0 elsewhere, 255 on
    the border row. Sizes vary with the index (like ADE20K validation images)."""

    def __init__(self, n: int = 6) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        h, w = (24, 24) if i % 2 else (20, 28)
        y = torch.zeros(h, w, dtype=torch.long)
        y[4 : 4 + 8 + i, 6 : 14 + i] = 1
        x = (0.15 + 0.7 * y.float())[None]
        y[0] = 255
        return x, y


class Threshold(nn.Module):
    """Class 1 where the pixel is above 0.5: perfect on clean Blobs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([0.5 - x, x - 0.5], dim=1) * 10


def test_corrupted_view_keeps_labels_and_is_deterministic():
    base = Blobs()
    view = CorruptedSegmentation(base, "gaussian_noise", 3, seed=0)
    x, y = view[1]
    x0, y0 = base[1]
    assert torch.equal(y, y0) and x.shape == x0.shape
    assert not torch.allclose(x, x0, atol=0.02)
    x_again, _ = CorruptedSegmentation(base, "gaussian_noise", 3, seed=0)[1]
    assert torch.equal(x, x_again)
    x_other, _ = CorruptedSegmentation(base, "gaussian_noise", 3, seed=1)[1]
    assert not torch.equal(x, x_other)
    with pytest.raises(ValueError, match="severity"):
        CorruptedSegmentation(base, "gaussian_noise", 6)


def test_records_over_mixed_sizes_add_up_to_the_streamed_metrics():
    torch.manual_seed(0)
    net = create_model("segmenter_symvit_mini_patch4_32", num_classes=2, in_chans=1, img_size=16)
    model = NormalizedModel(net, (0.3,), (0.3,)).eval()
    ds = Blobs()
    records = segmentation_items(model, ds, 2, batch_size=4)
    assert [r["index"] for r in records] == list(range(6))
    acc = SegmentationAccumulator(2)
    with torch.no_grad():
        for i in range(len(ds)):
            x, y = ds[i]
            acc.update(model(x[None]), y[None])
    ref = acc.compute()
    got = metrics_from_records(records, 2)
    for k in ("miou", "mean_accuracy", "pixel_accuracy"):
        assert got[k] == pytest.approx(ref[k])
    sub = segmentation_items(model, ds, 2, indices=[4, 1])
    assert [r["index"] for r in sub] == [4, 1]
    assert sub[0] == records[4] and sub[1] == records[1]


def test_corruptions_lower_miou_of_a_perfect_clean_model():
    res = evaluate_corrupted_segmentation(Threshold(), Blobs(), 2, corruptions=("gaussian_noise", "contrast"),
                                          severities=(1, 5), batch_size=3)
    rows = res["rows"]
    assert [(r["corruption"], r["severity"]) for r in rows] == [
        ("clean", 0), ("gaussian_noise", 1), ("gaussian_noise", 5), ("contrast", 1), ("contrast", 5)]
    assert rows[0]["metrics"]["miou"] == 1.0
    noisy = {(r["corruption"], r["severity"]): r["metrics"]["miou"] for r in rows[1:]}
    assert noisy[("gaussian_noise", 5)] < noisy[("gaussian_noise", 1)] <= 1.0
    assert noisy[("gaussian_noise", 5)] < 0.9
    s = res["summary"]
    assert s["clean_miou"] == 1.0
    assert s["corrupted_miou"] == pytest.approx(sum(noisy.values()) / 4)
    assert set(s["per_corruption"]) == {"gaussian_noise", "contrast"}
    assert all(len(r["items"]) == 6 for r in rows)
