"""Tests of kpca_attention.robust_pca: Principal Component Pursuit and its operators."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kpca_attention.robust_pca import RobustPCAResult, robust_pca, shrink, svt

pytestmark = pytest.mark.usefixtures("single_thread")


def candes_problem(n: int, rank: int, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Candes, Li, Ma, Wright (2011) section 4.1: L0 = X Y^T with N(0, 1/n) entries; S0 has a
    uniformly random support of frac * n^2 entries with independent random signs (+-1)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(0.0, np.sqrt(1.0 / n), (n, rank))
    Y = rng.normal(0.0, np.sqrt(1.0 / n), (n, rank))
    L0 = X @ Y.T
    m = int(round(frac * n * n))
    S0 = np.zeros(n * n)
    S0[rng.choice(n * n, m, replace=False)] = rng.choice([-1.0, 1.0], m)
    return L0, S0.reshape(n, n)


def numerical_rank(L: np.ndarray, rel: float = 1e-6) -> int:
    """Singular values above rel * s_max (the recovered L has its tail at ~1e-15 s_max)."""
    s = np.linalg.svd(L, compute_uv=False)
    return int((s > rel * s[0]).sum())


# ----------------------------------------------------------------------------------------------
# Exact recovery (Candes et al. 2011, section 4.1, Table 1): n = 500, rank 25, 5% and 10% errors
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("frac", [0.05, 0.10])
def test_candes_exact_recovery_n500(frac: float) -> None:
    n, rank = 500, 25
    L0, S0 = candes_problem(n, rank, frac, seed=0)
    t0 = time.perf_counter()
    res = robust_pca(L0 + S0)
    elapsed = time.perf_counter() - t0
    assert isinstance(res, RobustPCAResult) and isinstance(res.L, np.ndarray)
    assert res.converged and res.n_iter <= 40, (res.n_iter, res.residuals[-3:])
    rel_err = np.linalg.norm(res.L - L0) / np.linalg.norm(L0)
    assert rel_err <= 1e-5, rel_err
    assert numerical_rank(res.L) == rank and res.rank == rank
    # S comes out of a soft threshold, so off its support it is exactly 0.
    np.testing.assert_array_equal(res.S != 0, S0 != 0)
    np.testing.assert_allclose(res.S[S0 != 0], S0[S0 != 0], atol=1e-5)
    assert res.residuals[-1] <= 1e-7 and len(res.residuals) == res.n_iter
    print(f"n=500 rank=25 frac={frac}: rel err {rel_err:.2e}, {res.n_iter} iterations, {res.info}, "
          f"{elapsed:.2f} s")


def test_admm_recovers_and_agrees_with_ialm() -> None:
    L0, S0 = candes_problem(120, 6, 0.05, seed=1)
    M = L0 + S0
    admm = robust_pca(M, method="admm")
    ialm = robust_pca(M)
    for res in (admm, ialm):
        assert res.converged
        assert np.linalg.norm(res.L - L0) / np.linalg.norm(L0) <= 1e-5
        np.testing.assert_array_equal(res.S != 0, S0 != 0)
    # Candes' fixed mu: mu = n1 n2 / (4 ||M||_1), reported as used.
    assert admm.mu == pytest.approx(M.size / (4 * np.abs(M).sum()))
    assert admm.method == "admm" and ialm.method == "ialm"
    assert ialm.n_iter < admm.n_iter  # the point of the inexact ALM


@pytest.mark.parametrize("svd", ["full", "partial"])
def test_svd_modes_agree(svd: str) -> None:
    L0, S0 = candes_problem(200, 10, 0.05, seed=2)
    ref = robust_pca(L0 + S0, svd="auto")
    res = robust_pca(L0 + S0, svd=svd)
    assert res.converged and ref.converged
    assert np.linalg.norm(res.L - ref.L) / np.linalg.norm(ref.L) <= 1e-6
    if svd == "full":
        assert res.info["partial_svds"] == 0 and res.info["full_svds"] == res.n_iter
    else:
        assert res.info["partial_svds"] > 0


def test_rectangular_and_defaults() -> None:
    rng = np.random.default_rng(3)
    L0 = rng.normal(size=(150, 4)) @ rng.normal(size=(4, 90)) / 10
    S0 = np.where(rng.random((150, 90)) < 0.04, rng.choice([-1.0, 1.0], (150, 90)), 0.0)
    res = robust_pca(L0 + S0)
    assert res.converged
    assert res.lam == pytest.approx(1 / np.sqrt(150))
    assert np.linalg.norm(res.L - L0) / np.linalg.norm(L0) <= 1e-5
    assert res.L.shape == (150, 90)
    # the transpose is the same problem
    res_t = robust_pca((L0 + S0).T)
    np.testing.assert_allclose(res_t.L.T, res.L, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Types, batches, devices
# ----------------------------------------------------------------------------------------------


def test_numpy_and_torch_in_out() -> None:
    L0, S0 = candes_problem(80, 4, 0.05, seed=4)
    M = L0 + S0
    res_np = robust_pca(M)
    res_t = robust_pca(torch.from_numpy(M))
    assert isinstance(res_np.L, np.ndarray) and res_np.L.dtype == np.float64
    assert isinstance(res_t.L, torch.Tensor) and res_t.L.dtype == torch.float64
    np.testing.assert_allclose(res_t.L.numpy(), res_np.L, atol=1e-12)
    # integer NumPy input is computed in float64; nested lists are array-likes
    res_int = robust_pca(np.eye(30, dtype=np.int64))
    assert res_int.L.dtype == np.float64 and res_int.converged
    assert robust_pca([[1.0, 2.0], [3.0, 4.0]]).converged


def test_float32() -> None:
    L0, S0 = candes_problem(100, 5, 0.05, seed=5)
    M = torch.from_numpy(L0 + S0).float()
    res = robust_pca(M, tol=1e-5)
    assert res.L.dtype == torch.float32 and res.S.dtype == torch.float32
    assert res.converged
    assert float(torch.linalg.norm(res.L.double() - torch.from_numpy(L0)) / np.linalg.norm(L0)) <= 1e-3


def test_batched_torch_matches_single_solves() -> None:
    problems = [candes_problem(70, 3, 0.05, seed=s) for s in range(3)]
    M = torch.stack([torch.from_numpy(L + S) for L, S in problems])  # (3, 70, 70)
    M = torch.stack([M, 2 * M])  # (2, 3, 70, 70): two batch dimensions
    M[1, 2] = 0.0  # an all-zero problem inside the batch
    res = robust_pca(M)
    assert res.L.shape == M.shape and res.n_iter.shape == (2, 3) and res.converged.shape == (2, 3)
    assert res.residuals.shape[1:] == (2, 3) and res.residuals.shape[0] == res.n_iter.max()
    assert res.converged.all()
    assert res.n_iter[1, 2] == 0 and torch.all(res.L[1, 2] == 0) and torch.all(res.S[1, 2] == 0)
    for i in range(2):
        for j in range(3):
            if (i, j) == (1, 2):
                continue
            single = robust_pca(M[i, j])
            assert single.n_iter == res.n_iter[i, j]  # each problem runs its own iteration
            # same problem, same iteration; the partial SVDs of a batch share their block size,
            # so the results agree to the SVT accuracy (~tol), not bit for bit
            for got, want in ((res.L[i, j], single.L), (res.S[i, j], single.S)):
                assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) <= 1e-6
            L0 = problems[j][0] * (1 + i)
            assert np.linalg.norm(res.L[i, j].numpy() - L0) / np.linalg.norm(L0) <= 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu() -> None:
    L0, S0 = candes_problem(300, 15, 0.05, seed=6)
    M = torch.from_numpy(L0 + S0)
    res_gpu = robust_pca(M.cuda())
    assert res_gpu.L.device.type == "cuda" and res_gpu.L.dtype == torch.float64
    assert res_gpu.converged
    assert np.linalg.norm(res_gpu.L.cpu().numpy() - L0) / np.linalg.norm(L0) <= 1e-5
    batch = robust_pca(torch.stack([M, M]).cuda())
    assert batch.converged.all()


def test_all_zero_matrix() -> None:
    res = robust_pca(np.zeros((5, 7)))
    assert res.converged and res.n_iter == 0 and res.rank == 0
    assert np.all(res.L == 0) and np.all(res.S == 0) and res.residuals.shape == (0,)


def test_not_converged_is_reported() -> None:
    L0, S0 = candes_problem(80, 4, 0.05, seed=7)
    res = robust_pca(L0 + S0, max_iter=3)
    assert not res.converged and res.n_iter == 3 and res.residuals.shape == (3,)
    assert res.residuals[-1] > 1e-7


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [1e-25, 1e30])
def test_scale_equivariant(dtype: type, scale: float) -> None:
    """PCP of c M is c times that of M. Without solving the normalised problem, float32 at 1e-25 had
    ||M||_F underflow to 0 (L = S = 0, converged after 0 iterations) and at 1e30 overflow to inf (NaN
    residuals for all 1000 iterations, no warning)."""
    L0, S0 = candes_problem(80, 4, 0.05, seed=11)
    M = (L0 + S0).astype(dtype)
    ref = robust_pca(M)
    res = robust_pca(M * dtype(scale))
    assert res.converged and res.n_iter >= 5 and np.all(np.isfinite(res.residuals))
    assert res.L.dtype == dtype and res.rank == 4
    rel = np.linalg.norm(res.L / scale - ref.L) / np.linalg.norm(ref.L)
    assert rel <= (1e-4 if dtype == np.float32 else 1e-12), rel
    assert np.linalg.norm(res.L / scale - L0) / np.linalg.norm(L0) <= (1e-3 if dtype == np.float32 else 1e-5)
    assert res.mu * scale == pytest.approx(ref.mu, rel=1e-5)


@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_scale_equivariant_float64_extremes(scale: float) -> None:
    """float64 has the same underflow/overflow of ||M||_F, at 1e-300 and 1e300."""
    L0, S0 = candes_problem(60, 3, 0.05, seed=12)
    ref = robust_pca(L0 + S0, method="admm", mu=0.3, max_iter=4000)
    res = robust_pca((L0 + S0) * scale, method="admm", mu=0.3 / scale, max_iter=4000)
    assert ref.converged and res.converged and res.n_iter == ref.n_iter
    np.testing.assert_allclose(res.L / scale, ref.L, rtol=0, atol=1e-9)
    np.testing.assert_allclose(res.S / scale, ref.S, rtol=0, atol=1e-9)
    assert res.mu * scale == pytest.approx(0.3)


def test_nonfinite_residual_is_not_converged() -> None:
    """A mu so small that 1 / mu overflows float32 makes the residual NaN: that problem stops, is
    reported as not converged, and a warning says so (it used to run max_iter NaN iterations)."""
    L0, S0 = candes_problem(40, 2, 0.05, seed=13)
    M = np.stack([L0 + S0, L0 + S0]).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="NaN or inf"):
        res = robust_pca(M, mu=1e-45, max_iter=50)
    assert not res.converged.any() and (res.n_iter == 1).all()
    assert np.isnan(res.residuals[-1]).all()
    assert np.all(np.isfinite(res.L)) and np.all(np.isfinite(res.S))


def test_result_too_large_for_dtype() -> None:
    """Scaled back, L and S must fit the dtype. Ones with one entry flipped: L = ones, S = -2 e_00, so
    at the largest float32 the sparse entry -2 max does not fit: an error, not a silent -inf."""
    M = np.ones((10, 10))
    M[0, 0] = -1
    res = robust_pca(M)
    assert res.converged and res.S[0, 0] == pytest.approx(-2, rel=1e-6)
    with pytest.raises(FloatingPointError, match="does not fit"):
        robust_pca((M * np.finfo(np.float32).max).astype(np.float32))


def test_seed_reproducible_and_progress(capsys: pytest.CaptureFixture[str]) -> None:
    L0, S0 = candes_problem(100, 5, 0.05, seed=8)
    a = robust_pca(L0 + S0, progress=True)
    b = robust_pca(L0 + S0)
    np.testing.assert_array_equal(a.L, b.L)
    assert "robust_pca" in capsys.readouterr().err


def test_admm_explicit_mu_and_ialm_mu_growth() -> None:
    L0, S0 = candes_problem(80, 4, 0.05, seed=9)
    res = robust_pca(L0 + S0, method="admm", mu=0.5, max_iter=5)
    assert res.mu == 0.5
    ialm = robust_pca(L0 + S0, mu=0.1, rho=2.0, max_iter=4)
    assert ialm.mu == pytest.approx(0.1 * 2.0**3)  # the mu of the 4th iteration


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("M", "kwargs", "match"),
    [
        (np.array([1.0, 2.0]), {}, "matrix"),
        (np.float64(3.0), {}, "matrix"),
        (np.zeros((0, 4)), {}, "empty"),
        (np.zeros((2, 0, 4)), {}, "empty"),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), {}, "non-finite"),
        (torch.tensor([[1.0, float("inf")], [0.0, 1.0]]), {}, "non-finite"),
        (torch.ones(3, 3, dtype=torch.int64), {}, "float32 or float64"),
        (np.array([["a", "b"], ["c", "d"]]), {}, "numeric"),
        (np.ones((3, 3)) * (1 + 1j), {}, "complex"),
        (np.ones((3, 3)), {"lam": 0.0}, "lam"),
        (np.ones((3, 3)), {"lam": -1.0}, "lam"),
        (np.ones((3, 3)), {"mu": float("nan")}, "mu"),
        (np.ones((3, 3)), {"tol": 0.0}, "tol"),
        (np.ones((3, 3)), {"max_iter": 0}, "max_iter"),
        (np.ones((3, 3)), {"max_iter": 2.5}, "max_iter"),
        (np.ones((3, 3)), {"rho": 1.0}, "rho"),
        (np.ones((3, 3)), {"method": "apg"}, "method"),
        (np.ones((3, 3)), {"svd": "lanczos"}, "svd"),
        (np.ones((3, 3)), {"mu_max": -1.0}, "mu_max"),
        (np.ones((3, 3)), {"max_svd_steps": 0}, "max_svd_steps"),
        (np.ones((3, 3)), {"max_iter": True}, "max_iter must be an integer >= 1; got True"),
        (np.ones((3, 3)), {"seed": -1}, "seed must be an integer >= 0; got -1"),
    ],
)
def test_bad_input(M, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        robust_pca(M, **kwargs)


def test_operators_bad_input() -> None:
    with pytest.raises(ValueError, match="tau"):
        svt(np.eye(3), -1.0)
    with pytest.raises(ValueError, match="tau"):
        shrink(np.ones(3), float("inf"))
    with pytest.raises(ValueError, match="matrix"):
        svt(np.ones(3), 1.0)


# ----------------------------------------------------------------------------------------------
# Property tests of the operators (hypothesis)
# ----------------------------------------------------------------------------------------------

_shapes = st.tuples(st.integers(1, 7), st.integers(1, 7))


@st.composite
def matrices(draw) -> np.ndarray:
    n1, n2 = draw(_shapes)
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    return np.random.default_rng(seed).normal(size=(n1, n2)) * scale


@settings(max_examples=60, deadline=None)
@given(M=matrices(), frac=st.floats(0.0, 1.5))
def test_svt_singular_values_are_shrunk(M: np.ndarray, frac: float) -> None:
    s = np.linalg.svd(M, compute_uv=False)
    tau = frac * s[0]
    out = svt(M, tau)
    s_out = np.linalg.svd(out, compute_uv=False)
    np.testing.assert_allclose(s_out, np.maximum(s - tau, 0), atol=1e-10 * max(s[0], 1))


@settings(max_examples=40, deadline=None)
@given(M=matrices())
def test_svt_limits(M: np.ndarray) -> None:
    s_max = np.linalg.norm(M, 2)
    np.testing.assert_allclose(svt(M, 0.0), M, atol=1e-12 * max(s_max, 1))
    assert np.all(svt(M, s_max) == 0) or np.abs(svt(M, s_max)).max() <= 1e-12 * s_max
    assert np.all(svt(M, 2 * s_max + 1) == 0)


@settings(max_examples=60, deadline=None)
@given(M=matrices(), frac=st.floats(0.05, 0.95))
def test_svt_is_the_prox_of_the_nuclear_norm(M: np.ndarray, frac: float) -> None:
    """X = svt(M, tau) iff (M - X) / tau is a subgradient of ||.||_* at X:
    (M - X) / tau = U_r V_r^T + W with U_r^T W = 0, W V_r = 0, ||W||_2 <= 1."""
    s_all = np.linalg.svd(M, compute_uv=False)
    tau = frac * s_all[0]
    X = svt(M, tau)
    G = (M - X) / tau
    U, s, Vh = np.linalg.svd(X)
    r = int((s > 1e-9 * s_all[0]).sum())
    Ur, Vr = U[:, :r], Vh[:r].T
    W = G - Ur @ Vr.T
    tol = 1e-8
    assert np.abs(Ur.T @ W).max(initial=0) <= tol and np.abs(W @ Vr).max(initial=0) <= tol
    assert np.linalg.norm(W, 2) <= 1 + tol
    # and it does minimise tau ||X||_* + ||X - M||^2 / 2 against random perturbations
    rng = np.random.default_rng(0)

    def objective(Z: np.ndarray) -> float:
        return tau * np.linalg.svd(Z, compute_uv=False).sum() + 0.5 * np.sum((Z - M) ** 2)

    f0 = objective(X)
    for _ in range(5):
        D = rng.normal(size=M.shape) * 1e-3 * s_all[0]
        assert objective(X + D) >= f0 - 1e-12 * max(f0, 1)


@settings(max_examples=20, deadline=None)
@given(M=matrices(), frac=st.floats(0.0, 1.0))
def test_svt_torch_batched_matches_numpy(M: np.ndarray, frac: float) -> None:
    tau = frac * np.linalg.norm(M, 2)
    batch = torch.from_numpy(np.stack([M, 2 * M]))
    out = svt(batch, torch.tensor([tau, 2 * tau], dtype=torch.float64))
    assert isinstance(out, torch.Tensor) and out.shape == batch.shape
    np.testing.assert_allclose(out[0].numpy(), svt(M, tau), atol=1e-10 * max(1, tau))
    np.testing.assert_allclose(out[1].numpy(), 2 * svt(M, tau), atol=1e-10 * max(1, tau))


@settings(max_examples=80, deadline=None)
@given(x=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=20), tau=st.floats(0.0, 1e6))
def test_shrink_properties(x: list[float], tau: float) -> None:
    xa = np.array(x)
    out = shrink(xa, tau)
    assert isinstance(out, np.ndarray)
    # |out| = max(|x| - tau, 0), the sign of x where not zero
    np.testing.assert_allclose(np.abs(out), np.maximum(np.abs(xa) - tau, 0), rtol=1e-12, atol=1e-9)
    assert np.all((out == 0) | (np.sign(out) == np.sign(xa)))
    # the prox of tau |.|_1: (x - out) / tau is a subgradient of |.| at out (checked where tau is
    # not lost in the rounding of x)
    if tau > 1e-6 * max(1.0, np.abs(xa).max()):
        g = (xa - out) / tau
        assert np.all(np.abs(g) <= 1 + 1e-9)
        nz = out != 0
        np.testing.assert_allclose(g[nz], np.sign(out[nz]), atol=1e-9)
    # torch in, torch out, same numbers (it is kpca_attention.pap.shrink underneath)
    out_t = shrink(torch.from_numpy(xa), tau)
    assert isinstance(out_t, torch.Tensor)
    np.testing.assert_array_equal(out_t.numpy(), out)
    np.testing.assert_array_equal(shrink(xa, 0.0), xa)


def test_shrink_tensor_threshold_broadcasts() -> None:
    x = torch.tensor([[3.0, -3.0], [0.5, -0.5]])
    out = shrink(x, torch.tensor([[1.0], [1.0]]))
    torch.testing.assert_close(out, torch.tensor([[2.0, -2.0], [0.0, 0.0]]))
    assert shrink(np.array([2.0]), np.array([0.5]))[0] == 1.5  # NumPy threshold with NumPy x
