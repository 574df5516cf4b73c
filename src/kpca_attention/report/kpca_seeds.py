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

__all__ = ["seed_groups", "seed_section", "against_baseline", "group_names", "strip_seed", "SEED_FAMILY"]

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
_AGAINST = {"null": "its null", "copy": "untrained copy", "training": "first epoch"}


def strip_seed(label: str, seed: int | None) -> str:
    """``label`` without its seed suffix (``symvit-s0`` / ``symvit_seed0`` with seed 0 -> ``symvit``); only
    the run's own seed is stripped, so ``vit_s16`` stays itself."""
    if seed is not None:
        for sep in ("-", "_"):
            for tag in ("s", "seed"):
                if label.endswith(f"{sep}{tag}{seed}") and len(label) > len(f"{sep}{tag}{seed}"):
                    return label[: -len(f"{sep}{tag}{seed}")]
    return label


def _label(v: Mapping[str, Any]) -> str:
    """A judged model's file label (set by the command line), else its name's last part."""
    return str(v.get("label") or Path(str(v["model"])).name)


def group_names(members: Sequence[tuple[str, str | None, int | None]]) -> dict[str, str]:
    """``{recipe: group name}`` for the recipes of two or more ``(label, recipe, train seed)`` members: the
    labels without their seed (their common stem, else the first label), two recipes under one name told apart
    by their digest (``m-1a2b3c4d``). The command line checks ``--baseline`` against these before any
    analysis, with the same rule :func:`seed_groups` names its groups by."""
    by_recipe: dict[str, list[tuple[str, int | None]]] = {}
    for label, recipe, seed in members:
        if recipe is not None and seed is not None:
            by_recipe.setdefault(recipe, []).append((label, seed))
    names = {}
    for recipe, ms in by_recipe.items():
        if len(ms) >= 2:
            stems = {strip_seed(label, seed) for label, seed in ms}
            names[recipe] = stems.pop() if len(stems) == 1 else ms[0][0]
    taken = list(names.values())
    return {r: (f"{n}-{r[:8]}" if taken.count(n) > 1 else n) for r, n in names.items()}


def _finite(x: Any) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def _training_change(v: Mapping[str, Any]) -> float | None:
    for r in v["rows"]:
        if r["claim"] == f"{P2_CLAIM}, paper scaling":
            return _finite(r.get("value"))
    return None


def _on_mean_side(xs: Sequence[float]) -> int:
    mean = float(np.mean(xs))
    return int(sum(np.sign(x) == np.sign(mean) for x in xs)) if mean != 0 else 0


def seed_groups(verdicts: Sequence[Mapping[str, Any]], alpha: float = 0.05) -> list[dict[str, Any]]:
    """The groups of :func:`kpca_attention.kpca.claims.judge` results that are seeds of one recipe (two or
    more runs), each with its tests over seeds (module docstring), JSON-ready. A group where one seed
    appears in more than one model has no tests and says so in its ``notes``; so does a name shared by
    models of different recipes."""
    members = [(v, _label(v), (v.get("seed_data") or {}).get("recipe"),
                (v.get("seed_data") or {}).get("train_seed")) for v in verdicts]
    names = group_names([(label, recipe, seed) for _, label, recipe, seed in members])
    groups = []
    for recipe, name in names.items():
        ms = sorted((m for m in members if m[2] == recipe), key=lambda m: m[3])
        seeds = [m[3] for m in ms]
        if len(set(seeds)) < len(seeds):  # reruns of one seed, or one run judged twice: not independent seeds
            dup = sorted({s for s in seeds if seeds.count(s) > 1})
            groups.append({"label": name, "recipe": recipe, "models": [m[0]["model"] for m in ms],
                           "seeds": seeds, "tests": [], "values": {}, "family": None, "notes": [
                               f"not summarised: seed(s) {', '.join(map(str, dup))} appear in more than one "
                               "model (a run judged twice, or reruns of one seed, are not other seeds)"]})
            continue
        groups.append(_group(name, recipe, [m[0] for m in ms], alpha))
    # models that share a name without their seed but not their recipe: said, not grouped in silence
    stems: dict[str, set[str | None]] = {}
    for _, label, recipe, seed in members:
        if seed is not None:
            stems.setdefault(strip_seed(label, seed), set()).add(recipe)
    for stem, recipes in stems.items():
        if len(recipes) > 1:
            for g in groups:
                if g["label"] == stem or g["label"].startswith(f"{stem}-"):
                    g.setdefault("notes", []).append(
                        f"models named {stem} come from {len(recipes)} different recipes (settings other "
                        "than the seed differ): only runs of one recipe are summarised together")
    return groups


def _group(name: str, recipe: str, members: Sequence[Mapping[str, Any]], alpha: float) -> dict[str, Any]:
    data = [m["seed_data"] for m in members]
    all_seeds = [d["train_seed"] for d in data]
    family = Family(SEED_FAMILY)
    spec: dict[tuple[str, str], bool] = {}
    seeds_of: dict[tuple[str, str], list[int]] = {}
    notes: list[str] = []

    def add(key: tuple[str, str], per_seed: list[Any], higher_is_better: bool) -> None:
        have = [(s, x) for s, x in zip(all_seeds, map(_finite, per_seed), strict=True) if x is not None]
        lacking = [s for s, x in zip(all_seeds, map(_finite, per_seed), strict=True) if x is None]
        what = f"{_LABELS[key[0]]} vs {_AGAINST[key[1]]}"
        if len(have) < 2:
            if len(lacking) < len(all_seeds):  # some seeds have it: say why it is not tested
                notes.append(f"{what}: not tested (only {len(have)} seed has it)")
            return
        if lacking:
            notes.append(f"{what}: over seeds {', '.join(str(s) for s, _ in have)} (seed(s) "
                         f"{', '.join(map(str, lacking))} lack it)")
        family.add(key, [x for _, x in have])
        spec[key] = higher_is_better
        seeds_of[key] = [s for s, _ in have]

    for k in BASELINE_MEASURES:
        add((k, "null"), [d["vs_null"].get(k) for d in data], HIGHER_IS_BETTER[k])
        add((k, "copy"), [d["vs_copy"].get(k) for d in data], HIGHER_IS_BETTER[k])
    add(("gamma", "null"), [d["vs_null"].get("gamma") for d in data], False)  # lower: more eigenvector-like
    add(("j_proj", "training"), [_training_change(m) for m in members], False)  # the paper: it falls
    other_init = [(d["train_seed"], d.get("copy_init_seed")) for d in data
                  if d.get("copy_init_seed") is not None and d.get("copy_init_seed") != d["train_seed"]]
    if other_init:
        which = ", ".join(f"{s} (init seed {i})" for s, i in other_init)
        notes.append(f"the untrained copies of seed(s) {which} were built under another seed: not those "
                     "runs' initial weights")
    verdicts = family.verdicts(None, spec, alpha) if len(family) else {}
    tests = []
    for (measure, comparison), vd in verdicts.items():
        per_seed = [float(x) for x in family.tests[(measure, comparison)]]
        word = _WORDS[comparison].get(vd.word, _UNDECIDED[comparison])
        tests.append({"measure": measure, "comparison": comparison, "seeds": seeds_of[(measure, comparison)],
                      "per_seed": per_seed, "on_mean_side": _on_mean_side(per_seed), "word": word,
                      "verdict": vd.to_dict()})
    values = {}
    for k in BASELINE_MEASURES:
        xs = [_finite(d["values"].get(k)) for d in data]
        if all(x is not None for x in xs):
            values[k] = {"per_seed": xs, "mean": float(np.mean(xs)), "sd": spread(xs)}
    return {"label": name, "recipe": recipe, "models": [m["model"] for m in members], "seeds": all_seeds,
            "copy_init_seeds": [d.get("copy_init_seed") for d in data],
            "inputs": [d.get("inputs") for d in data],
            "inputs_sha256": [d.get("inputs_sha256") for d in data],
            "family": family.to_dict() if len(family) else None, "values": values, "tests": tests,
            "notes": notes}


def against_baseline(groups: Sequence[Mapping[str, Any]], baseline: str,
                     alpha: float = 0.05) -> dict[str, Any]:
    """Every other group's headline measures against the group ``baseline``'s, paired by training seed (the
    seed as a blocking factor: in this project's studies runs of one seed see the same batches in the same
    order; models of other architectures do not share initial weights): per seed the difference of the two
    models' values, a paired t test over the seeds both have, Holm over every (model, measure). Pairs
    analysed on other inputs (another description or inputs digest) are not compared. JSON-ready; when
    ``baseline`` names no group with values, no tests and a ``note`` naming the valid names."""
    labels = [g["label"] for g in groups if g.get("values")]
    base = next((g for g in groups if g["label"] == baseline and g.get("values")), None)
    if base is None:
        return {"baseline": baseline, "family": None, "tests": [],
                "note": f"{baseline} is not a model judged here with two or more seeds of one recipe; valid: "
                        + (", ".join(labels) or "none")}
    at = {s: i for i, s in enumerate(base["seeds"])}
    family = Family(f"every model's headline measures against {baseline}'s, paired by training seed")
    seeds: dict[tuple[str, str], list[int]] = {}
    skipped = []
    for g in groups:
        if g is base or not g.get("values"):
            continue
        common = [s for s in g["seeds"] if s in at]
        mine_at = {s: i for i, s in enumerate(g["seeds"])}
        same_inputs = all(
            (g.get(key) or [None] * len(g["seeds"]))[mine_at[s]] == (base.get(key) or [None] * len(at))[at[s]]
            for s in common for key in ("inputs", "inputs_sha256"))
        if not same_inputs:
            skipped.append(g["label"])
            continue
        for k in BASELINE_MEASURES:
            if k in g["values"] and k in base["values"] and len(common) >= 2:
                family.add((g["label"], k), [g["values"][k]["per_seed"][mine_at[s]]
                                             - base["values"][k]["per_seed"][at[s]] for s in common])
                seeds[(g["label"], k)] = common
    verdicts = family.verdicts(None, lambda key: HIGHER_IS_BETTER[key[1]], alpha) if len(family) else {}
    words = {BETTER: f"more aligned than {baseline}", WORSE: f"less aligned than {baseline}"}
    tests = [{"model": m, "measure": k, "seeds": seeds[(m, k)],
              "per_seed": [float(x) for x in family.tests[(m, k)]],
              "word": words.get(vd.word, f"not distinguished from {baseline}"), "verdict": vd.to_dict()}
             for (m, k), vd in verdicts.items()]
    out = {"baseline": baseline, "family": family.to_dict() if len(family) else None, "tests": tests}
    if skipped:
        out["note"] = (f"not compared (analysed on other inputs than {baseline}): " + ", ".join(skipped))
    return out


def _verdict(d: Mapping[str, Any]) -> Verdict:
    fields = dict(d)
    for k in ("ci", "tost_ci"):
        fields[k] = tuple(fields[k]) if fields[k] is not None else None
    return Verdict(**fields)


def _baseline_lines(comparison: Mapping[str, Any], out: Path) -> list[str]:
    b = comparison["baseline"]
    lines = [f"### Against {b}, paired by training seed", ""]
    if comparison.get("note"):
        lines += [f"Note: {comparison['note']}.", ""]
    if not comparison["tests"]:
        return lines + [f"No model shares two or more training seeds (and its inputs) with {b}.", ""]
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
        lines += [f"Note: {n}." for n in g.get("notes") or []] + ([""] if g.get("notes") else [])
        if not g["tests"] and not g.get("values"):
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
                "claim": f"{_LABELS[t['measure']]} vs {_AGAINST[t['comparison']]}",
                "per_seed": ", ".join(fmt(x) for x in t["per_seed"]),
                "mean": fmt(vd["mean"]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""),
                "sd": fmt(vd["sd"]),
                "p": fmt_p(vd["p_raw"]) if vd["p_raw"] is not None else "n/a",
                "holm": fmt_p(vd["p_holm"]) if vd["p_holm"] is not None else "n/a",
                "seeds": f"{t['on_mean_side']} of {len(t['per_seed'])}",
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
