"""Reports of the KPCA diagnostics: ``report.md`` with PNG plots for one analysis result
(:func:`write_report`), and the claims table ``claims.md`` + ``claims.json`` (:func:`write_claims`).

The numbers come from :mod:`kpca_attention.kpca` (:func:`~kpca_attention.kpca.run.analyze_model`,
:func:`~kpca_attention.kpca.claims.judge`); this module only lays them out. Every measure is shown
next to its chance levels (token-permuted V and Gaussian V) and the positive control's response curve.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..io import write_json_atomic, write_text_atomic
from ..kpca.analysis import CHANCE_MEASURES
from ..kpca.chance import NULL_LABELS, chance_word, model_family, verdict_null
from ..kpca.claims import PAPER_EIGENVALUES, THRESHOLDS, fmt, fmt_p
from ..plotting import new_figure, panel_grid, save_figure
from ..tables import markdown_table
from .kpca_seeds import against_baseline, seed_groups, seed_section

__all__ = ["write_report", "write_claims"]

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


def _label(key: str) -> str:
    for kind, what in NULL_LABELS.items():
        if key.endswith(f"_null_{kind}"):
            return f"{_label(key.removesuffix(f'_null_{kind}'))}: chance, {what}"
    return _LABELS.get(key, key.replace("_", " "))


def _fmts(*keys: str) -> dict[str, Any]:
    return {k: fmt for k in keys}


def _cell(text: Any) -> str:
    """Table-cell text: the norms ``||h||^2`` of the claims would otherwise split markdown cells."""
    return str(text).replace("|", "\\|")


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


def _alignment_fig(res: dict[str, Any], out: Path) -> list[str]:
    rec = res.get("records") or {}
    keys = [k for k in ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka") if k in rec]
    if not keys:
        return []
    fig, axes = panel_grid(len(keys), panel=(3.4, 3.2))
    for ax, key in zip(axes, keys, strict=True):
        x = np.asarray(rec[key], dtype=float)
        x = x[np.isfinite(x)]
        ax.hist(x, bins=40, color="tab:blue", alpha=0.8)
        ax.axvline(float(np.mean(x)), color="k", ls="--", lw=1, label=f"mean {np.mean(x):.3f}")
        for kind, color in (("perm", "tab:orange"), ("gauss", "tab:gray")):
            z = np.asarray(rec.get(f"{key}_null_{kind}", []), dtype=float)
            z = z[np.isfinite(z)]
            if z.size:
                ax.axvline(float(z.mean()), color=color, lw=1.5, label=f"{kind} null {z.mean():.3f}")
        ax.set_title(_label(key), fontsize=10)
        ax.set_xlabel("per (input, layer, head)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{res['model']['name']}: learned V vs KPCA-predicted V_hat, and chance", fontsize=10)
    save_figure(fig, out / "alignment_histograms.png", dpi=120)
    return ["alignment_histograms.png"]


def _chance_fig(res: dict[str, Any], out: Path) -> list[str]:
    """Per layer: each measure next to its two nulls."""
    layers = res.get("layers") or []
    keys = [k for k in CHANCE_MEASURES if layers and layers[0].get(f"{k}_null_perm") is not None]
    if not keys:
        return []
    cols = min(3, len(keys))
    rows_n = math.ceil(len(keys) / cols)
    fig, axes = new_figure(rows_n, cols, figsize=(4.2 * cols, 3.2 * rows_n), squeeze=False)
    x = [entry["layer"] for entry in layers]
    for ax, key in zip(axes.flat, keys, strict=False):
        ax.plot(x, [e.get(key) for e in layers], "o-", color="tab:blue", label="measured")
        ax.plot(x, [e.get(f"{key}_null_perm") for e in layers], "s--", color="tab:orange",
                label="null: tokens permuted")
        ax.plot(x, [e.get(f"{key}_null_gauss") for e in layers], "^:", color="tab:gray",
                label="null: Gaussian V")
        ax.set_title(_label(key), fontsize=10)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{res['model']['name']}: alignment of V with V_hat against chance (mean over heads)",
                 fontsize=10)
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
        ax.set_title(_label(key), fontsize=10)
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


def chance_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measure: measured, both nulls, and the test against the null the claims use."""
    s = res["summary"]
    family = model_family(s, CHANCE_MEASURES)
    rows = []
    for key in CHANCE_MEASURES:
        ch = (s.get("chance") or {}).get(key)
        if not ch:
            continue
        kind = verdict_null(key, ch)
        t = family.get(key, {})
        rows.append({
            "measure": _label(key),
            "measured": s.get(key),
            "perm": s.get(f"{key}_null_perm"),
            "gauss": s.get(f"{key}_null_gauss"),
            "rot": s.get(f"{key}_null_rot"),
            "test_null": {"perm": "permuted", "gauss": "Gaussian", "rot": "rotated"}[kind],
            "diff": t.get("diff"),
            "d_z": t.get("d_z"),
            "p": f"{fmt_p(t.get('p_above'))} / {fmt_p(t.get('p_below'))}",
            "p_holm": fmt_p(t.get("p_holm")),
            "n": t.get("n"),
            "verdict": chance_word(t) if t else "n/a",
        })
    return rows


def _chance_section(res: dict[str, Any]) -> list[str]:
    rows = chance_rows(res)
    if not rows:
        return []
    s = res["summary"]
    rotated = any(r.get("rot") is not None for r in rows)  # analyses stored before the rotated null: none
    opt_null = "V rotated" if rotated else "Gaussian"
    lines = [
        "## Alignment against chance",
        "",
        f"Nulls on {s.get('null_units')} (input, layer, head) units (the first "
        f"{res['config'].get('null_samples')} inputs), {res['config'].get('null_draws')} draws each: "
        "V with its tokens permuted, i.i.d. Gaussian V of the same shape and RMS"
        + (", and V rotated (V R, R random orthogonal: its rows keep their norms and angles)"
           if rotated else "")
        + ". The test compares "
        "the per-(layer, head) means of measured and null (Wilcoxon signed-rank tests; the two-sided p, "
        "twice the smaller one-sided p, is Holm-adjusted over the model's family of chance tests - these "
        "rows and the gamma test below - and a verdict needs the adjusted p < 0.05); 'above chance' means"
        " better alignment than the null, 'not distinguished from chance' that the adjusted test did not "
        "reject (no margin: not 'at chance'), 'too few units to test' that with n heads no outcome can "
        "reach 0.025 (the exact test's smallest one-sided p is 2^-n: 5 heads or fewer; such a test is not"
        " in the family). Above "
        "the token-permutation null is not evidence of kernel PCA by itself: V and K are maps of the same "
        "tokens, so any network's values depend on its keys (docs/kpca.md). The optimal cosine is "
        "blind to token order, so its permutation null equals the measured value; it is tested against "
        + ("V rotated (the Gaussian null keeps no structure of V's rows, so any structured V fell below "
           "it)" if rotated else "the Gaussian null (this analysis predates the rotated null, which keeps "
           "V's row geometry: below the Gaussian null says little, docs/kpca.md)")
        + ". `diff` = measured - null, `d_z` = diff / sd of the per-head differences.",
        "",
        markdown_table(
            rows,
            {
                "measure": "measure", "measured": "measured", "perm": "null: permuted",
                "gauss": "null: Gaussian", **({"rot": "null: rotated"} if rotated else {}),
                "test_null": "tested against", "diff": "diff", "d_z": "d_z",
                "p": "p above / below", "p_holm": "p Holm", "n": "heads", "verdict": "verdict",
            },
            formats=_fmts("measured", "perm", "gauss", "rot", "diff", "d_z", "n"),
        ),
        "",
        "Per layer (mean over heads and inputs; verdict over the layer's heads, permutation null; "
        f"optimal cosine: {opt_null} null; one-sided tests at 0.025 each, not adjusted: descriptive):",
        "",
    ]
    layer_rows = []
    for e in res.get("layers") or []:
        for key in ("linear_cka", "kernel_cka", "optimal_cosine"):
            if e.get(f"{key}_null_perm") is None:
                continue
            tests = (e.get("chance") or {}).get(key, {})
            t = tests.get(verdict_null(key, tests), {})
            layer_rows.append({
                "layer": e["layer"], "measure": _label(key), "measured": e.get(key),
                "perm": e.get(f"{key}_null_perm"), "gauss": e.get(f"{key}_null_gauss"),
                "rot": e.get(f"{key}_null_rot"), "d_z": t.get("d_z"),
                "verdict": chance_word(t) if t else "n/a",
            })
    rot = {"rot": "null: rotated"} if any(r.get("rot") is not None for r in layer_rows) else {}
    lines.append(markdown_table(
        layer_rows,
        {"layer": "layer", "measure": "measure", "measured": "measured", "perm": "null: permuted",
         "gauss": "null: Gaussian", **rot, "d_z": "d_z", "verdict": "verdict"},
        formats=_fmts("layer", "measured", "perm", "gauss", "rot", "d_z"),
    ))
    return lines + [""]


def _control_section(res: dict[str, Any]) -> list[str]:
    pc = res.get("positive_control") or {}
    if not pc:
        return []
    keys = [k for k in ("linear_cka", "kernel_cka", "optimal_cosine", "direct_cosine") if k in pc["plain"]]
    rows = []
    for i, snr in enumerate(pc["snr"]):
        row: dict[str, Any] = {"snr": str(snr)}
        for key in keys:
            row[key] = pc["plain"][key][i]
            if key in pc.get("rotated", {}):
                row[key + "_rot"] = pc["rotated"][key][i]
        rows.append(row)
    cols: dict[str, str] = {"snr": "SNR"}
    for key in keys:
        cols[key] = _label(key)
        cols[key + "_rot"] = _label(key) + ", rotated"
    return [
        "## Positive control: each measure's response to real alignment",
        "",
        "V replaced by `sqrt(snr) V_hat / rms(V_hat) + N(0, 1)` (and with V_hat's columns rotated by a "
        "random orthogonal matrix first, to which CKA is invariant) on "
        f"{pc.get('units')} (input, layer, head) units of the same N and d; SNR 0 is the Gaussian null, "
        "inf is V = V_hat.",
        "",
        markdown_table(rows, cols, formats=_fmts(*[c for c in cols if c != "snr"])),
        "",
    ]


def _other_tests_section(res: dict[str, Any]) -> list[str]:
    s = res["summary"]
    lines = []
    g = model_family(s, CHANCE_MEASURES).get("gamma")
    if g:
        null = g.get("null_label", "random-orthogonal control")  # analyses stored before: the control
        vc = s.get("gamma_vs_control")
        lines += [
            "## Gamma test against chance",
            "",
            f"Mean relative gamma difference per (layer, head): values {fmt(g['measured'])}, {null} "
            f"{fmt(g['null'])}; diff {fmt(g['diff'])}, d_z {fmt(g['d_z'])}, p above / below "
            f"{fmt_p(g['p_above'])} / {fmt_p(g['p_below'])} over {g['n']} heads"
            + (f", Holm-adjusted {fmt_p(g['p_holm'])} in the model's family of {g['family_size']}"
               if g.get("p_holm") is not None else "")
            + f": **{chance_word(g)}** "
            "(above chance = more eigenvector-like than the null; exact eigenvectors give ~0)."
            + (f" Against the critique's random-orthogonal control ({fmt(vc['null'])}; descriptive, not "
               f"adjusted): {chance_word(vc)} - "
               "a control that does not keep the weighting by g, so not a null for the values (docs/kpca.md)."
               if vc else ""),
            "",
        ]
    rows = []
    for prefix, label in (("", "paper scaling"), ("official_", "official variant")):
        sh = s.get(prefix + "j_proj_share_h")
        if sh:
            ci = sh.get("ci") or [None, None]
            rows.append({"variant": label, "share": sh["share"], "lo": ci[0], "hi": ci[1], "n": sh["n"]})
    if rows:
        lines += [
            "## J_proj: how much of its variation over (input, layer, head) is ||h||^2's",
            "",
            "`share = cov(J, -||h||^2) / var(J)` (the rest is ||phi(q)||^2's); 95 % interval from a "
            "bootstrap over inputs.",
            "",
            markdown_table(rows, {"variant": "J_proj", "share": _cell("share of ||h||^2"), "lo": "95 % lo",
                                  "hi": "95 % hi", "n": "units"}, formats=_fmts("share", "lo", "hi", "n")),
            "",
        ]
    return lines


def _prefix_section(res: dict[str, Any]) -> list[str]:
    """Causal models: the summary measures of each nested prefix (docs/kpca.md)."""
    causal = res.get("causal")
    if not causal:
        return []
    keys = ("mean_tokens", "units", "linear_cka", "linear_cka_null_perm", "linear_cka_null_gauss",
            "kernel_cka", "kernel_cka_null_perm", "optimal_cosine", "optimal_cosine_null_gauss", "j_proj")
    keys = tuple(k for k in keys if any(k in r for r in causal["by_prefix"]))
    return [
        "## Causal model: by prefix",
        "",
        f"Each window is analysed as {causal['prefixes']} nested prefixes; prefix 1..L is the data set of "
        "the query at position L (what it can attend to). Means over windows, layers and heads; the "
        "chance levels (null perm: tokens permuted; null gauss: Gaussian V) shrink as the prefix grows, "
        "so compare each measure with its null in the same row:",
        "",
        markdown_table(causal["by_prefix"], {"prefix": "prefix", **{k: _cell(_label(k)) for k in keys}},
                       formats={"prefix": str, "units": str, "mean_tokens": "{:.0f}".format,
                                **_fmts(*keys[2:])}),
        "",
    ]


def write_report(res: dict[str, Any], out_dir: str | Path) -> Path:
    """Write the PNG plots and ``report.md`` for one analysis result; returns the markdown path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # NaN-only ranks (sequences shorter than d_v) are expected
        warnings.simplefilter("ignore", RuntimeWarning)
        figs = _gamma_figs(res, out) + _spectrum_fig(res, out)
        figs += _alignment_fig(res, out) + _chance_fig(res, out)
        figs += _control_fig(res, out) + _norms_fig(res, out)
    s = res["summary"]
    keys = (
        "optimal_cosine", "direct_cosine", "signfix_cosine", "linear_cka", "kernel_cka", "relative_frobenius",
        "j_proj", "phi_norm_sq", "h_norm_sq", "log10_h_over_phi", "official_j_proj", "official_log_j_proj",
        "official_phi_norm_sq", "official_h_norm_sq",
    )
    rows: list[dict[str, Any]] = [{"measure": k, "value": fmt(s[k])} for k in keys if k in s]
    if "gamma" in s:
        present = [v for v in ("values", "values_permuted", "random", "eigenvectors") if v in s["gamma"]]
        for variant in present:
            g = s["gamma"][variant]
            rows.append({"measure": f"gamma {variant}: mean abs / rel difference",
                         "value": f"{fmt(g['mean_abs'])} / {fmt(g['mean_rel'])}"})
    for label, st in (res.get("eigen_stats") or {}).items():
        rows.append({"measure": f"eigenvalues ({label} keys) max / min / mean / median",
                     "value": " / ".join(fmt(st[k]["mean"]) for k in ("max", "min", "mean", "median"))})
    if res.get("pap"):
        rows.append({"measure": "PAP sparse-component density (max over layers, iterations)",
                     "value": fmt(s.get("pap_s_density_max"))})
    lines = [
        f"# KPCA analysis: {res['model']['name']}",
        "",
        f"Inputs: {res.get('inputs', 'n/a')}; {s['num_sequences']} sequences, "
        f"mean {fmt(s['mean_tokens'], 1)} analysed tokens, "
        f"{s['num_heads_analysed']} (input, layer, head) triples. "
        f"Attention: {', '.join(res['model'].get('attention_types', []))}.",
        "",
        markdown_table(rows, {"measure": "measure", "value": "value"}),
        "",
        *_chance_section(res),
        *_control_section(res),
        *_other_tests_section(res),
        *_prefix_section(res),
        "Config: " + ", ".join(f"{k}={v}" for k, v in sorted(res["config"].items())),  # as stored (sorted)
        "",
        *[f"![{f}]({f})" for f in figs],
    ]
    return write_text_atomic(out / "report.md", "\n".join(lines) + "\n")


#: under the claims table: what its words do and do not say (a row read alone claimed more than its test)
READING = ('How to read the verdicts: "above chance" says the measure beats its null (V with its tokens '
           "permuted, Gaussian or rotated V) over the model's heads - a number a random model can also "
           "reach, not evidence that attention is kernel PCA. Read P4's alignment rows with the untrained-"
           'copy rows where they are given (--untrained-baseline): "above chance" beside "trained below the '
           'untrained copy" means training made the values less aligned with Theorem 1\'s G H A, not more. '
           '"Not shown" and "not distinguished from chance" mean the test decided nothing at these inputs, '
           'not that the property is absent (docs/kpca.md).')


def write_claims(verdicts: list[dict[str, Any]], out_dir: str | Path, baseline: str | None = None) -> Path:
    """``claims.md`` (one table) and ``claims.json`` in ``out_dir`` from
    :func:`kpca_attention.kpca.claims.judge` results, with the claims over training seeds of runs of one
    recipe (:mod:`.kpca_seeds`) and, with ``baseline`` (a model's name without its seed), every model's
    headline measures against that model's, paired by seed; returns the markdown path."""
    out = Path(out_dir)
    rows = [
        {
            "model": _cell(v["model"]),
            "claim": _cell(r["claim"] + (f" ({r['note']})" if r["note"] else "")),
            "source": _cell(r["source"]),
            "measured": _cell(r["measured"]),
            "threshold": _cell(r["threshold"]),
            "verdict": f"**{_cell(r['verdict'])}**",
        }
        for v in verdicts
        for r in v["rows"]
    ]
    lines = [
        "# KPCA claims: paper vs critique, measured",
        "",
        markdown_table(rows, {"model": "model", "claim": "claim / measure", "source": "source",
                              "measured": "measured", "threshold": "threshold", "verdict": "verdict"}),
        "",
        "Inputs: " + "; ".join(f"{v['model']}: {v['inputs']}" for v in verdicts),
        "",
        READING,
        "",
    ]
    groups = seed_groups(verdicts)
    comparison = against_baseline(groups, baseline) if baseline is not None else None
    lines += seed_section(groups, out, comparison)
    md = write_text_atomic(out / "claims.md", "\n".join(lines) + "\n")
    data: dict[str, Any] = {"thresholds": THRESHOLDS, "paper_eigenvalues": PAPER_EIGENVALUES,
                            "models": verdicts}
    if groups:
        data["over_seeds"] = groups
    if comparison is not None:
        data["over_seeds_baseline"] = comparison
    write_json_atomic(out / "claims.json", data)
    return md
