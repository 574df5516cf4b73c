"""The PNG figures of a KPCA analysis report (:mod:`.kpca`): gamma differences, the eigenvalue spectrum,
alignment against chance, the positive control and the projection norms."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..kpca.analysis import CHANCE_MEASURES
from ..kpca.chance import NULL_LABELS, verdict_null
from ..plotting import new_figure, panel_grid, save_figure

__all__ = ["kpca_figures", "chance_by_layer", "measure_label"]

_VARIANT_STYLE = {
    "values": ("tab:blue", "a_hat from the learned V (paper's test)"),
    "random": ("tab:red", "random-orthogonal control QR(A + 0.1 noise)"),
    "values_permuted": ("tab:purple", "a_hat from V with its tokens permuted (the null)"),
    "eigenvectors": ("tab:green", "true eigenvectors (positive control)"),
}
_LABELS = {
    "linear_cka": "linear CKA",
    "kernel_cka": "kernel CKA",
    "optimal_cosine": "optimal cosine",
    "direct_cosine": "direct cosine",
    "signfix_cosine": "sign-fixed cosine",
    "relative_frobenius": "relative Frobenius error",
}


def measure_label(key: str) -> str:
    """A measure's name in words (a null column: the measure, then which null)."""
    for kind, what in NULL_LABELS.items():
        if key.endswith(f"_null_{kind}"):
            return f"{measure_label(key.removesuffix(f'_null_{kind}'))}: chance, {what}"
    return _LABELS.get(key, key.replace("_", " "))


def kpca_figures(res: dict[str, Any], out: Path) -> list[str]:
    """Write every figure ``res`` has the data for into ``out``; returns their file names."""
    with warnings.catch_warnings():  # NaN-only ranks (sequences shorter than d_v) are expected
        warnings.simplefilter("ignore", RuntimeWarning)
        figs = _gamma_figs(res, out) + _spectrum_fig(res, out)
        figs += _alignment_fig(res, out) + _chance_fig(res, out)
        return figs + _control_fig(res, out) + _norms_fig(res, out)


# ------------------------------------------------------------------------------------------- plots


def _gamma_figs(res: dict[str, Any], out: Path) -> list[str]:
    gamma = res.get("gamma") or {}
    if not gamma:
        return []
    # Fig. 2 (left) shape: mean +- std over the principal axes, averaged over heads and layers
    fig, axes = new_figure(1, 2, figsize=(12, 4.2))
    for ax, (stat, label) in zip(
        axes,
        (
            ("abs", r"$|\gamma_i - \gamma_j|$"),
            ("rel", r"$|\gamma_i - \gamma_j| / \max(|\gamma_i|, |\gamma_j|)$"),
        ),
        strict=True,
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
    save_figure(fig, out / "gamma_differences.png", dpi=120)
    # Fig. 5 shape: one panel per layer, relative differences
    layers = sorted(gamma, key=int)
    cols = min(4, len(layers))
    rows_n = math.ceil(len(layers) / cols)
    fig, axes = new_figure(rows_n, cols, figsize=(3.6 * cols, 2.8 * rows_n), squeeze=False)
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
        "relative gamma differences per layer (blue: values, purple: tokens permuted, red: random control, "
        "green: eigenvectors)",
        fontsize=10,
    )
    save_figure(fig, out / "gamma_differences_per_layer.png", dpi=110)
    return ["gamma_differences.png", "gamma_differences_per_layer.png"]


def _spectrum_fig(res: dict[str, Any], out: Path) -> list[str]:
    spec = res.get("spectrum") or {}
    if not spec:
        return []
    from matplotlib import colormaps

    fig, ax = new_figure(figsize=(6.5, 4.2))
    cmap = colormaps["viridis"]
    n = len(spec)
    for i, (li, vals) in enumerate(sorted(spec.items(), key=lambda kv: int(kv[0]))):
        y = np.array(vals, dtype=float)
        ax.plot(np.arange(1, len(y) + 1), y, color=cmap(i / max(n - 1, 1)), label=f"layer {li}")
    ax.set_yscale("log")
    ax.set_xlabel("rank d")
    ax.set_ylabel(r"$|\mu_d|$, eigenvalue of $\tilde K_\varphi$ (mean over heads, inputs)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    save_figure(fig, out / "eigenvalue_spectrum.png", dpi=120)
    return ["eigenvalue_spectrum.png"]


#: how each null is drawn in the figures (the verdict's null thicker)
_NULL_STYLE = {"perm": ("tab:orange", "s--"), "gauss": ("tab:gray", "^:"), "rot": ("tab:purple", "d-.")}


def _drawn_nulls(key: str, rec: dict[str, Any], res: dict[str, Any]) -> list[tuple[str, bool]]:
    """``[(null kind, is the verdict's)]`` of ``key`` held in the records, in :data:`_NULL_STYLE` order;
    the optimal cosine's permutation null is its measured value by construction and is not drawn."""
    verdict = verdict_null(key, ((res.get("summary") or {}).get("chance") or {}).get(key))
    kinds = [k for k in _NULL_STYLE if f"{key}_null_{k}" in rec
             and not (key == "optimal_cosine" and k == "perm")]
    return [(k, k == verdict) for k in kinds]


def _with_nulls(rec: dict[str, Any], key: str, kinds: list[str]) -> np.ndarray:
    """The units (records) holding ``key``'s nulls: the first ``--null-samples`` inputs."""
    mask = np.isfinite(np.asarray(rec[key], dtype=float))
    for kind in kinds:
        mask &= np.isfinite(np.asarray(rec[f"{key}_null_{kind}"], dtype=float))
    return mask


def _layer_means(column: Any, sub: np.ndarray, layer: np.ndarray, layers: list[int]) -> list[float]:
    """``column``'s mean over the units ``sub`` of each of ``layers``."""
    col = np.asarray(column, dtype=float)
    return [float(col[sub & (layer == li)].mean()) for li in layers]


def _alignment_fig(res: dict[str, Any], out: Path) -> list[str]:
    rec = res.get("records") or {}
    keys = [k for k in ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka") if k in rec]
    if not keys:
        return []
    fig, axes = panel_grid(len(keys), panel=(3.4, 3.2))
    for ax, key in zip(axes, keys, strict=True):
        x = np.asarray(rec[key], dtype=float)
        ax.hist(x[np.isfinite(x)], bins=40, color="tab:blue", alpha=0.8)
        nulls = _drawn_nulls(key, rec, res)
        sub = _with_nulls(rec, key, [k for k, _ in nulls])
        if nulls and sub.any():  # the means on the inputs with nulls, measured and null alike
            ax.axvline(float(x[sub].mean()), color="k", ls="--", lw=1, label=f"mean {x[sub].mean():.3f}")
            for kind, verdict in nulls:
                z = float(np.asarray(rec[f"{key}_null_{kind}"], dtype=float)[sub].mean())
                ax.axvline(z, color=_NULL_STYLE[kind][0], lw=2.5 if verdict else 1.2,
                           label=f"{NULL_LABELS[kind]} {z:.3f}{' (verdict)' if verdict else ''}")
        else:
            ax.axvline(float(np.nanmean(x)), color="k", ls="--", lw=1, label=f"mean {np.nanmean(x):.3f}")
        ax.set_title(measure_label(key), fontsize=10)
        ax.set_xlabel("per (input, layer, head)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{res['model']['name']}: learned V vs KPCA-predicted V_hat, and chance (lines: means on "
                 "the inputs with nulls)", fontsize=9)
    save_figure(fig, out / "alignment_histograms.png", dpi=120)
    return ["alignment_histograms.png"]


def chance_by_layer(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{measure: {"layers": [...], "measured": [...], "null_<kind>": [...], "verdict": kind}}``: per layer,
    each chance measure and its nulls averaged over the same units - every head of the inputs with nulls
    (the first ``--null-samples``), as the chance tests compare them (the optimal cosine's permutation null,
    its measured value by construction, is left out)."""
    rec = res.get("records") or {}
    if "layer" not in rec:
        return {}
    layer = np.asarray(rec["layer"])
    series: dict[str, dict[str, Any]] = {}
    for key in CHANCE_MEASURES:
        nulls = _drawn_nulls(key, rec, res) if key in rec else []
        sub = _with_nulls(rec, key, [k for k, _ in nulls]) if nulls else None
        if sub is None or not sub.any():
            continue
        xs = sorted({int(v) for v in layer[sub]})
        entry: dict[str, Any] = {"layers": xs, "measured": _layer_means(rec[key], sub, layer, xs),
                                 "verdict": next((k for k, v in nulls if v), None)}
        for kind, _ in nulls:
            entry[f"null_{kind}"] = _layer_means(rec[f"{key}_null_{kind}"], sub, layer, xs)
        series[key] = entry
    return series


def _chance_fig(res: dict[str, Any], out: Path) -> list[str]:
    """Per layer: each measure next to its nulls (:func:`chance_by_layer`); the verdict's null thicker."""
    series = chance_by_layer(res)
    if not series:
        return []
    cols = min(3, len(series))
    rows_n = math.ceil(len(series) / cols)
    fig, axes = new_figure(rows_n, cols, figsize=(4.2 * cols, 3.2 * rows_n), squeeze=False)
    for ax, (key, entry) in zip(axes.flat, series.items(), strict=False):
        xs = entry["layers"]
        ax.plot(xs, entry["measured"], "o-", color="tab:blue", label="measured")
        for kind, (color, style) in _NULL_STYLE.items():
            if f"null_{kind}" in entry:
                verdict = kind == entry["verdict"]
                ax.plot(xs, entry[f"null_{kind}"], style, color=color, lw=2.5 if verdict else 1.2,
                        label=f"null: {NULL_LABELS[kind]}{' (verdict)' if verdict else ''}")
        ax.set_title(measure_label(key), fontsize=10)
        ax.set_xlabel("layer")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    fig.suptitle(f"{res['model']['name']}: alignment of V with V_hat against chance (means over heads and "
                 "the inputs with nulls)", fontsize=10)
    save_figure(fig, out / "alignment_vs_chance.png", dpi=120)
    return ["alignment_vs_chance.png"]


def _control_fig(res: dict[str, Any], out: Path) -> list[str]:
    """Response curves of the positive control, with the measured value and its permutation null."""
    pc = res.get("positive_control") or {}
    if not pc:
        return []
    snr = [math.inf if s == "inf" else float(s) for s in pc["snr"]]
    finite = [s for s in snr if math.isfinite(s) and s > 0]
    lo, hi = (min(finite), max(finite)) if finite else (0.01, 100.0)
    # 0 and inf have no place on a log axis: draw them one decade beyond the finite ends
    pos = [lo / 10 if s == 0 else hi * 10 if math.isinf(s) else s for s in snr]
    keys = [k for k in CHANCE_MEASURES if k in pc.get("plain", {})]
    s = res["summary"]
    cols = min(3, len(keys))
    rows_n = math.ceil(len(keys) / cols)
    fig, axes = new_figure(rows_n, cols, figsize=(4.2 * cols, 3.2 * rows_n), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        ax.plot(pos, pc["plain"][key], "o-", color="tab:green", label="V = sqrt(snr) V_hat + noise")
        if key in pc.get("rotated", {}):
            ax.plot(pos, pc["rotated"][key], "s--", color="tab:purple", label="... V_hat rotated")
        if s.get(key) is not None:
            ax.axhline(s[key], color="tab:blue", lw=1.2, label="measured")
        if s.get(f"{key}_null_perm") is not None:
            ax.axhline(s[f"{key}_null_perm"], color="tab:orange", ls="--", lw=1, label="null: permuted")
        ax.set_xscale("log")
        ax.set_xticks([pos[0], *finite, pos[-1]] if finite else pos)
        ax.set_xticklabels(["0"] + [f"{v:g}" for v in finite] + ["inf"], fontsize=7, rotation=45)
        ax.set_title(measure_label(key), fontsize=10)
        ax.set_xlabel("signal-to-noise ratio")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{res['model']['name']}: positive control ({pc.get('units')} (input, layer, head) units)",
                 fontsize=10)
    save_figure(fig, out / "positive_control.png", dpi=120)
    return ["positive_control.png"]


def _norms_fig(res: dict[str, Any], out: Path) -> list[str]:
    layers = res.get("layers") or []
    if not layers:
        return []
    x = [entry["layer"] for entry in layers]
    fig, axes = new_figure(1, 2, figsize=(11, 4))
    for ax, prefix, title in (
        (axes[0], "", "paper scaling (eq. 13)"),
        (axes[1], "official_", "official code's variant"),
    ):
        ax.plot(x, [e.get(prefix + "phi_norm_sq") for e in layers], "o-", label=r"$\|\varphi(q)\|^2$")
        ax.plot(x, [e.get(prefix + "h_norm_sq") for e in layers], "s-", label=r"$\|h\|^2$")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{res['model']['name']}: the two terms of J_proj (mean over inputs, heads, tokens)", fontsize=10
    )
    save_figure(fig, out / "projection_norms.png", dpi=120)
    return ["projection_norms.png"]


# ------------------------------------------------------------------------------------------- tables
