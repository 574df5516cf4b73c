"""Null baselines, positive control and chance tests of the alignment measures (kpca.chance)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kpca_attention.kpca import alignment, optimal_cosine, predicted_values
from kpca_attention.kpca.analysis import AnalysisConfig, Analyzer
from kpca_attention.kpca.capture import QKVCapture
from kpca_attention.kpca.chance import (
    alignment_chance,
    chance_test,
    chance_word,
    model_family,
    null_alignment,
    null_values,
    positive_control,
    share_of_change,
    unit_means,
)
from kpca_attention.kpca.diagnostics import top_eigenvalues

pytestmark = pytest.mark.usefixtures("single_thread")


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_null_values_are_row_permutations_and_scaled_gaussians():
    v = _randn(3, 12, 5)
    perm = null_values(v, "perm", 4, torch.Generator().manual_seed(1))
    assert perm.shape == (4, 3, 12, 5)
    for d in range(4):
        for b in range(3):
            # the same multiset of rows, in another order
            assert torch.equal(torch.sort(perm[d, b], dim=0).values, torch.sort(v[b], dim=0).values)
    assert not torch.equal(perm[0], perm[1])  # draws differ
    big = 1e-9 * _randn(2, 200, 50)
    gauss = null_values(big, "gauss", 3, torch.Generator().manual_seed(1))
    rms = gauss.pow(2).mean((-2, -1)).sqrt() / big.pow(2).mean((-2, -1)).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=0.05)
    with pytest.raises(ValueError, match="unknown null"):
        null_values(v, "shuffle", 2)
    with pytest.raises(ValueError, match="draws"):
        null_values(v, "perm", 0)


def test_alignment_broadcasts_over_leading_dims():
    v, v_hat = _randn(4, 3, 15, 6, seed=1), _randn(3, 15, 6, seed=2)
    a = alignment(v, v_hat)
    b = alignment(v, v_hat.expand_as(v))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="leading dims broadcast"):
        alignment(v, _randn(2, 15, 6))


def test_null_alignment_is_the_mean_of_alignment_over_the_draws():
    v, v_hat = _randn(2, 10, 4, seed=3), predicted_values(_randn(2, 10, 4, seed=4))
    # max_elems forces draws into groups of 2: the grouping must not change the draws or the mean
    got = null_alignment(v, v_hat, draws=5, generator=torch.Generator().manual_seed(7), max_elems=400)
    gen = torch.Generator().manual_seed(7)
    for kind in ("perm", "gauss"):
        draws = torch.cat([null_values(v, kind, n, gen) for n in (2, 2, 1)])
        ref = alignment(draws, v_hat.expand_as(draws), optimal=kind != "perm")
        for key, val in ref.items():
            torch.testing.assert_close(got[f"{key}_null_{kind}"], val.mean(0), rtol=1e-10, atol=1e-12)
    # the optimal cosine is blind to token order: its permutation null is the measured value
    torch.testing.assert_close(got["optimal_cosine_null_perm"], optimal_cosine(v, v_hat))
    shuffled = v[:, torch.randperm(10, generator=torch.Generator().manual_seed(0))]
    torch.testing.assert_close(optimal_cosine(shuffled, v_hat), optimal_cosine(v, v_hat), rtol=1e-12, atol=0)


def test_random_values_are_at_chance_and_noisy_prediction_is_above():
    keys = _randn(40, 30, 8, seed=5)
    v_hat = predicted_values(keys)
    gen = torch.Generator().manual_seed(0)
    v = _randn(40, 30, 8, seed=6)  # values unrelated to the keys
    meas = alignment(v, v_hat, optimal=False)
    nulls = null_alignment(v, v_hat, draws=10, generator=gen, optimal=False)
    for key in ("linear_cka", "kernel_cka", "direct_cosine"):
        test = chance_test(meas[key].numpy(), nulls[f"{key}_null_perm"].numpy())
        assert test["verdict"] == "not distinguished from chance", (key, test)
    # V = V_hat (rescaled) plus noise at SNR 1: every measure is above its permutation null
    rms = v_hat.pow(2).mean((-2, -1), keepdim=True).sqrt()
    v = v_hat / rms + _randn(40, 30, 8, seed=8)
    meas = alignment(v, v_hat, optimal=False)
    nulls = null_alignment(v, v_hat, draws=10, generator=gen, optimal=False)
    for key in ("linear_cka", "kernel_cka", "direct_cosine", "relative_frobenius"):
        test = chance_test(
            meas[key].numpy(), nulls[f"{key}_null_perm"].numpy(), higher_is_better=key != "relative_frobenius"
        )
        assert test["verdict"] == "above chance" and test["p_above"] < 1e-6, (key, test)


def test_chance_test_directions_and_effect_size():
    rng = np.random.default_rng(0)
    null = rng.uniform(0.2, 0.3, 50)
    below = null - 0.05 + 0.01 * rng.standard_normal(50)
    t = chance_test(below, null)
    assert t["verdict"] == "below chance" and t["diff"] == pytest.approx(np.mean(below - null))
    assert t["d_z"] == pytest.approx(np.mean(below - null) / np.std(below - null, ddof=1))
    assert t["share_above_null"] < 0.05
    # for a lower-is-better measure the same numbers mean better than chance
    assert chance_test(below, null, higher_is_better=False)["verdict"] == "above chance"
    same = chance_test(null, null)
    assert same["verdict"] == "not distinguished from chance" and same["p_above"] == 1.0
    # 5 units: the exact one-sided test cannot go below 2^-5 = 0.031 > 0.025, whatever the values
    five = chance_test(null[:5] + 1.0, null[:5])
    assert five["p_above"] == pytest.approx(1 / 32) and five["verdict"] == "too few units to test"
    assert chance_test(null[:6] + 1.0, null[:6])["verdict"] == "above chance"  # 2^-6 = 0.016
    # a result stored with the old wording reads as the new
    assert chance_word({**chance_test(below, null), "verdict": "at chance"}) == "below chance"
    assert chance_test([np.nan], [0.1])["verdict"] == "n/a"
    with pytest.raises(ValueError, match="pair up"):
        chance_test([1.0, 2.0], [1.0])


def test_values_and_keys_of_the_same_tokens_beat_the_permutation_null_without_any_kpca():
    """The confound the untrained-copy baseline exists for: V = X W_V and K = X W_K with random weights -
    no training, no kernel PCA - are maps of the same tokens, so linear and kernel CKA between V and the
    KPCA prediction from K come out "above chance" against V with its tokens permuted."""
    x = _randn(40, 30, 8, seed=11)  # 40 (input, head) units of 30 tokens
    w_k, w_v = _randn(8, 8, seed=12), _randn(8, 8, seed=13)
    keys, v = x @ w_k / 8 ** 0.5, x @ w_v / 8 ** 0.5
    v_hat = predicted_values(keys)
    gen = torch.Generator().manual_seed(0)
    meas = alignment(v, v_hat, optimal=False)
    nulls = null_alignment(v, v_hat, draws=10, generator=gen, optimal=False)
    for key in ("linear_cka", "kernel_cka"):
        test = chance_test(meas[key].numpy(), nulls[f"{key}_null_perm"].numpy())
        assert test["verdict"] == "above chance", (key, test)


def _stored(p_above: float, n: int = 16) -> dict:
    return {"n": n, "alpha": 0.05, "p_above": p_above, "p_below": 1 - p_above, "null": 0.1, "diff": 0.01,
            "d_z": 0.5}


def test_model_family_holm_adjusts_the_verdict_tests_together():
    """A model's chance tests are one family: p above 0.02 reads "above chance" alone (0.02 < 0.025) and in
    a family of one, and not in a family of seven (two-sided 0.04, Holm 7 x 0.04); the two-sided p is
    twice the smaller one-sided p; a test with too few units is left out of the family and keeps its
    word; the optimal cosine is tested against its rotated null, not the permutation null it equals."""
    measures = ("linear_cka", "kernel_cka", "optimal_cosine", "direct_cosine")
    strong = _stored(1e-5)
    summary: dict = {"chance": {"linear_cka": {"perm": _stored(0.02)}}}
    one = model_family(summary, measures)
    assert chance_word(_stored(0.02)) == "above chance" and chance_word(one["linear_cka"]) == "above chance"
    assert one["linear_cka"]["p_two_sided"] == pytest.approx(0.04) and one["linear_cka"]["family_size"] == 1
    summary = {
        "chance": {"linear_cka": {"perm": _stored(0.02)}, "kernel_cka": {"perm": strong},
                   "optimal_cosine": {"perm": _stored(0.5), "rot": strong},
                   "direct_cosine": {"perm": _stored(1 / 32, n=5)}},
        "gamma_chance": _stored(0.985),  # alone below chance: p_below 0.015, two-sided 0.03
    }
    fam = model_family(summary, measures)
    assert set(fam) == {"linear_cka", "kernel_cka", "optimal_cosine", "direct_cosine", "gamma"}
    assert fam["linear_cka"]["family_size"] == 4 and "p_holm" not in fam["direct_cosine"]
    assert chance_word(fam["direct_cosine"]) == "too few units to test"
    # two-sided 2e-5, 2e-5, 0.03, 0.04: Holm 4 x, 3 x, 2 x 0.03 = 0.06, max(1 x 0.04, 0.06) = 0.06
    assert chance_word(fam["linear_cka"]) == "not distinguished from chance"
    assert chance_word(fam["kernel_cka"]) == chance_word(fam["optimal_cosine"]) == "above chance"
    assert fam["linear_cka"]["p_holm"] == pytest.approx(0.06) == fam["gamma"]["p_holm"]
    assert chance_word(fam["gamma"]) == "not distinguished from chance"
    assert chance_word(summary["gamma_chance"]) == "below chance"
    fam["kernel_cka"]["p_above"], fam["kernel_cka"]["p_below"] = 0.9, 1e-5  # direction from the smaller p
    assert chance_word(fam["kernel_cka"]) == "below chance"


def test_positive_control_response_and_rotation():
    v_hat = predicted_values(_randn(20, 40, 8, seed=9))
    snrs = (0.0, 0.1, 1.0, 10.0, math.inf)
    plain = positive_control(v_hat, snrs, generator=torch.Generator().manual_seed(0))
    rot = positive_control(v_hat, snrs, rotate=True, generator=torch.Generator().manual_seed(0))
    for key in ("linear_cka", "kernel_cka"):
        curve = plain[key].mean(1).numpy()
        assert np.all(np.diff(curve) > 0), (key, curve)
        assert curve[-1] == pytest.approx(1.0, abs=1e-9)
        assert rot[key].mean(1)[-1].item() == pytest.approx(1.0, abs=1e-9)  # CKA ignores the rotation
    assert plain["direct_cosine"].mean(1)[-1].item() == pytest.approx(1.0, abs=1e-9)
    assert abs(rot["direct_cosine"].mean(1)[-1].item()) < 0.2  # the cosine does not
    with pytest.raises(ValueError, match="snrs"):
        positive_control(v_hat, (-1.0,))


def test_unit_means_and_alignment_chance():
    rec = {
        "layer": [0, 0, 1, 1, 0],
        "head": [0, 1, 0, 0, 0],
        "x": [1.0, 2.0, 3.0, 5.0, 3.0],
        "x_null_perm": [0.0, 0.0, 1.0, np.nan, 1.0],
    }
    m = unit_means(rec, ["x", "x_null_perm"])
    assert m["layer"].tolist() == [0, 0, 1] and m["head"].tolist() == [0, 1, 0]
    assert m["x"].tolist() == [2.0, 2.0, 4.0]
    assert m["x_null_perm"].tolist() == [0.5, 0.0, 1.0]
    res = alignment_chance(rec, ["x"])["x"]["perm"]
    # only entries with a drawn null enter: unit (1, 0) has measure 3 (not 4) against null 1
    assert res["n"] == 3 and res["measured"] == pytest.approx((2.0 + 2.0 + 3.0) / 3)


def test_share_of_change():
    rng = np.random.default_rng(1)
    h = rng.uniform(1, 2, 40)
    phi = rng.uniform(1, 2, 40)
    assert share_of_change(5.0 - h, h)["share"] == pytest.approx(1.0)
    assert share_of_change(phi - 3.0, np.full(40, 3.0))["share"] == pytest.approx(0.0)
    mixed = share_of_change(phi - h, h, clusters=np.repeat(np.arange(10), 4), n_boot=300)
    lo, hi = mixed["ci"]
    assert lo <= mixed["share"] <= hi and 0.2 < mixed["share"] < 0.8 and mixed["n_clusters"] == 10


def test_analyzer_reports_nulls_control_and_tests():
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=16, patch_size=4, in_chans=1, num_classes=3, embed_dim=24, depth=2, num_heads=2
    ).eval()
    x = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    cfg = AnalysisConfig(detail_samples=2, null_samples=3, null_draws=10, control_samples=1,
                         control_snrs=(0.0, 1.0, math.inf))
    with QKVCapture(model) as cap, torch.no_grad():
        model(x)
        an = Analyzer(cap.sites, cfg)
        an.add(cap.records)
    res = an.result()
    s = res["summary"]
    for key in ("linear_cka", "kernel_cka", "optimal_cosine", "direct_cosine", "signfix_cosine",
                "relative_frobenius"):
        for kind in ("perm", "gauss"):
            assert isinstance(s[f"{key}_null_{kind}"], float), key
            assert isinstance(res["layers"][0][f"{key}_null_{kind}"], float)
        assert s["chance"][key]["perm"]["n"] == 4  # 2 layers x 2 heads
    rec = res["records"]
    assert np.isfinite(rec["linear_cka_null_perm"]).sum() == 3 * 2 * 2  # the first 3 of 4 inputs
    assert s["null_units"] == 12
    assert res["positive_control"]["snr"] == [0.0, 1.0, "inf"]
    assert res["positive_control"]["plain"]["linear_cka"][-1] == pytest.approx(1.0)
    assert s["gamma_chance"]["n"] == 4
    assert set(s["j_proj_share_h"]) == {"share", "ci", "n", "n_clusters"}
    # the eigenvalue statistics of raw and of standardised keys, and the spectrum: the mean over every
    # input of the mean over heads (two lines in the wrong loop once kept one input, and no raw keys)
    assert set(res["eigen_stats"]) == {"raw", "standardized"}
    for li, rec in enumerate(cap.records):
        k = rec["k"].double()
        want = top_eigenvalues(k, k.shape[-1]).mean(1).mean(0)  # (d,): heads, then inputs
        np.testing.assert_allclose(res["spectrum"][str(li)], want.numpy(), rtol=1e-6)
    raw = top_eigenvalues(torch.stack([r["k"].double() for r in cap.records], 1), 12)  # (S, L, H, d)
    assert res["eigen_stats"]["raw"]["max"]["mean"] == pytest.approx(
        raw.flatten(1, 2).mean(1).amax(-1).mean().item(), rel=1e-6)  # heads averaged, max over ranks
    with pytest.raises(ValueError, match="null_draws"):
        AnalysisConfig(null_draws=0)


def test_the_rotated_null_keeps_the_rows_and_calibrates_the_optimal_cosine():
    """The optimal cosine is blind to token order, and against Gaussian V any V whose rows have structure
    (here: anisotropic, one axis 10x the others) came out "below chance" though it is unrelated to the keys.
    V R (R random orthogonal) keeps every row norm and angle; against it the same V is not told apart from
    chance, while V = V_hat plus noise is still above it."""
    v_hat = predicted_values(_randn(40, 30, 8, seed=5))
    gen = torch.Generator().manual_seed(0)
    rot = null_values(_randn(2, 30, 8, seed=1), "rot", 3, gen)
    base = _randn(2, 30, 8, seed=1)
    gram = base @ base.transpose(-1, -2)
    torch.testing.assert_close(rot @ rot.transpose(-1, -2), gram.expand(3, -1, -1, -1))
    scale = torch.tensor([10.0, 1, 1, 1, 1, 1, 1, 1], dtype=torch.float64)
    v = _randn(40, 30, 8, seed=6) * scale + 3.0  # unrelated to the keys, structured rows
    meas = optimal_cosine(v, v_hat).numpy()
    nulls = null_alignment(v, v_hat, draws=10, generator=gen, kinds=("gauss", "rot"))
    assert chance_test(meas, nulls["optimal_cosine_null_gauss"].numpy())["verdict"] == "below chance"
    assert chance_test(meas, nulls["optimal_cosine_null_rot"].numpy())["verdict"] == \
        "not distinguished from chance"
    rms = v_hat.pow(2).mean((-2, -1), keepdim=True).sqrt()
    aligned = v_hat / rms + 0.3 * _randn(40, 30, 8, seed=8)
    nulls = null_alignment(aligned, v_hat, draws=10, generator=gen, kinds=("rot",))
    test = chance_test(optimal_cosine(aligned, v_hat).numpy(), nulls["optimal_cosine_null_rot"].numpy())
    assert test["verdict"] == "above chance"
    # CKA cannot see a rotation of V's axes: its rotated null is the measured value
    got = alignment(v, v_hat, optimal=False)["linear_cka"]
    torch.testing.assert_close(null_alignment(v, v_hat, draws=2, kinds=("rot",), generator=gen,
                                              optimal=False)["linear_cka_null_rot"], got)


# --- found by mutation testing (/work/notes/review/mutation.md): each fails on its mutant ---------------


def test_the_unadjusted_chance_word_is_two_sided_at_alpha() -> None:
    from kpca_attention.kpca.chance import chance_word

    assert chance_word({"n": 10, "p_above": 0.03, "p_below": 0.98}) == "not distinguished from chance"
    assert chance_word({"n": 10, "p_above": 0.02, "p_below": 0.99}) == "above chance"


def test_the_share_of_change_interval_is_95_percent() -> None:
    from scipy import stats

    from kpca_attention.kpca.chance import share_of_change

    rng = np.random.default_rng(2)
    j = rng.normal(0, 1, 400)
    h = -0.5 * j + rng.normal(0, 1, 400)  # share 0.5, homoscedastic: OLS's interval is the bootstrap's
    res = share_of_change(j, h, clusters=np.arange(400), n_boot=4000)  # one unit per cluster
    half = 1.96 * stats.linregress(j, -h).stderr
    assert (res["ci"][1] - res["ci"][0]) / 2 == pytest.approx(half, rel=0.07)
