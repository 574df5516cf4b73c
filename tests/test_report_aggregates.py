"""The aggregates the segmentation, language and classification study reports compute from per-example
results - corrupted mIoU over views, drops, per-corruption and per-class tables, bootstrap intervals,
seed-noise rows, paired token cells, the word-swap spill curve - and the claims' verdict thresholds. Each
test was written against a mutant no earlier test caught (the third mutation review, 2026-11-30) and fails
on it; expected values are computed by hand (IoU = I / (P + L - I) on hand-made counts, numpy percentiles
of the same resamples), never by the code under test."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest


def _img(hit):
    """Counts (3, 2) of a 10-pixel image, 5 pixels per class: intersection, prediction, label."""
    return np.array([[hit, hit], [5, 5], [5, 5]], dtype=np.int64)


def _counts(hits_clean, views):
    return {"clean": np.stack([_img(h) for h in hits_clean]),
            "views": {v: np.stack([_img(h) for h in hs]) for v, hs in views.items()}}


def _miou(hits):
    """mIoU by hand of images with intersection `hit` per class: IoU = I / (P + L - I) per class."""
    i = sum(hits)
    return i / (10 * len(hits) - i)


def _sections(counts, seg_classes=("a", "b")):
    from kpca_attention.tasks.segmentation.report import SegmentationSections, run_segmentation_metrics

    sec = SegmentationSections({"suites": {"corruptions": {"names": ["fog", "snow"], "severities": [1, 3]}},
                                "baseline": "sym"}, "images_per_s")
    sec.slugs, sec.base = list(counts), "sym"
    sec.label = {"sym": "SymViT", "rpc": "RPC"}
    sec.counts = counts
    sec.met = {s: {sd: run_segmentation_metrics(c) for sd, c in per.items()} for s, per in counts.items()}
    sec.res = {s: {sd: {"clean": {"iou": [0.5, 0.5], "class_names": list(seg_classes), "n": 4}}
                   for sd in per} for s, per in counts.items()}
    sec.has_corr = True
    return sec


def test_corrupted_is_the_mean_over_views_and_per_severity_its_own_views():
    from kpca_attention.tasks.segmentation.report import run_segmentation_metrics

    views = {("fog", 1): [5, 5], ("fog", 3): [1, 3], ("snow", 1): [4, 4], ("snow", 3): [0, 2]}
    m = run_segmentation_metrics(_counts([5, 5, 1, 1], views))  # 4 clean images, the first 2 corrupted
    per_view = {v: _miou(h) for v, h in views.items()}
    assert m["corrupted:miou"] == pytest.approx(np.mean(list(per_view.values())))
    assert m["per_severity"]["1"]["miou"] == pytest.approx((per_view["fog", 1] + per_view["snow", 1]) / 2)
    assert m["per_severity"]["3"]["miou"] == pytest.approx((per_view["fog", 3] + per_view["snow", 3]) / 2)
    assert m["per_corruption"]["fog"]["miou"] == pytest.approx((per_view["fog", 1] + per_view["fog", 3]) / 2)
    # the drop: clean of the same (first two) images minus the mean corrupted
    assert m["clean:miou"] == pytest.approx(_miou([5, 5, 1, 1])) and m["clean@corrupt:miou"] == 1.0
    assert m["drop:miou"] == pytest.approx(1.0 - np.mean(list(per_view.values())))


def test_keep_reads_only_the_corrupted_views_the_settings_ask_for():
    from kpca_attention.tasks.segmentation.report import SegmentationSections

    sec = SegmentationSections({"suites": {"corruptions": {"names": ["fog"], "severities": [1, 3]}}},
                               "images_per_s")
    r = {"run": {}, "clean": {},
         "corruptions": {"fog": {"1": "f1", "2": "f2", "3": "f3"}, "snow": {"1": "s1"}}}
    assert sec.keep(r)["corruptions"] == {"fog": {"1": "f1", "3": "f3"}}


def test_per_corruption_difference_row_is_variant_minus_baseline(tmp_path):
    views_b = {("fog", 1): [2, 2], ("snow", 1): [3, 3]}
    views_r = {("fog", 1): [4, 4], ("snow", 1): [3, 3]}  # RPC better on fog, equal on snow
    counts = {"sym": {0: _counts([5, 5], views_b)}, "rpc": {0: _counts([5, 5], views_r)}}
    text = "\n".join(_sections(counts).sections_before_trace(tmp_path, {}))
    row = next(line for line in text.splitlines() if line.startswith("| RPC - SymViT"))
    want = 100 * (_miou([4, 4]) - _miou([2, 2]))
    assert f"+{want:.2f}" in row and "+0.00" in row
    drop = next(line for line in text.splitlines() if line.startswith("| RPC |"))
    # the drop bracket: RPC's drop minus SymViT's (clean 100 % for both): RPC drops less
    d_r = 1 - np.mean([_miou([4, 4]), _miou([3, 3])])
    d_b = 1 - np.mean([_miou([2, 2]), _miou([3, 3])])
    assert f"[{100 * (d_r - d_b):+.2f}]" in drop


def test_per_class_iou_leaves_out_seeds_without_the_class(tmp_path):
    counts = {"sym": {0: _counts([5, 5], {}), 1: _counts([5, 5], {})}}
    sec = _sections(counts)
    sec.has_corr = False
    sec.res["sym"][0]["clean"]["iou"] = [0.5, None]  # class b absent in seed 0's test images
    sec.res["sym"][1]["clean"]["iou"] = [0.7, 0.4]
    text = "\n".join(sec.sections_before_trace(tmp_path, {}))
    row = next(line for line in text.splitlines() if line.startswith("| SymViT"))
    assert [c.strip() for c in row.strip("|").split("|")][1:] == ["60.0", "40.0"]


def test_seed_noise_and_paired_bootstrap_intervals_have_the_sign_of_the_difference():
    """Seed 1 of the baseline is better than seed 0 on every image, so every resample of seed 1 - seed 0
    is > 0; the variant is worse than the baseline on every image, so its interval is < 0; each cell
    prints [low, high]."""
    base = {0: _counts([2, 3, 2, 3], {}), 1: _counts([4, 5, 4, 5], {})}
    var = {0: _counts([1, 1, 1, 1], {}), 1: _counts([2, 2, 2, 2], {})}
    sec = _sections({"sym": base, "rpc": var})
    sec.has_corr = False
    summary = {"paired": {}}
    rng = np.random.default_rng(0)
    noise = sec.seed_noise(0, 1, rng, summary)
    lo, hi = summary["seed_noise"]["clean:miou"]["boot_ci"]
    assert 0 < lo <= hi
    cells = sec.paired("rpc", rng, summary)
    lo2, hi2 = summary["paired"]["rpc"]["clean:miou"]["boot_ci"]
    assert lo2 <= hi2 < 0
    for cell in (noise["clean:miou"], cells["clean:miou"]):
        a, b = map(float, re.search(r"\[([-+0-9.]+), ([-+0-9.]+)\]", cell).groups())
        assert a <= b, cell


def test_bootstrap_interval_is_the_2_5_and_97_5_percentiles_of_the_resamples():
    """By hand: the same n-image resamples (one draw of (n_boot, n) indices from the generator), mIoU
    of each resample's summed counts, the difference in points, and its 2.5 / 97.5 percentiles."""
    from kpca_attention.tasks.segmentation.report import bootstrap_metric_diff

    hits_a = [5, 4, 3, 5, 2, 4, 5, 1, 3, 4, 5, 2]
    hits_b = [4, 4, 2, 5, 3, 1, 5, 1, 2, 4, 3, 2]
    a = np.stack([_img(h) for h in hits_a])[None]
    b = np.stack([_img(h) for h in hits_b])[None]
    n_boot = 400
    idx = np.random.default_rng(7).integers(0, len(hits_a), size=(n_boot, len(hits_a)))
    diffs = [100 * (_miou([hits_a[i] for i in row]) - _miou([hits_b[i] for i in row])) for row in idx]
    got = bootstrap_metric_diff([a], [b], rng=7, n_boot=n_boot)["miou"]
    assert got == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))


def test_bootstrap_averages_the_metric_over_every_view():
    """Two corrupted views: each resample's difference is the mean over the views of the resampled mIoU
    (an image carries all its views)."""
    from kpca_attention.tasks.segmentation.report import bootstrap_metric_diff

    rng = np.random.default_rng(1)
    hits_a = rng.integers(0, 6, size=(2, 10))  # (views, images)
    hits_b = rng.integers(0, 6, size=(2, 10))
    a = np.stack([np.stack([_img(h) for h in row]) for row in hits_a])
    b = np.stack([np.stack([_img(h) for h in row]) for row in hits_b])
    idx = np.random.default_rng(5).integers(0, 10, size=(300, 10))
    diffs = [100 * np.mean([_miou(hits_a[v, row]) - _miou(hits_b[v, row]) for v in range(2)]) for row in idx]
    got = bootstrap_metric_diff([a], [b], rng=5, n_boot=300)["miou"]
    assert got == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))


def test_wordswap_spill_distance_0_is_the_swapped_tokens_own_prediction():
    """NLL entry p - 1 predicts token p: with token 3 swapped and only entry 2 (its prediction) and entry
    4 (two tokens after) raised, the spill curve is +1 at distance 0, 0 at 1 and +0.5 at 2."""
    from kpca_attention.tasks.language.report import _spill
    from kpca_attention.tasks.language.suites import encode_nll

    clean = np.full(8, 2.0)
    att = clean.copy()
    att[2] += 1.0
    att[4] += 0.5
    items = {"ppl/test": {"ppl": 1.0, **encode_nll(clean)},
             "wordswap/test": {"ppl": 1.0, **encode_nll(att), "swapped": [3]}}
    s = _spill(items, "test")
    assert s[:3] == pytest.approx([1.0, 0.0, 0.5], abs=1e-3)


def test_language_seed_noise_row_is_seed_b1_minus_seed_b0():
    """The row "<baseline> s1 - s0": seed 1's perplexity and per-token NLL minus seed 0's."""
    from kpca_attention.tasks.language.report import LanguageSections
    from kpca_attention.tasks.language.suites import encode_nll

    sec = LanguageSections({"suites": {"splits": ["test"]}, "recipe": {"context": 4}, "baseline": "sym"},
                           "tokens_per_s")
    nll = {0: np.full(8, 2.0), 1: np.full(8, 1.5)}
    sec.base, sec.keys_ = "sym", ["ppl/test"]
    sec.res = {"sym": {sd: {"ppl/test": {"ppl": math.exp(x.mean()), **encode_nll(x)}}
                       for sd, x in nll.items()}}
    sec.met = {"sym": {sd: {"ppl/test": math.exp(x.mean())} for sd, x in nll.items()}}
    cell = sec.seed_noise(0, 1, np.random.default_rng(0), {})["ppl/test"]
    assert cell.startswith(f"{math.exp(1.5) - math.exp(2.0):+.2f}; -0.5000 [-0.5000, -0.5000]"), cell


def test_language_paired_token_cell_is_variant_minus_baseline():
    """Over tokens: mean per-token NLL difference variant - baseline (negative: the variant is better)."""
    from kpca_attention.tasks.language.report import LanguageSections
    from kpca_attention.tasks.language.suites import encode_nll

    sec = LanguageSections({"suites": {"splits": ["test"]}, "recipe": {"context": 4}, "baseline": "sym"},
                           "tokens_per_s")
    nll = {"sym": {0: np.full(8, 2.0), 1: np.full(8, 2.5)}, "rpc": {0: np.full(8, 1.75), 1: np.full(8, 2.25)}}
    sec.base, sec.keys_, sec.slugs = "sym", ["ppl/test"], ["sym", "rpc"]
    sec.res = {s: {sd: {"ppl/test": {"ppl": math.exp(x.mean()), **encode_nll(x)}} for sd, x in per.items()}
               for s, per in nll.items()}
    sec.met = {s: {sd: {"ppl/test": math.exp(x.mean())} for sd, x in per.items()} for s, per in nll.items()}
    summary = {"paired": {}, "paired_tokens": {}}
    cell = sec.paired("rpc", np.random.default_rng(0), summary)["ppl/test"]
    assert summary["paired_tokens"]["rpc"]["ppl/test"]["mean"] == pytest.approx(-0.25)
    assert "; -0.2500 [-0.2500, -0.2500]" in cell, cell


def test_ctx_leaves_out_the_prediction_of_a_word_swapped_at_position_1():
    """Entry 0 predicts token 1: a swap there is the swapped token's own prediction, left out of ctx."""
    from kpca_attention.tasks.language.report import lm_metrics
    from kpca_attention.tasks.language.suites import encode_nll

    clean, att = np.full(4, 2.0), np.array([6.0, 2.0, 2.0, 2.0])
    items = {"run": {}, "ppl/test": {"ppl": math.exp(2.0), **encode_nll(clean)},
             "wordswap/test": {"ppl": math.exp(att.mean()), **encode_nll(att), "swapped": [1]}}
    assert lm_metrics(items)["ctx/test"] == pytest.approx(math.exp(2.0), rel=1e-3)


def test_classification_seed_noise_row_is_seed_b1_minus_seed_b0():
    """The report labels the row "<baseline> s1 - s0": seed 1 right on every image, seed 0 on half."""
    from kpca_attention.tasks.classification.report import ClassificationSections

    sec = ClassificationSections({"suites": {"attacks": []}, "baseline": "sym"}, "images_per_s")
    sec.base, sec.keys_ = "sym", ["clean"]
    sec.ex = {"sym": {0: {"clean": np.array([1, 0] * 10, dtype=bool)}, 1: {"clean": np.ones(20, dtype=bool)}}}
    cell = sec.seed_noise(0, 1, np.random.default_rng(0), {})["clean"]
    assert cell.startswith("+50.0 [+"), cell


def test_alignment_verdict_thresholds_are_inclusive():
    """THRESHOLDS: "at or above" align_holds holds, "at or below" align_fails fails, weak between."""
    from kpca_attention.kpca.claims import THRESHOLDS, _align_verdict

    assert _align_verdict(THRESHOLDS["align_fails"]) == "fails"
    assert _align_verdict(THRESHOLDS["align_holds"]) == "holds"
    assert _align_verdict((THRESHOLDS["align_fails"] + THRESHOLDS["align_holds"]) / 2) == "weak"
