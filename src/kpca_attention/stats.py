"""Paired statistics for comparing two models: over training seeds and over test examples (core: the
tasks' report sections compute their example-level statistics with these; the study report's verdicts,
:mod:`kpca_attention.report.stats`, build on them).

Noise, three ways (each answers a different question):

* **seeds** - the paired difference (variant - baseline, same seed: same init and data order) per
  seed, its mean, a t interval and a paired t-test (``scipy.stats.ttest_1samp``; with n seeds it has
  n - 1 degrees of freedom, nearly powerless at n = 2);
* **examples** - an exact McNemar test (``scipy.stats.binomtest`` on the discordant examples; with
  several seeds, on each example's mean difference over the seeds: the seeds share the examples, so an
  example is one unit, not one per seed) and a paired bootstrap 95% interval over test examples
  (``scipy.stats.bootstrap`` would do it too, but resampling *clusters* - an image with all its
  corrupted views and all seeds - needs the index form written here). These measure how sure we are
  about these trained models on the test distribution, not training randomness;
* **effect size** - the mean difference in percentage points and Cohen's d_z of the per-seed differences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .checks import check_real

__all__ = ["mcnemar", "bootstrap_diff_ci", "spread", "seed_test", "paired_summary", "holm", "signed_rank_p",
           "N_BOOT"]

N_BOOT = 2000


def mcnemar(a: np.ndarray, b: np.ndarray) -> tuple[int, int, float]:
    """Exact McNemar on paired correctness ``(examples,)``: ``(a right & b wrong, a wrong & b right, p)``.

    With leading axes (``(seeds, examples)``: the same examples under every seed) each example is one
    unit: the counts are the examples that ``a`` gets right more often than ``b`` over the seeds, and the
    reverse, and ``p`` the exact sign test on them - McNemar's test itself for one seed. Pooling the
    seeds' pairs as if independent would count one hard image once per seed (16 seeds x 500 images are
    not 8,000 independent pairs) and give p-values far too small."""
    from scipy.stats import binomtest

    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if a.shape != b.shape or a.ndim == 0:
        raise ValueError(f"McNemar needs paired results of the same examples, got {a.shape} and {b.shape}")
    per_example = (a.astype(np.int64) - b.astype(np.int64)).reshape(-1, a.shape[-1]).sum(0)
    n01 = int((per_example > 0).sum())
    n10 = int((per_example < 0).sum())
    p = 1.0 if n01 + n10 == 0 else float(binomtest(n01, n01 + n10, 0.5).pvalue)
    return n01, n10, p


def bootstrap_diff_ci(a: np.ndarray, b: np.ndarray, rng: np.random.Generator | int = 0,
                      n_boot: int = N_BOOT, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(a) - mean(b)``, resampling the last axis (examples);
    leading axes (seeds, corrupted views) go with their example."""
    rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"bootstrap needs paired results of the same shape, got {a.shape} and {b.shape}")
    n = a.shape[-1]
    diff = (a - b).reshape(-1, n).mean(0)  # per example
    idx = rng.integers(0, n, size=(n_boot, n))
    boots = diff[idx].mean(1)
    lo, hi = np.percentile(boots, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def spread(diffs: Sequence[float] | np.ndarray) -> float:
    """Sample SD (``ddof=1``) of per-seed differences, 0 where they are equal but for floating-point
    rounding. A difference of accuracies is computed as ``100 * (a - b)`` from counts, so equal steps do
    not come out bit for bit equal: rpc-seeds' ViT - SymViT at FGSM 4/255 was -1.4 points in each of three
    seeds (7 of 500 images), with an SD of 3e-15 from rounding alone - and a t test of p 3e-30 that had
    made the ViT `worse`. Below ``1e-9`` of the largest difference (or of 1) the spread is rounding."""
    d = np.asarray(diffs, dtype=np.float64).ravel()
    if d.size < 2:
        return math.nan
    sd = float(d.std(ddof=1))
    return 0.0 if sd <= 1e-9 * max(1.0, float(np.abs(d).max())) else sd


def seed_test(diffs: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Per-seed paired differences -> ``{"mean", "std", "n", "ci", "p", "d_z"}`` (t interval and
    two-sided one-sample t-test against 0; ``None`` where n < 2, and where every difference is the same
    (SD 0: no spread to test against - on a metric measured in steps, such as accuracy on 500 images,
    two seeds can differ by the same step by chance, and ``t`` would be infinite))."""
    from scipy import stats

    d = np.asarray(diffs, dtype=np.float64)
    out: dict[str, Any] = {"mean": float(d.mean()) if d.size else None, "n": int(d.size), "std": None,
                           "ci": None, "p": None, "d_z": None}
    if d.size < 2:
        return out
    sd = spread(d)
    out["std"] = sd
    if sd == 0:
        return out
    half = stats.t.ppf((1 + level) / 2, d.size - 1) * sd / math.sqrt(d.size)
    out["ci"] = [float(d.mean() - half), float(d.mean() + half)]
    out["p"] = float(stats.ttest_1samp(d, 0.0).pvalue)
    out["d_z"] = float(d.mean() / sd)
    return out


def paired_summary(per_seed_a: dict[int, np.ndarray], per_seed_b: dict[int, np.ndarray],
                   rng: np.random.Generator | int = 0, mcnemar_test: bool = True) -> dict[str, Any]:
    """Everything the report says about ``a`` against ``b`` on one metric, from per-seed
    per-example correctness (``(examples,)`` or ``(views, examples)``) of the seeds both have.
    Differences in percentage points."""
    seeds = sorted(set(per_seed_a) & set(per_seed_b))
    if not seeds:
        raise ValueError("no seed in common")
    diffs = [100 * (per_seed_a[s].mean() - per_seed_b[s].mean()) for s in seeds]
    a = np.stack([per_seed_a[s] for s in seeds])
    b = np.stack([per_seed_b[s] for s in seeds])
    lo, hi = bootstrap_diff_ci(a, b, rng)
    out = {"seeds": seeds, "diffs": diffs, **{f"seed_{k}": v for k, v in seed_test(diffs).items()},
           "boot_ci": [100 * lo, 100 * hi]}
    if mcnemar_test:
        n01, n10, p = mcnemar(a, b)
        out.update(mcnemar_better=n01, mcnemar_worse=n10, mcnemar_p=p)
    return out


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's (1979) step-down adjusted p-values, in the input's order.

    With the ``k`` present p-values sorted, ``p_(1) <= ... <= p_(k)``, the adjusted value of ``p_(i)``
    is ``max_{j <= i} min(1, (k - j + 1) p_(j))`` (monotone in ``i``, capped at 1); rejecting where the
    adjusted value is ``<= alpha`` is Holm's procedure, which holds the familywise error rate at
    ``alpha`` under any dependence. ``None`` and NaN (a test that could not run) are passed through
    and do not count in ``k``. Written here because scipy has only Benjamini-Hochberg
    (``scipy.stats.false_discovery_control``), which controls the false discovery rate instead.
    """
    vals = list(pvalues)
    present = [i for i, p in enumerate(vals) if p is not None and not math.isnan(p)]
    for i in present:
        check_real(vals[i], f"p-value {i}", min=0, max=1)
    out: list[float | None] = [None if p is None else float(p) for p in vals]
    if not present:
        return out
    p = np.array([vals[i] for i in present], dtype=np.float64)
    order = np.argsort(p, kind="stable")
    k = p.size
    adj = np.minimum(1.0, np.maximum.accumulate((k - np.arange(k)) * p[order]))
    for rank, j in enumerate(order):
        out[present[j]] = float(adj[rank])
    return out


def signed_rank_p(d: Sequence[float] | np.ndarray, alternative: str = "two-sided") -> float:
    """``scipy.stats.wilcoxon(d, alternative=alternative).pvalue``: the same test and the same value, fast
    where scipy is slow.

    For 13 or fewer differences with ties or zeros, scipy's Wilcoxon enumerates all ``2**n`` sign flips with
    ``scipy.stats.permutation_test`` and calls its statistic once per flip (4,096 Python calls at n = 12:
    a fifth of a second per test, most of the time of a model's chance verdicts). Here the same
    ``permutation_test`` gets the statistic vectorized: the sum of the ranks of ``|d|`` (zeros left out,
    Wilcoxon's zero method) where the flipped difference is positive. Without ties or zeros the full
    enumeration is scipy's exact distribution, so every 2 <= n <= 13 takes this path; other n go to scipy.
    """
    from scipy import stats

    x = np.asarray(d, dtype=np.float64).reshape(-1)
    if not 2 <= x.size <= 13 or not np.any(x != 0):
        return float(stats.wilcoxon(x, alternative=alternative).pvalue)
    ranks = np.zeros_like(x)
    ranks[x != 0] = stats.rankdata(np.abs(x[x != 0]))

    def r_plus(flipped: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.sum((np.moveaxis(flipped, axis, -1) > 0) * ranks, axis=-1)

    res = stats.permutation_test((x,), r_plus, permutation_type="samples", vectorized=True, n_resamples=9999,
                                 alternative=alternative)
    return float(res.pvalue)
