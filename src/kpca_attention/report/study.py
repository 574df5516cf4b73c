"""The report of a study (:mod:`kpca_attention.studies`): tables, paired statistics and plots from the
per-run results in ``<out>/results/*.json``; writes ``report.md``, ``summary.json`` and PNG plots.

Everything here is read from files, so ``kpca-attention report OUT`` rewrites a report without the
checkpoints, e.g. from results committed to a repository.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..io import read_json, write_json_atomic, write_text_atomic
from ..plotting import new_figure, save_figure
from ..robustness.store import decode_bits
from ..robustness.suites import eps_label
from .stats import paired_summary
from .study_common import (
    fmt_num,
    fmt_p,
    fmt_pm,
    load_runs,
    plot_training_curves,
    read_settings,
    regenerate_lines,
    trace_section,
)
from .tables import markdown_table

__all__ = ["load_study_results", "run_metrics", "write_study_report", "write_image_study_report"]

FULL_SEVERITIES = (1, 2, 3, 4, 5)


# ----------------------------------------------------------------------------- reading

def load_study_results(out: str | os.PathLike) -> tuple[dict[str, Any], dict[str, dict[int, dict[str, Any]]]]:
    """``(settings, {slug: {seed: results}})`` of a study folder; only the items that the settings
    ask for are kept (a store may hold items of an earlier evaluation), and only runs evaluated on
    all of them: a run still in evaluation is listed in ``settings["incomplete"]`` instead (its
    finished items stay in its file and are reused)."""
    settings = read_settings(out)
    suites = settings["suites"]
    corr = suites.get("corruptions") or {}
    want_c = {(c, str(s)) for c in corr.get("names", []) for s in corr.get("severities", [])}
    want_a = {(_attack_name(a), eps_label(e)) for a in suites.get("attacks", []) for e in a["eps"]}
    incomplete: list[str] = []

    def keep(r: dict[str, Any]) -> dict[str, Any] | None:
        r["corruptions"] = {c: {s: x for s, x in per.items() if (c, s) in want_c}
                            for c, per in r.get("corruptions", {}).items()}
        r["corruptions"] = {c: per for c, per in r["corruptions"].items() if per}
        r["attacks"] = {a: {e: x for e, x in per.items() if (a, e) in want_a}
                        for a, per in r.get("attacks", {}).items()}
        r["attacks"] = {a: per for a, per in r["attacks"].items() if per}
        return r

    runs = load_runs(out, settings, keep)
    for slug, per in runs.items():
        for seed in list(per):
            r = per[seed]
            have_c = {(c, sv) for c, x in r["corruptions"].items() for sv in x}
            attacks_for_seed = {(_attack_name(a), eps_label(e)) for a in suites.get("attacks", [])
                                if not a.get("seeds") or seed in a["seeds"] for e in a["eps"]}
            have_a = {(a, e) for a, x in r["attacks"].items() for e in x}
            if have_c != want_c or not attacks_for_seed <= have_a:
                incomplete.append(f"{slug}-s{seed}")
                del per[seed]
    settings["incomplete"] = incomplete
    return settings, {slug: per for slug, per in runs.items() if per}


def _attack_name(a: Mapping[str, Any]) -> str:
    if a.get("label"):
        return a["label"]
    opts = a.get("options") or {}
    if not opts:
        return a["method"]
    return a["method"] + "-" + "-".join(f"{k}{v}" for k, v in sorted(opts.items()))


def per_example(r: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Per-example correctness of one run: ``clean (n,)``, ``corrupted (views, n)``,
    ``<attack>@<eps> (n,)``, and the clean results of the corrupted / attacked subsets."""
    out = {"clean": decode_bits(r["clean"]["correct"])}
    views = [decode_bits(x["correct"]) for per in r.get("corruptions", {}).values() for x in per.values()]
    if views:
        out["corrupted"] = np.stack(views)
        out["clean@corrupt"] = decode_bits(r["clean_corrupt_subset"]["correct"])
    for a, per in r.get("attacks", {}).items():
        for e, x in per.items():
            out[f"{a}@{e}"] = decode_bits(x["correct"])
    if "clean_attack_subset" in r:
        out["clean@attack"] = decode_bits(r["clean_attack_subset"]["correct"])
    return out


def run_metrics(r: Mapping[str, Any]) -> dict[str, float]:
    """Accuracies (fractions), drops from clean on the same images, throughput of one run."""
    ex = per_example(r)
    m = {k: float(v.mean()) for k, v in ex.items()}
    if "corrupted" in ex:
        m["drop:corrupted"] = m["clean@corrupt"] - m["corrupted"]
    for k in [k for k in ex if "@" in k and not k.startswith("clean")]:
        n = len(ex[k])
        m["drop:" + k] = float(ex["clean@attack"][:n].mean()) - m[k]
    m["images_per_s"] = float(r["run"]["images_per_s"])
    return m


def _errors(r: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    return {c: {int(s): 1 - x["top1"] for s, x in per.items()} for c, per in r.get("corruptions", {}).items()}


def _mce(r: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(mCE, relative mCE) of ``r`` relative to ``base`` over the corruptions both have with all five
    severities; relative CE leaves out corruptions that do not degrade the baseline (undefined)."""
    from ..robustness.metrics import corruption_errors, relative_mce

    e, b = _errors(r), _errors(base)
    names = [c for c in e if c in b and sorted(e[c]) == list(FULL_SEVERITIES) == sorted(b[c])]
    if not names:
        return None, None
    ce = corruption_errors({c: e[c] for c in names}, {c: b[c] for c in names})
    rel = []
    ce_r, ce_b = 1 - r["clean_corrupt_subset"]["top1"], 1 - base["clean_corrupt_subset"]["top1"]
    for c in names:
        try:
            rel.append(relative_mce({c: e[c]}, ce_r, {c: b[c]}, ce_b))
        except ValueError:
            pass
    return float(np.mean(list(ce.values()))), (float(np.mean(rel)) if rel else None)


# ----------------------------------------------------------------------------- formatting

def _metric_title(k: str, norms: Mapping[str, str] | None = None) -> str:
    """Column title of a metric key; ``norms``: attack name -> "Linf" | "L2" | "L1"."""
    if k == "clean":
        return "clean"
    if k == "corrupted":
        return "corrupted"
    a, e = k.split("@")
    name = a.upper() if "-" not in a else a
    norm = (norms or {}).get(a, "Linf")
    if norm != "Linf":  # budgets are named in units of 1/255 (eps_label); L2 / L1 budgets read as they are
        return f"{name} {norm} {float(e) / 255:.3g}"
    return f"{name} {e}/255"


# ----------------------------------------------------------------------------- the report

def write_study_report(out: str | os.PathLike) -> Path:
    """Write ``report.md``, ``summary.json`` and the plots of a study folder; returns the report.
    Dispatches on the kind of its suites (``settings.json``: ``suites.kind``, default ``image``)."""
    out = Path(out)
    settings = read_json(out / "settings.json")
    kind = (settings or {}).get("suites", {}).get("kind", "image") if isinstance(settings, dict) else "image"
    if kind == "image":
        return write_image_study_report(out)
    if kind == "lm":
        from .study_lm import write_lm_study_report
        return write_lm_study_report(out)
    if kind == "segmentation":
        from .study_segmentation import write_segmentation_study_report
        return write_segmentation_study_report(out)
    raise ValueError(f"{out}: no report for studies of kind {kind!r}")


def write_image_study_report(out: str | os.PathLike) -> Path:
    """The report of a study of image classifiers (:class:`~kpca_attention.robustness.suites.ImageSuites`)."""
    out = Path(out)
    settings, res = load_study_results(out)
    from ..robustness.attacks import NORMS

    norms = {_attack_name(a): NORMS.get(a["method"], "Linf") for a in settings["suites"].get("attacks", [])}

    def title(k: str) -> str:
        return _metric_title(k, norms)
    if not res:
        raise FileNotFoundError(f"no finished runs under {out / 'results'}: run the study first")
    variants = {v["slug"]: v for v in settings["variants"]}
    slugs = [s for s in variants if s in res]
    label = {s: variants[s]["label"] for s in slugs}
    base = settings["baseline"]
    met = {s: {sd: run_metrics(r) for sd, r in res[s].items()} for s in slugs}
    ex = {s: {sd: per_example(r) for sd, r in res[s].items()} for s in slugs}
    keys = ["clean"] + (["corrupted"] if any("corrupted" in m for per in met.values() for m in per.values())
                        else [])
    att_keys = sorted({k for per in met.values() for m in per.values() for k in m
                       if "@" in k and not k.startswith(("clean", "drop"))},
                      key=lambda k: (k.split("@")[0], float(k.split("@")[1])))
    keys += att_keys
    rng = np.random.default_rng(0)
    summary: dict[str, Any] = {"study": settings["name"], "baseline": base, "metrics": met, "means": {},
                               "paired": {}, "mce": {}}

    s_ = settings
    suites = s_["suites"]
    corr = suites.get("corruptions")
    recipe = ", ".join(f"{k}={v}" for k, v in s_["recipe"].items())
    any_run = next(iter(next(iter(res.values())).values()))["run"]
    lines = [f"# {s_['title']}", ""]
    if s_.get("description"):
        lines += [s_["description"], ""]
    lines += [
        f"Training: preset `{s_['preset']}` with {recipe}; seeds {s_['seeds']}; every variant of one seed "
        "starts from the same weights and sees the same batches (differences are paired). "
        f"Parameters: {any_run['params'] / 1e6:.3f} M ({label[slugs[0]]}).",
        f"Evaluation: clean on {'all' if suites['clean'] is None else suites['clean']} test images"
        + (f"; {len(corr['names'])} corruptions x severities {corr['severities']} on {corr['n']} fixed "
           "test images (imagecorruptions, seeded per image)" if corr else "")
        + ("; attacks in pixel space (Linf eps in units of 1/255, normalisation inside the model): "
           + ", ".join(f"{_attack_name(a)} on {a['n']} images"
                       + (f" (seeds {a['seeds']} only)" if a.get("seeds") else "") for a in suites["attacks"])
           if suites["attacks"] else "")
        + (f"; PAP trace of the RPC models on {s_['trace']} test images" if s_.get("trace") else "") + ".",
    ]
    if s_.get("incomplete"):
        lines += ["", f"Still in evaluation, not shown: {', '.join(s_['incomplete'])} (their finished "
                  "items are kept and reused)."]
    lines += regenerate_lines(s_, out)
    lines.append("")

    # --- table 1: accuracy -------------------------------------------------------------------
    rows = []
    for s in slugs:
        seeds = sorted(met[s])
        row: dict[str, Any] = {"variant": label[s], "seeds": ",".join(map(str, seeds))}
        for k in keys:
            row[k] = fmt_pm([met[s][sd].get(k) for sd in seeds])
        mces = [_mce(res[s][sd], res[base][sd]) for sd in seeds if base in res and sd in res[base]]
        if any(m[0] is not None for m in mces):
            row["mCE"] = fmt_pm([m[0] for m in mces], scale=1)
            row["rel. mCE"] = fmt_pm([m[1] for m in mces], scale=1)
            summary["mce"][s] = {"mce": [m[0] for m in mces], "relative_mce": [m[1] for m in mces]}
        row["img/s"] = fmt_pm([met[s][sd]["images_per_s"] for sd in seeds], scale=1, digits=0)
        row["train min"] = fmt_pm([res[s][sd]["run"]["train_time_s"] / 60 for sd in seeds], scale=1)
        summary["means"][s] = {k: float(np.mean([met[s][sd][k] for sd in seeds if k in met[s][sd]]))
                               for k in keys if any(k in met[s][sd] for sd in seeds)}
        rows.append(row)
    cols = {"variant": "variant", "seeds": "seeds", **{k: title(k) for k in keys}}
    if any("mCE" in r for r in rows):
        cols.update({"mCE": f"mCE vs {label[base]}", "rel. mCE": "rel. mCE"})
    cols.update({"img/s": "train img/s", "train min": "train min"})
    lines += ["## Accuracy (top-1 %, mean ± std over seeds)", "", markdown_table(rows, cols), ""]
    if "mCE" in cols:
        lines += [f"mCE: corruption error relative to {label[base]} of the same seed (100 = as robust, lower "
                  "is better), over the corruptions evaluated at all five severities; rel. mCE the same on "
                  "the drop from clean accuracy of the same images (corruptions that do not degrade "
                  f"{label[base]} are left out). Throughput: the training loop's own images/s (one thread "
                  "per run; it follows the machine's load).", ""]

    # --- table 2: paired differences ----------------------------------------------------------
    if base in res and len(slugs) > 1:
        lines += ["## Paired differences against " + label[base] + " (percentage points)", "",
                  "Per metric: mean difference over seeds (variant - baseline, same seed) with its 95% t "
                  "interval and paired t-test p when there are >= 2 seeds; [bootstrap 95% interval over test "
                  "images, seeds pooled]; exact McNemar p on discordant images (pooled over seeds; not for "
                  "corruptions, whose views of one image are not independent). The first row is the "
                  "baseline against itself across seeds: the size of training noise.", ""]
        prow = []
        bseeds = sorted(ex[base])
        if len(bseeds) >= 2:
            r0 = {"variant": f"{label[base]} s{bseeds[1]} - s{bseeds[0]}"}
            for k in keys:
                if k in ex[base][bseeds[0]] and k in ex[base][bseeds[1]]:  # a run may be half evaluated
                    ps = paired_summary({0: ex[base][bseeds[1]][k]}, {0: ex[base][bseeds[0]][k]}, rng,
                                        mcnemar_test=k != "corrupted")
                    r0[k] = (f"{ps['seed_mean']:+.1f} [{ps['boot_ci'][0]:+.1f}, {ps['boot_ci'][1]:+.1f}]"
                             + (f" McN p {fmt_p(ps['mcnemar_p'])}" if k != "corrupted" else ""))
            prow.append(r0)
        for s in slugs:
            if s == base:
                continue
            r1: dict[str, Any] = {"variant": label[s]}
            summary["paired"][s] = {}
            for k in keys:
                a = {sd: ex[s][sd][k] for sd in ex[s] if k in ex[s][sd]}
                b = {sd: ex[base][sd][k] for sd in ex[base] if k in ex[base][sd]}
                if not set(a) & set(b):
                    continue
                ps = paired_summary(a, b, rng, mcnemar_test=k != "corrupted")
                summary["paired"][s][k] = ps
                cell = f"{ps['seed_mean']:+.1f}"
                if ps["seed_ci"] is not None:
                    cell += f" ({ps['seed_ci'][0]:+.1f}, {ps['seed_ci'][1]:+.1f}) t p {fmt_p(ps['seed_p'])}"
                cell += f" [{ps['boot_ci'][0]:+.1f}, {ps['boot_ci'][1]:+.1f}]"
                if k != "corrupted":
                    cell += f" McN p {fmt_p(ps['mcnemar_p'])}"
                r1[k] = cell
            prow.append(r1)
        lines += [markdown_table(prow, {"variant": "variant", **{k: title(k) for k in keys}}), ""]

    # --- drops from clean ---------------------------------------------------------------------
    drop_keys = [k for k in keys if k != "clean"]
    if drop_keys:
        lines += ["## Robustness as the drop from clean accuracy on the same images (percentage points)", "",
                  "A more accurate model is also more accurate under attack; the drop (clean top-1 of the "
                  "attacked / corrupted images minus top-1 after the attack / corruption) separates "
                  "robustness from accuracy. Lower is more robust; in brackets the mean paired difference "
                  f"against {label[base]}.", ""]
        drows = []
        for s in slugs:
            r2: dict[str, Any] = {"variant": label[s]}
            for k in drop_keys:
                vals = [met[s][sd].get("drop:" + k) for sd in sorted(met[s])]
                cell = fmt_pm(vals)
                if s != base and base in met:
                    d = [100 * (met[s][sd]["drop:" + k] - met[base][sd]["drop:" + k])
                         for sd in met[s] if sd in met[base] and "drop:" + k in met[s][sd]
                         and "drop:" + k in met[base][sd]]
                    if d:
                        cell += f" [{np.mean(d):+.1f}]"
                r2[k] = cell
            drows.append(r2)
        dcols = {"variant": "variant", **{k: title(k) for k in drop_keys}}
        lines += [markdown_table(drows, dcols), ""]

    # --- per corruption -----------------------------------------------------------------------
    if corr:
        names = [c for c in corr["names"] if any(c in r.get("corruptions", {}) for per in res.values()
                                                  for r in per.values())]
        crow = []
        for s in slugs:
            r3: dict[str, Any] = {"variant": label[s]}
            for c in names:
                vals = [np.mean([x["top1"] for x in r["corruptions"][c].values()])
                        for r in res[s].values() if c in r.get("corruptions", {})]
                r3[c] = f"{100 * np.mean(vals):.1f}" if vals else "-"
            crow.append(r3)
        lines += ["## Accuracy per corruption (top-1 %, mean over severities and seeds)", "",
                  markdown_table(crow, {"variant": "variant", **{c: c for c in names}}), ""]

    # --- PAP trace ------------------------------------------------------------------------------
    tlines, trows = trace_section(res, slugs, label)
    if trows:
        summary["trace"] = trows
    lines += tlines

    # --- study-wide checks ----------------------------------------------------------------------
    for f in sorted((out / "checks").glob("*.json")):
        chk = read_json(f)
        if not isinstance(chk, dict):
            continue
        result = chk.get("result")
        lines += [f"## {chk.get('title', f.stem)}", ""]
        if isinstance(result, dict) and all(isinstance(v, (int, float)) for v in result.values()) and result:
            ref = result.get(base)
            crows = [{"variant": label.get(k, k), "value": f"{v:.1f}",
                      f"ratio to {label.get(base, base)}": f"{v / ref:.3f}" if ref else "-"}
                     for k, v in result.items()]
            lines += [markdown_table(crows, list(crows[0])), ""]
        elif isinstance(result, list) and result and all(isinstance(x, dict) for x in result):
            cols_c = [k for k in result[0] if not isinstance(result[0][k], (dict, list))]
            fmt = {k: (lambda v: fmt_num(v, 3)) for k in cols_c if isinstance(result[0][k], float)}
            lines += [markdown_table(result, cols_c, formats=fmt), ""]
        summary.setdefault("checks", {})[f.stem] = result

    # --- plots -----------------------------------------------------------------------------------
    plots = _plots(out, slugs, label, res, met, keys, base, title)
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})\n" for p in plots]
    lines += ["Per-run results with per-example correctness: `results/<variant>-s<seed>.json`; paired "
              "statistics: `summary.json`.", ""]
    write_json_atomic(out / "summary.json", summary)
    return write_text_atomic(out / "report.md", "\n".join(lines))


def _plots(out: Path, slugs: list[str], label: dict[str, str], res: dict[str, dict[int, dict[str, Any]]],
           met: dict[str, dict[int, dict[str, float]]], keys: list[str], base: str,
           title: Any = _metric_title) -> list[Path]:
    paths = []
    fig, axes = new_figure(1, len(keys), figsize=(max(4.0, 3.0 * len(keys)), 4.4), squeeze=False)
    for ax, k in zip(axes[0], keys, strict=True):
        for i, s in enumerate(slugs):
            vals = [100 * met[s][sd][k] for sd in sorted(met[s]) if k in met[s][sd]]
            if vals:
                ax.bar(i, np.mean(vals), color=f"C{i}", alpha=0.6)
                ax.scatter([i] * len(vals), vals, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(slugs)), [label[s] for s in slugs], rotation=60, ha="right", fontsize=7)
        ax.set_title(title(k), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        lo = min((100 * met[s][sd][k] for s in slugs for sd in met[s] if k in met[s][sd]), default=0)
        ax.set_ylim(max(0, lo - 10), None)
    axes[0][0].set_ylabel("top-1 (%); bars: mean, dots: seeds")
    paths.append(save_figure(fig, out / "accuracy.png"))

    if any(r.get("corruptions") for per in res.values() for r in per.values()):
        fig, ax = new_figure(figsize=(6, 4))
        for i, s in enumerate(slugs):
            sev: dict[int, list[float]] = {}
            for r in res[s].values():
                for per in r.get("corruptions", {}).values():
                    for sv, x in per.items():
                        sev.setdefault(int(sv), []).append(100 * x["top1"])
            xs = sorted(sev)
            clean = np.mean([100 * r["clean_corrupt_subset"]["top1"] for r in res[s].values()])
            ax.plot([0, *xs], [clean, *[np.mean(sev[x]) for x in xs]], "o-", color=f"C{i}", label=label[s])
        ax.set_xlabel("severity (0 = clean, same images)")
        ax.set_ylabel("top-1 (%), mean over corruptions and seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, out / "severity.png"))

    attacks = sorted({k.split("@")[0] for k in keys if "@" in k})
    if attacks:
        fig, axes = new_figure(1, len(attacks), figsize=(4.5 * len(attacks), 4), squeeze=False)
        for ax, a in zip(axes[0], attacks, strict=True):
            for i, s in enumerate(slugs):
                eps = sorted({float(k.split("@")[1]) for sd in met[s] for k in met[s][sd]
                              if k.startswith(a + "@")})
                if not eps:
                    continue
                ys = [np.mean([100 * met[s][sd][f"{a}@{e:g}"] for sd in met[s] if f"{a}@{e:g}" in met[s][sd]])
                      for e in eps]
                clean = np.mean([100 * met[s][sd]["clean@attack"] for sd in met[s]])
                ax.plot([0, *eps], [clean, *ys], "o-", color=f"C{i}", label=label[s])
            ax.set_title(a)
            ax.set_xlabel("budget in units of 1/255")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("top-1 (%), mean over seeds")
        axes[0][0].legend(fontsize=7)
        paths.append(save_figure(fig, out / "attacks.png"))

    curves = plot_training_curves(res, slugs, label, "eval_top1", out / "training_curves.png",
                                  'held-out top-1 during training (%)', scale=100, log=False)
    if curves is not None:
        paths.append(curves)
    return paths
