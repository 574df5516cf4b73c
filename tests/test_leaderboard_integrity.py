"""The leaderboard publishes only numbers its sealed results give: a study's ``summary.json`` (derived,
unsealed) that is not what its report writes, and a benchmark JSON whose numbers its sealed per-image
results do not give, are refused with one line naming the file; copies of the committed results pass."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.studies.leaderboard import leaderboard_rows

REPO = Path(__file__).resolve().parents[1]
CLAIM = "RPC-SymViT with 12 blocks (PAP in block 1 of 12) vs its SymViT: clean"
AA = ("fashion-mnist", "Linf", "4/255", "pixel", "AutoAttack standard")
VIT = Path("fashion-mnist/Linf/4_255/rpc-seeds-vit-s0.json")


def _leaderboard(results: Path, tmp: Path, page: Path) -> object:
    return CliRunner().invoke(app, ["leaderboard", "--results", str(results), "-o", str(tmp / "lb"),
                                    "--markdown", str(tmp / "lb.md"), "--results-page", str(page)])


def _claim_row(page: Path) -> str:
    return next(line for line in page.read_text().splitlines() if line.startswith(f"| {CLAIM} |"))


def test_an_edited_verdict_cell_of_a_summary_is_refused(tmp_path, copy_committed) -> None:
    results = copy_committed("rpc-depth12", tmp_path / "results" / "rpc-depth12").parent
    page = tmp_path / "results.md"
    shutil.copy(REPO / "docs" / "results.md", page)
    # the committed summary is what `kpca-attention report` writes: it passes, and its cell is published
    res = _leaderboard(results, tmp_path, page)
    assert res.exit_code == 0, res.output
    true_row = _claim_row(page)
    assert "-0.16 (-0.57, +0.26) pp | +-0.5 | equivalent" in true_row
    # an edited verdict cell: the results would still verify, the summary is not sealed
    path = results / "rpc-depth12" / "summary.json"
    summary = json.loads(path.read_text())
    summary["verdicts"]["cells"]["rpc12_official"]["clean"].update(mean=2.5, ci=[2.0, 3.0], word="better")
    path.write_text(json.dumps(summary, indent=2))
    res = _leaderboard(results, tmp_path, page)
    assert res.exit_code != 0
    error = " ".join(res.output.split())  # the one line, as the terminal may wrap it
    assert f"{path}: verdicts.cells.rpc12_official.clean." in error and "sealed results" in error, error
    assert _claim_row(page) == true_row  # nothing published
    assert "+2.50 (+2.00, +3.00)" not in page.read_text()


def _benchmark_copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "results" / "benchmark", tmp_path / "benchmark")
    return tmp_path


def test_an_edited_benchmark_accuracy_is_refused(tmp_path) -> None:
    results = _benchmark_copy(tmp_path)
    rows = leaderboard_rows(results)[0][AA]  # the unedited copy: ranked as committed
    assert [(r["label"], r["robust_acc"]) for r in rows][0] == ("rpc-seeds-vit-s0", 56.5)
    path = results / "benchmark" / VIT
    record = json.loads(path.read_text())
    assert record["autoattack_acc"] == "56.50"
    for field, value in (("autoattack_acc", "96.50"), ("autoattack_acc_interval", [93.0, 99.0]),
                         ("clean_acc", "98.20"), ("n", 500)):
        path.write_text(json.dumps({**record, field: value}))
        refused = re.escape(f"{path}: {field} is ") + ".* but its sealed per-image results"
        with pytest.raises(ValueError, match=refused):
            leaderboard_rows(results)
    path.write_text(json.dumps(record))
    assert leaderboard_rows(results)[0][AA] == rows  # restored: ranked as before


def test_a_benchmark_json_without_its_sealed_results_is_refused(tmp_path) -> None:
    results = _benchmark_copy(tmp_path)
    (results / "benchmark" / "results" / "rpc-seeds-vit-s0.json").unlink()
    with pytest.raises(ValueError, match=re.escape(f"{results / 'benchmark' / VIT}: its sealed per-image "
                                                   "results ") + ".* are missing"):
        leaderboard_rows(results)


@pytest.mark.slow
def test_every_committed_summary_the_page_reads_is_what_its_report_writes() -> None:
    """A report change committed without regenerating the studies' summaries (or a hand edit) would make
    the next `kpca-attention leaderboard` refuse; caught here instead (about a minute: every page study's
    report written again in a temporary copy)."""
    from kpca_attention.studies.headline import check_summaries, page_studies

    checked = check_summaries(REPO / "results")
    assert checked and set(checked) <= set(page_studies())


def test_a_users_own_folder_gets_its_leaderboard_beside_it(tmp_path, copy_committed) -> None:
    # user-journey review: a folder of benchmark JSONs alone was refused ("holds no study folders"), a
    # results page had to exist (a copy of docs/results.md, then rewritten), and the leaderboard went into
    # the cwd's docs/ and results/; a `kpca-attention robustness` study of existing models was left out
    # without a word (its result files are <slug>.json, not <slug>-s<seed>.json)
    results = _benchmark_copy(tmp_path / "mine")
    res = CliRunner().invoke(app, ["leaderboard", "--results", str(results)])
    assert res.exit_code == 0, res.output
    page = (results / "leaderboard" / "leaderboard.md").read_text()
    assert "`benchmark/rpc-seeds-vit-s0`" in page and not (results / "leaderboard" / "headline.png").exists()
    # the page says where it came from, not the repository's boilerplate (tests, docs/results.md)
    # (the paragraph is wrapped: a line may break before the path, never inside it)
    assert f"Generated from the studies under `{results}`" in " ".join(page.split())
    assert "tests/test_leaderboard.py" not in page and "docs/results.md" not in page
    copy_committed("elliptical-adaptive", results / "elliptical-adaptive")  # existing models, evaluated once
    tables, _ = leaderboard_rows(results)
    adaptive = [r for rows in tables.values() for r in rows if r["name"].startswith("elliptical-adaptive/")]
    assert adaptive and all(r["seeds"] == [] and r["interval"].startswith("Wilson") for r in adaptive)
    assert {r["name"] for r in adaptive} == {f"elliptical-adaptive/elliptical_s{s}" for s in (4, 5, 6, 7)}


def test_a_result_file_whose_seal_was_removed_is_refused(tmp_path, copy_committed) -> None:
    """A security review removed the "sealed" flag of one committed result file and one item's hash, then
    changed that item's numbers: the leaderboard published them (a row moved from rank 16 to 11). This
    version seals every file it writes, so an unsealed one is refused by name before anything is written."""
    results = tmp_path / "results"
    copy_committed("rpc-depth12", results / "rpc-depth12")
    f = results / "rpc-depth12" / "results" / "rpc12_official-s0.json"
    data = json.loads(f.read_text())
    # the flag and one item's hash removed: the file still lists its items, so it still reads as sealed -
    # for the report too, which reads legacy files
    del data["sealed"], data["items"]["clean"]["sha256"]
    f.write_text(json.dumps(data))
    for argv in (["leaderboard", "--results", str(results), "-o", str(tmp_path / "lb")],
                 ["report", str(results / "rpc-depth12")]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2 and "'clean' has no hash in a sealed file" in res.output, (argv, res.output)
    # the list removed too: an unsealed (legacy) file, which the leaderboard refuses by name
    del data["sealed_items"]
    f.write_text(json.dumps(data))
    res = CliRunner().invoke(app, ["leaderboard", "--results", str(results), "-o", str(tmp_path / "lb")])
    assert res.exit_code == 2 and f"{f} is not sealed" in res.output, res.output
    assert not (tmp_path / "lb").exists()
