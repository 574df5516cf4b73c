"""Plots (matplotlib, Agg, PNG) and a markdown report from an analysis result dict."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_report", "fmt"]

_VARIANT_STYLE = {
    "values": ("tab:blue", "a_hat from the learned V (paper's test)"),
    "random": ("tab:red", "random-orthogonal control QR(A + 0.1 noise)"),
    "eigenvectors": ("tab:green", "true eigenvectors (positive control)"),
}


def fmt(x: Any, digits: int = 3) -> str:
    """Compact number formatting for tables (None / NaN -> 'n/a')."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        ax = abs(float(x))
        return f"{x:.{digits}g}" if ax != 0 and (ax < 1e-3 or ax >= 1e4) else f"{x:.{digits}f}"
    return str(x)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _gamma_figs(res: dict[str, Any], out: Path) -> list[str]:
    plt = _plt()
    gamma = res.get("gamma") or {}
    if not gamma:
        return []
    files = []
    # Fig. 2 (left) shape: mean +- std over the principal axes, averaged over heads and layers
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, (stat, label) in zip(
        axes,
        (
            ("abs", r"$|\gamma_i - \gamma_j|$"),
            ("rel", r"$|\gamma_i - \gamma_j| / \max(|\gamma_i|, |\gamma_j|)$"),
        ), strict=False,
    ):
        for variant, (color, vlabel) in _VARIANT_STYLE.items():
            rows = [g[variant] for g in gamma.values() if variant in g]
            if not rows:
                continue
            mean = np.nanmean([r[f"mean_{stat}"] for r in rows], 0)
            std = np.nanmean([r[f"std_{stat}"] for r in rows], 0)
            x = np.arange(1, len(mean) + 1)
            lower = mean - std
            if stat == "abs":  # log axis: the band's lower edge is clipped at a tenth of the mean
                lower = np.maximum(lower, mean / 10)
            ax.plot(x, mean, color=color, label=vlabel)
            ax.fill_between(x, lower, mean + std, color=color, alpha=0.15)
        if stat == "abs":
            lam = np.nanmean([g["lambda"] for g in gamma.values()], 0)
            ax.plot(np.arange(1, len(lam) + 1), lam, "k--", lw=1, label=r"eigenvalue $\lambda_d = \mu_d / N$")
            ax.set_yscale("log")
        ax.set_xlabel("index of the principal component axis")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{res['model']['name']}: gamma test, mean over heads and layers (band: mean std)")
    fig.tight_layout()
    fig.savefig(out / "gamma_differences.png", dpi=120)
    plt.close(fig)
    files.append("gamma_differences.png")
    # Fig. 5 shape: one panel per layer, relative differences
    layers = sorted(gamma, key=int)
    cols = min(4, len(layers))
    rows_n = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, 2.8 * rows_n), squeeze=False)
    for ax, li in zip(axes.flat, layers, strict=False):
        for variant, (color, _) in _VARIANT_STYLE.items():
            if variant not in gamma[li]:
                continue
            mean, std = np.array(gamma[li][variant]["mean_rel"]), np.array(gamma[li][variant]["std_rel"])
            x = np.arange(1, len(mean) + 1)
            ax.plot(x, mean, color=color, lw=1)
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.12)
        ax.set_title(f"layer {li}", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(layers) :]:
        ax.axis("off")
    fig.suptitle(
        "relative gamma differences per layer (blue: values, red: random control, green: eigenvectors)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out / "gamma_differences_per_layer.png", dpi=110)
    plt.close(fig)
    files.append("gamma_differences_per_layer.png")
    return files


def _spectrum_fig(res: dict[str, Any], out: Path) -> list[str]:
    plt = _plt()
    spec = res.get("spectrum") or {}
    if not spec:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    cmap = plt.get_cmap("viridis")
    n = len(spec)
    for i, (li, vals) in enumerate(sorted(spec.items(), key=lambda kv: int(kv[0]))):
        y = np.array(vals, dtype=float)
        ax.plot(np.arange(1, len(y) + 1), y, color=cmap(i / max(n - 1, 1)), label=f"layer {li}")
    ax.set_yscale("log")
    ax.set_xlabel("rank d")
    ax.set_ylabel(r"$|\mu_d|$, eigenvalue of $\tilde K_\varphi$ (mean over heads, inputs)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "eigenvalue_spectrum.png", dpi=120)
    plt.close(fig)
    return ["eigenvalue_spectrum.png"]


def _alignment_fig(res: dict[str, Any], out: Path) -> list[str]:
    plt = _plt()
    rec = res.get("records") or {}
    keys = [k for k in ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka") if k in rec]
    if not keys:
        return []
    fig, axes = plt.subplots(1, len(keys), figsize=(3.4 * len(keys), 3.2))
    for ax, key in zip(np.atleast_1d(axes), keys, strict=False):
        x = np.asarray(rec[key], dtype=float)
        x = x[np.isfinite(x)]
        ax.hist(x, bins=40, color="tab:blue", alpha=0.8)
        ax.axvline(float(np.mean(x)), color="k", ls="--", lw=1, label=f"mean {np.mean(x):.3f}")
        ax.set_title(key.replace("_", " "), fontsize=10)
        ax.set_xlabel("per (input, layer, head)")
        ax.legend(fontsize=8)
    fig.suptitle(f"{res['model']['name']}: learned V vs KPCA-predicted V_hat", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "alignment_histograms.png", dpi=120)
    plt.close(fig)
    return ["alignment_histograms.png"]


def _norms_fig(res: dict[str, Any], out: Path) -> list[str]:
    plt = _plt()
    layers = res.get("layers") or []
    if not layers:
        return []
    x = [entry["layer"] for entry in layers]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, prefix, title in (
        (axes[0], "", "paper scaling (eq. 13)"),
        (axes[1], "official_", "official code's variant"),
    ):
        phi = [entry.get(prefix + "phi_norm_sq") for entry in layers]
        h = [entry.get(prefix + "h_norm_sq") for entry in layers]
        ax.plot(x, phi, "o-", label=r"$\|\varphi(q)\|^2$")
        ax.plot(x, h, "s-", label=r"$\|h\|^2$")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{res['model']['name']}: the two terms of J_proj (mean over inputs, heads, tokens)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(out / "projection_norms.png", dpi=120)
    plt.close(fig)
    return ["projection_norms.png"]


def write_report(res: dict[str, Any], out_dir: str | Path) -> Path:
    """Write the PNG plots and ``report.md`` for one analysis result; returns the markdown path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # NaN-only ranks (sequences shorter than d_v) are expected
        warnings.simplefilter("ignore", RuntimeWarning)
        figs = _gamma_figs(res, out) + _spectrum_fig(res, out)
        figs += _alignment_fig(res, out) + _norms_fig(res, out)
    s = res["summary"]
    lines = [
        f"# KPCA analysis: {res['model']['name']}",
        "",
        f"Inputs: {res.get('inputs', 'n/a')}; {s['num_sequences']} sequences, "
        f"mean {fmt(s['mean_tokens'], 1)} "
        f"analysed tokens, {s['num_heads_analysed']} (input, layer, head) triples. "
        f"Attention: {', '.join(res['model'].get('attention_types', []))}.",
        "",
        "| measure | value |",
        "|---|---|",
    ]
    for key in (
        "optimal_cosine",
        "direct_cosine",
        "signfix_cosine",
        "linear_cka",
        "kernel_cka",
        "relative_frobenius",
        "j_proj",
        "phi_norm_sq",
        "h_norm_sq",
        "log10_h_over_phi",
        "official_j_proj",
        "official_log_j_proj",
        "official_phi_norm_sq",
        "official_h_norm_sq",
    ):
        if key in s:
            lines.append(f"| {key} | {fmt(s[key])} |")
    if "gamma" in s:
        for variant in ("values", "random", "eigenvectors"):
            g = s["gamma"][variant]
            lines.append(
                f"| gamma {variant}: mean abs / rel difference | {fmt(g['mean_abs'])} / "
                f"{fmt(g['mean_rel'])} |"
            )
    for label, st in (res.get("eigen_stats") or {}).items():
        lines.append(
            f"| eigenvalues ({label} keys) max / min / mean / median | "
            + " / ".join(fmt(st[k]["mean"]) for k in ("max", "min", "mean", "median"))
            + " |"
        )
    if res.get("pap"):
        lines.append(
            f"| PAP sparse-component density (max over layers, iterations) | "
            f"{fmt(s.get('pap_s_density_max'))} |"
        )
    lines += ["", "Config: " + ", ".join(f"{k}={v}" for k, v in res["config"].items()), ""]
    lines += [f"![{f}]({f})" for f in figs]
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    return md
