"""Read q, k, v of every attention layer: this project's layers, timm ViTs, Hugging Face encoders.

Each captured tensor is ``(B, H, N, D)`` per layer: the input projections' outputs split into heads,
bias included, before attention and the output projection.

* This project's layers (:mod:`kpca_attention.attention`): forward hooks on the identity hook points
  ``hook_q / hook_k / hook_v`` (after qk-norm; symmetric layers have q = k).
* timm ``Attention`` (anything with a fused ``qkv`` Linear and ``num_heads``): a hook on the ``qkv``
  output, split as timm splits it; timm applies ``q_norm`` / ``k_norm`` after the split, so the
  module's own norms are applied to the captured q and k too (identity unless ``qk_norm=True``).
* Hugging Face BERT-family self-attention (``query / key / value`` Linears; also DistilBERT's
  ``q_lin / k_lin / v_lin``): hooks on the three outputs, reshaped to heads.
* Hugging Face causal decoders whose attention layers dispatch through transformers'
  ``AttentionInterface`` (GPT-2, Llama, Qwen, Mistral, OPT, ... in transformers 5): inside the context
  the model runs a registered attention function, ``kpca_capture``, that records the q, k, v the
  attention itself receives - after rotary position embeddings - and then calls the model's own eager
  attention (outputs unchanged; tested). Grouped key/value heads are repeated to the query heads, as the
  attention does, and q, k are rescaled so that ``q k^T / sqrt(D)`` equals the layer's logits when its
  scaling is not ``1 / sqrt(D)``.

Padding is not handled here: the caller keeps the token mask and crops each sequence to its real
tokens (see :mod:`kpca_attention.kpca.analysis`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention import RPCAttention
from .pap_trace import TraceRecorder

__all__ = ["AttentionSite", "find_attention_sites", "QKVCapture", "CAPTURE_IMPLEMENTATION"]

SiteKind = Literal["project", "timm", "hf", "hf_causal"]

#: the name under which :class:`QKVCapture` registers its attention function with transformers
CAPTURE_IMPLEMENTATION = "kpca_capture"
#: id(attention module) -> (capture, site index) of the captures currently open
_OPEN: dict[int, tuple[QKVCapture, int]] = {}

_HF_NAMES = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"))


@dataclass
class AttentionSite:
    """One attention layer: its module path, module, kind, heads and head width."""

    name: str
    module: nn.Module
    kind: SiteKind
    num_heads: int
    head_dim: int
    projections: tuple[str, str, str] = ("q", "k", "v")
    extra: dict = field(default_factory=dict)

    @property
    def layer_type(self) -> str:
        return type(self.module).__name__


def _hf_heads(module: nn.Module, model: nn.Module) -> int | None:
    for attr in ("num_attention_heads", "num_heads", "n_heads"):
        n = getattr(module, attr, None)
        if isinstance(n, int) and n > 0:
            return n
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "num_attention_heads", None)
    return n if isinstance(n, int) and n > 0 else None


def _is_interface_attention(module: nn.Module) -> bool:
    """A transformers attention layer that dispatches through ``AttentionInterface`` and is causal."""
    cfg = getattr(module, "config", None)
    return (getattr(module, "is_causal", None) is True and "Attention" in type(module).__name__
            and isinstance(getattr(module, "head_dim", None), int) and hasattr(cfg, "_attn_implementation"))


def _classify(module: nn.Module, model: nn.Module, name: str) -> AttentionSite | None:
    if all(
        isinstance(getattr(module, h, None), nn.Module) for h in ("hook_q", "hook_k", "hook_v")
    ) and hasattr(module, "num_heads"):
        return AttentionSite(name, module, "project", int(module.num_heads), int(module.head_dim))
    qkv = getattr(module, "qkv", None)
    if isinstance(qkv, nn.Linear) and isinstance(getattr(module, "num_heads", None), int):
        h = int(module.num_heads)
        if qkv.out_features % (3 * h) == 0:
            return AttentionSite(name, module, "timm", h, qkv.out_features // (3 * h))
    for names in _HF_NAMES:
        lins = [getattr(module, n, None) for n in names]
        if all(isinstance(lin, nn.Linear) for lin in lins):
            h = _hf_heads(module, model)
            width = lins[0].out_features
            if h is None or width % h:
                raise ValueError(f"{name}: cannot tell the number of heads of {type(module).__name__}")
            return AttentionSite(name, module, "hf", h, width // h, projections=names)  # type: ignore[arg-type]
    if _is_interface_attention(module):
        h = getattr(module.config, "num_attention_heads", None) or getattr(module.config, "n_head", None)
        if not isinstance(h, int):
            raise ValueError(f"{name}: cannot tell the number of heads of {type(module).__name__}")
        return AttentionSite(name, module, "hf_causal", h, int(module.head_dim), extra={"causal": True})
    return None


def find_attention_sites(model: nn.Module) -> list[AttentionSite]:
    """All attention layers of ``model`` in module order (outermost match wins).

    Raises:
        ValueError: no supported attention layer was found.
    """
    sites: list[AttentionSite] = []
    taken: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(t + ".") for t in taken):
            continue
        site = _classify(module, model, name)
        if site is not None:
            sites.append(site)
            taken.append(name)
    if not sites:
        raise ValueError(
            f"no attention layer found in {type(model).__name__}: supported are this project's layers "
            "(hook_q/hook_k/hook_v), timm Attention (fused qkv Linear + num_heads) and Hugging Face "
            "self-attention (query/key/value or q_lin/k_lin/v_lin Linears, and causal decoders that use "
            "transformers' AttentionInterface: GPT-2, Llama, Qwen, OPT, ...)"
        )
    return sites


def _heads(x: Tensor, h: int) -> Tensor:
    """``(B, N, H*D)`` -> ``(B, H, N, D)``."""
    b, n, c = x.shape
    return x.reshape(b, n, h, c // h).transpose(1, 2)


def _capture_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: object,
                       **kwargs: object) -> object:
    """The attention function registered as ``kpca_capture``: record q, k, v, run the model's eager
    attention."""
    slot = _OPEN.get(id(module))
    if slot is not None:
        cap, i = slot
        rep = query.shape[1] // key.shape[1]
        d = query.shape[-1]
        scaling = kwargs.get("scaling")
        factor = 1.0 if scaling is None else float(scaling * d**0.5) ** 0.5
        k = key.detach().repeat_interleave(rep, dim=1) * factor
        cap.records[i].update(q=query.detach() * factor, k=k, v=value.detach().repeat_interleave(rep, dim=1))
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward as eager
    return eager(module, query, key, value, attention_mask, **kwargs)


def _register_capture() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(CAPTURE_IMPLEMENTATION, _capture_attention)
    AttentionMaskInterface.register(CAPTURE_IMPLEMENTATION, eager_mask)


class QKVCapture:
    """Context manager recording q, k, v of each site on every forward pass.

    >>> with QKVCapture(model) as cap:
    ...     model(x)
    >>> cap.records[0]["k"].shape   # (B, H, N, D) of the first attention layer

    ``records[i]`` is a dict ``{"q", "k", "v"}`` of detached tensors for ``sites[i]`` from the last
    forward pass (call :meth:`clear` between batches, or read them before the next forward).
    RPC layers get a :class:`~kpca_attention.kpca.pap_trace.TraceRecorder` on their hook points while
    inside the context; the PAP trace of their last forward goes into ``records[i]["pap_trace"]``. This
    project's layers also record whether they were called causally (``records[i]["causal"]``).
    """

    def __init__(self, model: nn.Module, sites: list[AttentionSite] | None = None) -> None:
        self.model = model
        self.sites = sites if sites is not None else find_attention_sites(model)
        self.records: list[dict[str, object]] = [{} for _ in self.sites]
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._recorders: list[TraceRecorder] = []
        self._implementation: str | None = None

    # hooks -------------------------------------------------------------------------------------
    def _store(self, i: int, key: str):
        def hook(_mod: nn.Module, _inp: object, out: Tensor) -> None:
            self.records[i][key] = out.detach()

        return hook

    def _store_timm(self, i: int, site: AttentionSite):
        attn = site.module

        def hook(_mod: nn.Module, _inp: object, out: Tensor) -> None:
            b, n, _ = out.shape
            qkv = out.detach().reshape(b, n, 3, site.num_heads, site.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            with torch.no_grad():  # timm applies these after the split
                q = getattr(attn, "q_norm", nn.Identity())(q)
                k = getattr(attn, "k_norm", nn.Identity())(k)
            self.records[i].update(q=q, k=k, v=v)

        return hook

    def _store_hf(self, i: int, key: str, heads: int):
        def hook(_mod: nn.Module, _inp: object, out: Tensor) -> None:
            self.records[i][key] = _heads(out.detach(), heads)

        return hook

    def _store_causal(self, i: int):
        def hook(_mod: nn.Module, args: tuple, kwargs: dict) -> None:  # forward(x, attn_mask, is_causal)
            self.records[i]["causal"] = bool(kwargs.get("is_causal", args[2] if len(args) > 2 else False))

        return hook

    def _store_trace(self, i: int) -> Callable[[dict[str, Any]], None]:
        def store(trace: dict[str, Any]) -> None:
            self.records[i]["pap_trace"] = trace

        return store

    def __enter__(self) -> QKVCapture:
        for i, site in enumerate(self.sites):
            m = site.module
            if site.kind == "project":
                for key in ("q", "k", "v"):
                    self._handles.append(getattr(m, f"hook_{key}").register_forward_hook(self._store(i, key)))
                self._handles.append(m.register_forward_pre_hook(self._store_causal(i), with_kwargs=True))
                if isinstance(m, RPCAttention):
                    self._recorders.append(TraceRecorder(m, on_trace=self._store_trace(i)).attach())
            elif site.kind == "timm":
                self._handles.append(m.qkv.register_forward_hook(self._store_timm(i, site)))
            elif site.kind == "hf_causal":
                _OPEN[id(m)] = (self, i)
            else:
                for key, attr in zip(("q", "k", "v"), site.projections, strict=False):
                    lin = getattr(m, attr)
                    self._handles.append(lin.register_forward_hook(self._store_hf(i, key, site.num_heads)))
        if any(site.kind == "hf_causal" for site in self.sites):
            _register_capture()
            self._implementation = self.model.config._attn_implementation
            self.model.set_attn_implementation(CAPTURE_IMPLEMENTATION)
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for r in self._recorders:
            r.detach()
        self._recorders.clear()
        for site in self.sites:
            if _OPEN.get(id(site.module), (None,))[0] is self:
                del _OPEN[id(site.module)]
        if self._implementation is not None:
            self.model.set_attn_implementation(self._implementation)
            self._implementation = None

    def clear(self) -> None:
        self.records = [{} for _ in self.sites]

    def __iter__(self) -> Iterator[tuple[AttentionSite, dict[str, object]]]:
        return iter(zip(self.sites, self.records, strict=False))

    def check_complete(self) -> None:
        """Raise if a site saw no forward pass (e.g. a layer the model skips)."""
        missing = [s.name for s, r in self if not {"q", "k", "v"} <= r.keys()]
        if missing:
            raise RuntimeError(f"no q/k/v captured for {missing}; did the forward pass run through them?")
