"""The verdicts of a study report: a fake language-model study folder with known per-seed perplexities,
its report's verdict cells against report/verdicts.py computed here from those numbers, and an old
settings.json without margins that still reports (no cell can be ``equivalent`` then)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kpca_attention.io import read_json, write_json_atomic
from kpca_attention.report.study import write_study_report
from kpca_attention.report.verdicts import (
    BETTER,
    INCONCLUSIVE,
    INTERIM_NOTE,
    Family,
    decided_word,
    equivalent_word,
    interim_note,
    planned_pairs,
    planned_seeds,
)
from kpca_attention.robustness.store import ResultStore
from kpca_attention.studies.language import quick_language_study
from kpca_attention.studies.margins import (
    PAPER_TABLE1,
    PAPER_TABLE2,
    PAPER_TABLE6,
    image_margins,
    language_margins,
    segmentation_margins,
)
from kpca_attention.studies.spec import Margin
from kpca_attention.tasks.language.report import PAPER_TABLE3
from kpca_attention.tasks.language.suites import encode_f16

SEEDS = list(range(6))
BASE = {"ppl/valid": [60.0, 61.5, 59.2, 62.3, 60.8, 61.1], "ppl/test": [50.0, 51.2, 49.5, 52.4, 50.9, 51.6]}
# variant - baseline per seed, in perplexity: RPC clearly lower on test (better), noisy on valid; the LM
# within a few hundredths on test (inside the margin 1.1), wide on valid
DIFFS = {
    "rpc_symlm": {"ppl/test": [-2.1, -1.9, -2.3, -2.0, -1.8, -2.2],
                  "ppl/valid": [-1.0, 1.5, -2.2, 0.8, -0.3, 1.9]},
    "lm": {"ppl/test": [0.03, -0.02, 0.01, -0.04, 0.02, 0.00],
           "ppl/valid": [3.0, -2.5, 0.5, -3.1, 2.2, -0.4]},
}
MARGINS = {"ppl/test": Margin(1.1, "paper Table 3, test"), "ppl/valid": Margin(0.99, "paper Table 3, valid")}


def _values(slug: str, key: str) -> list[float]:
    if slug == "symlm":
        return BASE[key]
    return [b + d for b, d in zip(BASE[key], DIFFS[slug][key], strict=True)]


def write_study(out: Path, study, jitter: float = 0.0) -> Path:
    """A study folder as the engine leaves it: settings.json and one result store per (variant, seed), the
    perplexities of :func:`_values` (plus ``jitter`` x a seeded normal draw)."""
    (out / "results").mkdir(parents=True)
    write_json_atomic(out / "settings.json", study.to_dict())
    rng = np.random.default_rng(0)
    for v in study.variants:
        for i, sd in enumerate(SEEDS):
            store = ResultStore(out / "results" / f"{v.slug}-s{sd}.json")
            store.put("run", {}, {"params": 12345, "tokens_per_s": 1000.0, "train_time_s": 60.0,
                                  "epochs": []})
            for key in ("ppl/valid", "ppl/test"):
                store.put(key, {}, {"ppl": _values(v.slug, key)[i] + jitter * rng.normal(),
                                    "nll_f16": encode_f16(rng.uniform(2, 5, size=64))})
    return out


@pytest.fixture
def study_dir(tmp_path: Path) -> Path:
    return write_study(tmp_path / "language",
                       quick_language_study().replace(seeds=tuple(SEEDS), margins=MARGINS))


def _expected(margins: dict[str, float] | None):
    fam = Family("independent")
    for key in ("ppl/valid", "ppl/test"):  # the report's metric order: valid, then test
        for slug in ("rpc_symlm", "lm"):
            fam.add((key, slug), np.subtract(_values(slug, key), BASE[key]))
    return fam, fam.verdicts(lambda k: None if margins is None else margins[k[0]], False)


def test_report_verdict_cells_match_the_verdict_engine(study_dir: Path) -> None:
    report = write_study_report(study_dir).read_text()
    summary = read_json(study_dir / "summary.json")
    fam, want = _expected({k: m.value for k, m in MARGINS.items()})
    ver = summary["verdicts"]
    assert ver["family"]["size"] == 4 == fam.size
    assert "family of 4 two-sided paired t tests" in ver["family"]["family"]
    assert "2 variants x 2 metrics" in ver["family"]["family"]
    assert ver["margins"] == {k: m.to_dict() for k, m in MARGINS.items()}
    assert ver["metrics"]["ppl/test"]["higher_is_better"] is False
    for (key, slug), v in want.items():
        cell = ver["cells"][slug][key]
        assert cell["word"] == v.word
        assert cell["seeds"] == SEEDS and cell["n"] == len(SEEDS)
        for q in ("mean", "p_raw", "p_holm", "tost_p", "mde", "margin", "sd"):
            assert cell[q] == pytest.approx(getattr(v, q), rel=1e-9, abs=1e-12), (slug, key, q)
        assert cell["ci"] == pytest.approx(list(v.ci), rel=1e-9)
        assert cell["tost_ci"] == pytest.approx(list(v.tost_ci), rel=1e-9)
        assert cell["seeds_needed"] == v.seeds_needed and cell["seeds_to_detect"] == v.seeds_to_detect
        # the report's verdict table: the word, the mean and the 95 % interval of this cell
        text = f"{v.word}: {v.mean:+.2f} ({v.ci[0]:+.2f}, {v.ci[1]:+.2f})"
        assert text in report, text
    # the planted effects come out as planted
    assert want[("ppl/test", "rpc_symlm")].word == BETTER
    assert want[("ppl/test", "lm")].word == equivalent_word(1.1)
    assert want[("ppl/valid", "lm")].word == INCONCLUSIVE
    row = next(line for line in report.splitlines() if line.startswith("| RPC-Symlm | 6 |"))
    assert row.count("|") == 5  # variant, paired seeds, valid, test
    assert "## Verdicts over seeds against Symlm" in report
    assert "test-set noise only, not a verdict" in report
    assert "paper Table 3, test" in report
    assert summary["verdicts"]["forest_plots"] == ["forest_rpc_symlm.png", "forest_lm.png"]
    for png in summary["verdicts"]["forest_plots"]:
        assert (study_dir / png).stat().st_size > 5000
    # Holm: the adjusted p is the step-down of the four raw p-values, computed by hand here
    raw = sorted((v.p_raw, k) for k, v in want.items())
    adj, prev = {}, 0.0
    for i, (p, k) in enumerate(raw):
        prev = max(prev, min(1.0, (4 - i) * p))
        adj[k] = prev
    for (key, slug), p in adj.items():
        assert ver["cells"][slug][key]["p_holm"] == pytest.approx(p, rel=1e-12)


def test_old_settings_without_margins_still_report(study_dir: Path) -> None:
    settings = read_json(study_dir / "settings.json")
    del settings["margins"]
    write_json_atomic(study_dir / "settings.json", settings)
    report = write_study_report(study_dir).read_text()
    summary = read_json(study_dir / "summary.json")
    _, want = _expected(None)
    ver = summary["verdicts"]
    assert ver["margins"] is None and "no margin declared" in ver["margins_note"]
    assert "Margins: none declared" in report
    words = {(k, s): c["word"] for s, per in ver["cells"].items() for k, c in per.items()}
    assert words == {k: v.word for k, v in want.items()}
    assert not any(w.startswith("equivalent") for w in words.values())
    assert words[("ppl/test", "rpc_symlm")] == BETTER  # a difference needs no margin
    lm = ver["cells"]["lm"]["ppl/test"]
    assert lm["word"] == INCONCLUSIVE and "no equivalence margin declared" in lm["reason"]
    assert lm["tost_p"] is None and lm["seeds_needed"] is None and lm["mde"] > 0


def test_a_verdict_before_the_planned_seeds_is_marked_interim(study_dir: Path, monkeypatch) -> None:
    """The study plans seven seeds and six have landed: every cell carries its planned pairs, the decided
    cells say they are interim in the report, its forest plots' titles, the headline's words and the docs'
    cells, and the words themselves are the engine's. With the plan met (six planned) nothing says interim."""
    import kpca_attention.report.verdict_sections as sections

    titles: list[str] = []
    ways: list[bool | None] = []
    draw = sections.forest_plot

    def spy(rows, path, title, unit, **kw):
        titles.append(title)
        ways.append(kw.get("higher_is_better"))
        return draw(rows, path, title, unit, **kw)

    monkeypatch.setattr(sections, "forest_plot", spy)
    settings = read_json(study_dir / "settings.json")
    settings["seeds"] = [*SEEDS, 6]
    write_json_atomic(study_dir / "settings.json", settings)
    report = write_study_report(study_dir).read_text()
    cells = read_json(study_dir / "summary.json")["verdicts"]["cells"]
    better = cells["rpc_symlm"]["ppl/test"]
    assert better["word"] == BETTER and better["n"] == 6 and better["planned"] == 7
    assert decided_word(better) == "better (interim: 6 of 7 planned seeds)"
    same = cells["lm"]["ppl/test"]
    assert decided_word(same) == "equivalent (within +-1.1; interim: 6 of 7 planned seeds)"
    assert "| RPC-Symlm | 6 of 7 planned |" in report
    row = next(line for line in report.splitlines() if line.startswith("| RPC-Symlm | 6 of 7 planned |"))
    assert "| better (interim): " in row and "| inconclusive: " in row  # only a decided word is interim
    lm_row = next(line for line in report.splitlines() if "| 6 of 7 planned |" in line and line != row)
    assert "| equivalent (within +-1.1; interim): " in lm_row
    assert "inconclusive (interim" not in row + lm_row
    assert "| better (interim: 6 of 7 planned seeds) |" in report and INTERIM_NOTE in report
    assert titles and all(t.endswith("over 6 seeds (interim: 6 of 7 planned seeds)") for t in titles)
    assert set(ways) == {False}  # perplexity: the plots' axes say lower is the variant's better side
    titles.clear()
    settings["seeds"] = SEEDS
    write_json_atomic(study_dir / "settings.json", settings)
    report = write_study_report(study_dir).read_text()
    cells = read_json(study_dir / "summary.json")["verdicts"]["cells"]
    met = cells["rpc_symlm"]["ppl/test"]
    assert met["planned"] == 6 and interim_note(met) is None
    assert "interim" not in report and decided_word(cells["lm"]["ppl/test"]) == equivalent_word(1.1)
    assert titles and all(t.endswith("over 6 seeds") for t in titles)


def test_planned_pairs_follow_the_variants_seeds_sources_and_the_metric_s_suite() -> None:
    settings = {"seeds": [0, 1, 2, 3], "variants": [
        {"slug": "base"}, {"slug": "few", "seeds": [0, 1]}, {"slug": "taken", "source": {"kind": "hf"}}]}
    assert planned_seeds(settings, "base") == {0, 1, 2, 3} and planned_seeds(settings, "few") == {0, 1}
    assert planned_seeds(settings, "taken") == {0}
    assert planned_pairs(settings, "few", "base") == 2 and planned_pairs(settings, "base", "base") == 4
    assert planned_pairs(settings, "base", "few", metric_seeds=[1, 3]) == 1  # an attack on some seeds only
    assert planned_pairs(settings, "taken", "base") == 1


def test_a_variant_on_one_seed_is_inconclusive_and_outside_the_family(study_dir: Path) -> None:
    for f in (study_dir / "results").glob("lm-s*.json"):
        if f.name != "lm-s0.json":
            f.unlink()
    write_study_report(study_dir)
    ver = json.loads((study_dir / "summary.json").read_text())["verdicts"]
    assert ver["family"]["size"] == 2
    cell = ver["cells"]["lm"]["ppl/test"]
    assert cell["word"] == INCONCLUSIVE and cell["n"] == 1 and cell["p_raw"] is None
    assert cell["mean"] == pytest.approx(DIFFS["lm"]["ppl/test"][0], abs=1e-9)
    assert ver["forest_plots"] == ["forest_rpc_symlm.png"]


def test_margins_are_the_papers_effects() -> None:
    """Each margin is the paper's RPC - baseline difference of its table (rounded to 2 decimals)."""
    sym, rpc = PAPER_TABLE1["SymViT"], PAPER_TABLE1["RPC-SymViT (4iter/layer1)"]
    im = image_margins()
    assert im["clean"].value == pytest.approx(0.50) and im["corrupted"].value == pytest.approx(0.90)
    assert im["clean"].value == round(rpc["clean"] - sym["clean"], 2)
    a_sym, a_rpc = PAPER_TABLE2["SymViT"], PAPER_TABLE2["RPC-SymViT (4iter/layer1)"]
    for key, attack in (("fgsm@8", "fgsm"), ("pgd@8", "pgd"), ("spsa@4", "spsa"), ("cw@255", "cw")):
        assert im[key].value == round(a_rpc[attack] - a_sym[attack], 2)
    assert [im[k].value for k in ("fgsm@8", "pgd@8", "spsa@4", "cw@127.5")] == [3.24, 0.17, 0.19, 1.56]
    lm = language_margins()
    assert lm["ppl/test"].value == pytest.approx(1.10) and lm["ppl/valid"].value == pytest.approx(0.99)
    assert lm["ppl/test"].value == round(PAPER_TABLE3["Symlm"]["test"] - PAPER_TABLE3["RPC-Symlm"]["test"], 2)
    seg = segmentation_margins()
    assert seg["clean:miou"].value == pytest.approx(0.69)
    assert seg["corrupted:miou"].value == pytest.approx(1.00)
    assert seg["clean:miou"].value == round(PAPER_TABLE6["RPC-SymViT (4iter/layer1)"]["clean:miou"]
                                            - PAPER_TABLE6["SymViT"]["clean:miou"], 2)
    for m in (*im.values(), *lm.values(), *seg.values()):
        assert m.value > 0 and math.isfinite(m.value)
        assert "paper Table" in m.source and "5-seed means" in m.source


def test_margin_and_study_validation() -> None:
    with pytest.raises(ValueError, match="> 0"):
        Margin(0.0, "x")
    with pytest.raises(ValueError, match="source"):
        Margin(0.5, " ")
    with pytest.raises(ValueError, match="Margin"):
        quick_language_study().replace(margins={"ppl/test": 1.1})
    d = quick_language_study().replace(margins=MARGINS).to_dict()
    assert d["margins"] == {"ppl/test": {"value": 1.1, "source": "paper Table 3, test"},
                            "ppl/valid": {"value": 0.99, "source": "paper Table 3, valid"}}
    assert quick_language_study().to_dict()["margins"] == {}


def test_two_seeds_report_and_power_at_one_degree_of_freedom(study_dir: Path) -> None:
    """With 2 seeds (1 degree of freedom) scipy's noncentral t gives NaN at large noncentrality; the
    power falls back on an integral over the sample SD: checked against a simulation, and a 2-seed
    study reports with a finite MDE."""
    from scipy import stats as st

    from kpca_attention.report.stats import mde_paired, paired_t_power

    rng = np.random.default_rng(1)
    d = rng.normal(8.0, 1.0, size=(400_000, 2))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(2))
    sim = float(np.mean(np.abs(t) > st.t.ppf(0.975, 1)))
    se = math.sqrt(sim * (1 - sim) / d.shape[0])
    assert paired_t_power(8.0, 1.0, 2) == pytest.approx(sim, abs=4 * se)
    m = mde_paired(1.0, 2)
    assert math.isfinite(m) and paired_t_power(m, 1.0, 2) == pytest.approx(0.8, abs=1e-6)
    for f in (study_dir / "results").glob("*-s*.json"):
        if not f.name.endswith(("-s0.json", "-s1.json")):
            f.unlink()
    write_study_report(study_dir)
    cells = read_json(study_dir / "summary.json")["verdicts"]["cells"]
    assert all(c["n"] == 2 and c["mde"] is not None and c["mde"] > 0 for per in cells.values()
               for c in per.values())


def test_an_attack_on_the_first_seed_only_plans_one_pair() -> None:
    """rpc-seeds runs CW and SPSA on its first seed only: their cells plan one pair (never interim), the
    attacks on every seed plan the study's seeds."""
    from kpca_attention.studies.rpc_seeds import rpc_seeds_study
    from kpca_attention.tasks.classification.report import ClassificationSections

    settings = rpc_seeds_study().to_dict()
    sec = ClassificationSections(settings, "images_per_s")
    assert sec.metric_seeds("cw@127.5") == (0,) == sec.metric_seeds("spsa@4")
    assert sec.metric_seeds("pgd@8") is None and sec.metric_seeds("clean") is None
    assert planned_pairs(settings, "rpc_official", "symvit", sec.metric_seeds("cw@255")) == 1
    assert planned_pairs(settings, "rpc_official", "symvit") == len(settings["seeds"]) == 16
    assert planned_pairs(settings, "rpc_all2_l3", "symvit") == 3


def test_a_report_without_plots_writes_the_same_summary_and_no_png(study_dir: Path, tmp_path: Path) -> None:
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(study_dir, bare)
    write_study_report(study_dir)
    pngs = sorted(p.name for p in study_dir.glob("*.png"))
    assert pngs  # the full report draws its plots ...
    report = write_study_report(bare, plots=False).read_text()
    assert not list(bare.glob("*.png"))  # ... this one renders and writes none
    assert read_json(bare / "summary.json") == read_json(study_dir / "summary.json")
    assert report == (study_dir / "report.md").read_text()
    write_study_report(bare)  # and the switch does not outlive the call
    assert sorted(p.name for p in bare.glob("*.png")) == pngs


def test_the_training_noise_row_is_announced_only_when_there_is_one(study_dir: Path) -> None:
    noise = "The first row is the baseline against itself across seeds"
    report = write_study_report(study_dir).read_text()
    assert noise in report and "| Symlm s" in report  # the row and its sentence
    for f in (study_dir / "results").glob("symlm-s*.json"):
        if f.stem != f"symlm-s{SEEDS[0]}":
            f.unlink()  # the baseline on one seed: no such row, no such sentence
    report = write_study_report(study_dir).read_text()
    assert noise not in report and "| Symlm s" not in report


def test_a_report_without_all_five_severities_says_why_it_has_no_mce() -> None:
    from kpca_attention.tasks.classification.report import _no_mce_reason

    suites = {"corruptions": {"n": 100, "names": ["fog"], "severities": [1, 3]}}
    assert "severities [1, 3] only" in _no_mce_reason({"suites": suites})
    suites["corruptions"]["severities"] = [5, 4, 3, 2, 1]
    assert _no_mce_reason({"suites": suites}) is None
    assert _no_mce_reason({"suites": {"corruptions": None}}) is None


def test_two_further_comparators_count_their_comparison_once(tmp_path: Path) -> None:
    """With two ``also_against`` comparators, the second's table leaves out the first (their comparison is
    in the first's table, as the baseline's is): every unordered pair of variants is one test of the family
    (here symlm-rpc, symlm-lm, rpc-lm on two metrics: 6, not 8)."""
    study = quick_language_study().replace(seeds=tuple(SEEDS), margins=MARGINS,
                                           also_against=("rpc_symlm", "lm"))
    out = write_study(tmp_path / "language", study, jitter=0.1)
    report = write_study_report(out, plots=False).read_text()
    ver = read_json(out / "summary.json")["verdicts"]
    keys = [tuple(t["key"]) for t in ver["family"]["tests"]]
    assert ver["family"]["size"] == 6 == len(keys) == len(set(keys))
    pairs = {frozenset(k[1:] if len(k) == 3 else (k[1], "symlm")) for k in keys}
    assert len(pairs) == 3  # each unordered pair once, over both metrics
    # LM's own table would hold only mirrors: there is none, and the family statement says why
    assert set(ver["also"]) == {"rpc_symlm"} and set(ver["also"]["rpc_symlm"]["cells"]) == {"lm"}
    assert "## Verdicts over seeds against LM" not in report
    assert "2 variants x 2 metrics against Symlm and 1 variant x 2 metrics against RPC-Symlm (" \
        in ver["family"]["family"]
    assert "a comparison between two of those comparators is counted once" in ver["family"]["family"]


def test_a_main_table_over_different_seed_sets_says_to_compare_paired(study_dir: Path) -> None:
    """A reviewer subtracted two rows of the language table (Symlm over 5 seeds, the others over 4) and got
    -0.55 where the paired difference is -0.36: a table whose rows have different seeds says so."""
    note = "The rows average over their own seeds (the seeds column), which differ between rows"
    assert note not in write_study_report(study_dir, plots=False).read_text()  # the same six seeds each
    (study_dir / "results" / "lm-s5.json").unlink()
    assert note in write_study_report(study_dir, plots=False).read_text()


def test_training_time_is_in_seconds_when_every_run_took_less_than_a_minute(study_dir: Path) -> None:
    """A smoke study's "train min" column read "0.0 +- 0.0" (runs of ~3 s): seconds then."""
    assert "| train min |" in write_study_report(study_dir, plots=False).read_text()  # 60 s runs
    for f in (study_dir / "results").glob("*.json"):
        ResultStore(f).put("run", {}, {"params": 12345, "tokens_per_s": 1000.0, "train_time_s": 3.0,
                                       "epochs": []})
    report = write_study_report(study_dir, plots=False).read_text()
    assert "| train s |" in report and "| 3.0 ± 0.0 |" in report


# --- found by mutation testing (/work/notes/review/mutation.md): each fails on its mutant ---------------


def test_every_declared_zoo_margin_is_its_sources_difference() -> None:
    """The margins recomputed by hand from the numbers docs/verdicts.md quotes (robust_transformer's logs:
    clean / FGSM 1/255 / PGD 1/255 / FGSM 4/255 / PGD 4/255; the RPC paper's Tables 1-3, 9-10), against
    studies/margins.py, where they are typed once."""
    from kpca_attention.studies.margins import ZOO_MARGINS, language_margins, segmentation_margins

    deit = (71.83, 54.62, 43.84, 30.51, 8.50)
    logs = {"kde": (72.68, 55.26, 43.38, 31.60, 8.63), "rkde": (72.58, 55.83, 44.15, 32.64, 9.35)}
    for slug, row in logs.items():
        want = dict(zip(("clean", "fgsm@1", "pgd@1", "fgsm@4", "pgd@4"),
                        (round(abs(m - d), 2) for m, d in zip(row, deit, strict=True)), strict=True))
        assert {k: m.value for k, m in ZOO_MARGINS[slug].items()} == pytest.approx(want), slug
    fan, rpc_fan = (77.89, 32.01, 2.92), (77.98, 35.12, 6.25)  # clean / FGSM / PGD, Tables 9-10
    want = {k: round(r - f, 2) for k, f, r in zip(("clean", "fgsm@8", "pgd@8"), fan, rpc_fan, strict=True)}
    assert {k: m.value for k, m in ZOO_MARGINS["rpc_fan"].items()} == pytest.approx(want)
    assert {m.against for m in ZOO_MARGINS["rpc_fan"].values()} == {"fan"}
    lm = language_margins()  # Table 3, word swap: valid 42.90 - 41.83, test 44.32 - 43.16
    assert (lm["wordswap/valid"].value, lm["wordswap/test"].value) == pytest.approx((1.07, 1.16))
    seg = segmentation_margins()  # each source names its own metric
    assert seg["clean:miou"].source.startswith("paper Table 6, ADE20K mIoU:")
    assert seg["clean:miou"].source != seg["corrupted:miou"].source
