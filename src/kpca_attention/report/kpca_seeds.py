"""The KPCA claims over training seeds: a claim about what training does to a model (its values align with
the KPCA prediction more than chance, or more than the same network before training) is a claim about the
training recipe, so its unit of replication is the seed, not the (layer, head) unit of one trained network.

Runs of one recipe (the same settings but the seed: ``model.recipe`` of their analyses, from
:func:`kpca_attention.train.resolve.run_identity`) are grouped. Per group and per claim, one number per seed
- a mean over that model's units - makes the per-seed "paired differences" the study verdict engine takes
(:mod:`.verdicts`): each headline measure against its verdict null and against the untrained copy (the
run's own initial weights, when ``claims --untrained-baseline`` analysed it), the gamma test's values
against V with its tokens permuted, and J_proj's change over training (last minus first logged epoch). The
group's tests are one Holm family; the words are the engine's (``better`` / ``worse`` / ``inconclusive``:
no equivalence margin is declared for these measures), read in the claim's own terms.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..io import output_path
from ..kpca.chance import HIGHER_IS_BETTER
from ..kpca.claims import BASELINE_MEASURES, P2_CLAIM, fmt, fmt_p
from ..stats import spread
from ..tables import markdown_table
from .forest import forest_plot
from .verdicts import BETTER, WORSE, Family, Verdict

__all__ = ["seed_groups", "seed_section", "against_baseline", "seed_stem", "SEED_FAMILY"]

#: what one group's Holm family is, in words
SEED_FAMILY = ("the group's seed-level tests: each headline measure against its verdict null and against "
               "the untrained copy, the gamma test, J_proj's change over training")
#: the engine's words in each comparison's terms
_WORDS = {
    "null": {BETTER: "above chance", WORSE: "below chance"},
    "copy": {BETTER: "trained above the untrained copy", WORSE: "trained below the untrained copy"},
    "training": {BETTER: "J_proj falls", WORSE: "J_proj rises"},
}
_UNDECIDED = {"null": "not distinguished from chance", "copy": "not distinguished from the untrained copy",
              "training": "not distinguished"}
_LABELS = {"linear_cka": "linear CKA", "kernel_cka": "kernel CKA", "optimal_cosine": "optimal cosine",
           "gamma": "gamma rel. diff", "j_proj": "J_proj (paper scaling)"}
_SEED_SUFFIX = re.compile(r"[-_]s(?:eed)?\d+$")


def seed_stem(name: str) -> str:
    """A run's name without its seed: ``runs/symvit-s0`` -> ``symvit`` (the name of its group)."""
    return _SEED_SUFFIX.sub("", Path(name).name)


def _group_label(names: Sequence[str]) -> str:
    """The models' common name: run folders ``symvit-s0``, ``symvit-s1`` -> ``symvit``."""
    stems = {seed_stem(n) for n in names}
    return stems.pop() if len(stems) == 1 else Path(names[0]).name


def _training_change(v: Mapping[str, Any]) -> float | None:
    for r in v["rows"]:
        if r["claim"] == f"{P2_CLAIM}, paper scaling" and r.get("value") is not None:
            return float(r["value"])
    return None


def seed_groups(verdicts: Sequence[Mapping[str, Any]], alpha: float = 0.05) -> list[dict[str, Any]]:
    """The groups of :func:`kpca_attention.kpca.claims.judge` results that are seeds of one recipe (two or
    more runs), each with its tests over seeds (module docstring), JSON-ready. A group where a seed appears
    twice (one run judged under two names) has no tests and says so in ``note``."""
    by_recipe: dict[str, list[Mapping[str, Any]]] = {}
    for v in verdicts:
        sd = v.get("seed_data") or {}
        if sd.get("recipe") is not None and sd.get("train_seed") is not None:
            by_recipe.setdefault(sd["recipe"], []).append(v)
    groups = []
    for recipe, members in by_recipe.items():
        seeds = [m["seed_data"]["train_seed"] for m in members]
        if len(seeds) < 2:
            continue
        members = sorted(members, key=lambda m: m["seed_data"]["train_seed"])
        if len(set(seeds)) < len(seeds):  # one run judged twice (two paths, or a copy): not independent seeds
            dup = sorted({s for s in seeds if seeds.count(s) > 1})
            groups.append({"label": _group_label([m["model"] for m in members]), "recipe": recipe,
                           "models": [m["model"] for m in members], "seeds": sorted(seeds), "tests": [],
                           "values": {}, "family": None,
                           "note": f"not summarised: seed(s) {', '.join(map(str, dup))} appear more than "
                                   "once (the same run judged twice is not another seed)"})
            continue
        groups.append(_group(recipe, members, alpha))
    labels = [g["label"] for g in groups]
    for g in groups:  # two recipes of one name (e.g. runs/a/m-s0 and runs/b/m-s0): told apart by their digest
        if labels.count(g["label"]) > 1:
            g["label"] = f"{g['label']}-{g['recipe'][:8]}"
    return groups


def _group(recipe: str, members: Sequence[Mapping[str, Any]], alpha: float) -> dict[str, Any]:
    data = [m["seed_data"] for m in members]
    family = Family(SEED_FAMILY)
    spec: dict[tuple[str, str], bool] = {}

    def add(key: tuple[str, str], per_seed: list[float | None], higher_is_better: bool) -> None:
        if all(x is not None for x in per_seed) and len(per_seed) >= 2:
            family.add(key, per_seed)
            spec[key] = higher_is_better

    for k in BASELINE_MEASURES:
        add((k, "null"), [d["vs_null"].get(k) for d in data], HIGHER_IS_BETTER[k])
        add((k, "copy"), [d["vs_copy"].get(k) for d in data], HIGHER_IS_BETTER[k])
    add(("gamma", "null"), [d["vs_null"].get("gamma") for d in data], False)  # lower: more eigenvector-like
    add(("j_proj", "training"), [_training_change(m) for m in members], False)  # the paper: it falls
    verdicts = family.verdicts(None, spec, alpha) if len(family) else {}
    tests = []
    for (measure, comparison), vd in verdicts.items():
        per_seed = [float(x) for x in family.tests[(measure, comparison)]]
        word = _WORDS[comparison].get(vd.word, _UNDECIDED[comparison])
        tests.append({"measure": measure, "comparison": comparison, "per_seed": per_seed,
                      "same_sign": max(sum(x > 0 for x in per_seed), sum(x < 0 for x in per_seed)),
                      "word": word, "verdict": vd.to_dict()})
    values = {}
    for k in BASELINE_MEASURES:
        xs = [d["values"].get(k) for d in data]
        if all(x is not None for x in xs):
            values[k] = {"per_seed": xs, "mean": float(np.mean(xs)), "sd": spread(xs)}
    return {"label": _group_label([m["model"] for m in members]), "recipe": recipe,
            "models": [m["model"] for m in members], "seeds": [d["train_seed"] for d in data],
            "copy_init_seeds": [d.get("copy_init_seed") for d in data],
            "family": family.to_dict() if len(family) else None, "values": values, "tests": tests}


def against_baseline(groups: Sequence[Mapping[str, Any]], baseline: str,
                     alpha: float = 0.05) -> dict[str, Any]:
    """Every other group's headline measures against the group ``baseline``'s, paired by training seed (runs
    of one seed start from the same weights and see the same batches in this project's studies): per seed the
    difference of the two models' values, a paired t test over the seeds both have, Holm over every (model,
    measure) of the comparison. JSON-ready; a ValueError naming the valid labels when ``baseline`` is not a
    group's."""
    labels = [g["label"] for g in groups if g.get("values")]
    base = next((g for g in groups if g["label"] == baseline and g.get("values")), None)
    if base is None:
        raise ValueError(f"--baseline {baseline!r} is not a model judged here with two or more seeds; valid: "
                         + (", ".join(labels) or "none (no model has two seeds)"))
    at = {s: i for i, s in enumerate(base["seeds"])}
    family = Family(f"every model's headline measures against {baseline}'s, paired by training seed")
    seeds: dict[tuple[str, str], list[int]] = {}
    for g in groups:
        if g is base or not g.get("values"):
            continue
        common = [s for s in g["seeds"] if s in at]
        for k in BASELINE_MEASURES:
            if k in g["values"] and k in base["values"] and len(common) >= 2:
                mine = dict(zip(g["seeds"], g["values"][k]["per_seed"], strict=True))
                family.add((g["label"], k), [mine[s] - base["values"][k]["per_seed"][at[s]] for s in common])
                seeds[(g["label"], k)] = common
    verdicts = family.verdicts(None, lambda key: HIGHER_IS_BETTER[key[1]], alpha) if len(family) else {}
    words = {BETTER: f"more aligned than {baseline}", WORSE: f"less aligned than {baseline}"}
    tests = [{"model": m, "measure": k, "seeds": seeds[(m, k)],
              "per_seed": [float(x) for x in family.tests[(m, k)]],
              "word": words.get(vd.word, f"not distinguished from {baseline}"), "verdict": vd.to_dict()}
             for (m, k), vd in verdicts.items()]
    return {"baseline": baseline, "family": family.to_dict() if len(family) else None, "tests": tests}


def _verdict(d: Mapping[str, Any]) -> Verdict:
    fields = dict(d)
    for k in ("ci", "tost_ci"):
        fields[k] = tuple(fields[k]) if fields[k] is not None else None
    return Verdict(**fields)


def _baseline_lines(comparison: Mapping[str, Any], out: Path) -> list[str]:
    b = comparison["baseline"]
    lines = [f"### Against {b}, paired by training seed", ""]
    if not comparison["tests"]:
        return lines + [f"No model shares two or more training seeds with {b}.", ""]
    rows = []
    for t in comparison["tests"]:
        vd = t["verdict"]
        ci = vd["ci"]
        rows.append({"model": t["model"], "measure": _LABELS[t["measure"]],
                     "per_seed": ", ".join(fmt(x) for x in t["per_seed"]),
                     "mean": fmt(vd["mean"]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""),
                     "p": fmt_p(vd["p_raw"]), "holm": fmt_p(vd["p_holm"]),
                     "seeds": ", ".join(map(str, t["seeds"])), "verdict": f"**{t['word']}**"})
    columns = {"model": "model", "measure": "measure", "per_seed": f"minus {b}, per seed",
               "mean": "mean [95 % t]", "p": "p", "holm": "Holm p", "seeds": "seeds", "verdict": "verdict"}
    lines += [markdown_table(rows, columns), "",
              f"Family: {comparison['family']['family']}.", ""]
    png = forest_plot([(f"{t['model']}: {_LABELS[t['measure']]}", _verdict(t["verdict"]))
                       for t in comparison["tests"]],
                      output_path(out, f"seeds_vs_{b}.png", what="plot"),
                      title=f"Each model minus {b}, paired by training seed", unit="CKA / cosine units",
                      words=[t["word"] for t in comparison["tests"]], difference=f"model - {b}")
    return lines + [f"![against {b}]({png.name})", ""]


def seed_section(groups: Sequence[Mapping[str, Any]], out: Path,
                 comparison: Mapping[str, Any] | None = None) -> list[str]:
    """The markdown of the claims over seeds, with a forest plot per group (``seeds_<label>.png`` in
    ``out``: the alignment measures' differences, which share a scale), and of ``comparison``
    (:func:`against_baseline`) with its plot ``seeds_vs_<baseline>.png``; empty when no group."""
    if not groups:
        return []
    lines = ["## Over training seeds", "",
             "Runs of one recipe are seeds of one model: per seed one number (the mean over its (layer, "
             "head) units), a paired t test over seeds, Holm over " + SEED_FAMILY + " (the engine's rule, "
             "`docs/verdicts.md`; no equivalence margin is declared here, so no claim is called equivalent). "
             "Differences are trained minus comparator; \"seeds\" counts those on the mean's side.", ""]
    for g in groups:
        lines += [f"### {g['label']}: seeds {', '.join(str(s) for s in g['seeds'])}", ""]
        if g.get("note"):
            lines += [g["note"].capitalize() + ".", ""]
            continue
        vals = g["values"]
        if vals:
            lines += ["Measured: " + "; ".join(
                f"{_LABELS[k]} {fmt(v['mean'])} +- {fmt(v['sd'])} (SD over seeds; "
                + ", ".join(fmt(x) for x in v["per_seed"]) + ")" for k, v in vals.items()) + ".", ""]
        rows = []
        for t in g["tests"]:
            vd = t["verdict"]
            ci = vd["ci"]
            rows.append({
                "claim": f"{_LABELS[t['measure']]} vs " + {"null": "its null", "copy": "untrained copy",
                                                           "training": "first epoch"}[t["comparison"]],
                "per_seed": ", ".join(fmt(x) for x in t["per_seed"]),
                "mean": fmt(vd["mean"]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""),
                "sd": fmt(vd["sd"]),
                "p": fmt_p(vd["p_raw"]) if vd["p_raw"] is not None else "n/a",
                "holm": fmt_p(vd["p_holm"]) if vd["p_holm"] is not None else "n/a",
                "seeds": f"{t['same_sign']} of {len(t['per_seed'])}",
                "verdict": f"**{t['word']}**",
            })
        lines += [markdown_table(rows, {"claim": "claim (difference)", "per_seed": "per seed",
                                        "mean": "mean [95 % t]", "sd": "SD", "p": "p", "holm": "Holm p",
                                        "seeds": "seeds", "verdict": "verdict"}), ""]
        if g["family"]:
            lines += [f"Family: {g['family']['family']}.", ""]
        shown = [t for t in g["tests"] if t["measure"] in BASELINE_MEASURES]
        if shown:
            png = forest_plot(
                [(f"{_LABELS[t['measure']]} vs {'chance' if t['comparison'] == 'null' else 'copy'}",
                  _verdict(t["verdict"])) for t in shown],
                output_path(out, f"seeds_{g['label']}.png", what="plot"),
                title=f"{g['label']}: trained minus chance or untrained copy, over seeds",
                unit="CKA / cosine units", words=[t["word"] for t in shown],
                difference="trained - comparator")
            lines += [f"![{g['label']} over seeds]({png.name})", ""]
    if comparison is not None:
        lines += _baseline_lines(comparison, out)
    return lines
