"""The study report's attack checks (:mod:`kpca_attention.robustness.attack_checks`): every run's attacks
compared on the same images for signs of gradient masking, one table of the checks over all runs and one of
how far the weaker attack of each pair overstates robustness, per variant."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...robustness.attack_checks import TOLERANCE, AttackResult, Check, attack_kind, masking_checks
from ...robustness.attacks import attack_norm
from ...tables import fmt_pm, markdown_table
from .suites import attack_name, attack_title, eps_text

__all__ = ["run_attack_results", "attack_checks_section", "attack_gap_plot"]


def run_attack_results(attacks: Sequence[Mapping[str, Any]],
                       ex: Mapping[str, np.ndarray]) -> list[AttackResult]:
    """The attacks of one run as :class:`AttackResult` s: ``attacks`` as ``settings.json`` records them,
    ``ex`` the run's per-example correctness (``<attack name>@<eps label>`` keys, eps labels in units of
    1/255)."""
    spec = {attack_name(a): a for a in attacks}
    out = []
    for key, bits in ex.items():
        name, _, label = key.partition("@")
        if not label or name not in spec:
            continue
        a = spec[name]
        norm = attack_norm(a["method"], a.get("options"))
        eps = float(label) / 255
        text = eps_text(norm, label)
        twin = _plain_twin(a, spec) if (a.get("options") or {}).get("adaptive") else None
        title = attack_title(name, {name: norm})[0]
        out.append(AttackResult(title, attack_kind(a["method"], a.get("options")), norm,
                                a.get("protocol") or "pixel", eps, text, np.asarray(bits, dtype=bool),
                                None if twin is None else attack_title(twin, {twin: norm})[0]))
    return out


def _plain_twin(a: Mapping[str, Any], spec: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The name of the attack that is ``a`` without ``adaptive`` (None when the study has none)."""
    want = {k: v for k, v in (a.get("options") or {}).items() if k != "adaptive"}
    for name, b in spec.items():
        opts = dict(b.get("options") or {})
        same = (b["method"], b.get("protocol")) == (a["method"], a.get("protocol"))
        if same and not opts.pop("adaptive", False) and opts == want:
            return name
    return None


def _points(fraction: float) -> float:
    """A difference of two accuracies in percentage points, without float noise (``0.2``, not
    ``0.20000000000000018``; ``0.0``, not ``-0.0``)."""
    return round(100 * fraction, 6) + 0.0


def attack_checks_section(attacks: Sequence[Mapping[str, Any]],
                          ex: Mapping[str, Mapping[int, Mapping[str, np.ndarray]]], slugs: Sequence[str],
                          label: Mapping[str, str], base: str, summary: dict[str, Any]) -> list[str]:
    """The report lines (none when no run has two comparable attacks); ``summary["attack_checks"]``."""
    checks: dict[tuple[str, str, str, str], dict[tuple[str, int], Check]] = {}
    budgets: dict[str, dict[str, Any]] = {}  # threat -> its norm, protocol and budget (pixel units)
    for s in slugs:
        for sd, e in sorted(ex[s].items()):
            results = run_attack_results(attacks, e)
            budgets.update({r.threat: {"norm": r.norm, "protocol": r.protocol, "eps": r.eps}
                            for r in results})
            for c in masking_checks(results):
                checks.setdefault(c.key, {})[(s, sd)] = c
    if not checks:
        return []
    runs = sorted({run for per in checks.values() for run in per})
    failed = [(k, run, c) for k, per in checks.items() for run, c in per.items() if not c.passed]
    entries = []
    rows = []
    for k, per in checks.items():
        rule, threat, stronger, weaker = k
        bad = [f"{s}-s{sd}" for (s, sd), c in per.items() if not c.passed]
        worst = max(c.excess for c in per.values())
        entries.append({"rule": rule, "threat": threat, **budgets.get(threat, {}), "stronger": stronger,
                        "weaker": weaker,
                        "runs": len(per), "failed": bad, "max_excess": worst,
                        "max_missed": max(c.missed for c in per.values()),
                        "gap_points": {s: {str(sd): _points(-c.excess) for (s2, sd), c in sorted(per.items())
                                           if s2 == s} for s in slugs if any(r[0] == s for r in per)}})
        rows.append({"rule": rule, "threat": threat, "pair": f"{stronger} vs {weaker}",
                     "passed": f"{len(per) - len(bad)} / {len(per)}", "excess": f"{100 * worst:+.1f}",
                     "missed": f"{100 * entries[-1]['max_missed']:.1f}"})
    summary["attack_checks"] = {"tolerance": TOLERANCE, "runs": len(runs), "checks": entries}

    adaptive_ran = any(k[0] == "adaptive >= plain" for k in checks)
    lines = ["## Attack checks: signs of gradient masking", "",
             "Attacks on the same images, compared as an evaluation's sanity checks ask (Carlini et al. "
             "2019, *On Evaluating Adversarial Robustness*; Athalye et al. 2018; AutoAttack's "
             "`check_square_sr`): an iterative gradient attack at least as strong as a one-step one, an "
             "adaptive attack at least as strong as the same attack without, the strongest white-box attack "
             "at least as strong as a gradient-free one, every attack stronger than noise, a larger budget "
             "at least as strong as a smaller one. A check fails when the attack expected to be stronger "
             f"leaves more than {100 * TOLERANCE:.1f} % of the images (AutoAttack's tolerance) more "
             "correct; the white-box check fails, as AutoAttack's flag does, when the gradient-free attack "
             f"breaks more than {100 * TOLERANCE:.1f} % of the images that every iterative attack left "
             "correct (per image: the totals can hide masking on some images). A failure is a sign, not "
             "proof, of gradients that the attacks cannot follow (robustness overstated); passing is not "
             "proof of the opposite: no unbounded attack is run"
             + ("." if adaptive_ran else ", nor an adaptive one."), ""]
    seeded = any(sd != 0 for _, sd in runs)

    def run_name(run: tuple[str, int]) -> str:
        return f"{label[run[0]]} seed {run[1]}" if seeded else label[run[0]]

    if failed:
        def why(c: Any) -> str:
            if c.criterion == "missed":
                return f"{100 * c.missed:.1f} % of the images broken only by the weaker"
            return f"{100 * c.excess:+.1f} points"

        shown = "; ".join(f"{run_name(run)}: {k[2]} vs {k[3]} at {k[1]} ({why(c)})"
                          for k, run, c in failed[:12])
        more = f" and {len(failed) - 12} more" if len(failed) > 12 else ""
        total = sum(len(p) for p in checks.values())
        lines += [f"**{len(failed)} of {total} checks failed**: {shown}{more}.", ""]
    else:
        counted = (f"{len(checks)} comparison{'s' * (len(checks) != 1)}, "
                   f"{len(runs)} run{'s' * (len(runs) != 1)}")
        lines += [f"**Every check passed in every run** ({counted}).", ""]
    lines += [markdown_table(rows, {"rule": "rule", "threat": "budget", "pair": "stronger vs weaker",
                                    "passed": "runs passed",
                                    "excess": "largest excess (points)",
                                    "missed": "images only the weaker broke (%, largest)"}), ""]
    gap_keys = [k for k in checks if k[0] in ("iterative >= one-step", "adaptive >= plain",
                                              "white-box >= black-box")]
    if gap_keys:
        lines += ["How far the weaker attack of each pair overstates robustness: top-1 under the weaker "
                  "minus under the stronger on the same images (percentage points, mean ± std over seeds; "
                  f"in brackets the mean paired difference against {label[base]}; descriptive, not a "
                  "verdict).", ""]
        cells: dict[tuple[str, int], str] = {}
        for i, k in enumerate(gap_keys):
            ref = {sd: -c.excess for (s2, sd), c in checks[k].items() if s2 == base}
            for s in slugs:
                gaps = {sd: -c.excess for (s2, sd), c in checks[k].items() if s2 == s}
                both = [gaps[sd] - ref[sd] for sd in gaps if sd in ref]
                cells[(s, i)] = fmt_pm(list(gaps.values())) + (
                    f" [{100 * float(np.mean(both)):+.1f}]" if s != base and both else "")
        pair = {i: f"{k[3]} − {k[2]} {k[1]}" for i, k in enumerate(gap_keys)}
        if len(gap_keys) <= max(len(slugs), 8):  # one row per variant
            rows2 = [{"variant": label[s], **{f"g{i}": cells[(s, i)] for i in pair}} for s in slugs]
            cols2 = {"variant": "variant", **{f"g{i}": t for i, t in pair.items()}}
        else:  # more comparisons than variants: one row per comparison
            rows2 = [{"pair": t, **{s: cells[(s, i)] for s in slugs}} for i, t in pair.items()]
            cols2 = {"pair": "weaker − stronger", **{s: label[s] for s in slugs}}
        lines += [markdown_table(rows2, cols2), ""]
    return lines


def attack_gap_plot(path: Path, entries: Sequence[Mapping[str, Any]], slugs: Sequence[str],
                    label: Mapping[str, str]) -> Path | None:
    """How far a one-step attack overstates robustness against an iterative one, against the budget: one
    panel per (iterative, one-step) pair run at two or more budgets of one norm, one line per variant (mean
    over seeds, error bars: std over seeds). ``entries``: ``summary["attack_checks"]["checks"]``. None when
    no pair has two budgets."""
    from ...plotting import panel_grid, row_starts, save_figure, series_style

    panels: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for e in entries:
        if e["rule"] == "iterative >= one-step" and e.get("protocol") == "pixel":
            panels.setdefault((e["stronger"], e["weaker"], e["norm"]), []).append(e)
    panels = {k: sorted(v, key=lambda e: e["eps"]) for k, v in panels.items() if len(v) >= 2}
    if not panels:
        return None
    fig, axes = panel_grid(len(panels), panel=(5.4, 4.2))
    for ax, ((stronger, weaker, norm), es) in zip(axes, panels.items(), strict=True):
        for i, s in enumerate(slugs):
            xs, ys, sds = [], [], []
            for e in es:
                vals = list(e["gap_points"].get(s, {}).values())
                if vals:
                    xs.append(255 * e["eps"] if norm == "Linf" else e["eps"])
                    ys.append(float(np.mean(vals)))
                    sds.append(float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0)
            if xs:
                st = series_style(i)
                ax.errorbar(xs, ys, yerr=sds, capsize=2, color=st["color"], marker=st["marker"],
                            linestyle=st["linestyle"], label=label[s])
        ax.axhline(0, color="0.4", linewidth=0.8)
        ax.set_title(f"{weaker} − {stronger}", fontsize=9)
        ax.set_xlabel("Linf budget in units of 1/255" if norm == "Linf" else f"{norm} budget")
        ax.grid(alpha=0.3)
    for ax in row_starts(axes):
        ax.set_ylabel("top-1 difference (points): how much\nthe one-step attack overstates robustness")
    axes[0].legend(fontsize=7, ncol=2)
    return save_figure(fig, path)
