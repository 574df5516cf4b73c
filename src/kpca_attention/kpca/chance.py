"""What the alignment measures give by chance, what they give where alignment exists, and the test
that compares a measured value with its chance level.

Neither the paper nor the critique says what linear CKA 0.1 or optimal cosine 0.25 between learned
values V and the predicted V_hat would be by chance, and the chance level depends on the number of
tokens N and the head width d. This module supplies it, reusing :func:`~.alignment.alignment` for
every measure:

* :func:`null_alignment` - two null baselines per (input, head): V with its rows (tokens) permuted,
  and V replaced by i.i.d. Gaussian entries of the same shape, each averaged over ``draws`` seeded draws.
  The Gaussian null has the per-matrix RMS of V as its standard deviation (identical to N(0, 1) for
  every scale-invariant measure - the cosines, CKA - and comparable in scale for the relative
  Frobenius error, which is not scale-invariant).
  The optimal cosine is invariant to any permutation of tokens (the Hungarian matching undoes it),
  so its permutation null *equals* the measured value: it is copied, not recomputed, and its
  verdict uses the Gaussian null.
* :func:`positive_control` - V replaced by ``sqrt(snr) V_hat / rms(V_hat) + N(0, 1)`` at known
  signal-to-noise ratios, optionally after a random orthogonal rotation of V_hat's columns (to which
  CKA is invariant and the cosines are not): each measure's response curve for the same N and d.
* :func:`chance_test` - one-sided Wilcoxon signed-rank tests (``scipy.stats.wilcoxon``) of measured
  minus null over units (the analysis uses (layer, head) means over inputs: inputs share a head's
  weights, so (input, layer, head) triples of one head are not independent), with the effect size
  (mean and median difference, standardised ``d_z = mean / sd`` of the differences).
* :func:`model_family` - the tests a model's verdicts rest on (each measure against the null its verdict
  uses, and the gamma test), Holm-adjusted together (:func:`kpca_attention.stats.holm`): a model's claims
  are one family, so seven tests at 0.05 do not give seven chances of a spurious "above chance".
* :func:`unit_means` (grouping columnar records) and :func:`share_of_change` (the J_proj
  decomposition: how much of a change of ``J = ||phi||^2 - ||h||^2`` is the change of ``||h||^2``,
  with a bootstrap interval).

Shapes: ``v``, ``v_hat`` ``(..., N, d)``; results ``(...,)`` float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..stats import holm, signed_rank_p
from .alignment import alignment, optimal_cosine
from .gram import require_finite

__all__ = [
    "NULL_KINDS",
    "HIGHER_IS_BETTER",
    "DEFAULT_SNRS",
    "null_values",
    "null_alignment",
    "positive_control",
    "chance_test",
    "unit_means",
    "share_of_change",
    "CHANCE_WORDS",
    "chance_word",
    "verdict_null",
    "NULL_LABELS",
    "model_family",
    "holm_family",
    "FAMILY_RULE",
    "alignment_chance",
]

#: the nulls: V's tokens permuted; i.i.d. Gaussian V; V's feature axes rotated (V R, R random orthogonal:
#: the rows keep their norms and the angles between them - the null of the optimal cosine, which is blind to
#: token order and which the Gaussian null's isotropy put "below chance" for any V with structured rows)
NULL_KINDS: tuple[str, ...] = ("perm", "gauss", "rot")
#: direction of "better alignment" for each measure of :func:`~.alignment.alignment`
HIGHER_IS_BETTER: dict[str, bool] = {
    "direct_cosine": True,
    "optimal_cosine": True,
    "signfix_cosine": True,
    "negative_pct": False,
    "pearson": True,
    "linear_cka": True,
    "kernel_cka": True,
    "relative_frobenius": False,
}
#: signal-to-noise ratios (signal power / noise power per entry) of the positive control
DEFAULT_SNRS: tuple[float, ...] = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0, math.inf)
#: what a chance test can say: better or worse than its null, not told apart from it by the test (not "at
#: chance": the test has no equivalence margin), or too few units for any outcome to reach alpha / 2
CHANCE_WORDS = ("below chance", "not distinguished from chance", "above chance", "too few units to test")


#: each null kind in words (tables, claims)
NULL_LABELS = {"perm": "tokens permuted", "gauss": "Gaussian V", "rot": "V rotated"}


def verdict_null(measure: str, tests: Mapping[str, Any] | None) -> str:
    """The null kind whose test gives ``measure``'s verdict, among the kinds ``tests`` holds: the
    token-permutation null, but for the optimal cosine (its matching undoes any permutation) the rotated
    null - or, in analyses stored before it existed, the Gaussian one."""
    if measure != "optimal_cosine":
        return "perm"
    return "rot" if tests and tests.get("rot") else "gauss"


def chance_word(test: Mapping[str, Any]) -> str:
    """The verdict of a stored :func:`chance_test` result, from its p-values and unit count (so results
    stored with an older wording read the same as new ones). With n units the exact one-sided Wilcoxon
    test cannot give p below 2^-n: at 5 units or fewer no outcome reaches 0.025, and the test says
    nothing."""
    n, alpha = test.get("n") or 0, float(test.get("alpha", 0.05))
    if n == 0 or (test.get("p_above") is None and test.get("p_below") is None):
        return "n/a"
    if 0.5 ** n >= alpha / 2:
        return "too few units to test"
    p_above, p_below = test.get("p_above"), test.get("p_below")
    if test.get("p_holm") is not None:  # in a family (model_family): two-sided, Holm-adjusted
        if test["p_holm"] >= alpha:
            return "not distinguished from chance"
        return "above chance" if (p_above if p_above is not None else 1.0) <= (
            p_below if p_below is not None else 1.0) else "below chance"
    if p_above is not None and p_above < alpha / 2:
        return "above chance"
    if p_below is not None and p_below < alpha / 2:
        return "below chance"
    return "not distinguished from chance"


#: the family of :func:`model_family`, in words (reports, claims)
FAMILY_RULE = ("Holm over the model's family of chance tests (each alignment measure against its null, "
               "and the gamma test): two-sided p = 2 x the smaller one-sided p, adjusted p < 0.05")


def _two_sided(test: Mapping[str, Any]) -> float | None:
    ps = [p for p in (test.get("p_above"), test.get("p_below")) if p is not None]
    return min(1.0, 2 * min(ps)) if ps else None


def model_family(summary: Mapping[str, Any], measures: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The chance tests one model's verdicts rest on, Holm-adjusted as one family.

    The family: each of ``measures`` against the null its verdict uses (:func:`verdict_null`) and the
    gamma test (``"gamma"``: values against their token-permuted copies), where the analysis holds them
    and the test can reach its level (a test with too few units, which no outcome can make significant,
    is left out and keeps its word). Each test's two-sided p (twice the smaller one-sided p: the two
    one-sided tests at alpha / 2 of :func:`chance_test` are this test at alpha) is adjusted by
    :func:`kpca_attention.stats.holm` over the family. Returns ``{name: copy of the test with
    p_two_sided, p_holm, family_size}``; :func:`chance_word` reads ``p_holm``. Per-layer tests are not in
    the family (descriptive).
    """
    tests: dict[str, dict[str, Any]] = {}
    chance = summary.get("chance") or {}
    for key in measures:
        t = (chance.get(key) or {}).get(verdict_null(key, chance.get(key)))
        if t:
            tests[key] = t
    if summary.get("gamma_chance"):
        tests["gamma"] = summary["gamma_chance"]
    return holm_family(tests)


def holm_family(tests: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`chance_test` results adjusted as one family: copies with ``p_two_sided`` (twice the smaller
    one-sided p), ``p_holm`` (:func:`kpca_attention.stats.holm` over the members), ``family_size``, and
    ``verdict`` the adjusted word (the test's own in ``verdict_unadjusted``).
    Members are the tests that can reach their level; one with too few units (or none) is copied as it is
    and keeps its word."""
    out = {k: dict(t) for k, t in tests.items()}
    members = [k for k, t in out.items() if chance_word(t) not in ("n/a", "too few units to test")]
    adjusted = holm([_two_sided(out[k]) for k in members])
    for k, p in zip(members, adjusted, strict=True):
        out[k].update(p_two_sided=_two_sided(out[k]), p_holm=p, family_size=len(members),
                      verdict_unadjusted=chance_word({**out[k], "p_holm": None}))
        out[k]["verdict"] = chance_word(out[k])
    return out


def _rms(x: Tensor) -> Tensor:
    """Root mean square per matrix: ``(..., N, d)`` -> ``(..., 1, 1)``, floored at the smallest normal."""
    return x.pow(2).mean((-2, -1), keepdim=True).sqrt().clamp_min(torch.finfo(x.dtype).tiny)


def null_values(v: Tensor, kind: str, draws: int, generator: torch.Generator | None = None) -> Tensor:
    """``draws`` null replacements of ``v`` ``(..., N, d)`` -> ``(draws, ..., N, d)`` float64.

    ``"perm"``: rows permuted, an independent uniform permutation per draw and matrix; ``"gauss"``:
    i.i.d. normal entries with the RMS of each matrix of ``v`` as standard deviation; ``"rot"``: ``v R`` with
    a Haar-random orthogonal ``R`` ``(d, d)`` per draw and matrix (row norms and inter-row angles kept).
    """
    if kind not in NULL_KINDS:
        raise ValueError(f"unknown null {kind!r}; valid: {', '.join(NULL_KINDS)}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    v = v.to(torch.float64)
    if kind == "perm":
        keys = torch.rand((draws, *v.shape[:-1]), generator=generator, dtype=torch.float64)
        idx = torch.argsort(keys, dim=-1).to(v.device)  # (draws, ..., N): uniform permutations
        return torch.gather(v.expand(draws, *v.shape), -2, idx.unsqueeze(-1).expand(draws, *v.shape))
    if kind == "rot":
        rot = _random_orthogonal((draws, *v.shape[:-2]), v.shape[-1], generator).to(v.device)
        return v @ rot
    z = torch.randn((draws, *v.shape), generator=generator, dtype=torch.float64).to(v.device)
    return z * _rms(v)


def _draw_groups(draws: int, batch: int, n: int, max_elems: int) -> list[int]:
    """Split ``draws`` into groups whose ``(group, batch, N, N)`` stacks stay under ``max_elems``."""
    per = max(1, max_elems // max(1, batch * n * n))
    return [min(per, draws - lo) for lo in range(0, draws, per)]


def null_alignment(
    v: Tensor,
    v_hat: Tensor,
    *,
    draws: int = 10,
    kinds: Sequence[str] = NULL_KINDS,
    generator: torch.Generator | None = None,
    measured_optimal_cosine: Tensor | None = None,
    max_elems: int = 2**23,
    **alignment_kwargs: Any,
) -> dict[str, Tensor]:
    """Chance levels of every alignment measure: ``{f"{measure}_null_{kind}": (...,)}``.

    Args:
        v, v_hat: ``(..., N, d)`` learned and predicted values.
        draws: null draws per matrix, averaged (all draws of a group run as one batched
            :func:`~.alignment.alignment` call).
        kinds: any of ``"perm"``, ``"gauss"``, ``"rot"`` (see :func:`null_values`).
        generator: torch RNG for the draws (None: the global one).
        measured_optimal_cosine: ``(...,)`` the measured optimal cosine; its permutation null equals
            it exactly and is copied from here (computed once when None and ``optimal`` is on).
        max_elems: bound on ``draws x matrices x N x N`` float64 elements per batched call.
        alignment_kwargs: passed to :func:`~.alignment.alignment` (``optimal``, ``threshold``,
            ``bandwidth``, ``row_eps``, ``cka_eps``).

    Returns:
        the mean over draws of each measure of :func:`~.alignment.alignment` under each null.
    """
    if v.shape != v_hat.shape or v.dim() < 2:
        raise ValueError(
            f"v and v_hat must be (..., N, d) of one shape, got {tuple(v.shape)} and {tuple(v_hat.shape)}"
        )
    require_finite("v", v)
    require_finite("v_hat", v_hat)
    v, v_hat = v.to(torch.float64), v_hat.to(torch.float64)
    batch = math.prod(v.shape[:-2])
    optimal = alignment_kwargs.get("optimal", True)
    out: dict[str, Tensor] = {}
    for kind in kinds:
        # the matching forgives any permutation of tokens: the permutation null of the optimal cosine
        # is the measured value itself, so the Hungarian algorithm is not run again on permuted V
        kwargs = {**alignment_kwargs, "optimal": optimal and kind != "perm"}
        sums: dict[str, Tensor] = {}
        for size in _draw_groups(draws, batch, v.shape[-2], max_elems):
            nv = null_values(v, kind, size, generator)
            al = alignment(nv, v_hat, **kwargs)  # v_hat broadcasts: its side is computed once
            for key, val in al.items():
                sums[key] = sums.get(key, 0) + val.sum(0)
        for key, val in sums.items():
            out[f"{key}_null_{kind}"] = val / draws
        if kind == "perm" and optimal:
            measured = measured_optimal_cosine
            if measured is None:
                measured = optimal_cosine(v, v_hat, eps=alignment_kwargs.get("row_eps", 0.0))
            out["optimal_cosine_null_perm"] = measured.to(torch.float64)
    return out


def _random_orthogonal(shape: tuple[int, ...], d: int, generator: torch.Generator | None) -> Tensor:
    """Haar-distributed ``(..., d, d)`` orthogonal matrices: QR of a Gaussian, signs fixed by R's diagonal."""
    q, r = torch.linalg.qr(torch.randn((*shape, d, d), generator=generator, dtype=torch.float64))
    return q * torch.sign(r.diagonal(dim1=-2, dim2=-1)).unsqueeze(-2)


def positive_control(
    v_hat: Tensor,
    snrs: Sequence[float] = DEFAULT_SNRS,
    *,
    rotate: bool = False,
    generator: torch.Generator | None = None,
    **alignment_kwargs: Any,
) -> dict[str, Tensor]:
    """Each measure's response when V really is V_hat plus noise: ``{measure: (len(snrs), ...)}``.

    For every ``snr`` (signal power / noise power per entry; ``inf``: no noise, ``0``: noise only -
    the Gaussian null) the control values are ``sqrt(snr) S + Z`` with ``S = V_hat / rms(V_hat)``
    (``S = V_hat R / rms`` with a random orthogonal ``R`` ``(d, d)`` per matrix when ``rotate``) and
    ``Z`` i.i.d. N(0, 1), and the measures compare them with ``V_hat``. One noise draw per
    (snr, matrix): average over matrices.

    Args:
        v_hat: ``(..., N, d)`` predicted values (the same N and d as the learned V).
        snrs: signal-to-noise ratios, each >= 0.
        rotate: rotate V_hat's columns first (CKA is invariant to it; the cosines are not).
        generator: torch RNG (None: the global one).
        alignment_kwargs: passed to :func:`~.alignment.alignment`.
    """
    if any(not (s >= 0) for s in snrs):
        raise ValueError(f"snrs must be >= 0 (inf allowed), got {list(snrs)}")
    require_finite("v_hat", v_hat)
    v_hat = v_hat.to(torch.float64)
    signal = v_hat / _rms(v_hat)
    if rotate:
        signal = signal @ _random_orthogonal(tuple(v_hat.shape[:-2]), v_hat.shape[-1], generator)
    noise = torch.randn((len(snrs), *v_hat.shape), generator=generator, dtype=torch.float64)
    amp = torch.tensor([math.sqrt(s) if math.isfinite(s) else 1.0 for s in snrs], dtype=torch.float64)
    keep_noise = torch.tensor([0.0 if math.isinf(s) else 1.0 for s in snrs], dtype=torch.float64)
    view = (len(snrs),) + (1,) * v_hat.dim()
    x = amp.view(view) * signal + keep_noise.view(view) * noise
    return alignment(x, v_hat, **alignment_kwargs)


def chance_test(
    measured: np.ndarray | Sequence[float],
    null: np.ndarray | Sequence[float],
    *,
    higher_is_better: bool = True,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Is ``measured`` above, at or below its chance level ``null`` (paired, one value per unit)?

    Two one-sided Wilcoxon signed-rank tests of ``measured - null`` (``scipy.stats.wilcoxon``'s values, by
    :func:`kpca_attention.stats.signed_rank_p`), each at ``alpha / 2`` (together a two-sided test at
    ``alpha``). "above chance" means better alignment than chance (larger, or smaller for measures where
    lower is better).

    Returns:
        ``verdict`` (one of :data:`CHANCE_WORDS`), ``n`` units, ``measured`` and ``null`` means,
        ``diff`` (mean of measured - null), ``median_diff``, ``d_z`` (mean / sd of the differences),
        ``null_p95`` (95th percentile of the unit nulls), ``share_above_null`` (fraction of units
        whose value is better than their null), ``p_above``, ``p_below``, ``test``, ``alpha``.
    """
    m, z = np.asarray(measured, dtype=float), np.asarray(null, dtype=float)
    if m.shape != z.shape:
        raise ValueError(f"measured and null must pair up, got shapes {m.shape} and {z.shape}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    ok = np.isfinite(m) & np.isfinite(z)
    m, z = m[ok], z[ok]
    d = m - z
    better = d if higher_is_better else -d
    out: dict[str, Any] = {
        "test": "one-sided Wilcoxon signed-rank tests over units, each at alpha/2",
        "alpha": alpha,
        "n": int(d.size),
        "measured": float(m.mean()) if d.size else None,
        "null": float(z.mean()) if d.size else None,
        "diff": float(d.mean()) if d.size else None,
        "median_diff": float(np.median(d)) if d.size else None,
        "d_z": float(d.mean() / d.std(ddof=1)) if d.size > 1 and d.std(ddof=1) > 0 else None,
        "null_p95": float(np.percentile(z, 95)) if d.size else None,
        "share_above_null": float((better > 0).mean()) if d.size else None,
        "p_above": None,
        "p_below": None,
        "verdict": "n/a",
    }
    if d.size == 0:
        return out
    if not np.any(better != 0):  # identical to its null (e.g. the optimal cosine's permutation null)
        out["p_above"] = out["p_below"] = 1.0
    else:
        out["p_above"] = signed_rank_p(better, "greater")
        out["p_below"] = signed_rank_p(better, "less")
    out["verdict"] = chance_word(out)
    return out


def unit_means(
    records: Mapping[str, Sequence[Any]], keys: Sequence[str], by: Sequence[str] = ("layer", "head")
) -> dict[str, np.ndarray]:
    """Means of ``keys`` per unit (a distinct combination of the ``by`` columns) of columnar
    ``records``; NaN entries are left out of a mean. Returns ``{column: (units,)}`` for ``by`` and
    ``keys``, units sorted by ``by``."""
    cols = {c: np.asarray(records[c]) for c in by}
    units, inverse = np.unique(np.stack([cols[c] for c in by], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    out: dict[str, np.ndarray] = {c: units[:, i] for i, c in enumerate(by)}
    for key in keys:
        x = np.asarray(records[key], dtype=float)
        ok = np.isfinite(x)
        total = np.bincount(inverse[ok], weights=x[ok], minlength=len(units))
        count = np.bincount(inverse[ok], minlength=len(units))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[key] = total / count
    return out


def share_of_change(
    j: np.ndarray | Sequence[float],
    h: np.ndarray | Sequence[float],
    clusters: np.ndarray | Sequence[int] | None = None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """How much of the variation of ``J_proj = ||phi||^2 - ||h||^2`` is variation of ``||h||^2``.

    ``share = cov(J, -h) / var(J)`` (least squares; ``share_phi = 1 - share``), over the given
    values: epochs of a training log, or (layer, head, input) units of one model. With ``clusters``
    (e.g. the input of each unit), a 95 % percentile interval from ``n_boot`` cluster-bootstrap
    resamples (whole clusters drawn with replacement; units of one input are not independent).

    Returns ``share``, ``ci`` (``[lo, hi]`` or None), ``n``, ``n_clusters``.
    """
    jj, hh = np.asarray(j, dtype=float), np.asarray(h, dtype=float)
    if jj.shape != hh.shape:
        raise ValueError(f"j and h must pair up, got shapes {jj.shape} and {hh.shape}")
    ok = np.isfinite(jj) & np.isfinite(hh)

    def share(jv: np.ndarray, hv: np.ndarray) -> float:
        jc = jv - jv.mean()
        var = float((jc * jc).sum())
        return float(-(jc * (hv - hv.mean())).sum() / var) if var > 0 else float("nan")

    out: dict[str, Any] = {"share": share(jj[ok], hh[ok]), "ci": None, "n": int(ok.sum()), "n_clusters": None}
    if clusters is None or n_boot < 1:
        return out
    cl = np.asarray(clusters)[ok]
    ids, inv = np.unique(cl, return_inverse=True)
    out["n_clusters"] = int(ids.size)
    if ids.size < 2:
        return out
    # sufficient statistics per cluster: sums of J, h, J^2, J h and counts
    jv, hv = jj[ok], hh[ok]
    sums = np.stack([np.bincount(inv, weights=w, minlength=ids.size)
                     for w in (np.ones_like(jv), jv, hv, jv * jv, jv * hv)])  # (5, clusters)
    rng = np.random.default_rng(seed)
    counts = np.stack([np.bincount(rng.integers(0, ids.size, ids.size), minlength=ids.size)
                       for _ in range(n_boot)])  # (boot, clusters): how often each cluster is drawn
    n, sj, sh, sjj, sjh = (counts @ sums.T).T  # each (boot,)
    var = sjj - sj * sj / n
    cov = sjh - sj * sh / n
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = -cov / var
    boot = boot[np.isfinite(boot)]
    if boot.size:
        out["ci"] = [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]
    return out


def alignment_chance(
    records: Mapping[str, Sequence[Any]],
    measures: Sequence[str],
    *,
    by: Sequence[str] = ("layer", "head"),
    alpha: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """:func:`chance_test` of each measure against each of its nulls, over ``by`` units.

    ``records`` are columnar (one entry per (input, layer, head)) with ``measure`` and
    ``f"{measure}_null_{kind}"`` columns (NaN where no null was drawn); only entries with a finite
    null enter a unit's means, so measure and null are averaged over the same inputs.

    Returns ``{measure: {kind: chance_test result}}`` for the measures and kinds present.
    """
    out: dict[str, dict[str, Any]] = {}
    for m in measures:
        if m not in records:
            continue
        out[m] = {}
        for kind in NULL_KINDS:
            nk = f"{m}_null_{kind}"
            if nk not in records:
                continue
            z = np.asarray(records[nk], dtype=float)
            sel = np.isfinite(z)
            if not sel.any():
                continue
            sub = {c: np.asarray(records[c])[sel] for c in (*by, m, nk)}
            means = unit_means(sub, (m, nk), by)
            out[m][kind] = chance_test(
                means[m], means[nk], higher_is_better=HIGHER_IS_BETTER.get(m, True), alpha=alpha
            )
    return out
