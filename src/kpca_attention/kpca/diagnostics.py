"""The paper's empirical checks of the KPCA view and the critique's re-examination of them.

* :func:`projection_loss` - eq. (13): ``J_proj = mean_i ||phi(q_i)||^2 - ||h_i||^2`` (log space).
* :func:`projection_loss_official` - what the official code (rachtsy/KPCA_code,
  ``Reconstruction/softmax.py``) logs for the paper's Fig. 1: q and k standardised per token,
  ``exp(q.q)`` without ``1/sqrt(D)`` and a denominator rebuilt from the first attention column.
* :func:`gamma_test` - Sec. 2.2.2 / Fig. 2, 5: ``gamma = (Kc a) / (N a)`` must be constant over tokens
  if ``a`` is an eigenvector; pairwise absolute and relative differences per principal axis, for the
  values-derived ``a_hat``, the true eigenvectors, and the critique's random-orthogonal control.
* :func:`top_eigenvalues`, :func:`eigen_stats` - the eigenvalue statistics quoted in the paper next
  to Fig. 2 (max / min / mean / median of |eigenvalues|), computed as the critique does.

Shapes: ``q``, ``k`` ``(..., N, D)``, ``v`` ``(..., N, D_v)``; leading dimensions are batch/head.
Everything is float64 inside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from .gram import KPCAEigen, Order, kpca_eigen, require_finite

__all__ = [
    "standardize",
    "projection_loss",
    "projection_loss_official",
    "pairwise_difference_stats",
    "gamma_test",
    "top_eigenvalues",
    "eigen_stats",
]


def standardize(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Per-token standardisation over the feature axis: ``(x - mean) / (std + eps)`` (unbiased std,
    as ``torch.std``). The official model applies it to q and k inside attention (without eps);
    the critique applies it (with eps = 1e-8) before its eigenvalue statistics."""
    x = x.to(torch.float64)
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps)


def _key_mask(mask: Tensor | None, like: Tensor) -> Tensor | None:
    """``(..., N)`` bool (True = real token) -> additive ``(..., 1, N)`` float64 mask on key columns."""
    if mask is None:
        return None
    if mask.shape != like.shape[:-1]:
        raise ValueError(f"mask must have shape {tuple(like.shape[:-1])} (..., N), got {tuple(mask.shape)}")
    return (
        torch.zeros(mask.shape, dtype=torch.float64, device=like.device)
        .masked_fill(~mask.bool(), float("-inf"))
        .unsqueeze(-2)
    )


def _logit_mask(mask: Tensor | None, like: Tensor, causal: bool) -> Tensor | None:
    """The additive mask on ``(..., N, N)`` logits: padded keys (:func:`_key_mask`) and, if ``causal``, the
    keys after each query (query i sees keys 1..i, as a causal LM's attention does)."""
    add = _key_mask(mask, like)
    if causal:
        n = like.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=like.device).triu(1)
        tri = torch.zeros(n, n, dtype=torch.float64, device=like.device).masked_fill(future, float("-inf"))
        add = tri if add is None else add + tri
    return add


def _masked_mean(x: Tensor, mask: Tensor | None, dim: tuple[int, ...] | None = None) -> Tensor:
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    w = mask.to(x.dtype)
    x = torch.where(mask.bool(), x, 0.0)
    return x.sum() / w.sum() if dim is None else x.sum(dim) / w.sum(dim)


def _log_mean_exp(log_x: Tensor, mask: Tensor | None) -> Tensor:
    """``log(mean(exp(log_x)))`` over all (masked) entries, without forming exp(log_x)."""
    if mask is not None:
        log_x = log_x.masked_fill(~mask.bool(), float("-inf"))
        count = mask.sum()
    else:
        count = log_x.numel()
    return torch.logsumexp(log_x.flatten(), 0) - math.log(float(count))


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if q.dim() < 2 or q.shape != k.shape:
        raise ValueError(f"q and k must both be (..., N, D), got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must be (..., N, D_v) matching k {tuple(k.shape)}, got {tuple(v.shape)}")
    if q.numel() == 0 or v.shape[-1] == 0:  # the measures are means over sequences and tokens
        raise ValueError(f"q, k, v must hold at least one sequence and one token with D >= 1 (the measures "
                         f"are means over them), got q {tuple(q.shape)}, v {tuple(v.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        require_finite(name, x)
    return q.to(torch.float64), k.to(torch.float64), v.to(torch.float64)


def _summarise(log_phi: Tensor, h_sq: Tensor, mask: Tensor | None) -> dict[str, Tensor]:
    phi = torch.exp(log_phi)
    j_tok = phi - h_sq
    log_mean_phi = _log_mean_exp(log_phi, mask)
    h_mean = _masked_mean(h_sq, mask)
    out = {
        "j_proj": _masked_mean(j_tok, mask),
        "phi_norm_sq": torch.exp(log_mean_phi),
        "h_norm_sq": h_mean,
        # how many times larger the subtracted term is: the critique's ~10^2-10^3 (log10 of ratio)
        "log10_h_over_phi": (torch.log(h_mean) - log_mean_phi) / math.log(10.0),
        "j_proj_seq": _masked_mean(j_tok, mask, dim=(-1,)),
        "phi_norm_sq_seq": _masked_mean(phi, mask, dim=(-1,)),
        "h_norm_sq_seq": _masked_mean(h_sq, mask, dim=(-1,)),
        "j_proj_tokens": j_tok,
        "phi_norm_sq_tokens": phi,
        "log_phi_norm_sq_tokens": log_phi,
        "h_norm_sq_tokens": h_sq,
    }
    return out


def projection_loss(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                    causal: bool = False) -> dict[str, Tensor]:
    """Projection loss of eq. (13) with the paper's scaling, in log space.

    ``||phi(q_i)||^2 = exp(q_i.q_i / sqrt(D)) / (sum_j exp(q_i.k_j / sqrt(D)))^2`` and
    ``h_i = sum_j softmax_j(q_i.k_j / sqrt(D)) v_j`` (the attention output before the output projection).
    ``J_proj`` equals a projection residual only if the value columns make orthonormal u_d, which
    learned values never guarantee (so it can be negative).

    Args:
        q, k: ``(..., N, D)``; v: ``(..., N, D_v)``.
        mask: optional ``(..., N)`` bool, True = real token: padded keys get no attention and padded
            queries are left out of every mean.
        causal: query i sees keys 1..i only (a causal LM): ``g(q_i)`` and ``h_i`` over its prefix, so
            ``h_i`` is the output the causal model computes.

    Returns:
        ``j_proj``, ``phi_norm_sq``, ``h_norm_sq`` (scalar means over all real tokens and leading
        dims), ``log10_h_over_phi``; per sequence ``*_seq`` ``(...,)``; per token ``*_tokens``
        ``(..., N)`` (``log_phi_norm_sq_tokens`` stays finite where phi over/underflows).
    """
    q, k, v = _check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = q @ k.mT * scale
    add = _logit_mask(mask, k, causal)
    if add is not None:
        logits = logits + add
    lse = torch.logsumexp(logits, -1)  # log g(q_i)
    log_phi = (q * q).sum(-1) * scale - 2.0 * lse
    h = torch.softmax(logits, -1) @ v
    return _summarise(log_phi, (h * h).sum(-1), mask)


def projection_loss_official(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, eps: float = 0.0, *, causal: bool = False
) -> dict[str, Tensor]:
    """The projection "loss" as the official code computes it (paper Fig. 1), in log space.

    The official ``Attention.forward`` standardises q and k per token (no eps), uses them for the
    attention itself, and when asked to log computes
    ``num = exp(q.q)`` (no ``1/sqrt(D)``), ``den = exp(2 q.k_1 - log(attn[:, 0]^2))`` with ``q.k_1``
    unscaled but ``attn`` from scaled logits, ``error = num / den - ||attn @ v||^2`` and logs
    ``log(error.mean())``. The scales disagree: this ``phi`` is
    ``exp(q.q - 2(1 - 1/sqrt(D)) q.k_1) / (sum_j exp(q.k_j / sqrt(D)))^2``, not ``||phi(q)||^2``.
    Here ``h`` is the attention output of the *standardised* q, k (what the official model
    computes); for a model that does not standardise, it is not that model's output.

    Args:
        q, k, v, mask, causal: as :func:`projection_loss`; the first token (column 0) must be real.
        eps: added to the std (0 as in the official code).

    Returns:
        As :func:`projection_loss`, plus ``log_j_proj`` = ``log(j_proj)`` (the logged number; NaN
        when the mean is <= 0).
    """
    q, k, v = _check_qkv(q, k, v)
    if mask is not None and not bool(mask[..., 0].all()):
        raise ValueError("projection_loss_official needs the first token of every sequence to be real")
    q, k = standardize(q, eps), standardize(k, eps)
    scale = 1.0 / math.sqrt(q.shape[-1])
    qk = q @ k.mT
    logits = qk * scale
    add = _logit_mask(mask, k, causal)
    if add is not None:
        logits = logits + add
    log_attn0 = logits[..., 0] - torch.logsumexp(logits, -1)
    log_phi = (q * q).sum(-1) - 2.0 * qk[..., 0] + 2.0 * log_attn0
    h = torch.softmax(logits, -1) @ v
    out = _summarise(log_phi, (h * h).sum(-1), mask)
    j = out["j_proj"]
    out["log_j_proj"] = torch.where(j > 0, torch.log(j.clamp_min(torch.finfo(j.dtype).tiny)), float("nan"))
    return out


# ------------------------------------------------------------------------------------ gamma test


def pairwise_difference_stats(
    gamma: Tensor, relative: bool = False, max_pairs: int | None = 1024, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Mean and (unbiased) std over token pairs ``i < j`` of ``|gamma_i - gamma_j|`` or of the
    relative ``|gamma_i - gamma_j| / max(|gamma_i|, |gamma_j|)`` (0 where both are 0).

    Args:
        gamma: ``(..., N, d)``; statistics per column (principal axis).
        relative: relative instead of absolute differences.
        max_pairs: relative differences have no closed form and all N(N-1)/2 pairs cost O(N^2 d);
            above this many pairs, ``max_pairs`` pairs drawn uniformly (fixed ``seed``, the same pairs
            for every column and batch entry) estimate mean and std. None: always all pairs.
            Absolute differences are exact for any N (sorted Gini-difference formula and
            ``sum_{i<j} (g_i - g_j)^2 = N sum_i (g_i - mean)^2``).

    Returns:
        ``(mean, std)`` each ``(..., d)``.
    """
    n = gamma.shape[-2]
    if n < 2:
        nan = gamma.new_full((*gamma.shape[:-2], gamma.shape[-1]), float("nan"))
        return nan, nan
    pairs = n * (n - 1) // 2
    if not relative:
        srt = torch.sort(gamma, dim=-2).values
        w = (2 * torch.arange(n, dtype=gamma.dtype, device=gamma.device) - n + 1).unsqueeze(-1)
        mean = (w * srt).sum(-2) / pairs
        sq = n * (gamma - gamma.mean(-2, keepdim=True)).pow(2).sum(-2)
        var = (sq - pairs * mean.pow(2)) / max(pairs - 1, 1)
        return mean, var.clamp_min(0).sqrt()
    if max_pairs is not None and pairs > max_pairs:
        gen = torch.Generator().manual_seed(seed)
        i = torch.randint(0, n, (max_pairs,), generator=gen)
        j = (i + torch.randint(1, n, (max_pairs,), generator=gen)) % n  # uniform over pairs i != j
    else:
        i, j = torch.triu_indices(n, n, offset=1)
    gi, gj = gamma[..., i.to(gamma.device), :], gamma[..., j.to(gamma.device), :]  # (..., P, d)
    den = torch.maximum(gi.abs(), gj.abs())
    diff = (gi - gj).abs_().div_(den.clamp_min_(torch.finfo(den.dtype).tiny))  # 0 / tiny = 0 where both 0
    return diff.mean(-2), diff.std(-2)


def _gamma(gram: Tensor, a: Tensor) -> Tensor:
    """``(Kc a) / (N a)`` elementwise: ``(..., N, N)``, ``(..., N, d)`` -> ``(..., N, d)``."""
    return (gram @ a) / (gram.shape[-1] * a)


def gamma_test(
    keys: Tensor,
    values: Tensor | None = None,
    d: int | None = None,
    order: Order = "abs",
    *,
    noise: float = 0.1,
    seed: int = 0,
    max_pairs: int | None = 1024,
    eigen: KPCAEigen | None = None,
) -> dict[str, dict[str, Tensor]]:
    """Is ``a`` an eigenvector of ``Kc``? The paper's gamma test (Sec. 2.2.2) with the critique's controls.

    ``gamma = (Kc a) / (N a)`` (elementwise) is the constant ``lambda`` over tokens for an eigenvector.
    Variants (keys of the result):

    * ``"values"`` (when ``values`` is given): the paper's estimate ``a_hat_d = (I - 1_N)^+ G^{-1} V[:, d]``;
      ``I - 1_N`` is singular (it is the centring projector H), its pseudo-inverse is H itself, so
      ``a_hat_d = H (g * v_d)``. Rows are rescaled by a common factor (gamma is invariant to it) so
      that huge g never overflows.
    * ``"eigenvectors"``: the true top-d eigenvectors (differences ~ 0: the positive control).
    * ``"random"``: the critique's control, ``QR(A + noise * randn)`` - orthonormal but not eigenvectors.
    * ``"values_permuted"`` (with ``values``): ``a_hat`` from V with its tokens permuted (seeded, one
      permutation per matrix): the null of ``"values"``. It keeps the weighting by g - whose spread over
      tokens sets much of the relative differences - and V's distribution, and loses only V's token-to-token
      link to the keys; the random control keeps neither, so random values "beat" it once keys are large.

    Because the eigenvalues of Kc are tiny (~1e-4 and below), absolute differences near 0 say
    nothing: compare the relative differences, and compare every variant against ``"random"``.

    Args:
        keys: ``(..., N, D)``; values: ``(..., N, D_v)``; d: axes (default D_v or D, capped at N).
        order, eigen: see :func:`kpca_attention.kpca.gram.kpca_eigen`.
        noise, seed: the random control.
        max_pairs: sampled token pairs for the relative differences, see :func:`pairwise_difference_stats`.

    Returns:
        ``{variant: {"mean_abs", "std_abs", "mean_rel", "std_rel", "gamma_mean"}}`` each ``(..., d)``,
        plus ``{"reference": {"lambda": mu / N}}`` (the constant gamma of an exact eigenvector).
    """
    n, dk = keys.shape[-2:]
    d = (values.shape[-1] if values is not None else dk) if d is None else d
    d = min(d, n)
    if eigen is None or eigen.eigenvectors.shape[-1] < d:
        eigen = kpca_eigen(keys, d, order=order)
    gram = eigen.gram
    a_true = eigen.eigenvectors[..., :d]
    gen = torch.Generator().manual_seed(seed)
    pert = a_true + noise * torch.randn(a_true.shape, generator=gen, dtype=a_true.dtype).to(a_true.device)
    a_rand = torch.linalg.qr(pert).Q[..., :d]
    variants: dict[str, Tensor] = {"eigenvectors": a_true, "random": a_rand}
    if values is not None:
        if values.shape[:-1] != keys.shape[:-1]:
            raise ValueError(
                f"values must be (..., N, D_v) matching keys {tuple(keys.shape)}, got {tuple(values.shape)}"
            )
        require_finite("values", values)
        lg = eigen.log_g
        g_scaled = torch.exp(lg - lg.amax(-1, keepdim=True)).unsqueeze(-1)  # g / max(g), in (0, 1]
        vals = values.to(torch.float64)[..., :d]
        perm = torch.argsort(torch.rand(vals.shape[:-1], generator=gen, dtype=torch.float64), dim=-1)
        shuffled = torch.gather(vals, -2, perm.to(vals.device).unsqueeze(-1).expand(vals.shape))
        a_hat, a_perm = g_scaled * vals, g_scaled * shuffled
        variants = {"values": a_hat - a_hat.mean(-2, keepdim=True),
                    "values_permuted": a_perm - a_perm.mean(-2, keepdim=True), **variants}
    out: dict[str, dict[str, Tensor]] = {}
    for name, a in variants.items():
        gam = _gamma(gram, a)
        m_abs, s_abs = pairwise_difference_stats(gam, relative=False)
        m_rel, s_rel = pairwise_difference_stats(gam, relative=True, max_pairs=max_pairs, seed=seed)
        out[name] = {
            "mean_abs": m_abs,
            "std_abs": s_abs,
            "mean_rel": m_rel,
            "std_rel": s_rel,
            "gamma_mean": gam.mean(-2),
        }
    out["reference"] = {"lambda": eigen.eigenvalues[..., :d] / n}
    return out


# ------------------------------------------------------------------------------------ eigenvalues


def top_eigenvalues(
    keys: Tensor,
    d: int | None = None,
    *,
    standardized: bool = False,
    eps: float = 1e-8,
    order: Order = "signed",
) -> Tensor:
    """``|mu_d|`` for the top-d eigenvalues of ``Kc`` (the critique's ``eigenvalues.py``: sort by
    signed value, keep d = head width, take absolute values), optionally after per-token
    standardisation of the keys (the critique needs it in float32; float64 log space does not).

    Returns ``(..., min(d, N))`` float64.
    """
    keys = standardize(keys, eps) if standardized else keys
    return kpca_eigen(keys, d, order=order).eigenvalues.abs()


def eigen_stats(abs_eigenvalues: Tensor) -> dict[str, Mapping[str, float]]:
    """Max / min / mean / median of the top-d |eigenvalues|, as the paper and critique report them.

    Args:
        abs_eigenvalues: ``(S, M, d)`` - S inputs (images / texts), M (layer, head) pairs, d ranks.

    Per input, |eigenvalue| of each rank is averaged over the M heads, then max/min/mean/median
    are taken over the d ranks; the result is the mean and (unbiased) std over the S inputs.

    Returns:
        ``{"max": {"mean", "std"}, "min": ..., "mean": ..., "median": ..., "per_rank": [d floats]}``.
    """
    if abs_eigenvalues.dim() != 3:
        raise ValueError(f"abs_eigenvalues must be (S, M, d), got {tuple(abs_eigenvalues.shape)}")
    per_rank = abs_eigenvalues.to(torch.float64).mean(1)  # (S, d)
    stats = {
        "max": per_rank.amax(-1),
        "min": per_rank.amin(-1),
        "mean": per_rank.mean(-1),
        # torch.median returns the lower middle value for even d, as in the critique's script
        "median": per_rank.median(-1).values,
    }
    out: dict[str, Mapping[str, float]] = {
        key: {"mean": float(val.mean()), "std": float(val.std()) if val.numel() > 1 else 0.0}
        for key, val in stats.items()
    }
    out["per_rank"] = [float(x) for x in per_rank.mean(0)]  # type: ignore[assignment]
    return out
