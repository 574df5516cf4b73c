"""Paired statistics for comparing two models: over training seeds and over test examples.

The paired primitives below live in the core (:mod:`kpca_attention.stats`, re-exported here) because the
tasks' report sections compute their example-level statistics with them; this module adds the verdicts.

The three kinds of noise (seeds, examples, effect size) are described in :mod:`kpca_attention.stats`.

For verdicts (``report/verdicts.py`` turns them into words; ``docs/verdicts.md`` says what they mean):

* **equivalence** - :func:`tost`, two one-sided paired t tests over seeds against a declared margin
  (Schuirmann 1987; Lakens 2017);
* **multiplicity** - :func:`holm` (a core primitive: the KPCA claims adjust their chance tests with it too),
  Holm's (1979) step-down adjusted p-values over a family of tests;
* **power** - :func:`paired_t_power` and :func:`mde_paired` (the minimum detectable mean difference of
  the two-sided paired t test, from the noncentral t), :func:`tost_power` (exact, by integrating over the
  sample SD), :func:`seeds_to_exclude` (how many seeds a margin needs) and :func:`seeds_to_detect` (how
  many seeds the paired t test needs to detect a given difference at a given level).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import check_choice, check_int, check_real
from ..stats import N_BOOT, bootstrap_diff_ci, holm, mcnemar, paired_summary, seed_test, spread  # primitives

__all__ = ["mcnemar", "bootstrap_diff_ci", "spread", "seed_test", "paired_summary", "N_BOOT", "TOST", "tost",
           "holm", "finite_diffs", "paired_t_power", "mde_paired", "tost_power", "seeds_to_exclude",
           "seeds_to_detect"]

# --- verdict statistics: equivalence, multiplicity, power ------------------------------------------


def finite_diffs(diffs: Sequence[float]) -> np.ndarray:
    """Per-seed paired differences as a flat float64 array; a NaN or inf is a ``ValueError``."""
    d = np.asarray(diffs, dtype=np.float64).ravel()
    if not np.all(np.isfinite(d)):
        raise ValueError(f"paired differences must be finite numbers; got {list(d)}")
    return d


def _alpha(alpha: float) -> float:
    return check_real(alpha, "alpha", min=0, max=0.5, min_open=True, max_open=True)


@dataclass(frozen=True)
class TOST:
    """Result of :func:`tost`: ``p`` is the larger of the two one-sided p-values, ``ci`` the
    ``1 - 2 alpha`` t interval of the mean difference (90 % at alpha 0.05), ``equivalent`` whether
    ``p < alpha`` - the same as ``ci`` lying inside ``(-margin, +margin)``. ``None`` / ``False`` with
    fewer than 2 seeds."""

    p: float | None
    ci: tuple[float, float] | None
    equivalent: bool
    p_lower: float | None  # H0: mean <= -margin
    p_upper: float | None  # H0: mean >= +margin
    margin: float
    alpha: float
    n: int


def tost(diffs: Sequence[float], margin: float, alpha: float = 0.05) -> TOST:
    """Two one-sided paired t tests over seeds (Schuirmann 1987) against ``+-margin``.

    ``diffs``: per-seed paired differences ``(n,)``. The lower test rejects ``mean <= -margin`` when
    ``t = (mean + margin) / se`` is large, the upper rejects ``mean >= +margin`` when
    ``t = (mean - margin) / se`` is small (``n - 1`` degrees of freedom, ``se = sd / sqrt(n)``). Both
    at level ``alpha`` is equivalence at level ``alpha``, i.e. the ``1 - 2 alpha`` interval inside the
    margins. With all differences equal (SD 0) the interval is the point and the p-values are 0 or 1.
    """
    from scipy import stats

    d = finite_diffs(diffs)
    m = check_real(margin, "margin", min=0, min_open=True)
    alpha = _alpha(alpha)
    n = int(d.size)
    if n < 2:
        return TOST(None, None, False, None, None, m, alpha, n)
    mean, sd, df = float(d.mean()), spread(d), n - 1
    if sd == 0:
        p_lo, p_up = float(mean <= -m), float(mean >= m)
        ci = (mean, mean)
    else:
        se = sd / math.sqrt(n)
        p_lo = float(stats.t.sf((mean + m) / se, df))
        p_up = float(stats.t.cdf((mean - m) / se, df))
        half = float(stats.t.ppf(1 - alpha, df)) * se
        ci = (mean - half, mean + half)
    p = max(p_lo, p_up)
    return TOST(p, ci, p < alpha, p_lo, p_up, m, alpha, n)


def _power_args(sd: float, n: int, alpha: float) -> tuple[float, int, float]:
    return (check_real(sd, "sd", min=0), check_int(n, "n", min=1), _alpha(alpha))


def _chi_pdf(df: int) -> Callable[[float], float]:
    """``scipy.stats.chi.pdf(u, df)`` as a plain function of ``u``, by scipy's own formula
    (``exp(log 2 - df log 2 / 2 - gammaln(df / 2) + xlogy(df - 1, u) - u^2 / 2)``): the integrals below
    call it ~50,000 times, and the distribution object's argument checks took 99 % of the time (31 s of a
    2-seed report) for the same numbers. ``scipy.special.ndtr`` stands for ``norm.cdf`` likewise
    (``norm.sf(x)`` is ``ndtr(-x)`` in scipy)."""
    from scipy.special import gammaln, xlogy

    const = math.log(2) - 0.5 * math.log(2) * df - float(gammaln(0.5 * df))

    def pdf(u: float) -> float:
        return math.exp(const + float(xlogy(df - 1.0, u)) - 0.5 * u * u)

    return pdf


def paired_t_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test over ``n`` seeds at level ``alpha`` when the true mean
    difference is ``effect`` and the SD of the differences ``sd``: ``P(|T| > t_{1-alpha/2, n-1})``
    with ``T`` noncentral t, noncentrality ``effect * sqrt(n) / sd``."""
    from scipy import stats

    sd, n, alpha = _power_args(sd, n, alpha)
    effect = check_real(effect, "effect")
    if n < 2:
        return 0.0
    if sd == 0:
        return float(effect != 0)
    df, nc = n - 1, effect * math.sqrt(n) / sd
    tc = stats.t.ppf(1 - alpha / 2, df)
    p = float(stats.nct.sf(tc, df, nc) + stats.nct.cdf(-tc, df, nc))
    if math.isfinite(p):
        return p
    # scipy's nct gives NaN at 1 degree of freedom (2 seeds) and a large noncentrality: integrate over the
    # sample SD instead, T = (Z + nc) / (U / sqrt(df)) with U chi-distributed, |T| > tc <=> |Z + nc| > c U
    from scipy import integrate
    from scipy.special import ndtr

    c = tc / math.sqrt(df)
    chi_pdf = _chi_pdf(df)

    def reject(u: float) -> float:  # norm.sf(c u - nc) + norm.cdf(-c u - nc), times the chi density
        return (ndtr(nc - c * u) + ndtr(-c * u - nc)) * chi_pdf(u)

    val, _ = integrate.quad(reject, 0.0, float(stats.chi.isf(1e-15, df)), limit=200, epsabs=1e-12)
    return float(min(1.0, max(0.0, val)))


def mde_paired(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect: the true mean difference (in the unit of ``sd``, > 0) at which the
    two-sided paired t test over ``n`` seeds has the given power (:func:`paired_t_power`, solved by
    ``scipy.optimize.brentq``). ``inf`` with fewer than 2 seeds, 0 when ``sd`` is 0."""
    from scipy.optimize import brentq

    sd, n, alpha = _power_args(sd, n, alpha)
    power = check_real(power, "power", min=alpha, max=1, min_open=True, max_open=True)
    if n < 2:
        return math.inf
    if sd == 0:
        return 0.0
    hi = sd
    while paired_t_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(brentq(lambda e: paired_t_power(e, sd, n, alpha) - power, 0.0, hi, xtol=1e-10 * sd))


def tost_power(n: int, sd: float, margin: float, alpha: float = 0.05, true_diff: float = 0.0) -> float:
    """Exact probability that :func:`tost` declares equivalence with ``n`` seeds, differences
    ``N(true_diff, sd^2)``: ``P(-m + c s / sqrt(n) < mean < m - c s / sqrt(n))`` with
    ``c = t_{1-alpha, n-1}`` and ``s`` the sample SD, integrated over ``s`` (``s sqrt(n-1) / sd``
    has a chi distribution with ``n - 1`` degrees of freedom, independent of the mean; Owen 1965).
    The common shortcut ``P(T_lo > c) + P(T_up < -c) - 1`` with two noncentral t's undercounts the
    samples where both tests fail (a wide interval), which at few seeds is not small."""
    from scipy import integrate, stats
    from scipy.special import ndtr

    sd, n, alpha = _power_args(sd, n, alpha)
    m = check_real(margin, "margin", min=0, min_open=True)
    mu = check_real(true_diff, "true_diff")
    if n < 2:
        return 0.0
    if sd == 0:
        return float(abs(mu) < m)
    df, rn = n - 1, math.sqrt(n)
    c = float(stats.t.ppf(1 - alpha, df))
    m, mu = m / sd, mu / sd
    u_max = m * rn / c * math.sqrt(df)  # beyond it the interval is wider than the margins

    chi_pdf = _chi_pdf(df)

    def inside(u: float) -> float:
        s = u / math.sqrt(df)
        return (ndtr(rn * (m - mu) - c * s) - ndtr(rn * (-m - mu) + c * s)) * chi_pdf(u)

    # integrate only where the chi density has mass (quad over a wide range can miss a narrow peak)
    lo, hi = float(stats.chi.ppf(1e-15, df)), min(u_max, float(stats.chi.isf(1e-15, df)))
    if hi <= lo:
        return 0.0
    val, _ = integrate.quad(inside, lo, hi, limit=200, epsabs=1e-12)
    return float(min(1.0, max(0.0, val)))


def _one_sided_power(n: int, sd: float, margin: float, alpha: float, true_diff: float) -> float:
    """Power of the one-sided paired t test of ``mean >= +margin`` against ``mean < +margin``."""
    from scipy import stats

    if n < 2:
        return 0.0
    if sd == 0:
        return float(true_diff < margin)
    df = n - 1
    return float(stats.nct.cdf(-stats.t.ppf(1 - alpha, df), df, (true_diff - margin) * math.sqrt(n) / sd))


def seeds_to_exclude(sd: float, margin: float, alpha: float = 0.05, power: float = 0.8,
                     max_n: int = 1000, test: str = "tost", true_diff: float = 0.0) -> int | None:
    """Smallest number of seeds (>= 2) at which, for differences ``N(true_diff, sd^2)`` (true
    difference 0 by default, the planning assumption of Lakens 2017), the test reaches ``power``;
    ``None`` if ``max_n`` seeds are not enough.

    ``test="tost"`` (default): both one-sided tests, i.e. the verdict ``equivalent (within +-m)``
    (:func:`tost_power`) - the number the verdict word needs. ``test="one-sided"``: only the test that
    excludes ``+margin`` (an effect as large as the paper's, in its direction), which needs fewer
    seeds; use it for the narrower claim "the paper's effect is excluded" (mirror the sign of the
    differences for an effect in the negative direction).

    The search doubles ``n`` and then bisects, which needs the powers to rise with ``n``: the one-sided
    power does; TOST's does wherever it is above a few percent (at 2-30 seeds and a margin well under
    the SD it first dips, from about 1 % - a lucky tiny sample SD - to 0), hence ``power >= 0.5``.
    """
    sd = check_real(sd, "sd", min=0)
    m = check_real(margin, "margin", min=0, min_open=True)
    alpha = _alpha(alpha)
    power = check_real(power, "power", min=0.5, max=1, max_open=True)
    max_n = check_int(max_n, "max_n", min=2)
    check_choice(test, "test", ("tost", "one-sided"))
    true_diff = check_real(true_diff, "true_diff")

    def enough(n: int) -> bool:
        if test == "tost":
            return tost_power(n, sd, m, alpha, true_diff) >= power
        return _one_sided_power(n, sd, m, alpha, true_diff) >= power

    return _fewest_seeds(enough, max_n)


def _fewest_seeds(enough: Callable[[int], bool], max_n: int) -> int | None:
    """Smallest ``n`` in ``2..max_n`` with ``enough(n)`` for a condition that, once true, stays true as ``n``
    grows (a power rising with the seeds); ``None`` if ``enough(max_n)`` is false. Doubles, then bisects."""
    if not enough(max_n):
        return None
    lo, hi = 1, 2  # enough(lo) is False (or lo = 1), enough(hi) is to be found
    while hi < max_n and not enough(hi):
        lo, hi = hi, min(2 * hi, max_n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def seeds_to_detect(effect: float, sd: float, alpha: float = 0.05, power: float = 0.8,
                    max_n: int = 1000) -> int | None:
    """Smallest number of seeds (>= 2) at which the two-sided paired t test at level ``alpha`` detects a
    true mean difference ``effect`` (SD of the differences ``sd``) with the given ``power``
    (:func:`paired_t_power`, which rises with ``n``); ``None`` if ``max_n`` seeds are not enough or
    ``effect`` is 0. For a cell of a family under Holm, ``alpha / family size`` is the level of Holm's
    first step - the strictest one, so the seeds it gives are enough for Holm too."""
    effect = check_real(effect, "effect")
    sd = check_real(sd, "sd", min=0)
    alpha = _alpha(alpha)
    power = check_real(power, "power", min=alpha, max=1, min_open=True, max_open=True)
    max_n = check_int(max_n, "max_n", min=2)
    if effect == 0:
        return None

    return _fewest_seeds(lambda n: paired_t_power(effect, sd, n, alpha) >= power, max_n)
