"""Reports of the KPCA diagnostics: ``report.md`` with PNG plots for one analysis result
(:func:`write_report`), and the claims table ``claims.md`` + ``claims.json`` (:func:`write_claims`).

The numbers come from :mod:`kpca_attention.kpca` (:func:`~kpca_attention.kpca.run.analyze_model`,
:func:`~kpca_attention.kpca.claims.judge`); this module only lays them out. Every measure is shown
next to its chance levels (token-permuted, Gaussian and rotated V) and the positive control's response
curve; the figures are :mod:`.kpca_figures`'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import write_json_atomic, write_text_atomic
from ..kpca.analysis import CHANCE_MEASURES
from ..kpca.chance import chance_word, model_family, verdict_null
from ..kpca.claims import PAPER_EIGENVALUES, THRESHOLDS, fmt, fmt_p
from ..tables import markdown_table
from .kpca_figures import kpca_figures, measure_label
from .kpca_seeds import against_baseline, seed_groups, seed_section

__all__ = ["write_report", "write_claims"]


def _fmts(*keys: str) -> dict[str, Any]:
    return {k: fmt for k in keys}


def _cell(text: Any) -> str:
    """Table-cell text: the norms ``||h||^2`` of the claims would otherwise split markdown cells."""
    return str(text).replace("|", "\\|")


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
            "measure": measure_label(key),
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
                "layer": e["layer"], "measure": measure_label(key), "measured": e.get(key),
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
        cols[key] = measure_label(key)
        cols[key + "_rot"] = measure_label(key) + ", rotated"
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
        markdown_table(causal["by_prefix"],
                       {"prefix": "prefix", **{k: _cell(measure_label(k)) for k in keys}},
                       formats={"prefix": str, "units": str, "mean_tokens": "{:.0f}".format,
                                **_fmts(*keys[2:])}),
        "",
    ]


def write_report(res: dict[str, Any], out_dir: str | Path) -> Path:
    """Write the PNG plots and ``report.md`` for one analysis result; returns the markdown path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = kpca_figures(res, out)
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
