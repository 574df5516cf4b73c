"""Per-item integrity of the result store: every item carries the SHA-256 of its canonical JSON (key and
result), checked on load by every reader (the study report too), together with the summary an item must
agree with (the stored accuracy against its correctness bits); a legacy folder is sealed by
``kpca-attention results seal``, after which a missing hash is an error too."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.robustness.store import (
    ResultIntegrityError,
    ResultStore,
    encode_bits,
    pack_bits,
    write_reference,
)

ROOT = Path(__file__).resolve().parents[1]
SEALED = ("vision", "language", "segmentation")


def _copy_vision(tmp_path: Path) -> Path:
    dst = tmp_path / "vision"
    shutil.copytree(ROOT / "results" / "vision", dst, ignore=shutil.ignore_patterns("*.png", "*.md"))
    return dst


def _flip_clean(f: Path, fix_summary: bool) -> None:
    """Set every correctness bit of ``clean`` to 1 (the audit's +77 points), optionally also the accuracy."""
    data = json.loads(f.read_text())
    res = data["items"]["clean"]["result"]
    ones = "1" * res["n"]
    res["correct"] = pack_bits(ones) if isinstance(res["correct"], dict) else ones  # packed on disk or not
    if fix_summary:
        res["top1"] = 1.0
    f.write_text(json.dumps(data))


@pytest.mark.parametrize("fix_summary", [False, True], ids=["bits-only", "bits-and-accuracy"])
def test_a_hand_edited_item_stops_the_study_report(tmp_path, fix_summary) -> None:
    study = _copy_vision(tmp_path)
    victim = study / "results" / "rpc_official-s0.json"
    _flip_clean(victim, fix_summary)
    res = CliRunner().invoke(app, ["report", str(study)])
    assert res.exit_code == 2, res.output
    assert str(victim) in res.output and "'clean'" in res.output, res.output
    assert not (study / "report.md").exists() or "100.0" not in (study / "report.md").read_text()


def test_items_carry_hashes_and_an_edit_names_file_and_item(tmp_path) -> None:
    f = tmp_path / "r.json"
    store = ResultStore(f)
    store.put("clean", {"n": 4}, {"correct": encode_bits([1, 0, 1, 1]), "n": 4, "top1": 0.75})
    store.put("run", {"n": 4}, {"loss": 0.5, "tuple": (1, 2)})
    data = json.loads(f.read_text())
    assert data["sealed"] is True and all(len(v["sha256"]) == 64 for v in data["items"].values())
    assert ResultStore(f).items()["run"] == {"loss": 0.5, "tuple": [1, 2]}  # reads back and verifies
    data["items"]["run"]["result"]["loss"] = 0.25
    f.write_text(json.dumps(data))
    with pytest.raises(ResultIntegrityError, match="'run'") as e:
        ResultStore(f)
    assert str(f) in str(e.value)


def test_a_key_edit_is_detected(tmp_path) -> None:
    f = tmp_path / "r.json"
    ResultStore(f).put("run", {"n": 4}, {"loss": 0.5})
    data = json.loads(f.read_text())
    data["items"]["run"]["key"]["n"] = 5
    f.write_text(json.dumps(data))
    with pytest.raises(ResultIntegrityError, match="'run'"):
        ResultStore(f)


def test_a_summary_that_disagrees_with_the_bits_is_detected_without_a_hash(tmp_path) -> None:
    f = tmp_path / "legacy.json"
    good = {"correct": "1011", "n": 4, "top1": 0.75}
    f.write_text(json.dumps({"items": {"clean": {"key": {}, "result": good}}}))
    assert ResultStore(f).items()["clean"]["top1"] == 0.75  # a legacy file (no hashes) still loads
    cases = (({**good, "top1": 1.0}, "top1"), ({**good, "n": 5}, "n"), ({**good, "correct": "10x1"}, "0/1"))
    for bad, says in cases:
        f.write_text(json.dumps({"items": {"clean": {"key": {}, "result": bad}}}))
        with pytest.raises(ResultIntegrityError, match=says):
            ResultStore(f)


def test_perplexity_must_agree_with_the_mean_nll(tmp_path) -> None:
    f = tmp_path / "lm.json"
    item = {"key": {}, "result": {"nll_mean": 4.0, "ppl": 54.598150033144236, "tokens": 10}}
    f.write_text(json.dumps({"items": {"ppl/test": item}}))
    ResultStore(f)
    item["result"]["ppl"] = 20.0
    f.write_text(json.dumps({"items": {"ppl/test": item}}))
    with pytest.raises(ResultIntegrityError, match="ppl"):
        ResultStore(f)


def test_a_damaged_file_is_an_error_not_an_empty_store(tmp_path) -> None:
    f = tmp_path / "r.json"
    ResultStore(f).put("run", {}, {"loss": 0.5})
    f.write_text(f.read_text()[:20])
    with pytest.raises(ResultIntegrityError, match="not valid JSON"):
        ResultStore(f)


def test_legacy_files_gain_hashes_and_stay_readable_mid_way(tmp_path) -> None:
    """A legacy file (written by an older process) takes new items (hashed) and stays unsealed until
    ``results seal``; after sealing, an item without a hash is an error."""
    f = tmp_path / "results" / "v-s0.json"
    f.parent.mkdir()
    f.write_text(json.dumps({"items": {"run": {"key": {"a": 1}, "result": {"loss": 1.0}}}}))
    store = ResultStore(f)
    store.put("clean", {"a": 1}, {"correct": "11", "n": 2, "top1": 1.0})
    data = json.loads(f.read_text())
    assert "sha256" not in data["items"]["run"] and "sha256" in data["items"]["clean"]
    assert not data.get("sealed")
    res = CliRunner().invoke(app, ["results", "seal", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads(f.read_text())
    assert data["sealed"] is True and "sha256" in data["items"]["run"]
    del data["items"]["run"]["sha256"]
    f.write_text(json.dumps(data))
    with pytest.raises(ResultIntegrityError, match="no hash"):
        ResultStore(f)
    res = CliRunner().invoke(app, ["results", "verify", str(tmp_path)])
    assert res.exit_code == 2 and "'run'" in res.output, res.output


def test_an_item_removed_from_a_sealed_file_is_named_until_the_removal_is_sealed(tmp_path) -> None:
    """A security review deleted the clean item of a sealed file: the run then read as one still in
    evaluation (a seed quietly dropped from the means). A sealed file lists its items' names, so the removal
    (or an item added by hand) is an error naming it; `results seal` records a removal made on purpose."""
    f = tmp_path / "results" / "v-s0.json"
    store = ResultStore(f)
    store.put("run", {"a": 1}, {"loss": 1.0})
    store.put("clean", {"a": 1}, {"correct": "11", "n": 2, "top1": 1.0})
    data = json.loads(f.read_text())
    assert data["sealed"] is True and data["sealed_items"] == ["clean", "run"]
    gone = {**data, "items": {k: v for k, v in data["items"].items() if k != "clean"}}
    f.write_text(json.dumps(gone))
    with pytest.raises(ResultIntegrityError, match=r"not those it was sealed with \(removed \['clean'\]\)"):
        ResultStore(f)
    res = CliRunner().invoke(app, ["results", "verify", str(tmp_path)])
    assert res.exit_code == 2 and "removed ['clean']" in res.output, res.output
    res = CliRunner().invoke(app, ["results", "seal", str(tmp_path)])  # on purpose: recorded
    assert res.exit_code == 0, res.output
    assert json.loads(f.read_text())["sealed_items"] == ["run"] and set(ResultStore(f).items()) == {"run"}
    extra = json.loads(f.read_text())
    extra["items"]["clean"] = data["items"]["clean"]  # an item (with its hash) put back by hand
    f.write_text(json.dumps(extra))
    with pytest.raises(ResultIntegrityError, match=r"added \['clean'\]"):
        ResultStore(f)
    extra.pop("sealed_items")  # sealed before the list existed: read as before
    f.write_text(json.dumps(extra))
    assert set(ResultStore(f).items()) == {"run", "clean"}


def test_a_report_names_the_legacy_files_it_reads(tmp_path) -> None:
    """The report reads unsealed (legacy) files, whose items can be edited without a trace: it says which."""
    study = _copy_vision(tmp_path)
    f = study / "results" / "vit-s1.json"
    data = json.loads(f.read_text())
    del data["sealed"], data["sealed_items"], data["items"]["clean"]["sha256"]
    f.write_text(json.dumps(data))
    res = CliRunner().invoke(app, ["report", str(study)])
    assert res.exit_code == 0, res.output
    assert ("Not sealed (legacy result files, written before items carried hashes: an edit of their items "
            f"cannot be detected): vit-s1.json; `kpca-attention results seal {study}`") in \
        (study / "report.md").read_text()
    assert CliRunner().invoke(app, ["results", "seal", str(study)]).exit_code == 0
    assert CliRunner().invoke(app, ["report", str(study)]).exit_code == 0
    assert "Not sealed" not in (study / "report.md").read_text()


def test_seal_refuses_a_folder_whose_items_disagree(tmp_path) -> None:
    f = tmp_path / "results" / "v-s0.json"
    f.parent.mkdir()
    bad = {"correct": "11", "n": 2, "top1": 0.5}
    f.write_text(json.dumps({"items": {"clean": {"key": {}, "result": bad}}}))
    res = CliRunner().invoke(app, ["results", "seal", str(tmp_path)])
    assert res.exit_code == 2 and "'clean'" in res.output and str(f) in res.output, res.output
    assert "sealed" not in json.loads(f.read_text())


@pytest.mark.parametrize("study", SEALED)
def test_the_committed_results_are_sealed(study) -> None:
    files = sorted((ROOT / "results" / study / "results").glob("*.json"))
    assert files
    for f in files:
        data = json.loads(f.read_text())
        assert data.get("sealed") is True, f
        ResultStore(f)  # verifies every hash and summary


def test_every_committed_result_file_lists_its_items() -> None:
    files = sorted((ROOT / "results").glob("*/results/*.json"))
    assert len(files) > 200
    for f in files:
        data = json.loads(f.read_text())
        assert data.get("sealed") is True and isinstance(data.get("sealed_items"), list), f


def test_the_leaderboard_reads_results_through_the_verifying_store(tmp_path) -> None:
    from kpca_attention.studies.leaderboard import leaderboard_rows

    study = _copy_vision(tmp_path / "results")
    _flip_clean(study / "results" / "vit-s0.json", fix_summary=True)
    with pytest.raises(ResultIntegrityError, match="'clean'"):
        leaderboard_rows(tmp_path / "results")


def test_written_files_get_the_usual_permissions_and_a_failed_write_leaves_nothing(tmp_path) -> None:
    # results, plots and cached images are written to a temporary file and renamed into place; mkstemp's
    # temporary files are 0600, which the renamed file kept (a collaborator could not read the results)
    from kpca_attention.io import atomic_path, write_json_atomic
    from kpca_attention.plotting import new_figure, save_figure
    from kpca_attention.robustness.corruptions import _atomic_save_npy

    old = os.umask(0o022)
    try:
        json_file = write_json_atomic(tmp_path / "r" / "a.json", {"x": 1})
        fig, _ = new_figure()
        png = save_figure(fig, tmp_path / "p.png")
        npy = tmp_path / "c.npy"
        _atomic_save_npy(npy, np.zeros(3))
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(old)
    want = stat.S_IMODE(plain.stat().st_mode)
    assert want == 0o644
    for f in (json_file, png, npy):
        assert stat.S_IMODE(f.stat().st_mode) == want, f
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "b.json") as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("crash mid-write")
    assert not (tmp_path / "b.json").exists() and not list(tmp_path.glob(".b.json.*"))


def test_two_writers_of_one_store_keep_each_others_items(tmp_path) -> None:
    """Two evaluations of one model at once (``benchmark`` at 4/255 and at 8/255): each store read the
    file before the other wrote; both items survive (before: the last writer's file replaced the other's)."""
    f = tmp_path / "model.json"
    clean = {"correct": encode_bits([1, 0, 1, 1]), "n": 4, "top1": 0.75}
    first, second = ResultStore(f), ResultStore(f)
    first.put("attack-4", {"eps": 4}, clean)
    second.put("attack-8", {"eps": 8}, clean)
    first.put("attack-2", {"eps": 2}, clean)
    assert sorted(ResultStore(f).items()) == ["attack-2", "attack-4", "attack-8"]


def test_a_put_verifies_what_another_writer_left(tmp_path) -> None:
    """A put takes in the other writers' items only after verifying them: an item edited on disk since this
    store read the file stops the put, whether this store held it or not."""
    f = tmp_path / "model.json"
    clean = {"correct": encode_bits([1, 0, 1, 1]), "n": 4, "top1": 0.75}
    mine, theirs = ResultStore(f), ResultStore(f)
    mine.put("attack-4", {"eps": 4}, clean)
    theirs.put("attack-8", {"eps": 8}, clean)
    for victim in ("attack-8", "attack-4"):  # the other's item, then one this store wrote itself
        data = json.loads(f.read_text())
        saved = json.loads(json.dumps(data))
        data["items"][victim]["result"]["top1"] = 1.0
        f.write_text(json.dumps(data))
        with pytest.raises(ResultIntegrityError, match=victim):
            mine.put("attack-2", {"eps": 2}, clean)
        f.write_text(json.dumps(saved))
    mine.put("attack-2", {"eps": 2}, clean)
    assert sorted(ResultStore(f).items()) == ["attack-2", "attack-4", "attack-8"]


def _two_studies(tmp_path: Path) -> tuple[Path, Path]:
    """``results/ran/results/v-s0.json`` (two items) and the path of the same run in ``results/took``."""
    theirs = tmp_path / "results" / "ran" / "results" / "v-s0.json"
    store = ResultStore(theirs)
    store.put("clean", {"n": 4}, {"correct": encode_bits([1, 0, 1, 1]), "n": 4, "top1": 0.75})
    store.put("run", {"n": 4}, {"loss": 0.5})
    return theirs, tmp_path / "results" / "took" / "results" / "v-s0.json"


def test_a_reference_reads_the_other_studys_items_and_keeps_its_own(tmp_path) -> None:
    """A study that reuses another's run refers to its items by hash (no copy); what it computes itself is
    stored beside the reference; sealing keeps the reference; the records read back are the other file's."""
    theirs, mine = _two_studies(tmp_path)
    assert write_reference(mine, theirs) == 2
    data = json.loads(mine.read_text())
    assert data["items"] == {} and data["reuses"]["study"] == "ran" and data["reuses"]["file"] == "v-s0.json"
    ref = ResultStore(mine)
    assert ref.records() == ResultStore(theirs).records() and ref.taken_from == theirs
    ref.put("trace", {"n": 2}, {"density": 0.1})
    data = json.loads(mine.read_text())
    assert sorted(data["items"]) == ["trace"] and "reuses" in data  # only its own item is written
    assert sorted(ResultStore(mine).items()) == ["clean", "run", "trace"]
    assert sorted(ResultStore(theirs).items()) == ["clean", "run"]  # the other study's file is untouched
    res = CliRunner().invoke(app, ["results", "seal", str(mine.parent.parent)])
    assert res.exit_code == 0 and "3 items" in res.output, res.output
    assert "reuses" in json.loads(mine.read_text())
    assert CliRunner().invoke(app, ["results", "verify", str(mine.parent.parent)]).exit_code == 0


def test_a_reference_fails_loudly_when_the_other_file_changes_moves_or_escapes(tmp_path) -> None:
    theirs, mine = _two_studies(tmp_path)
    write_reference(mine, theirs)
    saved = theirs.read_text()
    # the other study re-evaluated an item (a valid file, another result): the reference no longer holds
    ResultStore(theirs).put("run", {"n": 4}, {"loss": 0.25})
    with pytest.raises(ResultIntegrityError, match="'run' .* changed since it was taken") as e:
        ResultStore(mine)
    assert str(mine) in str(e.value) and str(theirs) in str(e.value)
    # an item dropped from the other file, then the file itself gone
    data = json.loads(saved)
    del data["items"]["clean"]
    theirs.write_text(json.dumps(data))
    with pytest.raises(ResultIntegrityError, match="no longer holds it"):
        ResultStore(mine)
    theirs.unlink()
    with pytest.raises(ResultIntegrityError, match="which is missing"):
        ResultStore(mine)
    theirs.write_text(saved)
    ResultStore(mine)  # whole again
    # a hand-made reference may name a plain study folder and file only: nothing outside the results root
    ref = json.loads(mine.read_text())
    for study, name in (("..", "v-s0.json"), ("ran/../..", "x.json"), ("/etc", "passwd.json"),
                        ("ran", "../v-s0.json"), ("ran", "v-s0.txt")):
        mine.write_text(json.dumps({**ref, "reuses": {**ref["reuses"], "study": study, "file": name}}))
        with pytest.raises(ResultIntegrityError, match="no paths"):
            ResultStore(mine)
    # and a reference to a reference is refused when written and when read
    with pytest.raises(ValueError, match="itself a reference"):
        write_reference(tmp_path / "results" / "third" / "results" / "v-s0.json", mine)
    with pytest.raises(ValueError, match="not a result file of a study beside"):
        write_reference(tmp_path / "elsewhere" / "results" / "v-s0.json", theirs)


def _train_items(n: int) -> list[tuple[str, dict, dict]]:
    train = {"epochs": 12, "lr": 0.002, "model": "vit_mini_patch4_28", "model_kwargs": {}, "seed": 2}
    return [(f"attacks/fgsm/{i}", {"eps": i / 255, "n": 4, "train": dict(train)},
             {"correct": encode_bits([1, 0, 1, i % 2]), "n": 4, "top1": (2 + i % 2) / 4}) for i in range(n)]


def test_a_runs_training_settings_are_stored_once_and_read_back_whole(tmp_path) -> None:
    f = tmp_path / "r.json"
    store = ResultStore(f)
    for item, key, result in _train_items(5):
        store.put(item, key, result)
    store.put("other", {"n": 4, "train": {"epochs": 1}}, {"loss": 0.5})  # a different value stays in place
    data = json.loads(f.read_text())
    assert data["shared"]["train"]["model"] == "vit_mini_patch4_28"
    assert [v["key"]["train"] for k, v in data["items"].items() if k != "other"] == [{"$shared": "train"}] * 5
    assert data["items"]["other"]["key"]["train"] == {"epochs": 1}
    assert f.read_text().count("vit_mini_patch4_28") == 1
    records = ResultStore(f).records()
    for item, key, result in _train_items(5):
        assert records[item]["key"] == key and ResultStore(f).get(item, key) == result
    # the hashes are those of the whole keys: a file with every key whole (the format before) holds the same
    whole = {"items": {k: {**v, "key": records[k]["key"]} for k, v in data["items"].items()}, "sealed": True}
    g = tmp_path / "whole.json"
    g.write_text(json.dumps(whole))
    assert ResultStore(g).records() == records
    assert CliRunner().invoke(app, ["results", "seal", str(g)]).exit_code == 0  # sealing stores it compactly
    assert json.loads(g.read_text()) == data


def test_an_edit_of_the_shared_settings_names_every_item_using_them(tmp_path) -> None:
    f = tmp_path / "r.json"
    store = ResultStore(f)
    for item, key, result in _train_items(3):
        store.put(item, key, result)
    data = json.loads(f.read_text())
    data["shared"]["train"]["epochs"] = 100
    f.write_text(json.dumps(data))
    with pytest.raises(ResultIntegrityError, match="'attacks/fgsm/0'.*SHA-256"):
        ResultStore(f)
    data["shared"] = {}
    f.write_text(json.dumps(data))
    with pytest.raises(ResultIntegrityError, match="shared part 'train'"):
        ResultStore(f)


def test_a_key_that_looks_like_a_shared_marker_is_stored_whole(tmp_path) -> None:
    f = tmp_path / "r.json"
    store = ResultStore(f)
    odd = {"train": {"$shared": "train"}, "data": [1, 2]}
    store.put("a", odd, {"loss": 1.0})
    store.put("b", {"data": [1, 2]}, {"loss": 2.0})
    assert "shared" not in json.loads(f.read_text())
    assert ResultStore(f).get("a", odd) == {"loss": 1.0}


def test_a_report_leaves_out_an_item_stored_under_another_runs_key(tmp_path) -> None:
    """An item left under another run's key (the weights or the protocol changed and a re-evaluation was
    killed half way) was counted by name: one row mixed two trainings. The engine recomputes such an item;
    the report now reads the run as missing it, and the other runs as before."""
    study = _copy_vision(tmp_path)
    f = study / "results" / "rpc_official-s0.json"
    store = ResultStore(f)
    assert set(store.run_items()) == set(store.items())  # a committed run: every item of its run
    rec = store.records()["clean"]
    key = json.loads(json.dumps(rec["key"]))
    key["train"]["lr"] *= 2  # the same item, computed from weights trained otherwise
    store.put("clean", key, rec["result"])
    assert "clean" in ResultStore(f).items() and "clean" not in ResultStore(f).run_items()
    res = CliRunner().invoke(app, ["report", str(study)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((study / "summary.json").read_text())["metrics"]
    assert "0" not in metrics["rpc_official"] and {"1", "2"} <= set(metrics["rpc_official"])
    assert {"0", "1", "2"} <= set(metrics["symvit"])


def test_verify_names_planned_runs_without_a_result_file(tmp_path, copy_committed) -> None:
    """A security review deleted one seed's result file of a committed study: verify still said "each
    study's files hold the runs its settings.json names" and the report averaged the seeds left. A seed
    removed reads as one not run yet - which verify now lists, so a cherry-pick shows."""
    study = copy_committed("rpc-depth12", tmp_path / "rpc-depth12")
    ok = CliRunner().invoke(app, ["results", "verify", str(study)])
    assert ok.exit_code == 0 and "no result file" not in ok.output, ok.output
    next(study.glob("results/rpc12_official-s2.json")).unlink()
    res = CliRunner().invoke(app, ["results", "verify", str(study)])
    assert res.exit_code == 0, res.output
    assert "planned by settings.json, no result file (not run yet, or removed): rpc-depth12/rpc12_official " \
           "seed 2" in res.output


def test_packed_data_cannot_unpack_past_its_declared_size() -> None:
    """A security review packed 3 GiB of zeros into a 645 KB analysis file: claims --from-analysis grew to
    4 GB. Unpacking now stops one byte past the size the record declares (8 bytes per value)."""
    import lzma

    from kpca_attention.io import pack_bytes, unpack_bytes
    from kpca_attention.kpca.analysis import unpack_records

    bomb = pack_bytes(bytes(64 << 20))  # 64 MiB of zeros: ~10 KB packed
    assert len(bomb) < 20_000
    with pytest.raises(ValueError, match="unpacks to more than the 800 bytes"):
        unpack_records({"n": 100, "columns": {"x": {"dtype": "float64", "data": bomb}}})
    with pytest.raises(ValueError, match="decompression bomb"):
        unpack_bytes(bomb, max_size=1 << 20)
    small = np.arange(5, dtype="<f8")
    column = {"dtype": "float64", "data": pack_bytes(small.tobytes())}
    out = unpack_records({"n": 5, "columns": {"x": column}})
    assert np.array_equal(out["x"], small)
    with pytest.raises((ValueError, lzma.LZMAError)):
        unpack_bytes(pack_bytes(b"abc")[:-3])  # cut short: never a silent partial result


def test_a_result_folder_refuses_links_and_pipes(tmp_path, copy_committed) -> None:
    """A FIFO named like a result file hung `results verify` forever; a link to /dev/zero filled memory."""
    study = copy_committed("rpc-depth12", tmp_path / "a")
    os.mkfifo(study / "results" / "zz-s0.json")
    res = CliRunner().invoke(app, ["results", "verify", str(study)])
    assert res.exit_code == 2 and "is not a regular file" in res.output, res.output
    other = copy_committed("rpc-depth12", tmp_path / "b")
    (other / "results" / "zz-s0.json").symlink_to("/dev/zero")
    res = CliRunner().invoke(app, ["results", "verify", str(other)])
    assert res.exit_code == 2 and "is not a regular file" in res.output, res.output
