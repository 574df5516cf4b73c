"""The KPCA claims over training seeds (report.kpca_seeds): runs of one recipe are grouped, each claim is
tested over seeds with the verdict engine (one Holm family per group), and the words follow the data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kpca_attention.kpca.claims import P2_CLAIM
from kpca_attention.report.kpca import write_claims
from kpca_attention.report.kpca_seeds import seed_groups


def verdict(name: str, seed: int, recipe: str | None, *, copy_diff: float, null_diff: float,
            j_change: float | None = -0.5, value: float = 0.2) -> dict:
    """A judge() result as the summary reads it: seed data and the P2 row."""
    row = {"source": "paper", "measured": "m", "threshold": "t", "verdict": "v", "note": ""}
    rows = [{**row, "claim": "P1: ...", "value": 1.0}]
    if j_change is not None:
        rows.append({**row, "claim": f"{P2_CLAIM}, paper scaling", "value": j_change})
    measures = ("linear_cka", "kernel_cka", "optimal_cosine")
    return {"model": name, "inputs": "x", "rows": rows, "seed_data": {
        "train_seed": seed, "recipe": recipe, "copy_init_seed": seed,
        "values": {k: value for k in measures},
        "vs_null": {**{k: null_diff for k in measures}, "gamma": -0.02},
        "vs_copy": {k: copy_diff for k in measures}}}


def test_seeds_of_one_recipe_are_grouped_and_tested_over_seeds():
    rng = np.random.default_rng(0)
    group = [verdict(f"runs/symvit-s{s}", s, "abc", copy_diff=-0.2 + 0.002 * rng.standard_normal(),
                     null_diff=0.003 * rng.standard_normal(), value=0.2 + 0.01 * s) for s in range(4)]
    other = [verdict("runs/vit-s0", 0, "def", copy_diff=-0.1, null_diff=0.1),  # one seed: no group
             verdict("hf-model", 0, None, copy_diff=-0.1, null_diff=0.1)]  # no recipe: not a run
    groups = seed_groups(other + group[::-1])
    assert len(groups) == 1
    g = groups[0]
    assert g["label"] == "symvit" and g["seeds"] == [0, 1, 2, 3] and g["models"][0] == "runs/symvit-s0"
    words = {(t["measure"], t["comparison"]): t["word"] for t in g["tests"]}
    # 3 vs null, 3 vs copy, gamma (every seed -0.02: no spread, no test), J_proj's change (likewise)
    assert len(words) == 8 and g["family"]["size"] == 6
    for k in ("linear_cka", "kernel_cka", "optimal_cosine"):
        assert words[(k, "copy")] == "trained below the untrained copy"
        assert words[(k, "null")] == "not distinguished from chance"
    assert words[("gamma", "null")] == "not distinguished from chance"  # no spread: no t test
    t = next(t for t in g["tests"] if t["comparison"] == "copy")
    assert t["on_mean_side"] == 4 and t["verdict"]["p_holm"] >= t["verdict"]["p_raw"]
    assert g["values"]["linear_cka"]["mean"] == pytest.approx(0.215)


def test_training_change_and_direction_words():
    rng = np.random.default_rng(1)
    up = [verdict(f"r-s{s}", s, "r", copy_diff=0.3 + 0.01 * rng.standard_normal(),
                  null_diff=0.2 + 0.01 * rng.standard_normal(), j_change=-1.0 + 0.05 * rng.standard_normal())
          for s in range(5)]
    words = {(t["measure"], t["comparison"]): t["word"] for t in seed_groups(up)[0]["tests"]}
    assert words[("linear_cka", "copy")] == "trained above the untrained copy"
    assert words[("linear_cka", "null")] == "above chance"
    assert words[("j_proj", "training")] == "J_proj falls"
    # a model without a training log, or without a copy, has no test of that claim in the group
    partial = [verdict(f"r-s{s}", s, "r", copy_diff=0.3, null_diff=0.2, j_change=None if s else -1.0)
               for s in range(3)]
    for v in partial[1:]:
        v["seed_data"]["vs_copy"] = {}
    keys = {(t["measure"], t["comparison"]) for t in seed_groups(partial)[0]["tests"]}
    assert ("j_proj", "training") not in keys and ("linear_cka", "copy") not in keys


def test_a_seed_judged_twice_is_not_summarised_and_the_section_is_written(tmp_path):
    dup = [verdict("a/m-s0", 0, "r", copy_diff=-0.2, null_diff=0.1),
           verdict("b/m-s0", 0, "r", copy_diff=-0.2, null_diff=0.1)]
    (g,) = seed_groups(dup)
    assert not g["tests"] and "appear in more than one model" in g["notes"][0]
    rng = np.random.default_rng(2)
    vs = [verdict(f"runs/m-s{s}", s, "r", copy_diff=-0.2 + 0.01 * rng.standard_normal(),
                  null_diff=0.05 + 0.01 * rng.standard_normal()) for s in range(3)]
    for v in vs:
        v.update(attention_types=[], summary={})
    md = write_claims(vs, tmp_path).read_text()
    assert "## Over training seeds" in md and "### m: seeds 0, 1, 2" in md
    assert (tmp_path / "seeds_m.png").stat().st_size > 1000
    data = json.loads((tmp_path / "claims.json").read_text())
    assert data["over_seeds"][0]["seeds"] == [0, 1, 2]
    # two recipes under one name get one section each, told apart by their digests
    twin = [dict(v, model=v["model"].replace("runs/", "other/"), seed_data={**v["seed_data"], "recipe": "q"})
            for v in vs]
    assert sorted(g["label"] for g in seed_groups(vs + twin)) == ["m-q", "m-r"]
    # models of different recipes: no section, no key
    for i, v in enumerate(vs):
        v["seed_data"]["recipe"] = f"r{i}"
    md = write_claims(vs, tmp_path).read_text()
    assert "Over training seeds" not in md
    assert "over_seeds" not in json.loads((tmp_path / "claims.json").read_text())


def test_models_against_a_baseline_paired_by_seed(tmp_path):
    """--baseline: each model's headline measures minus the baseline's, per shared seed, t test over seeds,
    Holm over every (model, measure); a model a fixed 0.05 above the baseline in every seed but for small
    seed noise is "more aligned", one at the baseline's values "not distinguished"."""
    from kpca_attention.report.kpca_seeds import against_baseline

    rng = np.random.default_rng(3)
    base = [verdict(f"r/sym-s{s}", s, "a", copy_diff=-0.2, null_diff=0.1,
                    value=0.2 + 0.02 * rng.standard_normal()) for s in range(4)]
    vals = {s: base[s]["seed_data"]["values"]["linear_cka"] for s in range(4)}
    up = [verdict(f"r/rpc-s{s}", s, "b", copy_diff=-0.2, null_diff=0.1,
                  value=vals[s] + 0.05 + 0.001 * rng.standard_normal()) for s in range(1, 4)]  # seeds 1-3
    same = [verdict(f"r/alt-s{s}", s, "c", copy_diff=-0.2, null_diff=0.1,
                    value=vals[s] + 0.01 * rng.standard_normal()) for s in range(4)]
    groups = seed_groups(base + up + same)
    cmp = against_baseline(groups, "sym")
    words = {(t["model"], t["measure"]): t for t in cmp["tests"]}
    assert cmp["family"]["size"] == 6
    assert words[("rpc", "linear_cka")]["word"] == "more aligned than sym"
    assert words[("rpc", "linear_cka")]["seeds"] == [1, 2, 3]
    assert words[("alt", "kernel_cka")]["word"] == "not distinguished from sym"
    missing = against_baseline(groups, "vit")  # no such group: said, no tests (the table is still written)
    assert not missing["tests"] and "valid: sym, rpc, alt" in missing["note"]
    for v in base + up + same:
        v.update(attention_types=[], summary={})
    md = write_claims(base + up + same, tmp_path, baseline="sym").read_text()
    assert "### Against sym, paired by training seed" in md and (tmp_path / "seeds_vs_sym.png").exists()
    assert json.loads((tmp_path / "claims.json").read_text())["over_seeds_baseline"]["baseline"] == "sym"


def test_seed_column_counts_the_mean_side_gamma_direction_and_missing_values():
    """One outlier seed carrying the mean is 1 of 3 on its side; the gamma test reads lower as more
    eigenvector-like; a seed lacking a claim (no copy, a NaN) is left out of that claim's test and said."""
    from kpca_attention.report.kpca_seeds import seed_groups as groups_of

    vs = [verdict(f"m-s{s}", s, "r", copy_diff=d, null_diff=0.1) for s, d in enumerate((-0.01, -0.011, 0.5))]
    for v, g in zip(vs, (-0.03, -0.031, -0.029), strict=True):
        v["seed_data"]["vs_null"]["gamma"] = g  # values below their permuted null: more eigenvector-like
    vs[2]["seed_data"]["vs_null"]["kernel_cka"] = float("nan")  # undefined: missing, not a crash
    (g,) = groups_of(vs)
    t = {(x["measure"], x["comparison"]): x for x in g["tests"]}
    assert t[("linear_cka", "copy")]["on_mean_side"] == 1  # mean +0.16: only the outlier is on its side
    assert t[("gamma", "null")]["word"] == "above chance"
    assert t[("kernel_cka", "null")]["seeds"] == [0, 1]
    assert any("kernel CKA vs its null: over seeds 0, 1 (seed(s) 2 lack it)" in n for n in g["notes"])
    vs[1]["seed_data"]["copy_init_seed"] = 0
    assert any("not those runs' initial weights" in n for n in groups_of(vs)[0]["notes"])


def test_pairing_is_by_seed_and_names_lose_only_their_own_seed():
    """Against a baseline the differences pair seed with seed, whatever the order the models come in; a
    group's name drops only the run's own seed suffix (vit_s16 keeps its s16)."""
    from kpca_attention.report.kpca_seeds import against_baseline, strip_seed

    base = [verdict(f"b-s{s}", s, "b", copy_diff=-0.2, null_diff=0.1, value=v)
            for s, v in ((0, 0.1), (1, 0.5), (2, 0.3), (3, 0.7))]
    other = [verdict(f"o-s{s}", s, "o", copy_diff=-0.2, null_diff=0.1, value=v + 0.05 + 0.001 * s)
             for s, v in ((3, 0.7), (1, 0.5), (2, 0.3))]  # seeds 1-3, shuffled: seeds pair, not positions
    cmp = against_baseline(seed_groups(base + other), "b")
    t = next(x for x in cmp["tests"] if x["measure"] == "linear_cka")
    assert t["seeds"] == [1, 2, 3] and t["word"] == "more aligned than b"
    assert t["per_seed"] == pytest.approx([0.051, 0.052, 0.053])
    assert strip_seed("vit_s16", 0) == "vit_s16" and strip_seed("vit_s16-s3", 3) == "vit_s16"
    assert strip_seed("m_seed12", 12) == "m" and strip_seed("-s1", 1) == "-s1"
