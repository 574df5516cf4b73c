"""State carried across layers, passed explicitly through the model (no module globals).

Some mechanisms read what earlier layers computed: NeuTRENO and PIDformer the first layer's values
V^0 (and PID the integral and the previous error), Elliptical attention the previous layer's values.
That state is a plain ``dict[str, Tensor]`` created empty at the start of every forward pass and
threaded through the blocks: ``x, state = block(x, state)``. Nothing is kept on a module between two
forward passes, so DDP, ``torch.compile`` (the dict is a pytree), FX (the dict holds proxies while
tracing) and hooks see an ordinary function of the input.

* :class:`StatefulAttention` - the base of such mechanisms: ``forward(x, ..., state=None)``. With a
  ``state`` dict it returns ``(out, new_state)``; without one it runs on a fresh empty state and returns
  ``out`` only (the layer alone, as if it were the first: e.g. NeuTRENO then is plain attention).
  Subclasses implement ``attend_state(qkv, attn_mask, is_causal, state) -> (out, state)`` and never
  mutate the dict they are given (they return ``{**state, ...}``).
* :class:`StatefulBlock` - timm's ``Block`` (same parameters, same state-dict keys) whose forward takes
  ``state`` as its second argument: ``block(x)`` is timm's block, ``block(x, state)`` returns
  ``(x, state)``. Attention layers without state (timm's ``Attention``, the other mechanisms) pass the
  state through unchanged.
* :func:`run_blocks` - run a sequence of blocks threading one state from an empty dict, optionally
  collecting intermediate outputs (``forward_intermediates``) and with gradient checkpointing.
* :class:`StatefulBlocks` - ``nn.Sequential`` of blocks whose forward is :func:`run_blocks` (a drop-in
  for ``VisionTransformer.blocks``: same indices, slicing, state-dict keys).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from timm.models.vision_transformer import Block
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..checks import Bool
from .base import HeadsAttention, is_proxy

__all__ = ["State", "StatefulAttention", "StatefulBlock", "StatefulBlocks", "run_blocks", "is_stateful"]

#: the cross-layer state of one forward pass
State = dict[str, Tensor]


def is_stateful(module: nn.Module) -> bool:
    """Whether ``module`` is an attention layer that reads or writes the cross-layer state."""
    return bool(getattr(module, "stateful", False))


class StatefulAttention(HeadsAttention):
    """Base of the mechanisms with cross-layer state (see the module docstring).

    ``applied``: False keeps the layer's bookkeeping (it still records what later layers need, e.g. its
    values) but computes plain softmax attention: the blocks outside a mechanism's ``layers``. (Not
    ``apply``: an attribute of that name would hide ``nn.Module.apply``, so ``model.apply(init_fn)`` broke.)
    """

    stateful = True
    parameter_constraints = {**HeadsAttention.parameter_constraints, "symmetric": Bool(),
                             "applied": Bool()}

    def __init__(self, dim: int, num_heads: int = 8, *args: Any, symmetric: bool = False,
                 applied: bool = True, **kwargs: Any) -> None:
        self.validate_options(symmetric=symmetric, applied=applied)
        self.projections = ("k", "v") if symmetric else ("q", "k", "v")
        super().__init__(dim, num_heads, *args, **kwargs)
        self.symmetric, self.applied = symmetric, applied

    def attend_state(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool,
                     state: State) -> tuple[Tensor, State]:
        raise NotImplementedError

    def attend(self, qkv: dict[str, Tensor], attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        return self.attend_state(qkv, attn_mask, is_causal, {})[0]

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                state: State | None = None) -> Tensor | tuple[Tensor, State]:
        """``x (B, N, C)`` -> ``(B, N, C)``, or ``(out, new_state)`` when ``state`` is given."""
        attn_mask, is_causal = self.check_inputs(x, attn_mask, is_causal)  # before any warning: errors
        if state is None and self.applied and not is_proxy(x):
            warnings.warn(
                f"{type(self).__name__} ran without the cross-layer state, so it computed what a first "
                "layer computes (NeuTRENO, PIDformer, Elliptical: plain attention); inside a model use its "
                "registered models (e.g. neutreno_vit_*) or StatefulBlocks, which pass the state "
                "(attention/stateful.py)",
                stacklevel=4)  # past torch's module call: at the block that called the layer
        b, n, _ = x.shape
        out, new_state = self.attend_state(self.split_heads(x), attn_mask, is_causal,
                                           {} if state is None else state)
        out = self.hook_z(out)
        out = self.norm(out.transpose(1, 2).reshape(b, n, self.attn_dim))
        out = self.proj_drop(self.proj(out))
        return out if state is None else (out, new_state)

    def extra_repr(self) -> str:
        return f"symmetric={self.symmetric}, applied={self.applied}"


class StatefulBlock(Block):
    """timm's pre-norm ``Block`` that threads the cross-layer state through its attention layer."""

    def forward(self, x: Tensor, state: State | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor | tuple[Tensor, State]:
        if state is None:
            return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)
        if is_stateful(self.attn):
            a, state = self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal, state=state)
        else:
            a = self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)
        x = x + self.drop_path1(self.ls1(a))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x, state


def _call_block(blk: nn.Module, x: Tensor, state: State, attn_mask: Tensor | None,
                is_causal: bool) -> tuple[Tensor, State]:
    if isinstance(blk, StatefulBlock):
        return blk(x, state, attn_mask=attn_mask, is_causal=is_causal)
    if attn_mask is not None or is_causal:
        return blk(x, attn_mask=attn_mask, is_causal=is_causal), state
    return blk(x), state


def run_blocks(
    blocks: Iterable[nn.Module],
    x: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    take: Sequence[int] | None = None,
    grad_checkpointing: bool = False,
) -> tuple[Tensor, list[Tensor]]:
    """Run ``blocks`` in order on ``x`` with one state created empty here.

    Returns ``(x, intermediates)``: the output of the last block and the outputs of the blocks whose
    index is in ``take`` (empty when ``take`` is None). ``grad_checkpointing`` recomputes each block
    in the backward pass (non-reentrant ``torch.utils.checkpoint``, which carries the state dict).
    """
    state: State = {}
    wanted = set(take or ())
    intermediates = []
    for i, blk in enumerate(blocks):
        if grad_checkpointing and not torch.jit.is_scripting() and torch.is_grad_enabled():
            x, state = checkpoint(_call_block, blk, x, state, attn_mask, is_causal, use_reentrant=False)
        else:
            x, state = _call_block(blk, x, state, attn_mask, is_causal)
        if i in wanted:
            intermediates.append(x)
    return x, intermediates


class StatefulBlocks(nn.Sequential):
    """``nn.Sequential`` of blocks run with one cross-layer state per forward (:func:`run_blocks`)."""

    grad_checkpointing: bool = False

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        return run_blocks(self, x, attn_mask=attn_mask, is_causal=is_causal,
                          grad_checkpointing=self.grad_checkpointing)[0]
