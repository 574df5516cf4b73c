"""KPCA diagnostics against direct NumPy / SciPy / scikit-learn computations on small cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.decomposition import KernelPCA

from kpca_attention.kpca import (
    alignment,
    eigen_stats,
    feature_gram,
    gamma_test,
    kernel_cka,
    kpca_eigen,
    linear_cka,
    optimal_cosine,
    pairwise_difference_stats,
    predicted_values,
    projection_loss,
    projection_loss_official,
    top_eigenvalues,
)


def _keys(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _np_gram(k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The critique's recipe in NumPy float64 (without its 1e-6): K_phi, centred, g."""
    n, d = k.shape
    raw = np.exp(k @ k.T / np.sqrt(d))
    g = raw.sum(1)
    kphi = raw / np.outer(g, g)
    one = np.full((n, n), 1.0 / n)
    kc = kphi - one @ kphi - kphi @ one + one @ kphi @ one
    return kphi, kc, g


def test_feature_gram_matches_numpy():
    k = _keys(2, 3, 20, 8)
    kc = feature_gram(k)
    kphi = feature_gram(k, centered=False)
    for b, h in itertools.product(range(2), range(3)):
        ref_phi, ref_c, _ = _np_gram(k[b, h].numpy())
        np.testing.assert_allclose(kphi[b, h].numpy(), ref_phi, rtol=1e-12)
        np.testing.assert_allclose(kc[b, h].numpy(), ref_c, rtol=1e-10, atol=1e-18)


def test_eigen_matches_sklearn_kernel_pca():
    k = _keys(30, 6, seed=1)
    kphi = feature_gram(k, centered=False).numpy()
    ours = kpca_eigen(k, 5, order="signed", method="dense")
    skl = KernelPCA(n_components=5, kernel="precomputed", eigen_solver="dense").fit(kphi)
    np.testing.assert_allclose(ours.eigenvalues.numpy(), skl.eigenvalues_, rtol=1e-8)
    # same unit eigenvectors up to sign
    dots = np.abs((ours.eigenvectors.numpy() * skl.eigenvectors_).sum(0))
    np.testing.assert_allclose(dots, 1.0, atol=1e-8)
    # and they solve Kc a = mu a
    kc = feature_gram(k).numpy()
    a, mu = ours.eigenvectors.numpy(), ours.eigenvalues.numpy()
    np.testing.assert_allclose(kc @ a, a * mu, atol=1e-12 * np.abs(mu).max())


@pytest.mark.parametrize("centering", ["GHA", "HGA"])
@pytest.mark.parametrize("scale", ["unit", "kpca"])
def test_predicted_values_match_formula(centering, scale):
    k = _keys(40, 8, seed=2)
    d_v = 8
    _, kc, g = _np_gram(k.numpy())
    w, vecs = np.linalg.eigh(kc)
    idx = np.argsort(-np.abs(w))[:d_v]
    a, mu = vecs[:, idx], w[idx]
    if scale == "kpca":
        a = a / np.sqrt(mu)
    n = len(g)
    one = np.full((n, n), 1.0 / n)
    G = np.diag(1 / g)
    ref = G @ a - G @ one @ a if centering == "GHA" else G @ a - one @ G @ a
    ours = predicted_values(k, d_v, scale=scale, centering=centering).numpy()
    signs = np.sign((ours * ref).sum(0))  # eigenvector signs are arbitrary
    np.testing.assert_allclose(ours * signs, ref, rtol=1e-7, atol=1e-9 * np.abs(ref).max())


def test_predicted_values_more_columns_than_tokens_are_zero():
    k = _keys(5, 8)
    v_hat = predicted_values(k)
    assert v_hat.shape == (5, 8)
    assert torch.all(v_hat[:, 5:] == 0)


def test_lowrank_eigensolver_matches_dense():
    # real-looking keys: a few dominant directions, N well above the top-k
    base = _keys(400, 4, seed=3) @ _keys(4, 16, seed=4) + 0.3 * _keys(400, 16, seed=5)
    keys = torch.stack([base, base * 1.3])
    dense = kpca_eigen(keys, 8, method="dense")
    low = kpca_eigen(keys, 8, method="lowrank", niter=12)
    np.testing.assert_allclose(low.eigenvalues.numpy(), dense.eigenvalues.numpy(), rtol=1e-6)
    # same top-8 subspace
    pd, pl = dense.eigenvectors, low.eigenvectors
    proj_diff = (pd @ pd.mT - pl @ pl.mT).norm(dim=(-2, -1))
    assert proj_diff.max() < 1e-4


def test_overflow_safety_keys_of_norm_100():
    k = _keys(2, 40, 16)
    k = 100 * k / k.norm(dim=-1, keepdim=True)
    v = _keys(2, 40, 16, seed=9)
    assert torch.isfinite(feature_gram(k)).all()
    assert torch.isfinite(predicted_values(k)).all()
    assert torch.isfinite(predicted_values(k, scale="kpca")).all()
    pl = projection_loss(k, k, v)
    assert all(torch.isfinite(pl[key]) for key in ("j_proj", "phi_norm_sq", "h_norm_sq"))
    assert torch.isfinite(pl["log_phi_norm_sq_tokens"]).all()
    g = gamma_test(k, v, d=8)
    assert torch.isfinite(g["random"]["mean_rel"]).all()
    assert torch.isfinite(top_eigenvalues(k, 8)).all()


def test_projection_loss_matches_direct_formula():
    q, k, v = _keys(12, 4, seed=1), _keys(12, 4, seed=2), _keys(12, 3, seed=3)
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    s = qn @ kn.T / 2.0
    attn = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    h = attn @ vn
    phi = np.exp((qn * qn).sum(1) / 2.0) / np.exp(s).sum(1) ** 2
    out = projection_loss(q, k, v)
    np.testing.assert_allclose(out["phi_norm_sq_tokens"].numpy(), phi, rtol=1e-12)
    np.testing.assert_allclose(out["h_norm_sq_tokens"].numpy(), (h * h).sum(1), rtol=1e-12)
    assert out["j_proj"].item() == pytest.approx((phi - (h * h).sum(1)).mean(), rel=1e-12)


def test_projection_loss_respects_key_padding():
    q, k, v = _keys(1, 10, 4, seed=1), _keys(1, 10, 4, seed=2), _keys(1, 10, 4, seed=3)
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[:, :7] = True
    full = projection_loss(q[:, :7], k[:, :7], v[:, :7])
    masked = projection_loss(q, k, v, mask)
    for key in ("j_proj", "phi_norm_sq", "h_norm_sq"):
        assert masked[key].item() == pytest.approx(full[key].item(), rel=1e-12)


def test_official_projection_loss_matches_official_code():
    """Transcription of rachtsy/KPCA_code Reconstruction/softmax.py (float64)."""
    B, H, N, D = 2, 3, 9, 4
    q, k, v = _keys(B, H, N, D, seed=1), _keys(B, H, N, D, seed=2), _keys(B, H, N, D, scale=0.1, seed=3)
    qs = (q - q.mean(-1, keepdim=True)) / q.std(-1, keepdim=True)
    ks = (k - k.mean(-1, keepdim=True)) / k.std(-1, keepdim=True)
    qk = qs @ ks.transpose(-2, -1)
    qq = qs @ qs.transpose(-2, -1)
    attn = (qk * D**-0.5).softmax(-1)
    x = attn @ v
    num = torch.exp(torch.diagonal(qq, dim1=-2, dim2=-1))
    den = torch.exp(2 * qk[:, :, :, 0] - torch.log(attn[:, :, :, 0].pow(2)))
    error = num / den - x.pow(2).sum(-1)
    out = projection_loss_official(q, k, v)
    assert out["j_proj"].item() == pytest.approx(error.mean().item(), rel=1e-10)
    assert out["log_j_proj"].item() == pytest.approx(math.log(error.mean().item()), rel=1e-10)
    # a negative mean is logged as NaN (log of a negative number), not hidden
    assert torch.isnan(projection_loss_official(q, k, 100 * v)["log_j_proj"])


def test_pairwise_difference_stats_brute_force():
    gam = _keys(3, 11, 4, seed=7)
    m, s = pairwise_difference_stats(gam)
    mr, sr = pairwise_difference_stats(gam, relative=True)
    for b, d in itertools.product(range(3), range(4)):
        x = gam[b, :, d].numpy()
        pairs = [(x[i], x[j]) for i in range(11) for j in range(i + 1, 11)]
        ab = np.array([abs(a - c) for a, c in pairs])
        rel = np.array([abs(a - c) / max(abs(a), abs(c)) for a, c in pairs])
        assert m[b, d].item() == pytest.approx(ab.mean(), rel=1e-10)
        assert s[b, d].item() == pytest.approx(ab.std(ddof=1), rel=1e-8)
        assert mr[b, d].item() == pytest.approx(rel.mean(), rel=1e-10)
        assert sr[b, d].item() == pytest.approx(rel.std(ddof=1), rel=1e-8)


def test_theorem1_consistency_values_built_from_eigenvectors():
    """If V is exactly G H A, every alignment measure is ~1 and gamma is constant over tokens."""
    k = _keys(4, 60, 8, seed=11)
    v = predicted_values(k)
    al = alignment(v, v)
    for key in ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka", "signfix_cosine"):
        assert torch.allclose(al[key], torch.ones(4, dtype=torch.float64), atol=1e-6), key
    assert torch.allclose(al["relative_frobenius"], torch.zeros(4, dtype=torch.float64))
    # "kpca" scale: V = G H A / sqrt(mu) is still the same axes
    g = gamma_test(k, predicted_values(k, scale="kpca"))
    assert g["values"]["mean_rel"].max() < 1e-6
    assert g["eigenvectors"]["mean_rel"].max() < 1e-6
    assert g["random"]["mean_rel"].mean() > 0.1  # the control is far from constant
    # gamma of an exact eigenvector is its eigenvalue lambda = mu / N
    torch.testing.assert_close(g["values"]["gamma_mean"], g["reference"]["lambda"], rtol=1e-6, atol=0)


def test_random_values_fail_the_gamma_test():
    k = _keys(2, 50, 8, seed=12)
    v = _keys(2, 50, 8, seed=13)
    g = gamma_test(k, v)
    assert g["values"]["mean_rel"].mean() > 0.1


def _np_cka_linear(x, y):
    n = len(x)
    h = np.eye(n) - 1.0 / n
    kx, ky = h @ x @ x.T @ h, h @ y @ y.T @ h
    return (kx * ky).sum() / np.sqrt((kx * kx).sum() * (ky * ky).sum())


def _np_cka_rbf(x, y, threshold=1.0):
    """Kornblith et al. 2019 colab: gram_rbf + cka."""

    def gram_rbf(z):
        dots = z @ z.T
        sq = np.diag(dots)
        d2 = -2 * dots + sq[:, None] + sq[None, :]
        return np.exp(-d2 / (2 * threshold**2 * np.median(d2)))

    n = len(x)
    h = np.eye(n) - 1.0 / n
    kx, ky = h @ gram_rbf(x) @ h, h @ gram_rbf(y) @ h
    return (kx * ky).sum() / np.sqrt((kx * kx).sum() * (ky * ky).sum())


def test_cka_matches_numpy_and_invariances():
    x, y = _keys(25, 6, seed=1), _keys(25, 4, seed=2)
    y = y + 0.5 * x[:, :4]
    assert linear_cka(x, y).item() == pytest.approx(_np_cka_linear(x.numpy(), y.numpy()), rel=1e-10)
    assert kernel_cka(x, y).item() == pytest.approx(_np_cka_rbf(x.numpy(), y.numpy()), rel=1e-8)
    assert kernel_cka(x, y, threshold=0.5).item() == pytest.approx(
        _np_cka_rbf(x.numpy(), y.numpy(), 0.5), rel=1e-8
    )
    rot = torch.linalg.qr(_keys(6, 6, seed=3)).Q
    for f in (linear_cka, kernel_cka):
        base = f(x, y)
        assert f(x, x).item() == pytest.approx(1.0, abs=1e-12)
        assert f(x @ rot, y).item() == pytest.approx(base.item(), rel=1e-9)  # orthogonal
        assert f(7.5 * x, y).item() == pytest.approx(base.item(), rel=1e-9)  # isotropic scale
    # the critique's bandwidth (median of nonzero distances) is a different, close number
    crit = kernel_cka(x, y, bandwidth="critique").item()
    assert crit != kernel_cka(x, y).item() and crit == pytest.approx(kernel_cka(x, y).item(), abs=0.05)


def test_optimal_cosine_hungarian():
    v = _keys(6, 3, seed=5)
    perm = torch.tensor([3, 0, 5, 1, 2, 4])
    assert optimal_cosine(v, v[perm]).item() == pytest.approx(1.0)
    w = _keys(6, 3, seed=6)
    vn = (v / v.norm(dim=1, keepdim=True)).numpy()
    wn = (w / w.norm(dim=1, keepdim=True)).numpy()
    brute = max(np.mean([vn[i] @ wn[p[i]] for i in range(6)]) for p in itertools.permutations(range(6)))
    assert optimal_cosine(v, w).item() == pytest.approx(brute, rel=1e-6)


def test_eigen_stats_by_hand():
    e = torch.tensor([[[4.0, 2.0, 1.0], [2.0, 2.0, 1.0]], [[6.0, 4.0, 2.0], [6.0, 2.0, 2.0]]])
    st = eigen_stats(e)  # per-sample rank means: [3, 2, 1] and [6, 3, 2]
    assert st["max"]["mean"] == pytest.approx(4.5)
    assert st["min"]["mean"] == pytest.approx(1.5)
    assert st["median"]["mean"] == pytest.approx(2.5)
    assert st["mean"]["mean"] == pytest.approx((2 + 11 / 3) / 2)
    assert st["max"]["std"] == pytest.approx(np.std([3, 6], ddof=1))


def test_sampled_relative_pairs_estimate_all_pairs():
    gam = _keys(2, 120, 3, seed=8)
    exact_m, exact_s = pairwise_difference_stats(gam, relative=True, max_pairs=None)
    est_m, est_s = pairwise_difference_stats(gam, relative=True, max_pairs=4000)
    torch.testing.assert_close(est_m, exact_m, rtol=0.05, atol=0)
    torch.testing.assert_close(est_s, exact_s, rtol=0.05, atol=0)


def test_feature_gram_keys_beyond_float64_scores():
    """Scores k_i.k_j / sqrt(D) above float64's range (keys x 1e200) give the limit, not NaN."""
    k = _keys(3, 20, 8)
    for scale in (1e100, 1e200, 1e300):
        kc = feature_gram(k * scale)
        assert torch.isfinite(kc).all(), scale
    # a zero key among two huge orthogonal keys: g_0 = 3 at any scale, so K_phi[0, 0] = 1/9 exactly,
    # and every entry that involves a huge key tends to 0
    e = torch.zeros(3, 4, dtype=torch.float64)
    e[1, 0], e[2, 1] = 1.0, 1.0
    for scale in (1.0e160, 1e200):
        kphi = feature_gram(e * scale, centered=False)
        assert kphi[0, 0].item() == pytest.approx(1 / 9, rel=1e-15)
        assert kphi[1:, :].abs().max().item() == 0.0 and kphi[:, 1:].abs().max().item() == 0.0
    # just inside float64's score range the scaled path agrees with the naive formula
    big = k[0] * 3.0
    ref = _np_gram(big.numpy())[0]
    np.testing.assert_allclose(feature_gram(big, centered=False).numpy(), ref, rtol=1e-11)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_diagnostics_refuse_non_finite_inputs(bad):
    q, k, v = _keys(2, 10, 4, seed=1), _keys(2, 10, 4, seed=2), _keys(2, 10, 4, seed=3)
    v_bad = v.clone()
    v_bad[1, 3, 2] = bad
    k_bad = k.clone()
    k_bad[0, 0, 0] = bad
    for call in (
        lambda: projection_loss(q, k, v_bad),
        lambda: projection_loss(q, k_bad, v),
        lambda: projection_loss_official(q, k, v_bad),
        lambda: alignment(v_bad, v),
        lambda: alignment(v, v_bad),
        lambda: linear_cka(v_bad, v),
        lambda: kernel_cka(v, v_bad),
        lambda: optimal_cosine(v_bad, v),
        lambda: gamma_test(k, v_bad),
        lambda: feature_gram(k_bad),
    ):
        with pytest.raises(ValueError, match="inf or NaN"):
            call()


def test_linear_cka_epsilon_of_the_critique_is_not_scale_invariant():
    x, y = _keys(30, 6, seed=1), _keys(30, 6, seed=2) + 0.3 * _keys(30, 6, seed=1)
    exact = linear_cka(x, y).item()
    assert linear_cka(x, 1e-11 * y).item() == pytest.approx(exact, rel=1e-9)
    # with the critique's 1e-10 the same pair collapses to ~0 once V_hat is tiny
    assert linear_cka(x, y, eps=1e-10).item() == pytest.approx(exact, rel=1e-6)
    assert linear_cka(x, 1e-11 * y, eps=1e-10).item() < 1e-3 * exact
    assert alignment(x, 1e-11 * y, cka_eps=1e-10)["linear_cka"].item() < 1e-3 * exact
    with pytest.raises(ValueError, match="eps"):
        linear_cka(x, y, eps=-1.0)


def test_row_measures_are_their_formulas():
    """``pearson`` (row-centred cosine), ``negative_pct`` and ``signfix_cosine`` against numpy, on values
    where centred and uncentred cosines differ (offset rows) and some cosines are negative."""
    rng = np.random.default_rng(0)
    v = rng.normal(size=(2, 9, 5)) + 0.8
    v_hat = rng.normal(size=(2, 9, 5)) - 0.3 * v
    out = alignment(torch.from_numpy(v), torch.from_numpy(v_hat), optimal=False)

    def cos(a, b):
        return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)

    pearson = [np.mean([np.corrcoef(v[m, i], v_hat[m, i])[0, 1] for i in range(9)]) for m in range(2)]
    np.testing.assert_allclose(out["pearson"].numpy(), pearson, rtol=1e-12)
    neg = 100 * (cos(v, v_hat) < 0).mean(-1)
    assert 0 < neg.min() and neg.max() < 100  # both signs occur
    np.testing.assert_allclose(out["negative_pct"].numpy(), neg)
    flip = np.where((v * v_hat).sum(-2, keepdims=True) < 0, -1.0, 1.0)
    np.testing.assert_allclose(out["signfix_cosine"].numpy(), cos(v, v_hat * flip).mean(-1), rtol=1e-12)


@pytest.mark.parametrize("n", [24, 2])
def test_kernel_cka_matches_numpy_for_an_even_token_count(n):
    """The bandwidth is the median distance; for an even count of distances it is the mean of the two
    middle ones (numpy's median), the branch N = 25 never reaches."""
    x, y = _keys(n, 6, seed=4), _keys(n, 4, seed=5)
    y = y + 0.5 * x[:, :4]
    assert kernel_cka(x, y).item() == pytest.approx(_np_cka_rbf(x.numpy(), y.numpy()), rel=1e-8)


def test_the_gamma_tests_null_keeps_the_weighting_by_g():
    """With keys of realistic scale, values unrelated to the keys come out far more eigenvector-like than
    the random-orthogonal control (the weighting by g sets the relative differences), so against that
    control they "pass"; V with its tokens permuted keeps the weighting and scores alike: the null."""
    gen = torch.Generator().manual_seed(3)
    k = 3.0 * torch.randn(16, 65, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(16, 65, 16, generator=gen, dtype=torch.float64)  # unrelated to the keys
    g = gamma_test(k, v)
    values, permuted = g["values"]["mean_rel"].mean().item(), g["values_permuted"]["mean_rel"].mean().item()
    control = g["random"]["mean_rel"].mean().item()
    assert values < 0.5 * control  # "beats" the control
    assert abs(values - permuted) < 0.1 * abs(control - values)  # but not its null


def test_eigenpairs_at_the_rounding_floor_give_zero_columns():
    """Large keys (sd 6: g spans hundreds of orders of magnitude) leave eigenvalues of Kc at its rounding
    floor, N eps max|mu|: their eigenvectors are noise, so V_hat's columns for them are zero (and counted by
    the analysis); keys of ordinary scale have none."""
    from kpca_attention.kpca.analysis import AnalysisConfig, Analyzer
    from kpca_attention.kpca.capture import AttentionSite
    from kpca_attention.kpca.gram import signal_columns

    gen = torch.Generator().manual_seed(0)
    big = torch.randn(4, 65, 16, generator=gen, dtype=torch.float64) * 6
    eig = kpca_eigen(big, 16)
    mu = eig.eigenvalues.abs()
    ok = signal_columns(eig)
    assert (~ok).any() and ok[:, 0].all()  # the largest pair is never at the floor
    assert torch.equal(ok, mu > 65 * torch.finfo(torch.float64).eps * mu.amax(-1, keepdim=True))
    v_hat = predicted_values(big, 16, eigen=eig)
    norms = v_hat.norm(dim=-2)
    assert torch.all(norms[~ok] == 0) and torch.all(norms[ok] > 0)
    normal = kpca_eigen(torch.randn(4, 65, 16, generator=gen, dtype=torch.float64), 16)
    assert signal_columns(normal).all()
    # N <= d_v: the last pair is Kc's own null direction (Kc 1 = 0), not a floor column of the analysis
    short = torch.randn(1, 4, 8, 16, generator=gen, dtype=torch.float64) * 0.5
    cfg0 = AnalysisConfig(detail_samples=0, null_samples=0, control_samples=0, optimal=False)
    an0 = Analyzer([AttentionSite(name="l0", module=torch.nn.Identity(), kind="timm", num_heads=4,
                                  head_dim=16)], cfg0)
    an0.add([{"q": short, "k": short, "v": torch.randn(1, 4, 8, 16, generator=gen)}])
    assert an0.result()["records"]["floor_columns"] == [0.0] * 4
    cfg = AnalysisConfig(detail_samples=0, null_samples=0, control_samples=0, optimal=False)
    site = AttentionSite(name="l0", module=torch.nn.Identity(), kind="timm", num_heads=4, head_dim=16)
    an = Analyzer([site], cfg)
    an.add([{"q": big[None], "k": big[None], "v": torch.randn(1, 4, 65, 16, generator=gen)}])
    rec = an.result()["records"]
    assert rec["floor_columns"] == (~ok).sum(-1).double().tolist()


# --- found by mutation testing (/work/notes/review/mutation.md): each fails on its mutant ---------------


def test_relative_frobenius_is_relative_to_the_learned_values() -> None:
    from kpca_attention.kpca.alignment import alignment

    v = torch.randn(2, 10, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = alignment(v, 3 * v, optimal=False)  # ||v - 3v|| / ||v|| = 2 (over ||3v||: 2/3)
    torch.testing.assert_close(out["relative_frobenius"], torch.full((2,), 2.0, dtype=torch.float64))
