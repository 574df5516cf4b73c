"""What image classification adds to the study report (:class:`ClassificationSections`): top-1 per
suite (clean, corrupted, each attack and budget), mCE and relative mCE against the baseline, paired
statistics per metric (t over seeds, bootstrap over images, exact McNemar), robustness as the drop from
clean on the same images, the attack checks for gradient masking (:mod:`.masking`), accuracy per
corruption, and the accuracy, severity and attack plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...plotting import new_figure, panel_grid, row_starts, save_figure, series_style
from ...robustness.attacks import attack_settings
from ...robustness.store import decode_bits
from ...stats import paired_summary
from ...tables import fmt_p, fmt_pm, markdown_table
from ..base import SeedMetric, StudySections, bar_plot
from ..images import structure_items
from .masking import attack_checks_section, attack_gap_plot
from .suites import attack_name, attack_title, eps_label, eps_text

__all__ = ["ClassificationSections", "per_example", "run_metrics"]

FULL_SEVERITIES = (1, 2, 3, 4, 5)


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
    if "images_per_s" in r["run"]:  # an existing model evaluated by a study was not trained here
        m["images_per_s"] = float(r["run"]["images_per_s"])
    return m


def _errors(r: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    return {c: {int(s): 1 - x["top1"] for s, x in per.items()} for c, per in r.get("corruptions", {}).items()}


def _no_mce_reason(settings: Mapping[str, Any]) -> str | None:
    """Why a report of these settings has no mCE column although it evaluated corruptions (None when it
    evaluated none, or all five severities): mCE sums each corruption's errors over the five severities."""
    corr = (settings.get("suites") or {}).get("corruptions")
    if not corr or sorted(corr.get("severities") or ()) == list(FULL_SEVERITIES):
        return None
    return (f"No mCE: it sums each corruption's error over all five severities (Hendrycks & Dietterich), and "
            f"these corruptions were evaluated at severities {list(corr['severities'])} only; the "
            "corrupted column is their mean accuracy.")


def _mce(r: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(mCE, relative mCE) of ``r`` relative to ``base`` over the corruptions both have with all five
    severities; relative CE leaves out corruptions that do not degrade the baseline (undefined)."""
    from ...robustness.metrics import corruption_errors, relative_mce

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


#: attacks named as their papers and libraries name them; the rest in capitals (FGSM, PGD, APGD-CE, SPSA, CW)
def _metric_title(k: str, norms: Mapping[str, str] | None = None) -> str:
    """Column title of a metric key; ``norms``: attack name -> "Linf" | "L2" | "L1"."""
    if k == "clean":
        return "clean"
    if k == "corrupted":
        return "corrupted"
    a, e = k.split("@")
    name, lab = attack_title(a, norms)
    return f"{name} {eps_text((norms or {}).get(a, 'Linf'), e)}{lab}"




# ----------------------------------------------------------------------------- the sections

class ClassificationSections(StudySections):
    """Image classification's part of the study report (see the module docstring)."""

    table_title = "## Accuracy (top-1 %, mean ± std over seeds)"
    training_note = ("; every variant of one seed starts from the same weights and sees the same batches "
                     "(differences are paired)")
    paired_unit = " (percentage points)"
    footer = ("Per-run results with per-example correctness: `results/<variant>-s<seed>.json`; paired "
              "statistics: `summary.json`.")

    def __init__(self, settings: Mapping[str, Any], throughput_key: str) -> None:
        from ...robustness.attacks import NORMS

        super().__init__(settings, throughput_key)
        suites = self.settings["suites"]
        corr = suites.get("corruptions") or {}
        self.want_c = {(c, str(s)) for c in corr.get("names", []) for s in corr.get("severities", [])}
        self.want_a = {(attack_name(a), eps_label(e)) for a in suites.get("attacks", []) for e in a["eps"]}
        self.norms = {attack_name(a): NORMS.get(a["method"], "Linf") for a in suites.get("attacks", [])}
        self.ex: dict[str, dict[int, dict[str, np.ndarray]]] = {}

    # --- reading ------------------------------------------------------------------------------------
    def structure(self, items: Mapping[str, Any]) -> dict[str, Any]:
        return structure_items(items)

    def keep(self, r: dict[str, Any]) -> dict[str, Any] | None:
        """Only the corrupted views and attacks the settings ask for (a store may hold items of an earlier
        evaluation)."""
        if "run" not in r or "clean" not in r:
            return None
        r["corruptions"] = {c: {s: x for s, x in per.items() if (c, s) in self.want_c}
                            for c, per in r.get("corruptions", {}).items()}
        r["corruptions"] = {c: per for c, per in r["corruptions"].items() if per}
        r["attacks"] = {a: {e: x for e, x in per.items() if (a, e) in self.want_a}
                        for a, per in r.get("attacks", {}).items()}
        r["attacks"] = {a: per for a, per in r["attacks"].items() if per}
        return r

    def select(self, res: dict[str, dict[int, dict[str, Any]]]) -> dict[str, dict[int, dict[str, Any]]]:
        """Runs evaluated on every item only: a run still in evaluation goes to ``settings["incomplete"]``."""
        attacks = self.settings["suites"].get("attacks", [])
        incomplete: list[str] = []
        for slug, per in res.items():
            for seed in list(per):
                r = per[seed]
                have_c = {(c, sv) for c, x in r["corruptions"].items() for sv in x}
                attacks_for_seed = {(attack_name(a), eps_label(e)) for a in attacks
                                    if not a.get("seeds") or seed in a["seeds"] for e in a["eps"]}
                have_a = {(a, e) for a, x in r["attacks"].items() for e in x}
                if have_c != self.want_c or not attacks_for_seed <= have_a:
                    incomplete.append(f"{slug}-s{seed}")
                    del per[seed]
        self.settings["incomplete"] = incomplete
        return {slug: per for slug, per in res.items() if per}

    # --- numbers ------------------------------------------------------------------------------------
    def prepare(self) -> None:
        super().prepare()
        self.ex = {s: {sd: per_example(r) for sd, r in self.res[s].items()} for s in self.slugs}

    def metrics(self, r: Mapping[str, Any]) -> dict[str, Any]:
        return run_metrics(r)

    def keys(self) -> list[str]:
        met = self.met
        corrupted = any("corrupted" in m for per in met.values() for m in per.values())
        keys = ["clean"] + (["corrupted"] if corrupted else [])
        att_keys = sorted({k for per in met.values() for m in per.values() for k in m
                           if "@" in k and not k.startswith(("clean", "drop"))},
                          key=lambda k: (k.split("@")[0], float(k.split("@")[1])))
        return keys + att_keys

    def title(self, key: str) -> str:
        return _metric_title(key, self.norms)

    def summary_extra(self) -> dict[str, Any]:
        reason = _no_mce_reason(self.settings)
        return {"mce": {}, **({"mce_note": reason} if reason else {})}

    def evaluation(self) -> str:
        s_ = self.settings
        suites = s_["suites"]
        corr = suites.get("corruptions")
        clean = "all" if suites["clean"] is None else f"the first {suites['clean']}"
        attacks = [f"{attack_name(a)} ({attack_settings(a['method'], a.get('options'))}) on {a['n']} images"
                   + (f" (seeds {a['seeds']} only)" if a.get("seeds") else "") for a in suites["attacks"]]
        return (
            f"Evaluation: clean on {clean} test images"
            + (f"; {len(corr['names'])} corruptions x severities {corr['severities']} on "
               + ("all test images" if corr["n"] is None else
                  f"{corr['n']} test images drawn with seed {suites.get('data_seed', 0)} (their own clean "
                  "accuracy is the drop table's and the severity plot's severity 0)")
               + " (imagecorruptions, seeded per image)" if corr else "")
            + ("; attacks in pixel space unless marked (lab) (Linf eps in units of 1/255, normalisation "
               "inside the model; lab: eps on the normalised tensor, as the paper's code): "
               + ", ".join(attacks) if attacks else "")
            + (f"; PAP trace of the RPC models on {s_['trace']} test images" if s_.get("trace") else "") + "."
        )

    def row_extras(self, s: str, seeds: list[int], summary: dict[str, Any]) -> dict[str, str]:
        res, base = self.res, self.base
        mces = [_mce(res[s][sd], res[base][sd]) for sd in seeds if base in res and sd in res[base]]
        if not any(m[0] is not None for m in mces):
            return {}
        summary["mce"][s] = {"mce": [m[0] for m in mces], "relative_mce": [m[1] for m in mces]}
        return {"mCE": fmt_pm([m[0] for m in mces], scale=1),
                "rel. mCE": fmt_pm([m[1] for m in mces], scale=1)}

    def seed_metrics(self) -> list[SeedMetric]:
        """The accuracies, and the mCE against the baseline of the same seed (lower is better; the
        baseline's is 100 by construction, so a variant's difference is its mCE - 100)."""
        out = super().seed_metrics()
        res, base = self.res, self.base
        if base not in res:
            return out
        mce: dict[str, dict[int, float]] = {}
        for s in self.slugs:
            for sd in sorted(self.met[s]):
                m = _mce(res[s][sd], res[base][sd])[0] if sd in res[base] else None
                if m is not None:
                    mce.setdefault(s, {})[sd] = m
        if mce:
            out.append(SeedMetric("mce", f"mCE vs {self.label[base]}", "mCE points (100 = the baseline)",
                                  False, mce))
        return out

    def metric_seeds(self, key: str) -> tuple[int, ...] | None:
        """An attack's metric (``<attack>@<eps>``) on the seeds its suite names, if it names any."""
        name = key.split("@", 1)[0] if "@" in key else None
        return next((tuple(a["seeds"]) for a in self.settings["suites"].get("attacks", [])
                     if a.get("seeds") and attack_name(a) == name), None)

    def extra_columns(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        if not any("mCE" in r for r in rows):
            return {}
        return {"mCE": f"mCE vs {self.label[self.base]}", "rel. mCE": "rel. mCE"}

    def table_notes(self, columns: Mapping[str, str]) -> list[str]:
        if "mCE" not in columns:
            reason = _no_mce_reason(self.settings)
            return [reason, ""] if reason else []
        base = self.label[self.base]
        return [f"mCE: corruption error relative to {base} of the same seed (100 = as robust, lower "
                "is better), over the corruptions evaluated at all five severities; rel. mCE the same on "
                "the drop from clean accuracy of the same images (corruptions that do not degrade "
                f"{base} are left out). Throughput: the training loop's own images/s (one thread "
                "per run; it follows the machine's load).", ""]

    # --- paired differences -------------------------------------------------------------------------
    def paired_note(self) -> str:
        return ("Per metric: mean difference over seeds (variant - baseline, same seed) with its 95% t "
                "interval and paired t-test p when there are >= 2 seeds; [bootstrap 95% interval over test "
                "images, seeds pooled]; exact McNemar p on discordant images (with several seeds: the sign "
                "test on each image's mean difference over the seeds, an image one unit; not for "
                "corruptions, whose views of one image are not independent).")

    def seed_noise(self, b0: int, b1: int, rng: np.random.Generator,
                   summary: dict[str, Any]) -> dict[str, str]:
        ex = self.ex[self.base]
        cells = {}
        for k in self.keys_:
            if k in ex[b0] and k in ex[b1]:  # a run may be half evaluated
                ps = paired_summary({0: ex[b1][k]}, {0: ex[b0][k]}, rng, mcnemar_test=k != "corrupted")
                cells[k] = (f"{ps['seed_mean']:+.1f} [{ps['boot_ci'][0]:+.1f}, {ps['boot_ci'][1]:+.1f}]"
                            + (f" McN p {fmt_p(ps['mcnemar_p'])}" if k != "corrupted" else ""))
        return cells

    def paired(self, s: str, rng: np.random.Generator, summary: dict[str, Any]) -> dict[str, str] | None:
        ex, base = self.ex, self.base
        cells: dict[str, str] = {}
        summary["paired"][s] = {}
        for k in self.keys_:
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
            cells[k] = cell
        return cells

    # --- sections and plots -------------------------------------------------------------------------
    def sections_before_trace(self, out: Path, summary: dict[str, Any]) -> list[str]:
        """Robustness as the drop from clean; the attack checks; accuracy per corruption."""
        met, slugs, label, base, res = self.met, self.slugs, self.label, self.base, self.res
        lines: list[str] = []
        drop_keys = [k for k in self.keys_ if k != "clean"]
        if drop_keys:
            lines += ["## Robustness as the drop from clean accuracy on the same images (percentage points)",
                      "", "A more accurate model is also more accurate under attack; the drop (clean top-1 "
                      "of the attacked / corrupted images minus top-1 after the attack / corruption) "
                      "separates robustness from accuracy. Lower is more robust; in brackets the mean paired "
                      f"difference against {label[base]}.", ""]
            drows = []
            for s in slugs:
                r2: dict[str, Any] = {"variant": label[s]}
                for k in drop_keys:
                    cell = fmt_pm([met[s][sd].get("drop:" + k) for sd in sorted(met[s])])
                    if s != base and base in met:
                        d = [100 * (met[s][sd]["drop:" + k] - met[base][sd]["drop:" + k])
                             for sd in met[s] if sd in met[base] and "drop:" + k in met[s][sd]
                             and "drop:" + k in met[base][sd]]
                        if d:
                            cell += f" [{np.mean(d):+.1f}]"
                    r2[k] = cell
                drows.append(r2)
            dcols = {"variant": "variant", **{k: self.title(k) for k in drop_keys}}
            lines += [markdown_table(drows, dcols), ""]
        lines += attack_checks_section(self.settings["suites"].get("attacks", []), self.ex, slugs, label,
                                       base, summary)
        corr = self.settings["suites"].get("corruptions")
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
        ood = self.settings["suites"].get("ood")
        if ood:
            lines += _ood_section(ood, slugs, label, res)
        return lines

    def plots(self, out: Path, summary: dict[str, Any]) -> tuple[list[Path], list[Path]]:
        paths = _plots(out, self.slugs, self.label, self.res, self.met, self.keys_, self.title, self.norms)
        gaps = attack_gap_plot(out / "attack_gaps.png", summary.get("attack_checks", {}).get("checks", []),
                               self.slugs, self.label)
        return paths + ([gaps] if gaps is not None else []), []


def _ood_section(ood: Mapping[str, Any], slugs: list[str], label: dict[str, str],
                 res: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """ImageNet-A / -R top-1 on the 200-class mask and ImageNet-O AUPR per variant (mean over seeds); a
    set without results says why (no folder given, or none evaluated)."""
    rows, notes = [], []
    for name in ("imagenet-a", "imagenet-r", "imagenet-o"):
        field_ = name.replace("-", "_")
        have = {s: [r["ood"][name] for r in res[s].values() if name in r.get("ood", {})] for s in slugs}
        if not any(have.values()):
            why = "no folder given" if ood.get(field_) is None else f"{ood[field_]} not found or not run"
            why = why if name != "imagenet-o" or ood.get("imagenet_val") else why + "; needs --imagenet-val"
            notes.append(f"- {name}: skipped ({why})")
            continue
        o = name == "imagenet-o"
        row = {"set": name, "metric": "AUPR (%)" if o else "top-1 (%) on the 200-class mask"}
        for s in slugs:
            vals = [x["aupr"] if o else 100 * x["top1"] for x in have[s]]
            row[s] = f"{np.mean(vals):.2f}" if vals else "-"
        rows.append(row)
    lines = ["## Out-of-distribution sets", ""]
    if rows:
        cols = {"set": "set", "metric": "metric", **{s: label[s] for s in slugs}}
        lines += [markdown_table(rows, cols), ""]
    return lines + notes + [""]


def _plots(out: Path, slugs: list[str], label: dict[str, str], res: dict[str, dict[int, dict[str, Any]]],
           met: dict[str, dict[int, dict[str, float]]], keys: list[str],
           title: Any = _metric_title, norms: Mapping[str, str] | None = None) -> list[Path]:
    """The accuracy bars per metric, accuracy against corruption severity, accuracy against attack budget
    (``norms``: attack key name -> "Linf" | "L2" | "L1", as for the titles; Linf when not named)."""
    paths = []
    fig, axes = panel_grid(len(keys), panel=(3.0, 4.4))
    for ax, k in zip(axes, keys, strict=True):
        bar_plot(ax, {s: [100 * met[s][sd][k] for sd in sorted(met[s]) if k in met[s][sd]] for s in slugs},
                 slugs, label, rotation=60)
        ax.set_title(title(k), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in row_starts(axes):
        ax.set_ylabel("top-1 (%); bars: mean, dots: seeds")
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
            ax.plot([0, *xs], [clean, *[np.mean(sev[x]) for x in xs]], **series_style(i), label=label[s])
        ax.set_xlabel("severity (0 = clean, same images)")
        ax.set_xticks([0, *xs])
        ax.set_ylabel("top-1 (%), mean over corruptions and seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, out / "severity.png"))

    attacks = sorted({k.split("@")[0] for k in keys if "@" in k})
    if attacks:
        fig, axes = panel_grid(len(attacks), panel=(4.5, 4.0))
        for ax, a in zip(axes, attacks, strict=True):
            norm = (norms or {}).get(a, "Linf")
            unit = 1.0 if norm == "Linf" else 255.0  # keys name every budget in units of 1/255
            for i, s in enumerate(slugs):
                eps = sorted({float(k.split("@")[1]) for sd in met[s] for k in met[s][sd]
                              if k.startswith(a + "@")})
                if not eps:
                    continue
                ys = [np.mean([100 * met[s][sd][f"{a}@{e:g}"] for sd in met[s] if f"{a}@{e:g}" in met[s][sd]])
                      for e in eps]
                clean = np.mean([100 * met[s][sd]["clean@attack"] for sd in met[s]])
                ax.plot([0, *[e / unit for e in eps]], [clean, *ys], **series_style(i), label=label[s])
            budgets = sorted({0.0} | {float(k.split("@")[1]) / unit for s in slugs for sd in met[s]
                                      for k in met[s][sd] if k.startswith(a + "@")})
            ax.set_xticks(budgets, [f"{e:g}" for e in budgets])
            ax.set_title("".join(attack_title(a, norms)))
            ax.set_xlabel("Linf budget in units of 1/255" if norm == "Linf" else f"{norm} budget")
            ax.grid(alpha=0.3)
        for ax in row_starts(axes):
            ax.set_ylabel("top-1 (%), mean over seeds")
        axes[0].legend(fontsize=7)
        paths.append(save_figure(fig, out / "attacks.png"))

    return paths
