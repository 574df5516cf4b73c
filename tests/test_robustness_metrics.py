"""mCE against AlexNet and against a baseline run, tables, ImageNet-A/R masks, ImageNet-O AUPR."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from kpca_attention.robustness import metrics as M
from kpca_attention.robustness.corruptions import COMMON_CORRUPTIONS

# AlexNet average errors from Hendrycks & Dietterich (2019), as quoted in the reference notes.
PAPER_ALEXNET_MEANS = {
    "gaussian_noise": 0.886428, "shot_noise": 0.894468, "impulse_noise": 0.922640,
    "defocus_blur": 0.819880, "glass_blur": 0.826268, "motion_blur": 0.785948, "zoom_blur": 0.798360,
    "snow": 0.866816, "frost": 0.826572, "fog": 0.819324, "brightness": 0.564592,
    "contrast": 0.853204, "elastic_transform": 0.646056, "pixelate": 0.717840,
    "jpeg_compression": 0.606500,
}  # fmt: skip


def test_alexnet_table_matches_paper_means():
    assert list(M.ALEXNET_ERRORS) == list(COMMON_CORRUPTIONS)
    for name, mean in PAPER_ALEXNET_MEANS.items():
        assert np.mean(M.ALEXNET_ERRORS[name]) == pytest.approx(mean, abs=1e-6), name


def test_mce_against_alexnet():
    assert M.mce(M.ALEXNET_ERRORS) == pytest.approx(100.0)
    half = {c: [e / 2 for e in v] for c, v in M.ALEXNET_ERRORS.items()}
    assert M.mce(half) == pytest.approx(50.0)
    # one corruption twice as bad as AlexNet's (capped at 1), the rest equal
    errs = {c: dict(enumerate(v, start=1)) for c, v in M.ALEXNET_ERRORS.items()}
    errs["fog"] = dict.fromkeys(range(1, 6), 1.0)
    expected = (14 * 100 + 100 * 5 / sum(M.ALEXNET_ERRORS["fog"])) / 15
    assert M.mce(errs) == pytest.approx(expected)
    # JSON round trip turns the severity keys into strings
    assert M.mce(json.loads(json.dumps(errs))) == pytest.approx(expected)


def test_mce_validation():
    errs = {c: [0.5] * 5 for c in COMMON_CORRUPTIONS}
    with pytest.raises(ValueError, match="missing"):
        M.mce({k: v for k, v in errs.items() if k != "fog"})
    with pytest.raises(ValueError, match="lacks severities"):
        M.mce({**errs, "fog": {1: 0.5, 2: 0.5}})
    with pytest.raises(ValueError, match="fractions"):
        M.mce({**errs, "fog": [50, 50, 50, 50, 50]})
    with pytest.raises(ValueError, match="not among the 15"):
        M.mce({**errs, "spatter": [0.5] * 5})


def test_mce_relative_to_a_baseline_run():
    base = {"fog": [0.2, 0.3, 0.4, 0.5, 0.6], "contrast": [0.1, 0.1, 0.2, 0.2, 0.4]}
    model = {"fog": [0.1, 0.2, 0.3, 0.4, 0.5], "contrast": [0.1, 0.1, 0.2, 0.2, 0.4]}
    assert M.mce(base, baseline=base, require_all=False) == pytest.approx(100.0)
    ce = M.corruption_errors(model, baseline=base)
    assert ce["fog"] == pytest.approx(100 * 1.5 / 2.0) and ce["contrast"] == pytest.approx(100.0)
    assert M.mce(model, baseline=base, require_all=False) == pytest.approx((75 + 100) / 2)
    with pytest.raises(ValueError, match="no baseline errors for corruption 'snow'"):
        M.corruption_errors({"snow": [0.1] * 5}, baseline=base)
    # relative mCE measures the drop from clean accuracy
    rel = M.relative_mce(model, 0.05, base, 0.1)
    fog = (sum(model["fog"]) - 5 * 0.05) / (sum(base["fog"]) - 5 * 0.1)
    con = (sum(model["contrast"]) - 5 * 0.05) / (sum(base["contrast"]) - 5 * 0.1)
    assert rel == pytest.approx(100 * (fog + con) / 2)


def test_accuracy_table():
    table = M.accuracy_table({"SymViT": {"fog": 50.0, "snow": 40.0}, "RPC": {"fog": 52.5}})
    lines = table.splitlines()
    assert lines[0] == "| corruption | SymViT | RPC |"
    assert lines[2] == "| fog | 50.00 | 52.50 |" and lines[3] == "| snow | 40.00 | - |"
    assert lines[-1] == "| **mean** | 45.00 | 52.50 |"
    # a model or corruption name holding a pipe stays one cell (every row has the header's cell count)
    odd = M.accuracy_table({"RPC|lam4": {"fog|v2": 50.0}, "Sym\nViT": {"fog|v2": 40.0}}).splitlines()
    assert odd[0] == "| corruption | RPC\\|lam4 | Sym ViT |" and odd[2] == "| fog\\|v2 | 50.00 | 40.00 |"
    assert {len(re.findall(r"(?<!\\)\|", line)) for line in odd} == {4}


def test_imagenet_a_r_indices():
    for subset in ("a", "r"):
        idx, wnids = M.imagenet_subset_indices(subset)
        assert len(idx) == len(set(idx)) == 200 and idx == sorted(idx) and max(idx) < 1000
        assert all(w.startswith("n") for w in wnids)
    idx_a, wnids_a = M.imagenet_subset_indices("imagenet-a")
    assert idx_a[:3] == [6, 11, 13] and wnids_a[0] == "n01498041"  # stingray, goldfinch, junco
    with pytest.raises(ValueError, match="'a' or 'r'"):
        M.imagenet_subset_indices("o")


class _LookupModel(nn.Module):
    """1000-way logits: the image's mean grey level encodes which 1K class is right; a larger logit
    always sits on class 0 (tench), which is not among ImageNet-R's 200 classes."""

    def __init__(self, level_to_class: dict[int, int]):
        super().__init__()
        self.level_to_class = level_to_class
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        out = torch.zeros(x.shape[0], 1000)
        for i, level in enumerate((x.mean(dim=(1, 2, 3)) * 255).round().long().tolist()):
            out[i, self.level_to_class[level]] = 5.0
        out[:, 0] = 10.0
        return out + self.dummy


def test_masked_accuracy_on_a_fake_imagenet_r(tmp_path):
    idx, wnids = M.imagenet_subset_indices("r")
    assert 0 not in idx
    chosen = [3, 50, 120]
    level_to_class = {}
    for k, j in enumerate(chosen):
        level = 40 * (k + 1)
        level_to_class[level] = idx[j]
        d = tmp_path / wnids[j]
        d.mkdir()
        for n in range(2):
            Image.fromarray(np.full((16, 16, 3), level, np.uint8)).save(d / f"{n}.png")
    model = _LookupModel(level_to_class)
    res = M.masked_accuracy(model, tmp_path, "r", img_size=16, progress=False)
    from kpca_attention.robustness.store import decode_bits

    correct = decode_bits(res.pop("correct"))  # per example
    assert res == {"top1": 1.0, "n": 6}  # unmasked, every prediction would be class 0
    assert correct.tolist() == [True] * 6
    (tmp_path / "not_a_wnid").mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "not_a_wnid" / "x.png")
    with pytest.raises(ValueError, match="not ImageNet-R wnids"):
        M.masked_accuracy(model, tmp_path, "r", img_size=16, progress=False)
    with pytest.raises(FileNotFoundError, match="ImageNet-A"):
        M.masked_accuracy(model, tmp_path / "missing", "a")


def test_ood_aupr_and_msp():
    assert M.ood_aupr([0.1, 0.2, 0.3], [0.8, 0.9]) == pytest.approx(1.0)
    # reversed scores: the positives rank last
    assert M.ood_aupr([0.8, 0.9], [0.1, 0.2]) < 0.6
    logits = torch.tensor([[10.0, 0.0, 0.0], [0.0, 0.1, 0.0]])
    s = M.msp_anomaly_score(logits)
    assert s[0] < s[1] < 0  # the confident example is the less anomalous
    assert M.msp_anomaly_score(logits, [1, 2])[0] == pytest.approx(-0.5)
    with pytest.raises(FileNotFoundError, match="ImageNet-O"):
        M.imagenet_o_aupr(nn.Linear(1, 1), "/nonexistent/o", "/nonexistent/val")


# --- found by mutation testing (/work/notes/review/mutation.md): each fails on its mutant ---------------


def test_imagenet_a_r_o_images_are_resized_to_size_over_0875(tmp_path) -> None:
    (tmp_path / "n01498041").mkdir()
    Image.new("RGB", (300, 200)).save(tmp_path / "n01498041" / "a.png")
    ds = M._image_folder(tmp_path, 224)
    assert ds[0][0].shape == (3, 224, 224) and ds.transform.transforms[0].size == 256  # 224 / 0.875
