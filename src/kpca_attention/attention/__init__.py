"""Attention mechanisms of the kernel-PCA view, drop-in for timm's ``Attention`` (as timm keeps ``layers/``).

Every layer takes timm's constructor arguments (``dim, num_heads, qkv_bias, qk_norm, scale_norm,
proj_bias, attn_drop, proj_drop, norm_layer, device, dtype``) and ``forward(x, attn_mask=None,
is_causal=False)`` with ``x`` of shape ``(B, N, C)``, so each can be given to
``timm.models.vision_transformer.VisionTransformer`` or ``Block`` as ``attn_layer``.

* :class:`SymmetricAttention` - one Linear(dim, 2 dim) for K and V, no Q: softmax(K K^T / sqrt(D)) V.
* :class:`RPCAttention` - Principal Attention Pursuit (:func:`kpca_attention.pap.pap`) on K, V;
  ``symmetric=False`` adds queries (the paper's appendix E.9).
* :class:`ScaledAttention` - Q, K, V with output A (I - S) V (paper Remark 3 / E.1).
* The robust-attention family, with state across layers (:mod:`.stateful`):
  :class:`NeuTRENOAttention` (A V + lambda (V^0 - V)), :class:`PIDAttention` (PID feedback toward V^0),
  :class:`EllipticalAttention` (a Mahalanobis metric on the queries from the change of the values);
  stateless: :class:`TwicingAttention` ((2A - A^2) V), :class:`KdeAttention` / :class:`RobustAttention`
  (KDE and robust KDE attention), :class:`PositionAwareAttention` (RVT's learned N x N logit scaling).

Named hook points (TransformerLens style, :mod:`.hooks`): ``hook_q``, ``hook_k``, ``hook_v`` are identity
modules that see the per-head ``(B, H, N, D)`` tensors (bias included, after qk-norm); register a
forward hook on them to read q, k, v of any layer; ``hook_z`` sees the heads' outputs before the output
projection. In symmetric layers ``hook_q`` sees the keys (Q = K).
RPC layers add PAP's inner states (``hook_mu``, ``hook_tau``, ``hook_L.t``, ``hook_W.t``,
``hook_S_density.t``); :func:`run_with_cache` reads every hook point of a model in one forward pass.

Modules: :mod:`.hooks` (``HookPoint``, ``run_with_cache``), :mod:`.base` (``HeadsAttention``, the options
table), one module per mechanism (:mod:`.symmetric`, :mod:`.rpc`, :mod:`.scaled`), :mod:`.replace`
(``configure``, ``replace_attention``, ``resolve_blocks``), :mod:`.registry` (``register_mechanism``,
``get_mechanism``, ``mechanisms``: one name gives every model, see :mod:`kpca_attention.models.family`) and
:mod:`.stateful` (state carried across layers, passed explicitly through the blocks), :mod:`.adaptive`
(``adaptive_gradients``: what an adaptive attack switches on). A new mechanism
is one more module that registers itself.

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

from .adaptive import adaptive_gradients, adaptive_layers
from .base import HeadsAttention, PapOption
from .elliptical import EllipticalAttention
from .hooks import HookPoint, run_with_cache
from .kde import KdeAttention, RobustAttention
from .neutreno import NeuTRENOAttention
from .pid import PIDAttention
from .registry import Mechanism, get_mechanism, mechanisms, register_mechanism
from .replace import configure, replace_attention, resolve_blocks
from .rpc import RPCAttention
from .rvt import PositionAwareAttention
from .scaled import ScaledAttention
from .stateful import StatefulAttention, StatefulBlock, StatefulBlocks, run_blocks
from .symmetric import SymmetricAttention
from .twicing import TwicingAttention

__all__ = [
    "SymmetricAttention",
    "RPCAttention",
    "ScaledAttention",
    "configure",
    "replace_attention",
    "resolve_blocks",
    "HookPoint",
    "run_with_cache",
    "HeadsAttention",
    "PapOption",
    "Mechanism",
    "register_mechanism",
    "get_mechanism",
    "mechanisms",
    "StatefulAttention",
    "StatefulBlock",
    "StatefulBlocks",
    "run_blocks",
    "NeuTRENOAttention",
    "PIDAttention",
    "EllipticalAttention",
    "TwicingAttention",
    "KdeAttention",
    "RobustAttention",
    "PositionAwareAttention",
    "adaptive_gradients",
    "adaptive_layers",
]
