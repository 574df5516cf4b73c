"""What Principal Attention Pursuit does inside a model: the PAP trace over a dataset .

:func:`trace_model` reads PAP's inner states from the hook points of every
:class:`~kpca_attention.attention.RPCAttention` of a model (``hook_k``, ``hook_mu``, ``hook_tau``,
``hook_L.t``, ``hook_W.t``; :class:`TraceRecorder`), runs batches through it and aggregates the
per-iteration diagnostics they give (:class:`kpca_attention.pap.PAPTrace`, the numbers of
``pap(..., return_info=True)``) per RPC layer and head across the data:

* ``s_density`` - fraction of non-zero entries of the sparse component S_t;
* ``tau`` and ``k_abs_max`` - the shrinkage threshold and max |K| (per (sample, head));
* ``primal_residual`` ||K - L - S|| / ||K||, ``dual_norm`` ||Y|| / ||K||,
  ``l_change`` ||L_t - L_{t-1}|| / ||L_t||.

PAP reports each quantity per iteration and head, averaged over the samples of a batch; here every
batch is one observation. ``mean`` is the sample-weighted mean over batches and heads, ``std`` the
spread across batches (of the head mean), ``head_std`` the spread across heads, ``min`` / ``max`` over
batches and heads. S is "active" when some batch has a non-zero density: since densities are
non-negative, a zero batch mean means S = 0 for every sample of that batch, so the statement is exact.
``tau_over_kmax`` is tau / max|K| per (batch, head) (batch means of both): above 1, the first step
shrinks nothing (S_1 = 0); later steps shrink ``K - L_{t-1} + Y_{t-1} / mu``, which s_density covers.

:func:`kpca_attention.report.pap_trace.write_trace_report` writes ``pap_trace.json``, ``report.md``
and one PNG per RPC layer; ``kpca-attention pap-trace`` does both for a checkpoint or a model name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..attention import RPCAttention
from ..modules import eval_mode
from ..pap import TRACE_KEYS, PAPTrace, key_validity

__all__ = [
    "rpc_layers", "recording", "TraceRecorder", "trace_model", "trace_statement", "lm_text_batches",
    "QUANTITIES",
]

QUANTITIES: tuple[str, ...] = TRACE_KEYS


def rpc_layers(model: nn.Module) -> dict[str, RPCAttention]:
    """``{module name: layer}`` of every :class:`RPCAttention` in ``model``, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, RPCAttention)}


class TraceRecorder:
    """The PAP trace of one RPC layer's forward passes, read from its hook points.

    While attached, forward hooks on ``hook_k``, ``hook_mu``, ``hook_tau``, ``hook_L.t`` and ``hook_W.t``
    (and a pre-hook for the ``attn_mask``) keep the states of the running forward; when the layer
    returns, :class:`~kpca_attention.pap.PAPTrace` turns them into the per-iteration diagnostics,
    which go to ``last`` (and to ``on_trace``, if given). These are the states ``pap`` itself traces
    with ``return_info=True``, so the numbers are the same to the last bit.
    """

    def __init__(self, layer: RPCAttention, on_trace: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.layer = layer
        self.on_trace = on_trace
        self.last: dict[str, Any] | None = None
        self._states: dict[str, Any] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def _keep(self, key: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _inputs: Any, out: Tensor) -> None:
            self._states[key] = out.detach()

        return hook

    def _start(self, _module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self._states = {"attn_mask": kwargs.get("attn_mask", args[1] if len(args) > 1 else None)}

    def _finish(self, _module: nn.Module, _args: Any, _out: Any) -> None:
        st, n_iter = self._states, len(self.layer.hook_L)
        k = st["k"]
        trace = PAPTrace(k, st["mu"], st["tau"], key_validity(st["attn_mask"], k), dual=self.layer.dual)
        for t in range(n_iter):
            trace.record(st[f"L.{t}"], st.get(f"L.{t - 1}"), st.get(f"W.{t - 1}"))
        self.last, self._states = trace.info, {}
        if self.on_trace is not None:
            self.on_trace(trace.info)

    def attach(self) -> TraceRecorder:
        m = self.layer
        points = {"k": m.hook_k, "mu": m.hook_mu, "tau": m.hook_tau}
        points.update({f"L.{t}": p for t, p in enumerate(m.hook_L)})
        points.update({f"W.{t}": p for t, p in enumerate(m.hook_W)})
        self._handles = [p.register_forward_hook(self._keep(key)) for key, p in points.items()]
        self._handles.append(m.register_forward_pre_hook(self._start, with_kwargs=True))
        self._handles.append(m.register_forward_hook(self._finish))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


@contextmanager
def recording(model: nn.Module) -> Iterator[dict[str, TraceRecorder]]:
    """A :class:`TraceRecorder` on every RPC layer of ``model`` (``{name: recorder}``), removed on exit."""
    recorders = {name: TraceRecorder(m) for name, m in rpc_layers(model).items()}
    try:
        for r in recorders.values():
            r.attach()
        yield recorders
    finally:
        for r in recorders.values():
            r.detach()


def _default_forward(model: nn.Module, batch: Any) -> int:
    """Run one batch (a tensor, ``(inputs, labels)`` or a dict of model kwargs); returns its size."""
    if isinstance(batch, dict):
        model(**batch)
        return int(next(iter(batch.values())).shape[0])
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    device = next(model.parameters()).device
    model(x.to(device))
    return int(x.shape[0])


def _weighted_std(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted standard deviation over axis 0 (NaN-aware through the caller's masking)."""
    mean = np.tensordot(w, x, axes=1)
    return np.sqrt(np.maximum(np.tensordot(w, (x - mean) ** 2, axes=1), 0.0))


def _stats(arr: np.ndarray, w: np.ndarray) -> dict[str, list[float]]:
    """``arr`` (batches, iterations, heads) -> per iteration: mean, std across batches, head_std, min, max."""
    with np.errstate(invalid="ignore"):
        per_head = np.tensordot(w, arr, axes=1)  # (T, H), sample-weighted over batches
        head_mean_b = arr.mean(-1)  # (B, T)
        return {
            "mean": per_head.mean(-1).tolist(),
            "std": _weighted_std(head_mean_b, w).tolist(),
            "head_std": per_head.std(-1).tolist(),
            "min": arr.min(axis=(0, 2)).tolist(),
            "max": arr.max(axis=(0, 2)).tolist(),
            "per_head": per_head.T.tolist(),  # (H, T)
        }


@torch.no_grad()
def trace_model(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    forward: Callable[[nn.Module, Any], int] | None = None,
    max_batches: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """The PAP trace of every RPC layer of ``model`` over ``batches``.

    Args:
        model: any module with :class:`RPCAttention` layers (a vision model taking ``(B, C, H, W)``,
            this project's LMs, ...); run in eval mode (its modes are restored; the hooks are removed).
        batches: iterable of model inputs: a tensor ``(B, ...)``, an ``(inputs, labels)`` pair, or a
            dict of keyword arguments.
        forward: ``forward(model, batch) -> batch size`` for other input conventions.
        max_batches: stop after this many batches.

    Returns:
        ``{"n_samples", "n_batches", "layers": {name: {"settings", "n_iter", "heads", "quantities":
        {q: {"mean", "std", "head_std", "min", "max", "per_head"}}, "tau_over_kmax": {...},
        "s_active", "s_density_max"}}, "summary": {...}}``; lists run over PAP iterations
        (``per_head``: heads x iterations). Non-finite values (``l_change`` at t = 1, ``tau`` = inf
        when ``sparse=False``) are kept as NaN / inf here; :func:`write_trace_report` writes them as null.
    """
    from tqdm.auto import tqdm

    forward = forward or _default_forward
    raw: dict[str, dict[str, list[np.ndarray]]] = {}
    sizes: list[int] = []
    with eval_mode(model):
        with recording(model) as recorders:
            if not recorders:
                raise ValueError("the model has no RPCAttention layer (a SymViT or ViT run, say): nothing to "
                                 "trace; give an RPC model")
            raw = {name: {q: [] for q in QUANTITIES} for name in recorders}
            bar = tqdm(batches, desc="pap-trace", disable=None if progress else True, leave=False)
            for i, batch in enumerate(bar):
                if max_batches is not None and i >= max_batches:
                    break
                for r in recorders.values():
                    r.last = None
                sizes.append(forward(model, batch))
                for name, r in recorders.items():
                    if r.last is None:
                        raise RuntimeError(f"RPC layer {name} did not run in the forward pass")
                    for q in QUANTITIES:
                        raw[name][q].append(torch.stack(r.last[q + "_per_head"]).double().numpy())
    if not sizes:
        raise ValueError("trace_model: no batches")
    w = np.asarray(sizes, dtype=np.float64)
    w /= w.sum()
    out_layers: dict[str, Any] = {}
    for name, per_q in raw.items():
        m = recorders[name].layer
        arrs = {q: np.stack(v) for q, v in per_q.items()}  # (batches, T, H)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = arrs["tau"] / arrs["k_abs_max"]
        dens = arrs["s_density"]
        out_layers[name] = {
            "settings": {
                "n_iter": m.n_iter,
                "lam": m.lam,
                "threshold": m.threshold,
                "mu_dim": m.mu_dim,
                "symmetric": m.symmetric,
                "sparse": m.sparse,
                "dual": m.dual,
            },
            "n_iter": int(dens.shape[1]),
            "heads": int(dens.shape[2]),
            "quantities": {q: _stats(a, w) for q, a in arrs.items()},
            "tau_over_kmax": _stats(ratio, w),
            "s_active": bool((dens > 0).any()),
            "s_density_max": float(dens.max()),
            # first iteration (1-based) at which some batch and head has S != 0; None: never
            "s_first_active_iter": next(
                (t + 1 for t in range(dens.shape[1]) if (dens[:, t] > 0).any()), None
            ),
        }
    summary = {
        "rpc_layers": list(out_layers),
        "s_active": any(v["s_active"] for v in out_layers.values()),
        "s_density_max": max(v["s_density_max"] for v in out_layers.values()),
        "tau_over_kmax_min": min(float(np.min(v["tau_over_kmax"]["min"])) for v in out_layers.values()),
        "tau_over_kmax_mean_first_iter": float(
            np.mean([v["tau_over_kmax"]["mean"][0] for v in out_layers.values()])
        ),
    }
    return {"n_samples": int(sum(sizes)), "n_batches": len(sizes), "layers": out_layers, "summary": summary}


def trace_statement(trace: dict[str, Any]) -> str:
    """One plain sentence: is the sparse component ever active, with the max density and tau / max|K|."""
    s = trace["summary"]
    n = trace["n_samples"]
    ratio = s["tau_over_kmax_min"]
    ratio_txt = "inf (S forced to zero)" if math.isinf(ratio) else f"{ratio:.3g}"
    forced = [name for name, v in trace["layers"].items() if not v["settings"]["sparse"]]
    if forced and len(forced) == len(trace["layers"]):
        head = "S is forced to zero (sparse=False) in every RPC layer, so it is never active"
        head += f" on the {n} inputs"
    elif not s["s_active"]:
        head = (
            f"The sparse component S is never active: S = 0 at every PAP iteration, in every RPC layer and "
            f"head, on all {n} inputs"
        )
    else:
        where = [
            f"{name} from iteration {v['s_first_active_iter']} (max density {v['s_density_max']:.3g})"
            for name, v in trace["layers"].items()
            if v["s_active"]
        ]
        head = (
            f"The sparse component S is active on these {n} inputs: max density {s['s_density_max']:.3g} "
            f"(fraction of non-zero entries of S, batch mean); " + "; ".join(where)
        )
    return (
        f"{head}. tau / max|K|: {s['tau_over_kmax_mean_first_iter']:.3g} on average, {ratio_txt} at the "
        "smallest (batch means per head; above 1 the first PAP step shrinks nothing)."
    )


def lm_text_batches(model: nn.Module, texts: list[str], batch_size: int) -> list[Tensor]:
    """Token windows (B, <= context) of a project LM from texts, one text per window (truncated)."""
    vocab = getattr(model, "vocab", None)
    if vocab is None:
        raise ValueError("this language model has no vocabulary (model.vocab): cannot encode --texts")
    ctx = int(getattr(getattr(model, "cfg", None), "context", 0) or 256)
    ids = [vocab.encode(t)[:ctx] for t in texts]
    ids = [x for x in ids if len(x) > 1]
    if not ids:
        raise ValueError("no text encodes to more than one token")
    batches = []
    for i in range(0, len(ids), batch_size):
        chunk = ids[i : i + batch_size]
        n = min(len(x) for x in chunk)  # equal length: no padding (project LMs take no mask)
        batches.append(torch.stack([x[:n] for x in chunk]))
    return batches
