"""Putting the mechanisms into models: :func:`configure` (a subclass with new constructor defaults, as
timm needs a class), :func:`replace_attention` (swap the attention of chosen blocks, carrying weights over)
and :func:`resolve_blocks`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .base import HeadsAttention

__all__ = ["configure", "replace_attention", "resolve_blocks"]


def configure(cls: type[nn.Module], **defaults: Any) -> type[nn.Module]:
    """A subclass of ``cls`` whose constructor has new keyword defaults (timm needs a class).

    >>> attn_layer = configure(RPCAttention, n_iter=6, lam=4.0)
    """

    class Configured(cls):  # type: ignore[valid-type, misc]
        __init__ = functools.partialmethod(cls.__init__, **defaults)  # type: ignore[assignment]

    opts = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
    Configured.__name__ = Configured.__qualname__ = f"{cls.__name__}[{opts}]"
    return Configured


# ----------------------------------------------------------------------------- replacement

def _projection_slices(layer: nn.Module) -> dict[str, tuple[Tensor, Tensor | None]]:
    """Weight and bias of each of q, k, v of a timm ``Attention`` or one of this module's layers."""
    names = getattr(layer, "projections", ("q", "k", "v"))
    lin = layer.in_proj if isinstance(layer, HeadsAttention) else getattr(layer, "qkv", None)
    if not isinstance(lin, nn.Linear):
        raise TypeError(f"cannot read q/k/v projections of {type(layer).__name__} (no fused qkv Linear)")
    ws = lin.weight.chunk(len(names), 0)
    bs = lin.bias.chunk(len(names), 0) if lin.bias is not None else [None] * len(names)
    out = dict(zip(names, zip(ws, bs, strict=True), strict=True))
    out.setdefault("q", out["k"])  # symmetric: W_Q = W_K
    return out


@torch.no_grad()
def _carry_weights(old: nn.Module, new: HeadsAttention) -> None:
    src = _projection_slices(old)
    dst = new.in_proj
    ws = dst.weight.chunk(len(new.projections), 0)
    bs = dst.bias.chunk(len(new.projections), 0) if dst.bias is not None else [None] * len(new.projections)
    for name, w, b in zip(new.projections, ws, bs, strict=True):
        w.copy_(src[name][0])
        if b is not None and src[name][1] is not None:
            b.copy_(src[name][1])
    new.proj.load_state_dict(old.proj.state_dict())
    for norm in ("q_norm", "k_norm", "norm"):
        a, b = getattr(old, norm, None), getattr(new, norm, None)
        if isinstance(a, nn.Module) and type(a) is type(b) and not isinstance(a, nn.Identity):
            b.load_state_dict(a.state_dict())


def resolve_blocks(spec: str | int | Iterable[int], depth: int) -> list[int]:
    """``"all"``, ``"first"``, ``"none"``, an index, or a list of indices -> sorted block indices."""
    if isinstance(spec, str):
        table = {"all": list(range(depth)), "first": [0], "none": [], "last": [depth - 1]}
        if spec in table:
            return table[spec]
        try:
            spec = [int(s) for s in spec.split(",") if s.strip()]
        except ValueError:
            raise ValueError(
                f"unknown block spec {spec!r}; valid: 'all', 'first', 'last', 'none', or indices like '0,3'"
            ) from None
    valid = "valid: 'all', 'first', 'last', 'none', an index, or a list of indices like [0, 3] or '0,3'"
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple, range)):
        raise ValueError(f"unknown block spec {spec!r}; {valid}")
    idx = [spec] if isinstance(spec, int) else list(spec)
    if any(isinstance(i, bool) or not isinstance(i, int) for i in idx):
        raise ValueError(f"block indices must be integers, got {idx!r}; {valid}")
    bad = [i for i in idx if not -depth <= i < depth]
    if bad:
        raise ValueError(f"block indices {bad} out of range for a model with {depth} blocks")
    return sorted({i % depth for i in idx})


_LAYOUT = (
    "timm's Attention layout: a fused input projection `qkv` = nn.Linear(dim, 3 * dim), an output "
    "projection `proj` = nn.Linear(dim, dim) and an integer `num_heads` dividing dim (optional: "
    "`attn_drop` / `proj_drop` nn.Dropout, absent = no dropout; `q_norm`, `k_norm`, `norm`)"
)


def _timm_layout(old: nn.Module, where: str) -> tuple[nn.Linear, nn.Linear]:
    """The fused input and the output projection of an attention layer in timm's layout, or a
    ValueError listing what the layer lacks (e.g. ``nn.MultiheadAttention``, separate q/k/v Linears)."""
    proj = getattr(old, "proj", None)
    in_proj = old.in_proj if isinstance(old, HeadsAttention) else getattr(old, "qkv", None)
    problems = []
    if not isinstance(in_proj, nn.Linear):
        seen = ("q", "k", "v", "q_proj", "k_proj", "v_proj", "in_proj_weight")
        names = [n for n in seen if hasattr(old, n)]
        problems.append("no fused `qkv` nn.Linear" + (f" (it has {', '.join(names)})" if names else ""))
    if not isinstance(proj, nn.Linear):
        problems.append("no `proj` nn.Linear" + (" (it has `out_proj`)" if hasattr(old, "out_proj") else ""))
    heads = getattr(old, "num_heads", None)
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        problems.append(f"no integer `num_heads` (got {heads!r})")
    if not problems:
        dim = proj.in_features
        n_parts = len(old.projections) if isinstance(old, HeadsAttention) else 3
        if proj.out_features != dim or getattr(old, "gate", None) is not None:
            problems.append(f"gated attention or dim_out != dim (proj is {dim} -> {proj.out_features})")
        if in_proj.in_features != dim or in_proj.out_features != n_parts * dim:
            problems.append(f"`qkv` is {in_proj.in_features} -> {in_proj.out_features}, not {dim} -> "
                            f"{n_parts * dim}")
        elif dim % heads:
            problems.append(f"num_heads {heads} does not divide dim {dim}")
    if not problems and not isinstance(old, HeadsAttention):  # what the swap would drop, or cannot give
        own = [n for n, _ in (*old.named_parameters(recurse=False), *old.named_buffers(recurse=False))]
        if own:
            problems.append(f"its own parameters or buffers {', '.join(own)} (biases or position tables the "
                            "new layer would drop)")
        named = [p for p in inspect.signature(old.forward).parameters.values()
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)][1:]  # after the input
        extra = [p.name for p in named if p.name not in ("attn_mask", "is_causal")]
        if extra:
            problems.append(f"its forward takes {', '.join(extra)} (position information the new layer "
                            "cannot take)")
    if problems:
        raise ValueError(f"{where}: cannot replace {type(old).__name__}: {'; '.join(problems)}. "
                         f"replace_attention needs {_LAYOUT}")
    return in_proj, proj


def _dropout_p(old: nn.Module, name: str, where: str) -> float:
    drop = getattr(old, name, None)
    if drop is None:
        return 0.0
    if isinstance(drop, nn.Dropout):
        return drop.p
    if isinstance(drop, nn.Identity):
        return 0.0
    raise ValueError(f"{where}: `{name}` of {type(old).__name__} is a {type(drop).__name__}; "
                     "replace_attention reads its rate from an nn.Dropout (no attribute = no dropout)")


def replace_attention(
    model: nn.Module,
    attn_layer: type[nn.Module],
    blocks: str | int | Sequence[int] = "all",
    **layer_kwargs: Any,
) -> list[int]:
    """Swap the attention of chosen blocks of a timm ``VisionTransformer`` (or anything with
    ``.blocks[i].attn``) in place, carrying over the weights that have a counterpart: the K and V
    (and Q, taking W_Q = W_K from a symmetric layer) rows of the input projection, the output
    projection and the norms. New parameters (e.g. Scaled Attention's S) keep their init.

    The attention layers must have timm's layout (``qkv``, ``proj``, ``num_heads``; see the error
    message for the rest): a ValueError names what a layer lacks, before anything is replaced.

    Returns the indices of the replaced blocks.
    """
    if isinstance(attn_layer, nn.Module) or not callable(attn_layer):  # an instance where a class is due
        raise TypeError(f"attn_layer must be a class, not an instance of {type(attn_layer).__name__}: pass "
                        "the class (e.g. RPCAttention, or configure(RPCAttention, n_iter=6) for options); "
                        "each block gets its own layer built with that block's width and heads")
    blocks_of = getattr(model, "blocks", None)
    if blocks_of is None or not hasattr(blocks_of, "__len__") or not hasattr(blocks_of, "__getitem__"):
        raise TypeError(f"{type(model).__name__} has no .blocks sequence; expected a timm VisionTransformer "
                        "(or a module whose .blocks[i].attn are attention layers in timm's layout)")
    chosen = resolve_blocks(blocks, len(blocks_of))
    layouts = {}
    for i in chosen:  # check every block first, so that a failure leaves the model unchanged
        if not isinstance(getattr(blocks_of[i], "attn", None), nn.Module):
            raise ValueError(f"block {i} ({type(blocks_of[i]).__name__}) has no `attn` module to replace")
        layouts[i] = _timm_layout(blocks_of[i].attn, f"block {i}")
    for i in chosen:
        old = blocks_of[i].attn
        qkv_lin, proj = layouts[i]
        dim = proj.in_features
        kwargs = dict(
            num_heads=old.num_heads,
            qkv_bias=qkv_lin.bias is not None,
            qk_norm=not isinstance(getattr(old, "k_norm", nn.Identity()), nn.Identity),
            scale_norm=not isinstance(getattr(old, "norm", nn.Identity()), nn.Identity),
            proj_bias=proj.bias is not None,
            attn_drop=_dropout_p(old, "attn_drop", f"block {i}"),
            proj_drop=_dropout_p(old, "proj_drop", f"block {i}"),
        )
        if kwargs["qk_norm"] or kwargs["scale_norm"]:
            norm = old.k_norm if kwargs["qk_norm"] else old.norm
            kwargs["norm_layer"] = type(norm)
        kwargs.update(layer_kwargs)
        p = next(old.parameters())
        new = attn_layer(dim, device=p.device, dtype=p.dtype, **kwargs)
        _carry_weights(old, new)
        new.train(old.training)
        blocks_of[i].attn = new
    return chosen
