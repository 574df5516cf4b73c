"""PAP's per-iteration diagnostics, computed from its states (mu, tau, each step's L and Y / mu).

:class:`PAPTrace` is what ``pap(..., return_info=True)`` returns as ``info`` and what
:func:`kpca_attention.kpca.pap_trace.trace_model` aggregates; the latter feeds it the states that the
RPC layer's hook points see (``hook_k``, ``hook_mu``, ``hook_tau``, ``hook_L.t``, ``hook_W.t``), so
both give the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from .inputs import normalise_mask, valid_keys

__all__ = ["PAPTrace", "TRACE_KEYS", "STATES", "key_validity"]


class PAPTrace:
    """Per-iteration diagnostics of PAP (computed under no_grad, only when asked for).

    Keys of ``info`` (lists with one float per iteration, averaged over batch and heads;
    ``*_per_head`` lists hold ``(H,)`` tensors averaged over the batch):
    ``s_density`` fraction of non-zero entries of S; ``tau`` mean threshold; ``k_abs_max`` mean
    over (batch, head) of max |K|; ``primal_residual`` ||K - L - S||_F / ||K||_F; ``dual_norm``
    ||Y||_F / ||K||_F; ``l_change`` ||L_t - L_{t-1}||_F / ||L_t||_F (NaN at t = 1).

    Args:
        k: the keys PAP ran on ``(B, H, N, D)``; ``mu``, ``tau``: its step size and threshold (``tau``
            = inf when S is forced to 0); ``valid``: ``(B, H, N)`` bool of the keys that take part
            (:func:`key_validity`), None = all; ``dual``: False when Y is never updated (ablation).
    """

    KEYS = ("s_density", "tau", "k_abs_max", "primal_residual", "dual_norm", "l_change")

    def __init__(
        self, k: Tensor, mu: Tensor, tau: Tensor, valid: Tensor | None, *, dual: bool = True
    ) -> None:
        self.dual = dual  # False: Y is never updated (ablation), so its norm is 0
        # statistics in at least float32: squares and counts overflow / round in half precision
        self.dtype = torch.promote_types(k.dtype, torch.float32)
        with torch.no_grad():
            self.k = k.detach().to(self.dtype)
            self.mu = mu.detach().to(self.dtype)
            self.tau = tau.detach().to(self.dtype)
            # Row weights: padded tokens take no part in the statistics either.
            self.row_w = None if valid is None else valid.to(self.dtype).unsqueeze(-1)
            self.k_norm = self._fro(self.k).clamp_min(torch.finfo(self.dtype).tiny)
            self.k_abs_max = self._masked(self.k.abs()).amax(dim=(-2, -1))
        self.info: dict[str, list] = {}
        for key in self.KEYS:
            self.info[key] = []
            self.info[key + "_per_head"] = []

    def _masked(self, x: Tensor) -> Tensor:
        return x if self.row_w is None else x * self.row_w

    def _fro(self, x: Tensor) -> Tensor:
        return self._masked(x).pow(2).sum(dim=(-2, -1)).sqrt()  # (B, H)

    def _add(self, key: str, per_bh: Tensor) -> None:
        per_head = per_bh.detach().cpu().double().mean(0)
        self.info[key].append(float(per_head.mean()))
        self.info[key + "_per_head"].append(per_head)

    @torch.no_grad()
    def record(self, L: Tensor, L_prev: Tensor | None, W_prev: Tensor | None) -> dict[str, Tensor]:
        """One step: L_t, L_{t-1} and W_{t-1} = Y_{t-1} / mu (both None at t = 1). Returns this step's
        quantities per (batch, head), ``(B, H)`` each."""
        L = L.detach().to(self.dtype)
        L_prev = None if L_prev is None else L_prev.detach().to(self.dtype)
        W0 = torch.zeros_like(self.k) if W_prev is None else W_prev.detach().to(self.dtype)
        # S_t from its definition, not as K - X_t - W_{t-1}: that difference is zero only up to
        # rounding and would count every rounding error as a non-zero entry of S.
        Z = self.k if L_prev is None else self.k - L_prev + W0  # K - L_{t-1} + W_{t-1}
        S = Z - torch.maximum(torch.minimum(Z, self.tau), -self.tau)
        nonzero = self._masked((S != 0).to(self.dtype)).sum(dim=(-2, -1))
        n_rows = self.k.shape[-2] if self.row_w is None else self.row_w.sum(dim=(-2, -1))
        step: dict[str, Tensor] = {"s_density": nonzero / (n_rows * self.k.shape[-1])}
        tau_rows = self.tau.expand(*self.k.shape[:3], 1)
        step["tau"] = self._masked(tau_rows).sum(dim=(-2, -1)) / n_rows
        step["k_abs_max"] = self.k_abs_max
        residual = self.k - L - S  # = W_t - W_{t-1}
        step["primal_residual"] = self._fro(residual) / self.k_norm
        if self.dual:
            step["dual_norm"] = self._fro(self.mu * (W0 + residual)) / self.k_norm
        else:
            step["dual_norm"] = torch.zeros(self.k.shape[:2], dtype=self.dtype)
        if L_prev is None:
            step["l_change"] = torch.full(self.k.shape[:2], float("nan"))
        else:
            step["l_change"] = self._fro(L - L_prev) / self._fro(L).clamp_min(1e-30)
        for key in self.KEYS:
            self._add(key, step[key])
        return step


#: the per-iteration quantities of ``pap(..., return_info=True)`` (see :class:`PAPTrace`)
TRACE_KEYS: tuple[str, ...] = PAPTrace.KEYS


def key_validity(attn_mask: Tensor | None, k: Tensor) -> Tensor | None:
    """Which keys of ``k (B, H, N, D)`` take part in PAP under ``attn_mask`` (any mask :func:`pap`
    takes): ``(B, H, N)`` bool, or None without a mask. The row weights of :class:`PAPTrace`."""
    return valid_keys(normalise_mask(attn_mask, k, False), tuple(k.shape))


class Observer:
    """Where one call of :func:`~kpca_attention.pap.pap` reports its states: to the caller's ``hooks``
    (callables by state name, see :data:`STATES`) and, for ``return_info`` or an ``S_density`` hook, to a
    :class:`PAPTrace`. ``mu``, ``tau`` and ``L.t`` continue as the hook returns them (an intervention,
    as TransformerLens hooks); ``W.t`` and ``S_density.t`` are observations (their return is ignored)."""

    def __init__(self, hooks: Mapping[str, Callable[[Tensor], Tensor]] | None, return_info: bool) -> None:
        self.hooks = dict(hooks or {})
        self.trace_wanted = return_info or any(name.startswith("S_density.") for name in self.hooks)
        self.wants_dual = self.trace_wanted or any(name.startswith("W.") for name in self.hooks)
        self.trace: PAPTrace | None = None
        self.L_prev: Tensor | None = None
        self.W_prev: Tensor | None = None

    def emit(self, name: str, value: Tensor) -> Tensor:
        hook = self.hooks.get(name)
        return value if hook is None else hook(value)

    def start(self, k: Tensor, mu: Tensor, tau: Tensor, attn_mask: Tensor | None, dual: bool) -> Tensor:
        """The threshold the loop uses (after ``hook_tau``); sets up the trace."""
        tau = self.emit("tau", tau)
        if self.trace_wanted:
            self.trace = PAPTrace(k, mu, tau, valid_keys(attn_mask, tuple(k.shape)), dual=dual)
        return tau

    def output(self, t: int, L: Tensor) -> Tensor:
        """Step t's L (after ``hook_L.t``); the trace's step and ``S_density.t``."""
        L = self.emit(f"L.{t}", L)
        if self.trace is not None:
            self.emit(f"S_density.{t}", self.trace.record(L, self.L_prev, self.W_prev)["s_density"])
        return L

    def dual_state(self, t: int, L: Tensor, W: Tensor | None, like: Tensor) -> None:
        """Step t's W_t = Y_t / mu (None = 0, the shape of ``like``), after its L."""
        if f"W.{t}" in self.hooks:
            self.emit(f"W.{t}", torch.zeros_like(like) if W is None else W)
        self.W_prev, self.L_prev = W, L


#: the states :func:`~kpca_attention.pap.pap` reports to ``hooks`` (``*.t``: one per step t = 0 ...)
STATES: tuple[str, ...] = ("mu", "tau", "L.t", "W.t", "S_density.t")
