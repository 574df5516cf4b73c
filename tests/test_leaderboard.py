"""The leaderboard: in sync with the committed studies, and its rows computed as documented."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kpca_attention.robustness.store import encode_bits, seal_store
from kpca_attention.studies import cells, landed
from kpca_attention.studies.headline import (
    BEGIN,
    END,
    clip_interval,
    headline_markdown,
    headline_plot,
    update_results_doc,
)
from kpca_attention.studies.leaderboard import leaderboard_rows, render_markdown, write_leaderboard

REPO = Path(__file__).resolve().parents[1]


def test_the_committed_leaderboard_is_in_sync_with_results(tmp_path):
    write_leaderboard(REPO / "results", tmp_path / "lb", tmp_path / "leaderboard.md")
    assert (tmp_path / "leaderboard.md").read_text() == (REPO / "docs" / "leaderboard.md").read_text(), \
        "docs/leaderboard.md is stale: run `kpca-attention leaderboard`"
    new = {p.relative_to(tmp_path / "lb"): p.read_text() for p in (tmp_path / "lb").rglob("*.json")}
    old = {p.relative_to(REPO / "results" / "leaderboard"): p.read_text()
           for p in (REPO / "results" / "leaderboard").rglob("*.json")}
    assert new == old, "results/leaderboard/ is stale: run `kpca-attention leaderboard`"


def _item(bits: str, **extra) -> dict:
    n = len(bits)
    return {"key": {"train": {"dataset": "digits"}}, "result": {
        "correct": encode_bits([b == "1" for b in bits]), "top1": bits.count("1") / n, "n": n, **extra}}


def _study(root: Path, name: str = "toy") -> Path:
    folder = root / name
    (folder / "results").mkdir(parents=True)
    attacks = [{"method": "fgsm", "eps": [4 / 255], "n": 4, "options": {}, "seeds": None, "label": None},
               {"method": "pgd", "eps": [4 / 255], "n": 4, "options": {}, "seeds": None, "label": None},
               {"method": "spsa", "eps": [4 / 255], "n": 2, "options": {}, "seeds": [0], "label": None},
               {"method": "noise", "eps": [4 / 255], "n": 4, "options": {}, "seeds": None, "label": None},
               {"method": "pgd", "eps": [4 / 255], "n": 4, "options": {}, "seeds": None, "label": None,
                "protocol": "lab"}]
    settings = {"name": name, "task": "vision", "suites": {"attacks": attacks},
                "variants": [{"slug": "a", "label": "A", "model": "m_a", "kwargs": {}},
                             {"slug": "b", "label": "B", "model": "m_b", "kwargs": {}}]}
    (folder / "settings.json").write_text(json.dumps(settings))
    runs = {  # (clean, fgsm, pgd, spsa, noise, pgd-lab)
        "a-s0": ("1111", "1101", "1011", "00", "0000", "1111"),
        "a-s1": ("1111", "1111", "1110", None, "0000", "1111"),
        "b-s0": ("1110", "1100", "1100", "11", "1110", "0000"),
    }
    for run, (clean, fgsm, pgd, spsa, noise, lab) in runs.items():
        items = {"attacks/clean": _item(clean), "attacks/fgsm/4": _item(fgsm, norm="Linf"),
                 "attacks/pgd/4": _item(pgd, norm="Linf", protocol="pixel"),
                 "attacks/noise/4": _item(noise, norm="Linf"),
                 "attacks/pgd-lab/4": _item(lab, norm="Linf", protocol="lab")}
        if spsa:
            items["attacks/spsa/4"] = _item(spsa, norm="Linf")
        (folder / "results" / f"{run}.json").write_text(json.dumps({"items": items}))
    return folder


def test_rows_are_worst_cases_over_attacks_sorted_with_seeds_and_intervals(tmp_path):
    _study(tmp_path)
    tables, notes = leaderboard_rows(tmp_path)
    assert set(tables) == {("digits", "Linf", "4/255", "pixel", "worst case of fgsm, pgd"),
                           ("digits", "Linf", "4/255", "lab", "worst case of pgd-lab")}
    rows = tables[("digits", "Linf", "4/255", "pixel", "worst case of fgsm, pgd")]
    assert [r["name"] for r in rows] == ["toy/a", "toy/b"]  # sorted by robust accuracy
    a, b = rows
    # a: seed 0 fgsm 1101 AND pgd 1011 -> 1001 (50 %); seed 1: 1111 AND 1110 -> 75 %; noise is no attack
    assert a["robust_acc"] == pytest.approx(62.5) and a["seeds"] == [0, 1] and a["interval"] == "t, 2 seeds"
    assert b["robust_acc"] == pytest.approx(50.0) and b["interval"] == "Wilson, 4 images"
    assert b["clean_acc"] == pytest.approx(75.0)
    assert a["left_out"] == ["spsa"]  # run on 2 of the 4 images
    lab = tables[("digits", "Linf", "4/255", "lab", "worst case of pgd-lab")]
    assert [r["robust_acc"] for r in lab] == [100.0, 0.0]  # never mixed with the pixel rows
    assert notes == []
    # a run in progress (an item its settings ask for is missing) is left out until it finishes
    run = tmp_path / "toy" / "results" / "b-s0.json"
    data = json.loads(run.read_text())
    del data["items"]["attacks/pgd/4"]
    run.write_text(json.dumps(data))
    tables, notes = leaderboard_rows(tmp_path)
    rows = tables[("digits", "Linf", "4/255", "pixel", "worst case of fgsm, pgd")]
    assert [r["name"] for r in rows] == ["toy/a"]


def test_write_leaderboard_removes_tables_that_went_away(tmp_path):
    folder = _study(tmp_path / "results")
    paths = write_leaderboard(tmp_path / "results", tmp_path / "lb", tmp_path / "lb.md")
    assert len(paths) == 3
    text = (tmp_path / "lb.md").read_text()
    assert "## digits, Linf 4/255 (lab protocol: eps in normalised units) - worst case of pgd-lab" in text
    settings = json.loads((folder / "settings.json").read_text())
    settings["suites"]["attacks"] = [a for a in settings["suites"]["attacks"] if "protocol" not in a]
    (folder / "settings.json").write_text(json.dumps(settings))
    for run in folder.glob("results/*.json"):
        data = json.loads(run.read_text())
        del data["items"]["attacks/pgd-lab/4"]
        run.write_text(json.dumps(data))
    write_leaderboard(tmp_path / "results", tmp_path / "lb", tmp_path / "lb.md")
    assert [p.name for p in (tmp_path / "lb").rglob("*.json")] == ["4_255-pixel-worst_case_of_fgsm_pgd.json"]


def test_tables_name_their_attack_settings_and_never_pool_other_settings(tmp_path):
    """Each row and table says what its attacks ran with; a second study whose PGD took other steps is
    another threat evaluation: its rows go to their own table, whose evaluation names the settings."""
    from kpca_attention.robustness.attacks import attack_settings

    _study(tmp_path, "toy")
    tables, _ = leaderboard_rows(tmp_path)
    key = ("digits", "Linf", "4/255", "pixel", "worst case of fgsm, pgd")
    said = f"fgsm: {attack_settings('fgsm')}; pgd: {attack_settings('pgd')}"
    assert said == "fgsm: one signed-gradient step; pgd: 20 steps of 0.15 eps, random start"
    assert {r["attack_settings"] for r in tables[key]} == {said}
    write_leaderboard(tmp_path, tmp_path / "lb", tmp_path / "lb.md")
    assert f"Attacks: {said}.\n" in (tmp_path / "lb.md").read_text()
    table = tmp_path / "lb" / "digits" / "Linf" / "4_255-pixel-worst_case_of_fgsm_pgd.json"
    table = json.loads(table.read_text())
    assert table["attack_settings"] == said
    other = _study(tmp_path, "other")  # the same attack names (PGD labelled "pgd"), PGD with 5 steps
    settings = json.loads((other / "settings.json").read_text())
    settings["suites"]["attacks"][1].update(options={"steps": 5}, label="pgd")
    (other / "settings.json").write_text(json.dumps(settings))
    for run in (other / "results").glob("*.json"):  # other runs than toy's (not byte-identical copies)
        data = json.loads(run.read_text())
        data["items"]["attacks/clean"]["key"]["study"] = "other"
        run.write_text(json.dumps(data))
    tables, _ = leaderboard_rows(tmp_path)
    assert key not in tables
    five = f"fgsm: {attack_settings('fgsm')}; pgd: {attack_settings('pgd', {'steps': 5})}"
    assert {r["name"] for r in tables[(*key[:4], f"{key[4]} [{said}]")]} == {"toy/a", "toy/b"}
    assert {r["name"] for r in tables[(*key[:4], f"{key[4]} [{five}]")]} == {"other/a", "other/b"}


def test_committed_benchmark_jsons_are_rows(tmp_path):
    from kpca_attention.robustness.store import ResultStore

    rec = {"name": "symvit-s0", "dataset": "digits", "threat_model": "Linf", "eps": "4/255",
           "protocol": "pixel", "version": "standard", "clean_acc": "90.00",
           "clean_acc_interval": [87.98, 91.71], "autoattack_acc": "40.00",
           "autoattack_acc_interval": [37.01, 43.07], "n": 1000,
           "architecture": "symvit_mini_patch4_28"}
    path = tmp_path / "benchmark" / "digits" / "Linf" / "4_255" / "symvit-s0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))
    store = ResultStore(tmp_path / "benchmark" / "results" / "symvit-s0.json")  # its sealed per-image results
    for item, k in (("autoattack/clean", 900), ("autoattack/standard-Linf/4", 400)):
        store.put(item, {"dataset": "digits", "n": 1000}, _item("1" * k + "0" * (1000 - k))["result"])
    tables, _ = leaderboard_rows(tmp_path)
    (row,) = tables[("digits", "Linf", "4/255", "pixel", "AutoAttack standard")]
    assert (row["robust_acc"], row["seeds"], row["interval"]) == (40.0, [0], "Wilson, 1000 images")


def test_a_study_s_copy_of_another_s_runs_is_listed_once(tmp_path, copy_committed) -> None:
    # Study.reuse copies another study's result files byte for byte: one row, under the study that ran them
    import json

    from kpca_attention.studies.leaderboard import leaderboard_rows

    copy_committed("rpc-seeds", tmp_path / "rpc-seeds")
    alone, _ = leaderboard_rows(tmp_path)
    copy_committed("rpc-seeds", tmp_path / "zz-copy")
    settings = json.loads((tmp_path / "zz-copy" / "settings.json").read_text())
    settings["name"] = "zz-copy"
    (tmp_path / "zz-copy" / "settings.json").write_text(json.dumps(settings))
    both, _ = leaderboard_rows(tmp_path)
    def names(t: dict) -> dict:
        return {k: [r["name"] for r in v] for k, v in t.items()}

    assert names(both) == names(alone)
    assert all(r["name"].startswith("rpc-seeds/") for rows in both.values() for r in rows)


@pytest.mark.parametrize(("what", "begin", "end", "render"), [
    ("the headline table", BEGIN, END, headline_markdown),
    ("the table of finished seeds", landed.BEGIN, landed.END, landed.landed_markdown),
    ("the paired cells", cells.BEGIN, cells.END, cells.cells_markdown)])
def test_the_generated_tables_of_docs_results_are_in_sync_with_results(what, begin, end, render) -> None:
    text = (REPO / "docs" / "results.md").read_text()
    assert begin in text and end in text
    block = text.split(begin, 1)[1].split(end, 1)[0]
    assert block == "\n" + render(REPO / "results"), \
        f"{what} in docs/results.md is stale: run `kpca-attention leaderboard`"


def test_headline_rows_come_from_the_verdict_cells(tmp_path) -> None:
    """Each claim's row is its study's cell - against the baseline, or a further comparator's - with the
    interval, margin and word as the report computed them; a missing study or cell says so."""
    cell = {"mean": -1.234, "ci": [-2.5, 0.04], "margin": 0.9, "n": 5, "word": "inconclusive",
            "seeds_needed": 12, "seeds_to_detect": 30}
    one = {"mean": 0.5, "ci": None, "margin": None, "n": 1, "word": "inconclusive"}
    summary = {"verdicts": {"baseline": "symvit", "metrics": {
        "corrupted": {"title": "corrupted", "unit": "percentage points"},
        "clean": {"title": "clean", "unit": "percentage points"}},
        "cells": {"rpc_official": {"corrupted": cell}, "rpc_all2_l3": {"clean": one}},
        "also": {"rpc_official": {"cells": {"rpc_no_sparse": {"clean": {**cell, "word": "equivalent (within "
                                                                        "+-0.5)", "margin": 0.5}}}}}}}
    (tmp_path / "rpc-seeds").mkdir()
    (tmp_path / "rpc-seeds" / "summary.json").write_text(json.dumps(summary))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in headline_markdown(tmp_path).splitlines()}
    corrupted = rows["RPC-SymViT (4 it., block 1) vs SymViT: corrupted top-1"]
    assert ("`rpc-seeds`, 5 seeds | -1.23 (-2.50, +0.04) pp | +-0.9 | inconclusive (the observed difference "
            "lies outside +-0.9; the observed difference under Holm: > 16 seeds) |") in corrupted
    summary["verdicts"]["cells"]["rpc_official"]["corrupted"] = {**cell, "mean": -0.634, "ci": [-1.9, 0.64]}
    (tmp_path / "rpc-seeds" / "summary.json").write_text(json.dumps(summary))
    inside = next(line for line in headline_markdown(tmp_path).splitlines() if line.startswith("| " + (
        "RPC-SymViT (4 it., block 1) vs SymViT: corrupted top-1")))
    assert ("-0.63 (-1.90, +0.64) pp | +-0.9 | inconclusive (equivalence: 12 seeds if the true difference "
            "is 0; the observed difference under Holm: > 16 seeds) |") in inside  # plans for a true 0
    assert "| +0.50 pp | - | inconclusive (1 seed: no test yet) |" in \
        rows["RPC with 2 it. in every block, lambda 3, vs SymViT: clean"]
    assert "| +-0.5 | equivalent (within +-0.5) |" in \
        rows["forcing S = 0 leaves RPC-SymViT's clean accuracy as it is"]
    # an equivalent cell whose 95 % interval excludes 0 says so, with its raw and Holm p: read alone, the word
    # hid a difference within the margin (RPC-SymViT's FGSM 8/255, -1.86 (-3.28, -0.45), raw p 0.013)
    below = {**cell, "mean": -0.3, "ci": [-0.45, -0.12], "word": "equivalent (within +-0.5)", "margin": 0.5,
             "p_raw": 0.0132, "p_holm": 1.0}
    summary["verdicts"]["also"]["rpc_official"]["cells"]["rpc_no_sparse"]["clean"] = below
    (tmp_path / "rpc-seeds" / "summary.json").write_text(json.dumps(summary))
    row = next(line for line in headline_markdown(tmp_path).splitlines() if line.startswith(
        "| forcing S = 0 leaves RPC-SymViT's clean accuracy as it is"))
    assert row.endswith("| +-0.5 | equivalent (within +-0.5); the 95 % interval lies below 0 (raw p 0.013, "
                        "Holm 1: not a decided difference) |")
    missing = "| - | - | no paired seeds yet |"
    assert rows["RPC-SymViT (4 it., block 1) vs SymViT: clean top-1"].endswith(missing)  # no such cell
    assert rows["RPC-Symlm vs Symlm: test perplexity"].endswith(f"| `language` {missing}")  # no such study
    # the forest plot in units of the margins: the rows with an interval and a margin (here two)
    assert headline_plot(tmp_path / "h.png", tmp_path).stat().st_size > 5000
    assert headline_plot(tmp_path / "none.png", tmp_path / "nothing") is None
    page = tmp_path / "page.md"
    page.write_text(f"# x\n\nbefore\n{BEGIN}\nold\n{END}\nafter\n")
    assert update_results_doc(page, tmp_path) is True
    assert page.read_text() == f"# x\n\nbefore\n{BEGIN}\n{headline_markdown(tmp_path)}{END}\nafter\n"
    assert update_results_doc(page, tmp_path) is False  # in sync: unchanged
    page.write_text("no markers\n")
    assert update_results_doc(page, tmp_path) is False and page.read_text() == "no markers\n"


def test_landed_rows_count_finished_runs_their_machines_and_where_they_come_from(
        tmp_path, copy_committed) -> None:
    """Finished seeds per row, the plan, the machines read from the runs' own files, the runs taken from
    another study; a run with an item missing (still evaluating) is not finished."""
    for name in ("rpc-seeds", "zoo"):
        copy_committed(name, tmp_path / name)

    def files_of(study: str, slug: str) -> set[int]:
        files = (tmp_path / study / "results").glob(f"{slug}-s*.json")
        return {int(f.stem.rsplit("-s", 1)[1]) for f in files}

    zoo_refs, gone = files_of("zoo", "vit"), max(files_of("rpc-seeds", "vit"))
    assert gone not in zoo_refs  # a run the zoo does not refer to (its reference would be damaged)
    (tmp_path / "rpc-seeds" / "results" / f"vit-s{gone}.json").unlink()
    for f in (tmp_path / "zoo" / "results").glob("rpc_fan-s*.json"):  # a row with no run yet
        f.unlink()
    for twicing in (tmp_path / "zoo" / "results").glob("twicing-s*.json"):
        data = json.loads(twicing.read_text())
        del data["items"]["attacks/pgd/8"]
        data["sealed_items"].remove("attacks/pgd/8")  # as a run still in evaluation
        twicing.write_text(json.dumps(data))
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
            for line in landed.landed_markdown(tmp_path).splitlines()[2:]}
    assert {study for study, _ in rows} == {"`rpc-seeds`", "`zoo`"}  # no folder: no rows

    def machines(study: str, slug: str, seeds: list[int]) -> str:  # read independently from the files
        caps: dict[str, int] = {}
        for s in seeds:
            m = json.loads((tmp_path / study / "results" / f"{slug}-s{s}.json").read_text())
            m = m["items"]["run"]["result"]["machine"]
            assert m["cpu"] == "AMD EPYC"
            cap = m.get("cpu_capability") or "not recorded"
            caps[cap] = caps.get(cap, 0) + 1
        return "AMD EPYC (" + ", ".join(f"{c} {n}" for c, n in sorted(caps.items())) + ")"

    def on_disk(study: str, slug: str) -> list[int]:  # the committed files hold finished runs only
        return sorted(files_of(study, slug))

    planned = landed.seed_ranges(json.loads((tmp_path / "rpc-seeds" / "settings.json").read_text())["seeds"])
    vit = on_disk("rpc-seeds", "vit")
    assert gone not in vit and {0, 1, 2, 3} <= set(vit)
    assert rows[("`rpc-seeds`", "ViT (asymmetric)")] == [f"{landed.seed_ranges(vit)} ({len(vit)})", planned,
                                                         machines("rpc-seeds", "vit", vit)]
    sym = on_disk("rpc-seeds", "symvit")
    assert rows[("`rpc-seeds`", "SymViT")][:2] == [f"{landed.seed_ranges(sym)} ({len(sym)})", planned]
    zoo_planned = landed.seed_ranges(json.loads((tmp_path / "zoo" / "settings.json").read_text())["seeds"])
    taken = sorted(files_of("zoo", "symvit"))
    ranges = landed.seed_ranges(taken)
    assert {0, 1, 2} <= set(taken) and rows[("`zoo`", "SymViT")] == [
        f"{ranges} ({len(taken)})", zoo_planned, machines("rpc-seeds", "symvit", taken)
        + f"; seeds {ranges} taken from `rpc-seeds`"]
    assert rows[("`zoo`", "Twicing")] == ["-", zoo_planned, "-"]  # an item missing: not finished
    assert rows[("`zoo`", "RPC-FAN")] == ["-", zoo_planned, "-"]
    assert landed.seed_ranges([7, 0, 1, 2, 4, 6]) == "0-2, 4, 6-7" and landed.seed_ranges([]) == "-"
    page = tmp_path / "page.md"
    page.write_text(f"a\n{landed.BEGIN}\nold\n{landed.END}\nb\n")
    assert update_results_doc(page, tmp_path) is True
    assert page.read_text() == f"a\n{landed.BEGIN}\n{landed.landed_markdown(tmp_path)}{landed.END}\nb\n"


def test_landed_rows_count_vector_instructions_within_each_kind_of_machine(tmp_path, copy_committed) -> None:
    """A row trained on two kinds of machine says each kind's own runs per capability (they were pooled
    across kinds, which put an Intel run's AVX512 under the AMD EPYC's name)."""
    copy_committed("rpc-seeds", tmp_path / "rpc-seeds")
    files = sorted((tmp_path / "rpc-seeds" / "results").glob("vit-s*.json"),
                   key=lambda f: int(f.stem.rsplit("-s", 1)[1]))
    last = files[-1]
    data = json.loads(last.read_text())
    data["items"]["run"]["result"]["machine"].update(cpu="Intel(R) Xeon(R) Processor", cpu_capability="AVX2")
    del data["items"]["run"]["sha256"], data["sealed"], data["sealed_items"]  # recorded there: sealed anew
    last.write_text(json.dumps(data))
    seal_store(last)
    amd: dict[str, int] = {}
    for f in files[:-1]:
        m = json.loads(f.read_text())["items"]["run"]["result"]["machine"]
        assert m["cpu"] == "AMD EPYC"
        cap = m.get("cpu_capability") or "not recorded"
        amd[cap] = amd.get(cap, 0) + 1
    table = landed.landed_markdown(tmp_path).splitlines()
    row = next(line for line in table if "| ViT (asymmetric) |" in line)
    said = row.split("|")[5].strip()
    assert said == ("AMD EPYC (" + ", ".join(f"{c} {n}" for c, n in sorted(amd.items())) + "); "
                    "Intel(R) Xeon(R) Processor (AVX2 1)")


def test_cells_rows_are_the_paired_differences_of_the_committed_seeds(tmp_path, copy_committed) -> None:
    """Each cell's difference and t interval, and each row's mean and SD, recomputed from the per-seed
    metrics of the committed summary with scipy and numpy (not from the verdict cells the table reads)."""
    from scipy import stats as sps

    copy_committed("rpc-seeds", tmp_path / "rpc-seeds")
    summary = json.loads((tmp_path / "rpc-seeds" / "summary.json").read_text())
    per_seed = summary["metrics"]
    grid = cells.Grid("rpc-seeds", (("vit", "rpc_official"),), ("clean", "pgd@8"))
    text = cells.cells_markdown(tmp_path, (grid,))
    row = next(line for line in text.splitlines() if line.startswith("| ViT (asymmetric) - RPC-SymViT"))
    for metric in ("clean", "pgd@8"):
        seeds = sorted(set(per_seed["vit"]) & set(per_seed["rpc_official"]), key=int)
        vit, rpc = per_seed["vit"], per_seed["rpc_official"]
        d = np.array([100 * (vit[s][metric] - rpc[s][metric]) for s in seeds])
        half = sps.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        assert f"{d.mean():+.2f} ({d.mean() - half:+.2f}, {d.mean() + half:+.2f})" in row
        assert f"({len(d)})" in row
    labels = (("symvit", "SymViT"), ("vit", "ViT (asymmetric)"), ("rpc_official", "RPC-SymViT 4 it."))
    for slug, label in labels:
        if slug == "symvit":  # the baseline is listed though no comparison names it
            assert f"| {label} ({len(per_seed[slug])}) |" in text
        pgd = np.array([100 * v["pgd@8"] for v in per_seed[slug].values()])
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {label} ("))
        assert line.endswith(f"| {pgd.mean():.1f} +- {pgd.std(ddof=1):.1f} |")
    # margins that differ between rows are named in each row; a comparison with no cell yet is left out
    copy_committed("zoo", tmp_path / "zoo")
    zoo = json.loads((tmp_path / "zoo" / "summary.json").read_text())["verdicts"]
    margin = zoo["also"]["fan"]["cells"]["rpc_fan"]["pgd@8"]["margin"]
    grid = cells.Grid("zoo", (("no_such", None), ("rpc_fan", "fan"), ("kde", None)), ("clean", "pgd@8"))
    text = cells.cells_markdown(tmp_path, (grid,))
    assert "no_such" not in text and "named in each row" in text
    rpc_fan = next(ln for ln in text.splitlines() if ln.startswith("| RPC-FAN"))
    assert f"PGD 8/255 +-{margin:g})" in rpc_fan and "; margins clean +-" in rpc_fan
    # the raw and Holm p of an inconclusive cell whose interval excludes 0, and only of those
    cell = {"mean": -3.2, "ci": [-4.9, -1.5], "n": 8, "word": "inconclusive", "p_raw": 0.003, "p_holm": 0.33}
    assert cells._cell_text(cell) == "-3.20 (-4.90, -1.50) inconclusive (raw p 0.003, Holm 0.330)"
    assert cells._cell_text({**cell, "p_raw": 0.2, "p_holm": 1.0}).endswith(") inconclusive")
    assert cells._cell_text({**cell, "word": "worse"}).endswith("**worse**")
    one = {"mean": 1.0, "ci": None, "n": 1, "word": "inconclusive"}
    assert cells._cell_text(one) == "+1.00 (1 seed: no test)"


def test_the_headline_plot_cuts_intervals_at_its_edge_without_reversing_them(tmp_path, monkeypatch) -> None:
    # rpc-seeds' PGD 8/255 at eight seeds: -3.18 (-4.85, -1.50) pp against a margin of 0.17, i.e. an interval
    # of -28.5 to -8.8 margins, wholly past the plot's edge at -6: it must sit at the edge, not be drawn as a
    # reversed interval from -8.8 back to -6
    assert clip_interval(-28.5, -8.8) == (-6.0, -6.0)
    assert clip_interval(-8.8, -28.5) == (-6.0, -6.0)
    assert clip_interval(-9.0, 2.0) == (-6.0, 2.0) and clip_interval(0.5, -0.5) == (-0.5, 0.5)
    assert clip_interval(7.0, 30.0) == (6.0, 6.0)
    import kpca_attention.report.forest as forest

    drawn = []
    monkeypatch.setattr(forest, "forest_plot", lambda rows, path, *a, **k: drawn.extend(rows) or Path(path))
    cell = {"mean": -3.18, "ci": [-4.85, -1.50], "tost_ci": [-4.52, -1.83], "margin": 0.17, "n": 8,
            "word": "inconclusive"}
    summary = {"verdicts": {"baseline": "symvit", "metrics": {"pgd@8": {"title": "PGD 8/255"}},
                            "cells": {"rpc_official": {"pgd@8": cell}}}}
    (tmp_path / "rpc-seeds").mkdir()
    (tmp_path / "rpc-seeds" / "summary.json").write_text(json.dumps(summary))
    headline_plot(tmp_path / "h.png", tmp_path)
    (label, v), = drawn
    assert "cut at +-6" in label and v.mean == -6.0 and v.ci == (-6.0, -6.0) and v.tost_ci == (-6.0, -6.0)
    assert "interim" not in label  # the summary predates the planned seeds: nothing to compare with
    drawn.clear()
    cell["planned"] = 16  # eight of sixteen planned: the row's label says the word is interim
    (tmp_path / "rpc-seeds" / "summary.json").write_text(json.dumps(summary))
    headline_plot(tmp_path / "h.png", tmp_path)
    (label, _), = drawn
    assert label.endswith("(cut at +-6) (interim)")


def test_the_headline_plot_signs_a_lower_is_better_metric_so_that_right_is_the_variant_better(
        tmp_path, monkeypatch) -> None:
    """Perplexity: the variant 0.5 lower than the LM (a gain) against a margin of 0.25 is drawn at +2
    margins, its interval (-0.8, -0.2) at (+0.8, +3.2)."""
    import kpca_attention.report.forest as forest

    drawn = []
    monkeypatch.setattr(forest, "forest_plot", lambda rows, path, *a, **k: drawn.extend(rows) or Path(path))
    cell = {"mean": -0.5, "ci": [-0.8, -0.2], "margin": 0.25, "n": 6, "word": "better"}
    summary = {"verdicts": {"baseline": "symlm", "cells": {"rpc_symlm": {"ppl/test": cell}},
                            "metrics": {"ppl/test": {"title": "test ppl", "higher_is_better": False}}}}
    (tmp_path / "language").mkdir()
    (tmp_path / "language" / "summary.json").write_text(json.dumps(summary))
    headline_plot(tmp_path / "h.png", tmp_path)
    (label, v), = drawn
    assert label.startswith("rpc_symlm - symlm") and v.mean == pytest.approx(2.0)
    assert v.ci == pytest.approx((0.8, 3.2))


def test_a_long_hyphenated_folder_stays_whole_in_the_page():
    """The page's paragraph is wrapped at 106 columns; a folder's path is a code span, which a line break
    would turn into a space ("popen- gw0"): paths are never broken, at hyphens or inside."""
    source = "/tmp/pytest-of-someone/pytest-12/popen-gw0/test_a_users_own-folder-gets-its-leaderboard0/mine"
    page = render_markdown({}, [], source)
    assert f"`{source}`" in page and page.count(source) == 2  # the folder and the command's argument
