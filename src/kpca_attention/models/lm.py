"""Decoder-only language models with causal attention from :mod:`kpca_attention.attention` (paper Sec. 4.2).

=============  ===============================================================================
``lm``         asymmetric softmax attention (timm's ``Attention``): the baseline
``symlm``      causal :class:`~kpca_attention.attention.SymmetricAttention` in every layer
``rpc_symlm``  causal :class:`~kpca_attention.attention.RPCAttention` (PAP under the causal mask, prefix mu)
               in ``rpc_layers`` (paper: layers 1-4, 4 iterations, lambda 4), symmetric elsewhere
=============  ===============================================================================

Architecture: token embedding + learned positional embedding, dropout, ``n_layer`` pre-norm blocks,
final LayerNorm, output head (a Linear tied to the embedding, or ``torch.nn.AdaptiveLogSoftmaxWithLoss``
as in the paper when ``adaptive_softmax_cutoffs`` is set). The blocks are timm's
``timm.models.vision_transformer.Block`` (pre-norm, GELU MLP of width ``d_ff``) called with
``is_causal=True``: the same block the vision models use, so the attention layer is the only difference
between the families and between vision and text. The paper's LM code is not public and the paper does
not say pre- or post-norm; pre-norm is the stable choice at 16 layers and is what we use.

Weight init as timm's ViT: truncated normal (std 0.02) on every Linear, zero biases; embeddings N(0, 0.02).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models.vision_transformer import init_weights_vit_timm
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..attention import (
    RPCAttention,
    StatefulBlock,
    SymmetricAttention,
    configure,
    get_mechanism,
    resolve_blocks,
    run_blocks,
)
from ..checks import check_int
from ..modules import eval_mode
from ..pap import RPC_OFFICIAL
from .family import FAMILY_MECHANISMS, check_attn_kwargs
from .vit import check_rpc_options

__all__ = ["LMConfig", "CausalLM", "LM_MODELS", "FAMILY_LM_MODELS", "LM_PRESETS", "create_lm", "perplexity",
           "token_nll"]

#: model name -> attention family
LM_MODELS: dict[str, str] = {"lm": "softmax", "symlm": "symmetric", "rpc_symlm": "rpc"}

#: the robust-attention family's LMs (:mod:`.family`): ``<m>_lm`` / ``<m>_symlm`` -> (mechanism, symmetric)
FAMILY_LM_MODELS: dict[str, tuple[str, bool]] = {
    f"{name}_{'symlm' if sym else 'lm'}": (name, sym)
    for name, sym_too in FAMILY_MECHANISMS.items() if "lm" in get_mechanism(name).applies_to
    for sym in ((False, True) if sym_too else (False,))
}


@dataclass
class LMConfig:
    """Configuration of :class:`CausalLM`. Defaults are the paper's WikiText-103 model (Sec. 4.2):
    16 layers, 8 heads, d_model 128 (head width 16), feed-forward 2048, dropout 0.1, context 256.

    ``rpc_*`` apply to ``rpc_symlm`` only; ``rpc_layers`` takes what
    :func:`kpca_attention.attention.resolve_blocks` takes (``"first"``, ``"all"``, ``"0,1,2,3"``, a list);
    None (default) is the paper's layers 1-4 (all layers of a model with fewer than 4).
    ``adaptive_softmax_cutoffs`` (e.g. ``(20000, 40000, 200000)`` for WikiText-103's 267k words) switches
    the output to ``nn.AdaptiveLogSoftmaxWithLoss``; None (default) keeps a full softmax, right for small
    vocabularies. ``tie_weights`` ties the full-softmax head to the token embedding.
    """

    vocab_size: int
    n_layer: int = 16
    n_head: int = 8
    d_model: int = 128
    d_ff: int = 2048
    dropout: float = 0.1
    attn_dropout: float = 0.0
    context: int = 256
    adaptive_softmax_cutoffs: tuple[int, ...] | None = None
    adaptive_softmax_div_value: float = 4.0
    tie_weights: bool = True
    rpc_layers: Any = None
    rpc_iters: int = RPC_OFFICIAL["n_iter"]
    rpc_lambda: float = RPC_OFFICIAL["lam"]
    rpc_threshold: str = RPC_OFFICIAL["threshold"]
    rpc_mu_dim: int | None = RPC_OFFICIAL["mu_dim"]
    attn_kwargs: dict[str, Any] | None = None
    attn_layers: Any = None

    def __post_init__(self) -> None:
        check_int(self.vocab_size, "LMConfig: vocab_size", min=2)
        for name in ("n_layer", "n_head", "d_model", "d_ff", "context"):
            check_int(getattr(self, name), f"LMConfig: {name}", min=1)
        if self.d_model % self.n_head:
            raise ValueError(f"LMConfig: d_model ({self.d_model}) must be divisible by n_head "
                             f"({self.n_head})")
        if not 0.0 <= self.dropout < 1.0 or not 0.0 <= self.attn_dropout < 1.0:
            raise ValueError("LMConfig: dropout and attn_dropout must be in [0, 1)")
        if self.adaptive_softmax_cutoffs is not None:
            cut = tuple(int(c) for c in self.adaptive_softmax_cutoffs)
            if not cut or list(cut) != sorted(set(cut)) or cut[0] < 1 or cut[-1] >= self.vocab_size:
                raise ValueError(
                    f"LMConfig: adaptive_softmax_cutoffs must increase strictly within (0, vocab_size="
                    f"{self.vocab_size}), got {self.adaptive_softmax_cutoffs}"
                )
            self.adaptive_softmax_cutoffs = cut
        check_rpc_options(dataclasses.asdict(self), "LMConfig")  # rpc_mu_dim=0 would give tau = 0
        # None: the paper's layers 1-4 (fewer when the model has fewer layers)
        spec = list(range(min(4, self.n_layer))) if self.rpc_layers is None else self.rpc_layers
        self.rpc_layers = resolve_blocks(spec, self.n_layer)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: named configurations (keyword overrides of LMConfig); ``small`` trains on a CPU in minutes
LM_PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    # 4 layers, RPC in the first one (the paper's 4 of 16 layers, scaled: a quarter of the depth)
    "small": dict(n_layer=4, n_head=4, d_model=64, d_ff=256, dropout=0.1, context=64, rpc_layers=[0]),
}


def _attn_layer(family: str, cfg: LMConfig, layer: int, symmetric: bool = False) -> type[nn.Module]:
    if family not in ("softmax", "symmetric", "rpc"):  # a registered mechanism (models/family.py)
        mech = get_mechanism(family)
        applied = layer in mech.applied_blocks("lm", cfg.n_layer, cfg.attn_layers)
        opts = dict(cfg.attn_kwargs or {})
        if "num_tokens" in getattr(mech.cls, "parameter_constraints", {}):
            opts.setdefault("num_tokens", cfg.context)  # a per-position parameter (RVT's W_p): the context
        if mech.stateful:  # outside attn_layers it still records its state (applied=False)
            return mech.layer_class("lm", symmetric, **opts, applied=applied)
        if applied:
            return mech.layer_class("lm", symmetric, **opts)
        return SymmetricAttention if symmetric else Attention
    if family == "softmax":
        return Attention
    if family == "rpc" and layer in cfg.rpc_layers:
        return configure(RPCAttention, n_iter=cfg.rpc_iters, lam=cfg.rpc_lambda,
                         threshold=cfg.rpc_threshold, mu_dim=cfg.rpc_mu_dim)
    return SymmetricAttention


class CausalLM(nn.Module):
    """Decoder-only transformer: ``forward(idx (B, T) long, targets (B, T) long | None)``.

    Returns ``(logits, loss)``:

    * full softmax: ``logits (B, T, vocab)``; ``loss`` the mean cross-entropy when ``targets`` is given;
    * adaptive softmax: with ``targets`` -> ``(None, loss)`` (full logits are not needed for the loss and
      are costly for a 267k vocabulary); without -> ``(log_probs (B, T, vocab), None)``.
    """

    def __init__(self, cfg: LMConfig, attention: str = "symmetric", symmetric: bool = False) -> None:
        super().__init__()
        families = (*LM_MODELS.values(), *sorted({m for m, _ in FAMILY_LM_MODELS.values()}))
        if attention not in families:
            raise ValueError(f"CausalLM: unknown attention {attention!r}; valid: {', '.join(families)}")
        if symmetric and attention in LM_MODELS.values():
            raise ValueError(f"CausalLM: symmetric= applies to the family's mechanisms, not {attention!r}")
        self.cfg, self.attention, self.symmetric = cfg, attention, symmetric
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Parameter(torch.zeros(1, cfg.context, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([
            StatefulBlock(cfg.d_model, cfg.n_head, mlp_ratio=cfg.d_ff / cfg.d_model, qkv_bias=True,
                          proj_drop=cfg.dropout, attn_drop=cfg.attn_dropout,
                          attn_layer=_attn_layer(attention, cfg, i, symmetric))
            for i in range(cfg.n_layer)
        ])
        self.norm = nn.LayerNorm(cfg.d_model)
        if cfg.adaptive_softmax_cutoffs is not None:
            self.head = None
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(
                cfg.d_model, cfg.vocab_size, list(cfg.adaptive_softmax_cutoffs),
                div_value=cfg.adaptive_softmax_div_value,
            )
        else:
            self.adaptive = None
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    @property
    def rpc_blocks(self) -> list[int]:
        return [i for i, b in enumerate(self.blocks) if isinstance(b.attn, RPCAttention)]

    def reset_parameters(self) -> None:
        for m in self.modules():  # timm's ViT init: trunc_normal(0.02) on Linear, zero bias
            if m is not self:
                init_weights_vit_timm(m, needs_reset=True)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb, std=0.02)
        if self.head is not None and self.cfg.tie_weights:
            self.head.weight = self.tok_emb.weight

    def hidden(self, idx: Tensor) -> Tensor:
        """Final hidden states ``(B, T, d_model)`` (after the last LayerNorm) of tokens ``idx (B, T)``."""
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be a (B, T) long tensor, got {idx.dtype} {tuple(idx.shape)}")
        t = idx.shape[1]
        if not 1 <= t <= self.cfg.context:
            raise ValueError(f"sequence length {t} must be in [1, context={self.cfg.context}]")
        x = self.drop(self.tok_emb(idx) + self.pos_emb[:, :t])
        x, _ = run_blocks(self.blocks, x, is_causal=True)  # one cross-layer state per forward
        return self.norm(x)

    def nll_from_hidden(self, h: Tensor, targets: Tensor) -> Tensor:
        """Per-position negative log-likelihood ``(...)`` of ``targets (...)`` given hidden ``(..., C)``."""
        if targets.shape != h.shape[:-1]:
            raise ValueError(f"targets {tuple(targets.shape)} must match hidden states {tuple(h.shape[:-1])}")
        flat_h, flat_t = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        if self.adaptive is not None:
            nll = -self.adaptive(flat_h, flat_t).output
        else:
            nll = F.cross_entropy(self.head(flat_h), flat_t, reduction="none")
        return nll.view(targets.shape)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        h = self.hidden(idx)
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets {tuple(targets.shape)} must have the shape of idx {tuple(idx.shape)}")
        if self.adaptive is not None:
            if targets is not None:
                return None, self.adaptive(h.reshape(-1, h.shape[-1]), targets.reshape(-1)).loss
            return self.adaptive.log_prob(h.reshape(-1, h.shape[-1])).view(*idx.shape, -1), None
        logits = self.head(h)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def create_lm(name: str, vocab_size: int, preset: str = "paper", **overrides: Any) -> CausalLM:
    """``lm``, ``symlm``, ``rpc_symlm`` or a family LM (``<m>_lm`` / ``<m>_symlm``, :data:`FAMILY_LM_MODELS`:
    the mechanism's LM defaults, ``attn_kwargs=`` / ``attn_layers=`` override them) at a preset of
    :data:`LM_PRESETS` with LMConfig overrides."""
    if name not in LM_MODELS and name not in FAMILY_LM_MODELS:
        valid = [*LM_MODELS, *FAMILY_LM_MODELS]
        raise ValueError(f"unknown language model {name!r}; valid: {', '.join(valid)}")
    if preset not in LM_PRESETS:
        raise ValueError(f"unknown LM preset {preset!r}; valid: {', '.join(LM_PRESETS)}")
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise TypeError(f"unknown LMConfig field(s) {bad}; valid: {', '.join(sorted(fields))}")
    unused = sorted(k for k in overrides
                    if (k.startswith("rpc_") and name != "rpc_symlm")
                    or (k.startswith("attn_") and k != "attn_dropout" and name not in FAMILY_LM_MODELS))
    if unused:  # never recorded as if they had been applied
        raise TypeError(f"{name} does not use {', '.join(unused)}: rpc_* options apply to rpc_symlm, "
                        f"attn_kwargs / attn_layers to the family's LMs ({', '.join(FAMILY_LM_MODELS)})")
    if name in FAMILY_LM_MODELS:
        check_attn_kwargs(overrides.get("attn_kwargs"), name)
    cfg = LMConfig(vocab_size=vocab_size, **{**LM_PRESETS[preset], **overrides})
    if name in FAMILY_LM_MODELS:
        mechanism, symmetric = FAMILY_LM_MODELS[name]
        return CausalLM(cfg, mechanism, symmetric=symmetric)
    return CausalLM(cfg, LM_MODELS[name])


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def token_nll(
    model: nn.Module,
    token_ids: Tensor | Sequence[int],
    context: int,
    *,
    stride: int = 1,
    batch_size: int = 64,
    progress: bool = False,
) -> Tensor:
    """Per-token negative log-likelihood ``(n - 1,)`` float64 of ``token_ids`` (n tokens): entry
    ``t - 1`` is ``-log p(ids[t] | ids[max(0, t - c) : t])``: the paper's sliding-window protocol
    (:func:`perplexity` is the exp of its mean; the studies keep every token for paired statistics).

    Windows of ``context`` tokens advance by ``stride`` and score their last ``stride`` positions; the
    first window scores all of its positions. ``stride=1`` is the paper's protocol, ``stride=context``
    non-overlapping windows (what training's per-epoch evaluation computes). The output layer runs on
    the scored positions only: with stride 1 that is one position in ``context`` (no logits are formed
    for positions that are not scored).

    Args:
        model: a :class:`~kpca_attention.models.lm.CausalLM` (``hidden`` + ``nll_from_hidden``), or a
            module whose ``forward(idx)`` returns ``(logits (B, T, V), _)``.
        batch_size: windows per forward.
        progress: show a tqdm bar over the windows.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    n = ids.numel()
    if n < 2:
        raise ValueError(f"token_nll needs at least 2 tokens, got {n}")
    check_int(context, "context", min=1)
    check_int(stride, "stride", min=1, max=context)
    check_int(batch_size, "batch_size", min=1)
    model_ctx = getattr(getattr(model, "cfg", None), "context", None)
    if model_ctx is not None and context > model_ctx:
        raise ValueError(f"context {context} exceeds the model's context {model_ctx}")
    device = next(model.parameters()).device

    def nll(idx: Tensor, tgt: Tensor, last: int) -> Tensor:
        """NLL of the last ``last`` positions of windows ``idx (b, L)`` predicting ``tgt (b, L)``."""
        idx, tgt = idx.to(device), tgt.to(device)
        if hasattr(model, "hidden") and hasattr(model, "nll_from_hidden"):
            return model.nll_from_hidden(model.hidden(idx)[:, -last:], tgt[:, -last:])
        logits, _ = model(idx)
        lg = logits[:, -last:]
        return F.cross_entropy(lg.flatten(0, 1), tgt[:, -last:].flatten(), reduction="none").view(-1, last)

    with eval_mode(model):
        out = torch.empty(n - 1, dtype=torch.float64)
        first = min(context, n - 1)
        out[:first] = nll(ids[None, :first], ids[None, 1 : first + 1], first)[0].double().cpu()
        # the window of last target e: inputs ids[e - L : e], targets ids[e - L + 1 : e + 1], scoring
        # targets e - stride + 1 .. e (out[e - stride : e]); full strides first, then a shorter tail
        ends = list(range(first + stride, n, stride))
        offs = torch.arange(-context, 0)
        for i in tqdm(range(0, len(ends), batch_size), desc="perplexity", unit="batch",
                      disable=True if not (progress and ends) else None):
            chunk = torch.tensor(ends[i : i + batch_size])
            pos = chunk[:, None] + offs  # (b, L) input positions
            res = nll(ids[pos], ids[pos + 1], stride).double().cpu()  # (b, stride)
            if stride == 1:
                out[chunk - 1] = res[:, 0]
            else:
                for j, e in enumerate(chunk.tolist()):
                    out[e - stride : e] = res[j]
        done = ends[-1] if ends else first
        if done < n - 1:  # the tail: fewer than `stride` tokens left
            tail = n - 1 - done
            pos = torch.arange(n - 1 - context, n - 1)
            out[done:] = nll(ids[None, pos], ids[None, pos + 1], tail)[0].double().cpu()
    return out


@torch.no_grad()
def perplexity(
    model: nn.Module,
    token_ids: Tensor | Sequence[int],
    context: int,
    batch_size: int = 1,
    stride: int = 1,
    progress: bool = True,
) -> float:
    """Perplexity of ``token_ids`` with the paper's sliding-window protocol: ``exp`` of the mean of
    :func:`token_nll` (one implementation of the windows for ``kpca-attention evaluate`` and the studies).

    Windows of ``L = context`` tokens slide one token at a time; each window scores only its last
    position, except the first window, which scores all of its positions. So every token after the
    first is predicted exactly once, and from exactly ``min(L, position)`` preceding tokens: the most
    context the model can use. ``batch_size`` windows run in one forward (same numbers as batch 1:
    the model is put in eval mode and every window has the same length).

    ``stride > 1`` is a faster APPROXIMATION of this protocol: windows advance by ``stride`` and score
    their last ``stride`` positions, so a token sees between ``L - stride + 1`` and ``L`` preceding
    tokens instead of exactly ``L`` (``stride = L`` is non-overlapping evaluation). Perplexity grows
    as ``stride`` grows; report ``stride`` with the number.

    Args:
        model: a :class:`CausalLM` (its ``hidden``/``nll_from_hidden`` are used, so an adaptive softmax
            never forms full logits), or any module whose ``forward(idx)`` returns ``(logits, _)``.
        token_ids: 1-D token ids (at least 2).
        context: window length L (at most the model's context).
        batch_size: windows per forward.
        stride: 1 for the paper's protocol; > 1 for the approximation above.
        progress: show a tqdm bar.

    Returns:
        ``exp(mean negative log-likelihood)`` over all predicted tokens (natural log).
    """
    nll = token_nll(model, token_ids, context, stride=stride, batch_size=batch_size, progress=progress)
    return math.exp(nll.mean().item())
