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

__all__ = ["seed_groups", "seed_section", "SEED_FAMILY"]

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


def _group_label(names: Sequence[str]) -> str:
    """The models' common name: run folders ``symvit-s0``, ``symvit-s1`` -> ``symvit``."""
    stems = {_SEED_SUFFIX.sub("", Path(n).name) for n in names}
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


def _verdict(d: Mapping[str, Any]) -> Verdict:
    fields = dict(d)
    for k in ("ci", "tost_ci"):
        fields[k] = tuple(fields[k]) if fields[k] is not None else None
    return Verdict(**fields)


def seed_section(groups: Sequence[Mapping[str, Any]], out: Path) -> list[str]:
    """The markdown of the claims over seeds, with a forest plot per group (``seeds_<label>.png`` in
    ``out``: the alignment measures' differences, which share a scale); empty when no group."""
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
    return lines
