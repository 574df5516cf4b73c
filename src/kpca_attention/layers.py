"""Attention layers of the kernel-PCA view, drop-in for timm's ``Attention``.

Every layer takes timm's constructor arguments (``dim, num_heads, qkv_bias, qk_norm, scale_norm,
proj_bias, attn_drop, proj_drop, norm_layer, device, dtype``) and ``forward(x, attn_mask=None,
is_causal=False)`` with ``x`` of shape ``(B, N, C)``, so each can be given to
``timm.models.vision_transformer.VisionTransformer`` or ``Block`` as ``attn_layer``.

* :class:`SymmetricAttention` - one Linear(dim, 2 dim) for K and V, no Q: softmax(K K^T / sqrt(D)) V.
* :class:`RPCAttention` - Principal Attention Pursuit (:func:`kpca_attention.pap.pap`) on K, V;
  ``symmetric=False`` adds queries (the paper's appendix E.9).
* :class:`ScaledAttention` - Q, K, V with output A (I - S) V (paper Remark 3 / E.1).

Named hook points (TransformerLens style): ``hook_q``, ``hook_k``, ``hook_v`` are identity modules
that see the per-head ``(B, H, N, D)`` tensors (bias included, after qk-norm); register a forward
hook on them to read q, k, v of any layer. In symmetric layers ``hook_q`` sees the keys (Q = K).

timm calls ``issubclass(attn_layer, ...)``, so options cannot be bound with ``functools.partial``:
:func:`configure` makes a subclass with new constructor defaults instead.

Tracing and compiling: the forward passes branch in Python on shapes and options only, never on a
tensor's values, so ``torch.compile`` sees no graph break in them and FX traces them
(``torchvision.models.feature_extraction.create_feature_extractor`` works as on timm's ViTs). Under FX,
:func:`~kpca_attention.pap.pap` is one leaf call (``torch.fx.wrap``): its input checks run when the
traced graph runs. Checks that read values (NaN/Inf inputs) follow ``pap``'s ``validate`` rule: eager
mode on the CPU by default. TorchScript is not supported: PAP's fused update is a
``torch.autograd.Function`` with a hand-written backward, which TorchScript cannot compile
(``torch.compile`` / ``torch.export`` are the supported graph paths).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .pap import check_options, pap, visible

__all__ = [
    "SymmetricAttention",
    "RPCAttention",
    "ScaledAttention",
    "configure",
    "replace_attention",
    "resolve_blocks",
]

# FX: record every call of pap as one node instead of tracing through it (its mask handling and checks
# branch on shapes); the GraphModule then calls pap itself, with real tensors.
torch.fx.wrap("pap")


def _is_proxy(x: object) -> bool:
    """True for an FX symbolic-tracing proxy: its shape is no concrete number to check."""
    return isinstance(x, torch.fx.Proxy)


class _HeadsAttention(nn.Module):
    """Shared plumbing: projections to heads, qk-norm, hook points, output projection."""

    #: names of the input projections this layer has, in the order they are stacked
    projections: tuple[str, ...] = ("q", "k", "v")

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Callable[..., nn.Module] | None = None,
        device: Any = None,
        dtype: Any = None,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        gated: bool = False,
        depth: int = 0,
    ) -> None:
        super().__init__()
        # timm's Attention takes these too; only their defaults are supported here. An unknown
        # keyword is a TypeError (not swallowed), so a misspelt option of configure() is caught.
        del depth  # timm's block index, used by none of these layers
        for name, value in (("dim", dim), ("num_heads", num_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be an integer >= 1, got {value!r}")
        if gated or dim_out not in (None, dim) or attn_head_dim not in (None, dim // max(num_heads, 1)):
            raise ValueError(
                f"{type(self).__name__} supports timm's attn_head_dim, dim_out and gated only at their "
                f"defaults (got attn_head_dim={attn_head_dim}, dim_out={dim_out}, gated={gated})"
            )
        if dim % num_heads != 0:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("norm_layer must be given when qk_norm or scale_norm is True")
        dd = {"device": device, "dtype": dtype}
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_dim = dim
        in_proj = nn.Linear(dim, len(self.projections) * dim, bias=qkv_bias, **dd)
        # timm's name for the fused projection is ``qkv``; the symmetric one holds only K and V.
        self.add_module("".join(self.projections), in_proj)
        has_q = "q" in self.projections
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm and has_q else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.hook_q, self.hook_k, self.hook_v = nn.Identity(), nn.Identity(), nn.Identity()

    @property
    def in_proj(self) -> nn.Linear:
        return getattr(self, "".join(self.projections))

    def split_heads(self, x: Tensor) -> dict[str, Tensor]:
        """``(B, N, C)`` -> ``{"q"?, "k", "v"}`` each ``(B, H, N, D)``, normed and hooked."""
        b, n, _ = x.shape
        parts = self.in_proj(x).reshape(b, n, len(self.projections), self.num_heads, self.head_dim)
        parts = parts.permute(2, 0, 3, 1, 4)  # (S, B, H, N, D); indexed, as FX cannot iterate a proxy
        out = {name: parts[i] for i, name in enumerate(self.projections)}
        out["k"] = self.hook_k(self.k_norm(out["k"]))
        out["q"] = self.hook_q(self.q_norm(out["q"])) if "q" in out else self.hook_q(out["k"])
        out["v"] = self.hook_v(out["v"])
        return out

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """``x (B, N, C)`` -> ``(B, N, C)``; ``attn_mask`` an SDPA mask broadcastable to (B, H, N, N)."""
        if not _is_proxy(x) and (x.dim() != 3 or x.shape[-1] != self.attn_dim):
            raise ValueError(
                f"{type(self).__name__}: x must be (B, N, {self.attn_dim}), got {tuple(x.shape)}"
            )
        b, n, _ = x.shape
        out = self.attend(self.split_heads(x), attn_mask, is_causal)  # (B, H, N, D)
        out = self.norm(out.transpose(1, 2).reshape(b, n, self.attn_dim))
        return self.proj_drop(self.proj(out))

    @property
    def dropout_p(self) -> float:
        return self.attn_drop.p if self.training else 0.0


class SymmetricAttention(_HeadsAttention):
    """Symmetric softmax attention: ``softmax(K K^T / sqrt(D)) V`` (W_Q = W_K, bias included)."""

    projections = ("k", "v")

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        k = qkv["k"]
        return F.scaled_dot_product_attention(
            k, k, qkv["v"], attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout_p
        )


class RPCAttention(_HeadsAttention):
    """Attention with Robust Principal Components: ``n_iter`` steps of PAP on (K, V).

    Args (besides timm's):
        n_iter: PAP softmax evaluations (official README: 4 in the first layer).
        lam: lambda of the shrinkage threshold (official: 4).
        threshold: ``"lambda_mu"`` (official code) or ``"lambda_over_mu"`` (paper).
        mu_dim: width in mu = N * mu_dim / (4 ||K||_1); None = full width (official code).
        symmetric: False adds a query projection, softmax(Q (K - S - Y/mu)^T) V (paper E.9).
        record_trace: keep the per-iteration PAP diagnostics of the last forward in
            ``self.last_trace`` (off by default: nothing extra is computed).
        sparse: False forces the sparse component to zero (ablation: iterated attention with dual
            feedback, no shrinkage).
        dual: False removes the dual update (ablation: Y = 0 throughout).
        validate: :func:`~kpca_attention.pap.pap`'s ``validate``: None checks inputs for NaN/Inf in
            eager mode on the CPU only (no host sync on an accelerator), True on every device.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args: Any,
        n_iter: int = 4,
        lam: float = 4.0,
        threshold: str = "lambda_mu",
        mu_dim: int | None = None,
        symmetric: bool = True,
        record_trace: bool = False,
        sparse: bool = True,
        dual: bool = True,
        validate: bool | None = None,
        **kwargs: Any,
    ) -> None:
        check_options(n_iter=n_iter, lam=lam, threshold=threshold, mu_dim=mu_dim, where="RPCAttention")
        for name, value in (("symmetric", symmetric), ("record_trace", record_trace), ("sparse", sparse),
                            ("dual", dual)):
            if not isinstance(value, bool):
                raise ValueError(f"RPCAttention: {name} must be True or False, got {value!r}")
        if validate not in (None, True, False):
            raise ValueError(f"RPCAttention: validate must be None, True or False, got {validate!r}")
        self.projections = ("k", "v") if symmetric else ("q", "k", "v")
        super().__init__(dim, num_heads, *args, **kwargs)
        self.n_iter, self.lam, self.threshold, self.mu_dim = n_iter, lam, threshold, mu_dim
        self.symmetric = symmetric
        self.sparse, self.dual = sparse, dual
        self.validate = validate
        self.record_trace = record_trace
        self.last_trace: dict | None = None

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        result = pap(
            qkv["k"], qkv["v"], self.n_iter, self.lam,
            mu_dim=self.mu_dim, threshold=self.threshold,
            q=None if self.symmetric else qkv["q"],
            attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout_p,
            sparse=self.sparse, dual=self.dual, return_info=self.record_trace, validate=self.validate,
        )
        if self.record_trace:
            result, self.last_trace = result
        return result

    def extra_repr(self) -> str:
        ablations = "".join(f", {name}=False" for name in ("sparse", "dual") if not getattr(self, name))
        return (f"n_iter={self.n_iter}, lam={self.lam}, threshold={self.threshold!r}, "
                f"mu_dim={self.mu_dim}, symmetric={self.symmetric}{ablations}")


def _masked_scale(s: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    """Scaled Attention's learned S ``(H, N, N)`` with the mask of A, so that S V brings in nothing A
    may not see (padding, future): zero where ``attn_mask`` hides a key, or above the diagonal."""
    if is_causal:
        s = s.tril()
    if attn_mask is not None:
        s = torch.where(visible(attn_mask), s, 0.0)
    return s


# FX: timm's VisionTransformer.forward takes attn_mask and is_causal, so a traced graph sees them as
# inputs; the branches on them run when the graph runs.
torch.fx.wrap("_masked_scale")


class ScaledAttention(_HeadsAttention):
    """Scaled Attention (paper Remark 3, appendix E.1): ``A (I - S) V`` with A = softmax(Q K^T / sqrt(D)).

    Args (besides timm's):
        mode: ``"scalar"``: S = alpha * A_sym with A_sym = softmax(K K^T / sqrt(D)) and one learned
            alpha per layer (init 0); ``"matrix"``: a learned S of shape (H, N, N) (init 0), which
            fixes the number of tokens.
        num_tokens: N, required by ``mode="matrix"``.

    Both modes start as ordinary attention (S = 0). Computed without forming A:
    ``A (I - S) V = SDPA(Q, K, V - S V)``, where ``S V`` is ``S @ V`` or ``alpha * SDPA(K, K, V)``.
    Masks (``attn_mask``, ``is_causal``) apply to A_sym and, in matrix mode, to the learned S as well
    (entries that A may not attend to are zeroed), so S V brings in no hidden or future token.
    """

    MODES = ("scalar", "matrix")

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args: Any,
        mode: Literal["scalar", "matrix"] = "scalar",
        num_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, *args, **kwargs)
        if mode not in self.MODES:
            raise ValueError(f"ScaledAttention: unknown mode {mode!r}; valid: {', '.join(self.MODES)}")
        self.mode = mode
        self.num_tokens = num_tokens
        dd = {"device": self.proj.weight.device, "dtype": self.proj.weight.dtype}  # timm's device=, dtype=
        if mode == "matrix":
            if num_tokens is None or num_tokens < 1:
                raise ValueError(
                    "ScaledAttention(mode='matrix') needs num_tokens >= 1 (the fixed sequence length)"
                )
            self.scale_s = nn.Parameter(torch.zeros(num_heads, num_tokens, num_tokens, **dd))
        else:
            self.alpha = nn.Parameter(torch.zeros(1, **dd))

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        q, k, v = qkv["q"], qkv["k"], qkv["v"]
        if self.mode == "matrix":
            n = v.shape[-2]
            if not _is_proxy(n) and n != self.num_tokens:
                raise ValueError(
                    f"ScaledAttention(mode='matrix') was built for {self.num_tokens} tokens, got {n}"
                )
            sv = _masked_scale(self.scale_s.to(v.dtype), attn_mask, is_causal) @ v
        else:
            a_sym_v = F.scaled_dot_product_attention(k, k, v, attn_mask=attn_mask, is_causal=is_causal)
            sv = self.alpha * a_sym_v
        return F.scaled_dot_product_attention(
            q, k, v - sv, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout_p
        )

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, num_tokens={self.num_tokens}"


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
    lin = layer.in_proj if isinstance(layer, _HeadsAttention) else getattr(layer, "qkv", None)
    if not isinstance(lin, nn.Linear):
        raise TypeError(f"cannot read q/k/v projections of {type(layer).__name__} (no fused qkv Linear)")
    ws = lin.weight.chunk(len(names), 0)
    bs = lin.bias.chunk(len(names), 0) if lin.bias is not None else [None] * len(names)
    out = dict(zip(names, zip(ws, bs, strict=True), strict=True))
    out.setdefault("q", out["k"])  # symmetric: W_Q = W_K
    return out


@torch.no_grad()
def _carry_weights(old: nn.Module, new: _HeadsAttention) -> None:
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
    idx = [spec] if isinstance(spec, int) else list(spec)
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
    in_proj = old.in_proj if isinstance(old, _HeadsAttention) else getattr(old, "qkv", None)
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
        n_parts = len(old.projections) if isinstance(old, _HeadsAttention) else 3
        if proj.out_features != dim or getattr(old, "gate", None) is not None:
            problems.append(f"gated attention or dim_out != dim (proj is {dim} -> {proj.out_features})")
        if in_proj.in_features != dim or in_proj.out_features != n_parts * dim:
            problems.append(f"`qkv` is {in_proj.in_features} -> {in_proj.out_features}, not {dim} -> "
                            f"{n_parts * dim}")
        elif dim % heads:
            problems.append(f"num_heads {heads} does not divide dim {dim}")
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
