"""RPC-Attention: attention with robust principal components, ``n_iter`` steps of Principal Attention
Pursuit (:func:`kpca_attention.pap.pap`) on (K, V), with hook points on PAP's inner states."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..checks import Bool
from ..pap import RPC_OFFICIAL, pap
from .base import HeadsAttention, PapOption, is_proxy
from .hooks import HookPoint
from .registry import register_mechanism

__all__ = ["RPCAttention"]

# FX: record every call of pap as one node instead of tracing through it (its mask handling and checks
# branch on shapes); the GraphModule then calls pap itself, with real tensors.
torch.fx.wrap("pap")


class RPCAttention(HeadsAttention):
    """Attention with Robust Principal Components: ``n_iter`` steps of PAP on (K, V).

    Args (besides timm's):
        n_iter: PAP softmax evaluations (official README: 4 in the first layer).
        lam: lambda of the shrinkage threshold (official: 4).
        threshold: ``"lambda_mu"`` (official code) or ``"lambda_over_mu"`` (paper).
        mu_dim: width in mu = N * mu_dim / (4 ||K||_1); None = full width (official code).
        symmetric: False adds a query projection, softmax(Q (K - S - Y/mu)^T) V (paper E.9).
        sparse: False forces the sparse component to zero (ablation: iterated attention with dual
            feedback, no shrinkage).
        dual: False removes the dual update (ablation: Y = 0 throughout).
        validate: :func:`~kpca_attention.pap.pap`'s ``validate``: None checks inputs for NaN/Inf in
            eager mode on the CPU only (no host sync on an accelerator), True on every device.

    Hook points of PAP's inner states (:class:`~.hooks.HookPoint`; :func:`~.hooks.run_with_cache` reads
    them): ``hook_mu`` and ``hook_tau`` (the step size and threshold), and per step t = 0 ... n_iter - 1
    ``hook_L.t`` (the step's output L_t), ``hook_W.t`` (Y_t / mu, the scaled dual) and
    ``hook_S_density.t`` (the fraction of non-zero entries of S_t per (batch, head)). While none has a
    hook, PAP takes its fast paths and forms none of them; with one, the reference loop runs (the same
    output to rounding). See :func:`kpca_attention.pap.pap`'s ``hooks``.
    """

    key_padding_masks = True  # pap takes a boolean (B, N) key-padding mask
    parameter_constraints = {
        **HeadsAttention.parameter_constraints,
        "n_iter": PapOption(), "lam": PapOption(), "threshold": PapOption(), "mu_dim": PapOption(),
        "symmetric": Bool(), "sparse": Bool(), "dual": Bool(),
        "validate": Bool(allow_none=True),
    }

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args: Any,
        n_iter: int = RPC_OFFICIAL["n_iter"],
        lam: float = RPC_OFFICIAL["lam"],
        threshold: str = RPC_OFFICIAL["threshold"],
        mu_dim: int | None = RPC_OFFICIAL["mu_dim"],
        symmetric: bool = True,
        sparse: bool = True,
        dual: bool = True,
        validate: bool | None = None,
        **kwargs: Any,
    ) -> None:
        self.validate_options(n_iter=n_iter, lam=lam, threshold=threshold, mu_dim=mu_dim, symmetric=symmetric,
                              sparse=sparse, dual=dual, validate=validate)
        self.projections = ("k", "v") if symmetric else ("q", "k", "v")
        super().__init__(dim, num_heads, *args, **kwargs)
        self.n_iter, self.lam, self.threshold, self.mu_dim = n_iter, lam, threshold, mu_dim
        self.symmetric = symmetric
        self.sparse, self.dual = sparse, dual
        self.validate = validate
        self.hook_mu, self.hook_tau = HookPoint(), HookPoint()
        self.hook_L = nn.ModuleList(HookPoint() for _ in range(n_iter))
        self.hook_W = nn.ModuleList(HookPoint() for _ in range(n_iter))
        self.hook_S_density = nn.ModuleList(HookPoint() for _ in range(n_iter))

    def pap_hooks(self) -> dict[str, HookPoint] | None:
        """PAP's state name -> hook point, for the hook points that have a hook (None if none has)."""
        points = {"mu": self.hook_mu, "tau": self.hook_tau}
        for state, points_t in (("L", self.hook_L), ("W", self.hook_W), ("S_density", self.hook_S_density)):
            points.update((f"{state}.{t}", p) for t, p in enumerate(points_t))
        active = {name: p for name, p in points.items() if p.active}
        return active or None

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        # no hook: the fast paths (while tracing with FX no module may be handed to the leaf call)
        hooks = None if is_proxy(qkv["k"]) else self.pap_hooks()
        return pap(
            qkv["k"], qkv["v"], self.n_iter, self.lam,
            mu_dim=self.mu_dim, threshold=self.threshold,
            q=None if self.symmetric else qkv["q"],
            attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout_p,
            sparse=self.sparse, dual=self.dual, validate=self.validate, hooks=hooks,
        )

    def extra_repr(self) -> str:
        ablations = "".join(f", {name}=False" for name in ("sparse", "dual") if not getattr(self, name))
        return (f"n_iter={self.n_iter}, lam={self.lam}, threshold={self.threshold!r}, "
                f"mu_dim={self.mu_dim}, symmetric={self.symmetric}{ablations}")


register_mechanism(
    "rpc", RPCAttention, RPC_OFFICIAL,
    layers={"vision": "first", "lm": lambda depth: list(range(min(4, depth)))},
    description="RPC-Attention: PAP on (K, V) in the first block (paper: layers 1-4 of the LM)",
)
