"""What Principal Attention Pursuit does inside a model: the PAP trace over a dataset (issue 6).

:func:`trace_model` switches on ``record_trace`` in every :class:`~kpca_attention.layers.RPCAttention`
of a model, runs batches through it and aggregates the per-iteration diagnostics of
:func:`kpca_attention.pap.pap` (``return_info=True``) per RPC layer and head across the data:

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

:func:`write_trace_report` writes ``pap_trace.json``, ``report.md`` and one PNG per RPC layer;
``kpca-attention pap-trace`` (:func:`pap_trace_cmd`) does both for a checkpoint or a model name.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import typer
from torch import Tensor, nn

from .layers import RPCAttention
from .pap import _Trace

__all__ = ["rpc_layers", "recording", "trace_model", "trace_statement", "write_trace_report", "pap_trace_cmd"]

QUANTITIES: tuple[str, ...] = _Trace.KEYS


def rpc_layers(model: nn.Module) -> dict[str, RPCAttention]:
    """``{module name: layer}`` of every :class:`RPCAttention` in ``model``, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, RPCAttention)}


@contextmanager
def recording(model: nn.Module) -> Iterator[dict[str, RPCAttention]]:
    """Switch ``record_trace`` on in every RPC layer of ``model`` (restored on exit)."""
    layers = rpc_layers(model)
    saved = {name: m.record_trace for name, m in layers.items()}
    try:
        for m in layers.values():
            m.record_trace = True
        yield layers
    finally:
        for name, m in layers.items():
            m.record_trace = saved[name]


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
            this project's LMs, ...); run in eval mode, its modes and ``record_trace`` flags are restored.
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
    was_training = model.training
    model.eval()
    try:
        with recording(model) as layers:
            if not layers:
                raise ValueError(f"{type(model).__name__} has no RPCAttention layer: nothing to trace")
            raw = {name: {q: [] for q in QUANTITIES} for name in layers}
            for i, batch in enumerate(tqdm(batches, desc="pap-trace", disable=not progress, leave=False)):
                if max_batches is not None and i >= max_batches:
                    break
                for m in layers.values():
                    m.last_trace = None
                sizes.append(forward(model, batch))
                for name, m in layers.items():
                    if m.last_trace is None:
                        raise RuntimeError(f"RPC layer {name} did not run in the forward pass")
                    for q in QUANTITIES:
                        raw[name][q].append(torch.stack(m.last_trace[q + "_per_head"]).double().numpy())
    finally:
        model.train(was_training)
    if not sizes:
        raise ValueError("trace_model: no batches")
    w = np.asarray(sizes, dtype=np.float64)
    w /= w.sum()
    out_layers: dict[str, Any] = {}
    for name, per_q in raw.items():
        m = layers[name]
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


# ----------------------------------------------------------------------------- report


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return _json_safe(x.item())
    return x


def plot_layer(name: str, layer: dict[str, Any], path: Path) -> Path:
    """Six panels across PAP iterations: s_density (per head), tau vs max|K|, tau / max|K| per head,
    primal residual, dual norm, l_change (mean with the batch spread as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = layer["quantities"]
    it = np.arange(1, layer["n_iter"] + 1)
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))

    def band(ax: Any, stats: dict[str, list[float]], label: str, **kw: Any) -> None:
        mean = np.asarray(stats["mean"], dtype=float)
        ax.errorbar(
            it, mean, yerr=np.asarray(stats["std"], dtype=float), marker="o", capsize=3, label=label, **kw
        )

    ax = axes[0, 0]
    for h, row in enumerate(q["s_density"]["per_head"]):
        ax.plot(it, row, marker=".", alpha=0.7, label=f"head {h}")
    band(ax, q["s_density"], "mean", color="k")
    ax.set_title("s_density: fraction of S != 0")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    if np.all(np.isfinite(q["tau"]["mean"])):
        band(ax, q["tau"], "tau")
    else:
        ax.text(0.5, 0.9, "tau = inf (S forced to 0)", transform=ax.transAxes, ha="center")
    band(ax, q["k_abs_max"], "max |K|")
    ax.set_title("threshold tau vs max |K|")
    ax.legend(fontsize=7)
    ax = axes[0, 2]
    ratio = np.asarray(layer["tau_over_kmax"]["per_head"], dtype=float)
    if np.all(np.isfinite(ratio)):
        for h, row in enumerate(ratio):
            ax.plot(it, row, marker=".", label=f"head {h}")
        ax.axhline(1.0, color="r", ls="--", lw=1, label="tau = max|K|")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "tau = inf", transform=ax.transAxes, ha="center")
    ax.set_title("tau / max|K| per head")
    for ax, key, title in (
        (axes[1, 0], "primal_residual", "||K - L - S|| / ||K||"),
        (axes[1, 1], "dual_norm", "||Y|| / ||K||"),
        (axes[1, 2], "l_change", "||L_t - L_{t-1}|| / ||L_t||"),
    ):
        band(ax, q[key], key)
        ax.set_title(title)
    for ax in axes.flat:
        ax.set_xlabel("PAP iteration")
        ax.set_xticks(it)
        ax.grid(alpha=0.3)
    s = layer["settings"]
    fig.suptitle(
        f"{name}: n_iter={s['n_iter']}, lam={s['lam']:.4g}, threshold={s['threshold']}, "
        f"mu_dim={s['mu_dim']}, sparse={s['sparse']}, dual={s['dual']}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return "inf" if math.isinf(x) else f"{x:.4g}"
    return str(x)


def write_trace_report(
    trace: dict[str, Any],
    out_dir: str | os.PathLike,
    *,
    title: str = "PAP trace",
    source: str | None = None,
    inputs: str | None = None,
) -> Path:
    """Write ``pap_trace.json`` (non-finite values as null), one ``<layer>.png`` per RPC layer and
    ``report.md`` into ``out_dir``; returns the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    statement = trace_statement(trace)
    data = {"source": source, "inputs": inputs, "statement": statement, **trace}
    tmp = out / "pap_trace.json.tmp"
    tmp.write_text(json.dumps(_json_safe(data), indent=2))
    os.replace(tmp, out / "pap_trace.json")
    lines = [f"# {title}", ""]
    if source:
        lines.append(f"Model: `{source}`. " + (f"Inputs: {inputs}. " if inputs else ""))
    lines += [f"{trace['n_samples']} inputs in {trace['n_batches']} batches.", "", f"**{statement}**", ""]
    for name, layer in trace["layers"].items():
        png = plot_layer(name, layer, out / f"{name.replace('.', '_')}.png")
        q = layer["quantities"]
        lines += [
            f"## {name}",
            "",
            f"Settings: {layer['settings']}.",
            "",
            "| iteration | s_density mean (max) | tau | max abs K | tau / max abs K (min) | "
            "primal residual | dual norm | l_change |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in range(layer["n_iter"]):
            r = layer["tau_over_kmax"]
            lines.append(
                f"| {t + 1} | {_fmt(q['s_density']['mean'][t])} ({_fmt(q['s_density']['max'][t])}) | "
                f"{_fmt(q['tau']['mean'][t])} | {_fmt(q['k_abs_max']['mean'][t])} | "
                f"{_fmt(r['mean'][t])} ({_fmt(r['min'][t])}) | {_fmt(q['primal_residual']['mean'][t])} | "
                f"{_fmt(q['dual_norm']['mean'][t])} | {_fmt(q['l_change']['mean'][t])} |"
            )
        lines += ["", f"![{name}]({png.name})", ""]
    lines += [
        "Means are over inputs and heads; (max) / (min) over batches and heads. tau / max|K| above 1 means "
        "the first PAP step shrinks nothing; s_density covers every step. Raw numbers: `pap_trace.json`.",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


# ----------------------------------------------------------------------------- CLI


def _lm_text_batches(model: nn.Module, texts: list[str], batch_size: int) -> list[Tensor]:
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


def pap_trace_cmd(
    model: Annotated[str, typer.Argument(help="checkpoint / run directory, or a registered model name")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder for report.md, pap_trace.json, plots")],
    images: Annotated[Path | None, typer.Option("--images", help="folder of images")] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="image dataset (fashion-mnist, ...)")
    ] = None,
    texts: Annotated[Path | None, typer.Option("--texts", help="text file, one text per line (LMs)")] = None,
    split: Annotated[str, typer.Option(help="dataset split")] = "test",
    data_root: Annotated[str | None, typer.Option("--data-root", help="dataset root folder")] = None,
    max_samples: Annotated[int, typer.Option(help="trace at most this many inputs")] = 512,
    batch_size: Annotated[int, typer.Option(help="inputs per forward pass")] = 64,
    threads: Annotated[int | None, typer.Option(help="CPU threads (1 is fastest on a busy machine)")] = None,
) -> None:
    """PAP trace of every RPC-Attention layer of MODEL over data: is the sparse component ever active,
    tau vs max|K|, residuals, dual norm, convergence (writes report.md, pap_trace.json, PNG plots)."""
    if threads:
        torch.set_num_threads(threads)
    try:
        path = Path(model).expanduser()
        if texts is not None and path.exists():
            from .kpca.load import read_texts
            from .train import load_model

            net, cfg = load_model(path)
            if cfg.task != "lm":
                raise ValueError(f"{model} is a {cfg.task} model: give --images DIR or --dataset NAME")
            batches = _lm_text_batches(net, read_texts(texts, max_samples), batch_size)
            desc = f"texts from {texts}"
        else:
            from .kpca.load import load_for_analysis
            from .kpca.run import resolve_inputs

            loaded = load_for_analysis(model, pretrained=False)
            if loaded.modality != "image":
                raise ValueError(f"{model} is a text model without RPC layers of this project")
            _, x, desc = resolve_inputs(
                loaded,
                texts=texts,
                images=images,
                dataset=dataset,
                split=split,
                data_root=data_root,
                max_samples=max_samples,
            )
            net = loaded.model
            if loaded.normalize is not None:  # timm models normalise outside
                mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in loaded.normalize)
                x = (x - mean) / std
            batches = list(x.split(batch_size))
        trace = trace_model(net, batches, progress=True)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    report = write_trace_report(trace, out, title=f"PAP trace of {model}", source=model, inputs=desc)
    typer.echo(trace_statement(trace))
    typer.echo(report)
