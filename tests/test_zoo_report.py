"""The zoo's machinery: a fake zoo-like study folder (the zoo-language study cut to four variants, known
per-seed perplexities) whose report must give per-variant margins before per-metric ones, verdicts
against the baseline AND a second comparator in one Holm family, and a leaderboard whose cells equal
report/verdicts.py computed here independently; the engine's reuse of another study's results and its
refusal to change a declared margin once results exist."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpca_attention.io import read_json, write_json_atomic
from kpca_attention.report.study import write_study_report
from kpca_attention.report.verdicts import BETTER, Family, equivalent_word
from kpca_attention.robustness.store import ResultStore
from kpca_attention.studies import zoo_language_study, zoo_study
from kpca_attention.studies.engine import (
    _check_settings,
    _holds_everything,
    result_path,
    run_study,
)
from kpca_attention.studies.language import quick_language_study
from kpca_attention.studies.machines import trained_on
from kpca_attention.studies.margins import ZOO_MARGINS, ZOO_NOT_FOUND
from kpca_attention.studies.spec import Leaderboard, Margin
from kpca_attention.tasks.language.suites import LMSuites, encode_f16

pytestmark = pytest.mark.usefixtures("single_thread")

SEEDS = [0, 1, 2, 3]
KEYS = ("ppl/valid", "ppl/test")  # the report's metric order
BASE = {"ppl/valid": [60.0, 61.5, 59.2, 62.3], "ppl/test": [50.0, 51.2, 49.5, 52.4]}
# variant - LM per seed: SymViT-like symlm a little worse, RPC clearly better on test, KDE within a few
# hundredths of the LM on test (inside its own margin 0.5, outside nothing), noisy on valid
DIFFS = {
    "symlm": {"ppl/valid": [0.4, 0.9, -0.2, 0.6], "ppl/test": [0.3, 0.5, 0.1, 0.4]},
    "rpc_symlm": {"ppl/valid": [-1.0, 1.5, -2.2, 0.8], "ppl/test": [-3.1, -2.9, -3.3, -3.1]},
    "kde": {"ppl/valid": [3.0, -2.5, 0.5, -3.1], "ppl/test": [0.03, -0.02, 0.01, -0.04]},
}
VARIANTS = ("lm", "symlm", "rpc_symlm", "kde")
#: a per-metric margin and a per-variant one for KDE on test, which must win over it
MARGINS = {"ppl/test": Margin(5.0, "a metric's margin"), ("kde", "ppl/test"): Margin(0.5, "KDE's own"),
           ("rpc_symlm", "ppl/valid"): Margin(0.99, "RPC's own")}


def _values(slug: str, key: str) -> list[float]:
    if slug == "lm":
        return BASE[key]
    return [b + d for b, d in zip(BASE[key], DIFFS[slug][key], strict=True)]


def _margin(slug: str, key: str) -> float | None:
    m = MARGINS.get((slug, key)) or MARGINS.get(key)
    return None if m is None else m.value


@pytest.fixture
def zoo_dir(tmp_path: Path) -> Path:
    """A zoo-language-like folder as the engine leaves it: settings.json and one store per run."""
    z = zoo_language_study(seeds=tuple(SEEDS))
    study = z.replace(variants=tuple(v for v in z.variants if v.slug in VARIANTS), margins=MARGINS,
                      leaderboard=Leaderboard(KEYS, plot=KEYS))
    out = tmp_path / "zoo-language"
    (out / "results").mkdir(parents=True)
    write_json_atomic(out / "settings.json", study.to_dict())
    rng = np.random.default_rng(0)
    for v in study.variants:
        for i, sd in enumerate(SEEDS):
            store = ResultStore(out / "results" / f"{v.slug}-s{sd}.json")
            store.put("run", {}, {"params": 1, "tokens_per_s": 1000.0, "train_time_s": 60.0, "epochs": []})
            for key in KEYS:
                store.put(key, {}, {"ppl": _values(v.slug, key)[i],
                                    "nll_f16": encode_f16(rng.uniform(2, 5, size=32))})
    return out


def _expected(pairs=(), margin=lambda k: _margin(k[1], k[0])):
    """The verdicts computed here from the planted numbers: against LM every other variant, against Symlm
    every variant but LM (that test is the LM table's Symlm row), and each ``(variant, comparator)`` of
    ``pairs``: one family."""
    fam = Family("independent")
    for key in KEYS:
        comparisons = [(s, "lm") for s in ("symlm", "rpc_symlm", "kde")]
        comparisons += [(s, "symlm") for s in ("rpc_symlm", "kde")] + list(pairs)
        for s, c in comparisons:
            fam.add((key, s, c), np.subtract(_values(s, key), _values(c, key)))
    return fam, fam.verdicts(margin, False)


def test_zoo_report_two_comparators_margins_and_leaderboard(zoo_dir: Path) -> None:
    report = write_study_report(zoo_dir).read_text()
    summary = read_json(zoo_dir / "summary.json")
    fam, want = _expected()
    ver = summary["verdicts"]
    # one Holm family over both comparisons: 3 x 2 against the LM, 2 x 2 against Symlm
    assert ver["family"]["size"] == 10 == fam.size
    assert "3 variants x 2 metrics against LM (asymmetric) and 2 variants x 2 metrics against Symlm" \
        in ver["family"]["family"]
    for (key, slug, comp), v in want.items():
        cells = ver["cells"] if comp == "lm" else ver["also"][comp]["cells"]
        cell = cells[slug][key]
        assert cell["word"] == v.word, (key, slug, comp)
        assert cell["margin"] == _margin(slug, key)
        for q in ("mean", "p_raw", "p_holm", "tost_p", "sd"):
            if getattr(v, q) is None:  # no margin: no TOST
                assert cell[q] is None and _margin(slug, key) is None
                continue
            assert cell[q] == pytest.approx(getattr(v, q), rel=1e-9, abs=1e-12), (slug, key, comp, q)
        assert cell["ci"] == pytest.approx(list(v.ci), rel=1e-9)
    # the planted effects: KDE equivalent within its OWN margin (0.5, not the metric's 5), RPC better
    assert want[("ppl/test", "kde", "lm")].word == equivalent_word(0.5)
    assert want[("ppl/test", "rpc_symlm", "lm")].word == BETTER
    assert "## Verdicts over seeds against LM (asymmetric)" in report
    assert "## Verdicts over seeds against Symlm" in report
    assert ("KDE, test ppl (this variant's own, applied in each of its comparisons: where its source "
            "measured another one, borrowed): +-0.5 (KDE's own)") in report
    assert (zoo_dir / "forest_kde_vs_symlm.png").stat().st_size > 5000
    # the leaderboard: mean +- std, the paired difference against the LM with interval, word and margin
    lb = summary["leaderboard"]
    assert lb["metrics"] == list(KEYS)
    for slug in VARIANTS:
        cells = []
        for key in KEYS:
            vals = np.array(_values(slug, key))
            cells.append(f"{vals.mean():.2f} ± {vals.std(ddof=1):.2f}")
            assert lb["rows"][slug][key]["mean"] == pytest.approx(vals.mean(), rel=1e-12)
        for key in KEYS:
            if slug == "lm":
                cells.append("baseline")
                continue
            v = want[(key, slug, "lm")]
            m = _margin(slug, key)
            cells.append(f"{v.mean:+.2f} ({v.ci[0]:+.2f}, {v.ci[1]:+.2f}) {v.word}; "
                         + (f"m +-{m:g}" if m is not None else "no margin"))
        label = {"lm": "LM (asymmetric)", "symlm": "Symlm", "rpc_symlm": "RPC-Symlm", "kde": "KDE"}[slug]
        row = f"| {label} | {len(SEEDS)} | " + " | ".join(cells) + " |"
        assert row in report, row
    assert lb["plot"] == {"x": "ppl/valid", "y": "ppl/test", "file": "leaderboard.png"}
    assert (zoo_dir / "leaderboard.png").stat().st_size > 10000
    assert report.index("## Leaderboard") < report.index("## Verdicts over seeds against LM")
    # a fifth seed planned and not landed: the leaderboard's rows and decided words say so
    settings = read_json(zoo_dir / "settings.json")
    settings["seeds"] = [*SEEDS, 4]
    write_json_atomic(zoo_dir / "settings.json", settings)
    report = write_study_report(zoo_dir).read_text()
    v = want[("ppl/test", "rpc_symlm", "lm")]
    assert "| RPC-Symlm | 4 of 5 planned | " in report and "| LM (asymmetric) | 4 of 5 planned | " in report
    assert f"{v.mean:+.2f} ({v.ci[0]:+.2f}, {v.ci[1]:+.2f}) better (interim: 4 of 5 planned seeds); m +-5" \
        in report
    rows = read_json(zoo_dir / "summary.json")["leaderboard"]["rows"]
    assert rows["kde"]["ppl/test"]["diff"]["planned"] == 5


def test_the_zoo_declares_each_papers_own_gain() -> None:
    z = zoo_study()
    d = z.to_dict()
    assert d["also_against"] == ["symvit"] and d["reuse"] == ["rpc-seeds"] and d["baseline"] == "vit"
    assert d["leaderboard"]["plot"] == ["clean", "pgd@4"]
    assert [c.name for c in z.checks] == ["cost"]
    # KDE's clean gain from the repository's logs (72.68 - 71.83), RKDE's FGSM 1/255 (55.83 - 54.62)
    assert z.margin("kde", "clean").value == pytest.approx(0.85)
    assert z.margin("rkde", "fgsm@1").value == pytest.approx(1.21)
    # RPC-FAN's gain is over FAN (the paper's Tables 9-10): its margin belongs to that comparison only
    assert z.margin("rpc_fan", "pgd@8", "fan").value == pytest.approx(3.33)
    assert z.margin("rpc_fan", "pgd@8") is None and z.margin("rpc_fan", "pgd@8", "symvit") is None
    assert d["pairs"] == [["rpc_fan", "fan"]] and d["variant_margins"]["rpc_fan"]["clean"]["against"] == "fan"
    assert z.margin("twicing", "clean") is None and "twicing" in ZOO_NOT_FOUND  # not found: none declared
    assert set(d["variant_margins"]) == set(ZOO_MARGINS) and d["margins"] == {}
    lm = zoo_language_study().to_dict()
    assert lm["also_against"] == ["symlm"] and set(lm["variant_margins"]) == {"rpc_symlm"}
    with pytest.raises(ValueError, match="also_against"):
        z.replace(also_against=("vit",))
    with pytest.raises(ValueError, match="not a variant"):
        z.replace(margins={("nope", "clean"): Margin(1.0, "x")})
    for pairs in ((("rpc_fan", "vit"),), (("rpc_fan", "symvit"),), (("fan", "fan"),), (("fan", "nope"),),
                  (("kde", "fan"), ("kde", "fan"))):  # the baseline, a comparator already, itself, twice
        with pytest.raises(ValueError, match="pairs"):
            z.replace(pairs=pairs)
    # a margin against a comparator the study does not compare that variant with is refused
    with pytest.raises(ValueError, match="against 'fan'"):
        z.replace(margins={("kde", "clean"): Margin(1.0, "x", against="fan")})
    with pytest.raises(ValueError, match="against 'fan'"):
        z.replace(margins={"clean": Margin(1.0, "x", against="fan")})


def test_a_declared_pair_and_a_margin_of_one_comparison(zoo_dir: Path) -> None:
    """``pairs``: KDE against RPC-Symlm as one more comparison, with a margin of KDE's that belongs to it
    only (``against``): the report adds that row to the same Holm family, uses the margin there and not
    against the LM, and says so."""
    settings = read_json(zoo_dir / "settings.json")
    settings["pairs"] = [["kde", "rpc_symlm"]]
    settings["variant_margins"]["kde"]["ppl/valid"] = {"value": 4.0, "source": "KDE vs RPC",
                                                       "against": "rpc_symlm"}
    write_json_atomic(zoo_dir / "settings.json", settings)
    report = write_study_report(zoo_dir).read_text()
    ver = read_json(zoo_dir / "summary.json")["verdicts"]

    def margin(k):
        if k[1] == "kde" and k[0] == "ppl/valid":
            return 4.0 if k[2] == "rpc_symlm" else None  # its own, of that comparison only
        return _margin(k[1], k[0])

    fam, want = _expected(pairs=[("kde", "rpc_symlm")], margin=margin)
    assert ver["family"]["size"] == 12 == fam.size
    assert set(ver["also"]["rpc_symlm"]["cells"]) == {"kde"}  # the pair's section: only its variant
    for (key, slug, comp), v in want.items():
        cells = ver["cells"] if comp == "lm" else ver["also"][comp]["cells"]
        cell = cells[slug][key]
        assert (cell["word"], cell["margin"]) == (v.word, margin((key, slug, comp))), (key, slug, comp)
        assert cell["p_holm"] == pytest.approx(v.p_holm, rel=1e-9)
    # KDE - RPC-Symlm on valid: +-4 holds its interval? Whatever the word, the margin was used there only
    assert ver["cells"]["kde"]["ppl/valid"]["margin"] is None
    assert ver["also"]["rpc_symlm"]["cells"]["kde"]["ppl/valid"]["margin"] == 4.0
    assert "## Verdicts over seeds against RPC-Symlm" in report
    assert "KDE, valid ppl (this variant's own, in its comparison with RPC-Symlm): +-4 (KDE vs RPC)" in report
    assert "A single comparison the study declares (pairs): KDE against RPC-Symlm." in report


def test_reuse_of_another_studys_results_and_fixed_margins(tmp_path: Path, capsys) -> None:
    other = quick_language_study().replace(name="other")
    run_study(other, tmp_path / "other", runs=tmp_path / "runs-other", only=("symlm",), report=False,
              checks=False, progress=False)
    mine = quick_language_study().replace(name="mine", reuse=("other",))
    capsys.readouterr()
    run_study(mine, tmp_path / "mine", runs=tmp_path / "runs-mine", only=("symlm",), report=False,
              checks=False, progress=False)
    log = capsys.readouterr().out
    v = mine.variant("symlm")
    theirs, ours = result_path(tmp_path / "other", v, 0), result_path(tmp_path / "mine", v, 0)
    assert "results of study 'other' reused" in log and "nothing to train or evaluate" in log
    # a reference to the other study's items by hash, not a copy: the same records, a fraction of the bytes
    assert read_json(ours)["reuses"]["study"] == "other" and read_json(ours)["items"] == {}
    assert ResultStore(ours).records() == ResultStore(theirs).records()
    assert ours.stat().st_size < theirs.stat().st_size / 5  # names and hashes (5 items of a toy LM run)
    assert ResultStore(ours).taken_from == theirs
    assert trained_on(tmp_path / "mine") == trained_on(tmp_path / "other")  # the machine check sees it
    assert not (tmp_path / "runs-mine" / "symlm-s0").exists()  # neither trained nor evaluated
    report = write_study_report(tmp_path / "mine").read_text()  # it reads the run through the reference
    assert "Taken from the study `other`" in report and "symlm-s0" in report
    # other suites: the other study's items do not have this study's keys - not taken
    other_suites = mine.replace(suites=LMSuites(tokens=200, positions=4, batch_size=32))
    assert not _holds_everything(other_suites, v, 0, tmp_path / "runs-x", theirs)
    assert _holds_everything(mine, v, 0, tmp_path / "runs-x", theirs)
    # margins are fixed once results exist: another value is refused, --force starts again
    with pytest.raises(ValueError, match="margins were declared before its results"):
        _check_settings(mine.replace(margins={"ppl/test": Margin(1.0, "x")}), tmp_path / "mine", False)
    declared = mine.replace(margins={"ppl/test": Margin(1.1, "paper")})
    _check_settings(declared, tmp_path / "mine", True)  # --force
    settings = read_json(tmp_path / "mine" / "settings.json")
    assert settings["margins"] == {"ppl/test": {"value": 1.1, "source": "paper"}}
    # a folder whose settings predate margins takes them once, with a note; the note stays
    del settings["margins"]
    write_json_atomic(tmp_path / "mine" / "settings.json", settings)
    _check_settings(declared, tmp_path / "mine", False)
    note = read_json(tmp_path / "mine" / "settings.json")["margins_note"]
    assert "after 1 result file(s)" in note
    _check_settings(declared.replace(margins={"ppl/test": Margin(1.1, "paper, reworded")}), tmp_path / "mine",
                    False)
    assert read_json(tmp_path / "mine" / "settings.json")["margins_note"] == note
    with pytest.raises(ValueError, match=r"ppl/test 1.1 -> none"):
        _check_settings(declared.replace(margins={}), tmp_path / "mine", False)
    # a margin of one variant may still be declared while that variant has no result file (rpc_symlm)...
    later = declared.replace(margins={"ppl/test": Margin(1.1, "paper"),
                                      ("rpc_symlm", "ppl/valid"): Margin(2.0, "p")})
    _check_settings(later, tmp_path / "mine", False)
    per_variant = read_json(tmp_path / "mine" / "settings.json")["variant_margins"]
    assert per_variant["rpc_symlm"]["ppl/valid"]["value"] == 2.0
    # ...but not for a variant that has one (symlm), nor changed for all variants
    with pytest.raises(ValueError, match=r"symlm: ppl/valid none -> 2.0"):
        _check_settings(later.replace(margins={**later.margins, ("symlm", "ppl/valid"): Margin(2.0, "p")}),
                        tmp_path / "mine", False)
    # the comparison a margin belongs to is part of it: once rpc_symlm has a result (a file under its
    # name here), moving its margin to the comparison with the LM alone is a change, and refused
    results = tmp_path / "mine" / "results"
    (results / "rpc_symlm-s0.json").write_bytes((results / "symlm-s0.json").read_bytes())
    moved = later.replace(also_against=("lm",), margins={**later.margins, ("rpc_symlm", "ppl/valid"):
                                                         Margin(2.0, "p", against="lm")})
    with pytest.raises(ValueError, match=r"rpc_symlm: ppl/valid 2.0 -> \(2.0, 'lm'\)"):
        _check_settings(moved, tmp_path / "mine", False)


@pytest.mark.parametrize("slug", ["symlm", "lm", "rpc_symlm"])
def test_zoo_language_reuses_the_committed_language_runs(slug: str) -> None:
    """zoo-language trains its three shared rows with the language study's recipe and suites: every
    committed language run holds all of its items under zoo-language's keys (so it is copied, not
    retrained, and both studies stay on the language study's kind of machine)."""
    root = Path(__file__).resolve().parents[1]
    study = zoo_language_study()
    assert "language" in study.reuse
    for path in sorted((root / "results" / "language" / "results").glob(f"{slug}-s*.json")):
        seed = int(path.stem.rsplit("-s", 1)[1])
        assert _holds_everything(study, study.variant(slug), seed, root / "runs" / "none", path), path
