"""Report of a PAP trace (:func:`kpca_attention.kpca.pap_trace.trace_model`): ``pap_trace.json``,
``report.md`` with one table per RPC layer, and one PNG per layer."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..io import write_json_atomic, write_text_atomic
from ..kpca.pap_trace import trace_statement
from ..plotting import new_figure, save_figure

__all__ = ["plot_layer", "write_trace_report"]


def plot_layer(name: str, layer: dict[str, Any], path: Path) -> Path:
    """Six panels across PAP iterations: s_density (per head), tau vs max|K|, tau / max|K| per head,
    primal residual, dual norm, l_change (mean with the batch spread as error bars)."""
    q = layer["quantities"]
    it = np.arange(1, layer["n_iter"] + 1)
    fig, axes = new_figure(2, 3, figsize=(13, 7))

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
    return save_figure(fig, path, dpi=100)


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
    write_json_atomic(out / "pap_trace.json", data)
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
    return write_text_atomic(out / "report.md", "\n".join(lines))
