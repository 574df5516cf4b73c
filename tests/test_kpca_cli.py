"""The ``analyze`` and ``claims`` commands end to end (offline, small inputs)."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.cli import kpca as kpca_cli
from kpca_attention.kpca import pack_records, unpack_records

TEXTS = "\n".join(
    [
        "In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void; and darkness was upon the face of the deep.",
        "And God said, Let there be light: and there was light.",
        "",
        "And God called the light Day, and the darkness he called Night.",
    ]
)


def test_analyze_minilm_texts_with_report(tmp_path):
    texts = tmp_path / "t.txt"
    texts.write_text(TEXTS)
    out = tmp_path / "a.json"
    r = CliRunner().invoke(
        app,
        [
            "analyze",
            "all-MiniLM-L6-v2",
            "--texts",
            str(texts),
            "--json",
            str(out),
            "--report",
            str(tmp_path / "rep"),
            "--detail-samples",
            "2",
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["summary"]["num_sequences"] == 4  # the empty line is skipped
    for key in (
        "linear_cka",
        "kernel_cka",
        "optimal_cosine",
        "direct_cosine",
        "j_proj",
        "phi_norm_sq",
        "h_norm_sq",
    ):
        assert isinstance(res["summary"][key], float)
    assert len(res["heads"]) == 6 * 12 and len(res["layers"]) == 6
    # the per-record columns are stored packed and read back exactly: the summary is their mean
    rec = unpack_records(res["records"])
    assert res["records"]["n"] == 4 * 6 * 12 and all(len(c) == 4 * 6 * 12 for c in rec.values())
    assert rec["layer"].dtype == np.int64 and sorted(set(rec["layer"].tolist())) == list(range(6))
    assert np.nanmean(rec["linear_cka"]) == pytest.approx(res["summary"]["linear_cka"], rel=1e-12)
    for png in (
        "gamma_differences.png",
        "eigenvalue_spectrum.png",
        "alignment_histograms.png",
        "projection_norms.png",
    ):
        assert (tmp_path / "rep" / png).stat().st_size > 1000
    assert "optimal_cosine" in (tmp_path / "rep" / "report.md").read_text()


def test_analyze_image_model_needs_inputs_and_runs_on_a_dataset(tmp_path):
    runner = CliRunner()
    r = runner.invoke(
        app, ["analyze", "symvit_mini_patch4_28", "--no-pretrained", "--json", str(tmp_path / "x.json")]
    )
    assert r.exit_code == 2 and "--images DIR" in r.output
    r = runner.invoke(
        app,
        [
            "analyze",
            "rpc_symvit_mini_patch4_28",
            "--no-pretrained",
            "--dataset",
            "digits",
            "--max-samples",
            "3",
            "--detail-samples",
            "1",
            "--json",
            str(tmp_path / "d.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "d.json").read_text())
    assert res["summary"]["num_sequences"] == 3 and res["pap"]  # RPC layer traced


def test_claims_table(tmp_path):
    texts = tmp_path / "t.txt"
    texts.write_text(TEXTS)
    r = CliRunner().invoke(
        app,
        [
            "claims",
            "all-MiniLM-L6-v2",
            "--texts",
            str(texts),
            "--out",
            str(tmp_path / "c"),
            "--detail-samples",
            "2",
            "--null-samples",
            "3",
            "--control-samples",
            "1",
            "--untrained-baseline",
        ],
    )
    assert r.exit_code == 0, r.output
    table = (tmp_path / "c" / "claims.md").read_text()
    for claim in ("P1:", "P2:", "P3:", "P4:", "C1: optimal cosine <= 0.32", "C2:", "P5/C3:"):
        assert claim in table, claim
    # a row read alone claimed more than its test: the table says how its words read
    assert "not evidence that attention is kernel PCA" in table
    assert "trained below the untrained copy" in table
    data = json.loads((tmp_path / "c" / "claims.json").read_text())
    rows = data["models"][0]["rows"]
    chance_words = ("below chance", "not distinguished from chance", "above chance", "too few units to test")
    plain = {"holds", "fails", "weak", "n/a", "reproduced", "not reproduced", "within the bound",
             "above the bound", "confirmed", "not confirmed",
             "undecided", "active", "never active", "holds (control passes too: uninformative)",
             "fails (control passes too: uninformative)",
             "not comparable (the paper's max exceeds N, the bound on Kc's eigenvalues)", *chance_words,
             "trained above the untrained copy", "trained below the untrained copy",
             "not distinguished from the untrained copy", "both above their nulls: not evidence of training",
             "only the trained model above its null"}
    for row in rows:
        v = row["verdict"]
        assert v in plain or any(v.endswith(w) or v.endswith(f"({w})") for w in chance_words), v
    # every P4 / C1 row reads its measure against chance, with the numbers
    p4c1 = [r for r in rows if r["claim"].startswith(("P4:", "C1:"))]
    assert len(p4c1) == 6 + 3
    for r in p4c1:
        assert any(w in r["verdict"] for w in chance_words), r
        assert "vs chance" in r["measured"] and "Wilcoxon p above" in r["measured"], r
    assert any(r["claim"].startswith("P3 against chance") for r in rows)
    # the untrained copy (same architecture, random weights, same texts): stored, compared measure by measure
    stored = json.loads((tmp_path / "c" / "untrained_baseline_all-MiniLM-L6-v2.json").read_text())
    assert stored["model"]["init_seed"] == 0 and stored["heads"] and "records" not in stored
    copy = [r for r in rows if r["claim"].startswith("Learned or built in")]
    assert len(copy) == 3 + 1 and all("untrained copy (init seed 0)" in r["measured"] for r in copy[:3])
    assert all("against their own nulls: trained" in r["measured"] for r in copy[:3])
    assert any("J_proj's variation" in r["claim"] for r in rows)
    report = (tmp_path / "c" / "all-MiniLM-L6-v2" / "report.md").read_text()
    assert "Alignment against chance" in report and "Positive control" in report
    for png in ("alignment_vs_chance.png", "positive_control.png"):
        assert (tmp_path / "c" / "all-MiniLM-L6-v2" / png).stat().st_size > 1000
    # judged again from the stored analysis, no model loaded: the same table under the same rules
    import kpca_attention.kpca.load as load_mod

    before = table
    (tmp_path / "c" / "claims.md").unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load_mod, "load_for_analysis", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
        again = CliRunner().invoke(app, ["claims", "--from-analysis", str(tmp_path / "c")])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "c" / "claims.md").read_text() == before
    # and the model's report, written again from the stored analysis, is the one the run wrote
    assert (tmp_path / "c" / "all-MiniLM-L6-v2" / "report.md").read_text() == report
    # with -o the judgement goes there and the folder judged is left as it was (-o was ignored and the
    # folder's claims rewritten in place)
    stamp = (tmp_path / "c" / "claims.md").stat().st_mtime_ns
    elsewhere = CliRunner().invoke(app, ["claims", "--from-analysis", str(tmp_path / "c"), "-o",
                                         str(tmp_path / "c2")])
    assert elsewhere.exit_code == 0, elsewhere.output
    assert (tmp_path / "c2" / "claims.md").read_text() == before
    assert (tmp_path / "c2" / "all-MiniLM-L6-v2" / "report.md").read_text() == report
    assert (tmp_path / "c" / "claims.md").stat().st_mtime_ns == stamp
    both = CliRunner().invoke(app, ["claims", "all-MiniLM-L6-v2", "--from-analysis", str(tmp_path / "c")])
    assert both.exit_code == 2 and "not both" in both.output
    mixed = CliRunner().invoke(app, ["claims", "--from-analysis", str(tmp_path / "c"),
                                     "--untrained-baseline"])
    assert mixed.exit_code == 2 and "give one of them" in mixed.output
    # a stored copy analysed on other inputs is refused, not compared with the wrong numbers
    base_file = tmp_path / "c" / "untrained_baseline_all-MiniLM-L6-v2.json"
    stored["inputs"] = "10 other texts"
    base_file.write_text(json.dumps(stored))
    other = CliRunner().invoke(app, ["claims", "--from-analysis", str(tmp_path / "c")])
    assert other.exit_code == 2 and "other inputs" in other.output
    # a run without the copy leaves no older run's copy behind to be judged with its analysis
    again = CliRunner().invoke(app, ["claims", "all-MiniLM-L6-v2", "--texts", str(texts), "--out",
                                     str(tmp_path / "c"), "--detail-samples", "0", "--null-samples", "3",
                                     "--control-samples", "0", "--no-report"])
    assert again.exit_code == 0, again.output
    assert not base_file.exists() and "Learned or built in" not in (tmp_path / "c" / "claims.md").read_text()


def test_untrained_copy_is_the_architecture_with_its_own_seeded_init():
    """The copy has the model's parameters (names, shapes), none of its weights, is in eval mode, depends
    only on its seed, and leaves the global RNG as it was; a Hugging Face copy has its own config."""
    from kpca_attention.train.resolve import resolve_model, untrained_copy

    loaded = resolve_model("symvit_mini_patch4_28", pretrained=False)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.add_(1.0)  # "trained"
    state = torch.random.get_rng_state()
    a, b, c = (untrained_copy(loaded, seed=s).model for s in (0, 0, 1))
    assert torch.equal(torch.random.get_rng_state(), state)
    trained = loaded.model.state_dict()
    for name, w in a.state_dict().items():
        assert w.shape == trained[name].shape and torch.equal(w, b.state_dict()[name])
    differs = [n for n, w in a.state_dict().items()
               if w.is_floating_point() and not torch.equal(w, trained[n])]
    assert len(differs) == len(trained) - sum(not w.is_floating_point() for w in trained.values())
    assert any(not torch.equal(w, c.state_dict()[n]) for n, w in a.state_dict().items())
    assert not a.training and untrained_copy(loaded).info["untrained"] is True
    hf = resolve_model("all-MiniLM-L6-v2")
    copy = untrained_copy(hf)
    assert copy.model.config is not hf.model.config and copy.tokenizer is hf.tokenizer


def test_untrained_baseline_rows_pair_heads_and_adjust_together():
    """Trained against an untrained copy: paired by (layer, head), Holm over the measures; a copy that equals
    the trained model is "not distinguished", one lower in every head is below it."""
    from kpca_attention.kpca.claims import BASELINE_MEASURES, judge

    rng = np.random.default_rng(0)
    heads = [(li, hi) for li in range(4) for hi in range(4)]
    trained = {m: rng.uniform(0.2, 0.4, len(heads)) for m in BASELINE_MEASURES}

    def analysis(values, seed=None):
        return {"model": {"name": "m", **({} if seed is None else {"init_seed": seed})}, "summary": {},
                "heads": [{"layer": li, "head": hi, **{m: float(values[m][i]) for m in values}}
                          for i, (li, hi) in enumerate(heads)]}

    def words(copy_values):
        copy = analysis(copy_values, seed=0)
        # pairing is by (layer, head), not by list position: the copy's heads shuffled, one missing
        copy["heads"] = [copy["heads"][i] for i in np.random.default_rng(1).permutation(len(heads))][1:]
        got = judge(analysis(trained), untrained=copy)["rows"]
        return [r["verdict"] for r in got if r["claim"].startswith("Learned or built in")]

    assert words(trained) == ["not distinguished from the untrained copy"] * 3
    lower = {m: v - 0.05 - 0.01 * rng.random(len(heads)) for m, v in trained.items()}
    assert words(lower) == ["trained above the untrained copy"] * 3  # 16 heads: p 1.5e-5, Holm x 3
    got = judge(analysis(trained), untrained=analysis(lower, seed=0))["rows"]
    assert "Holm-adjusted" in got[-1]["measured"] and "family of 3" in got[-1]["measured"]
    assert "16 heads" in got[-1]["measured"]
    assert "15 heads" in next(r["measured"] for r in judge(analysis(trained), untrained={
        **analysis(lower, seed=0), "heads": analysis(lower, seed=0)["heads"][1:]})["rows"]
        if r["claim"].startswith("Learned or built in"))
    assert not [r for r in judge(analysis(trained))["rows"] if r["claim"].startswith("Learned")]


def test_records_pack_and_unpack_exactly() -> None:
    cols = {"x": [0.1, float("nan"), -1e-300, 1 / 3], "layer": [0, 1, 2, 3],
            "flag": [True, False, True, True]}
    packed = pack_records(cols)
    json.dumps(packed)  # JSON-safe text
    back = unpack_records(json.loads(json.dumps(packed)))
    np.testing.assert_array_equal(back["x"], np.asarray(cols["x"]))  # bit for bit, NaN included
    assert back["layer"].tolist() == [0, 1, 2, 3] and back["flag"].tolist() == [1, 0, 1, 1]
    assert unpack_records({"x": [1.5, 2.5]})["x"].tolist() == [1.5, 2.5]  # files written before packing
    with pytest.raises(ValueError, match="expected 4 values"):
        pack_records({"a": [1.0, 2.0, 3.0, 4.0], "b": [1.0]})
    packed["n"] = 5
    with pytest.raises(ValueError, match="the file says 5"):
        unpack_records(packed)


def test_claim_verdicts_from_known_summaries():
    """The verdict rules on summaries with known values: a share of J_proj's variation must lie near 1 (a
    share of 5 is not "confirmed"); the paper's eigenvalues above N cannot be eigenvalues of Kc; a measure
    no test told from chance is "not shown", not "fails"."""
    from kpca_attention.kpca.claims import judge

    stats = {k: {"mean": 1e-3, "std": 0.0} for k in ("max", "min", "mean", "median")}

    def rows(**summary):
        res = {"model": {"name": "m"}, "summary": summary, "eigen_stats": {"standardized": stats}}
        return {r["claim"]: r["verdict"] for r in judge(res)["rows"]}

    def share(ci):
        got = rows(j_proj_share_h={"share": sum(ci) / 2, "ci": ci, "n": 10})
        return next(v for k, v in got.items() if "variation of ||h||^2, paper" in k)

    assert share([0.95, 1.05]) == "confirmed"
    assert share([5.0, 5.0]) == "not confirmed" and share([0.2, 0.5]) == "not confirmed"
    assert share([0.85, 1.2]) == "undecided"
    p5 = next(v for k, v in rows(mean_tokens=197.0).items() if k.startswith("P5/C3"))
    assert p5.startswith("not comparable")  # 648.46 > 197 tokens
    undecided = {"n": 16, "alpha": 0.05, "p_above": 0.3, "p_below": 0.7, "null": 0.1, "diff": 0.01,
                 "d_z": 0.1, "verdict": "at chance"}
    got = rows(linear_cka=0.12, chance={"linear_cka": {"perm": undecided}})
    assert got["P4: learned V aligns with Theorem 1's G H A (linear cka)"] == \
        "not shown (not distinguished from chance)"
    # the critique's bounds (optimal cosine 0.32, linear CKA 0.11): at or below is within, above is above
    bound = rows(optimal_cosine=0.1, linear_cka=0.11, kernel_cka=0.5)
    assert bound["C1: optimal cosine <= 0.32 (critique's bound)"] == "within the bound"
    assert bound["C1: linear cka <= 0.11 (critique's bound)"] == "within the bound"
    assert bound["C1: kernel cka <= 0.32 (critique's bound)"] == "above the bound"


def test_undefined_units_are_counted_not_dropped_in_silence():
    """A measure undefined on some (input, head) units (kernel CKA on duplicate tokens) is left out of the
    means, and the summary and the P4 row say on how many."""
    from kpca_attention.kpca.analysis import AnalysisConfig, Analyzer
    from kpca_attention.kpca.capture import AttentionSite
    from kpca_attention.kpca.claims import judge

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    v[0, 1] = 1.0  # head 1: every token's value is the same: no bandwidth for kernel CKA
    site = AttentionSite(name="l0", module=torch.nn.Identity(), kind="timm", num_heads=2, head_dim=4)
    an = Analyzer([site], AnalysisConfig(detail_samples=0, null_samples=0, control_samples=0, optimal=False))
    an.add([{"q": q, "k": k, "v": v}])
    res = {**an.result(), "model": {"name": "m"}}
    assert res["summary"]["undefined_units"].get("kernel_cka") == 1
    row = next(r for r in judge(res)["rows"] if r["claim"].endswith("(kernel cka)"))
    assert "undefined on 1 of 2 (input, head) units" in row["note"]


@contextlib.contextmanager
def counted_analyses():
    """The list of kpca.run.analyze_model calls made inside the block (each still runs)."""
    import kpca_attention.kpca.run as run_mod

    calls: list[int] = []
    real = run_mod.analyze_model
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_mod, "analyze_model", lambda *a, **k: calls.append(1) or real(*a, **k))
        yield calls


def test_claims_resume_reuses_only_analyses_of_the_same_weights_inputs_and_settings(tmp_path):
    """A killed claims run continues with --resume: a stored analysis (and its untrained copy's) is reused
    when the weights, the inputs themselves and the settings are this run's, and computed again otherwise."""
    texts = tmp_path / "t.txt"
    texts.write_text(TEXTS)
    args = ["claims", "all-MiniLM-L6-v2", "--texts", str(texts), "--out", str(tmp_path / "c"),
            "--detail-samples", "0", "--null-samples", "2", "--control-samples", "0", "--no-report",
            "--untrained-baseline"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    table = (tmp_path / "c" / "claims.md").read_text()
    stored = json.loads((tmp_path / "c" / "analysis_all-MiniLM-L6-v2.json").read_text())
    assert set(stored["provenance"]) == {"network", "weights_sha256", "inputs_sha256", "prefixes", "config",
                                         "code_sha256", "torch", "device", "cpu_capability", "kernels"}
    assert stored["provenance"]["device"] == "cpu"
    assert "config_sha256" in stored["provenance"]["network"]  # a Hugging Face model: its config too
    with counted_analyses() as calls:
        again = CliRunner().invoke(app, [*args, "--resume"])
        assert again.exit_code == 0, again.output
        assert calls == [] and again.output.count("reused") == 2  # the model's analysis and its copy's
        assert (tmp_path / "c" / "claims.md").read_text() == table
        # other texts (same count, same description): both analysed again
        texts.write_text(TEXTS.replace("the", "a"))
        other = CliRunner().invoke(app, [*args, "--resume"])
        assert other.exit_code == 0, other.output
        assert len(calls) == 2 and "reused" not in other.output
        assert "stored with other inputs_sha256" in other.output
        # other settings: analysed again
        more = CliRunner().invoke(app, [*[a if a != "2" else "3" for a in args], "--resume"])
        assert more.exit_code == 0 and len(calls) == 4, more.output
        # other code (a commit that changed the package): analysed again, and said
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kpca_cli, "_code_sha256", lambda: "0" * 64)
            newer = CliRunner().invoke(app, [*[a if a != "2" else "3" for a in args], "--resume"])
        assert newer.exit_code == 0 and len(calls) == 6, newer.output
        # said once: the copy's analysis goes with its model's (deleted when the model's is made again)
        assert newer.output.count("stored with other code_sha256") == 1
    mixed = CliRunner().invoke(app, ["claims", "--from-analysis", str(tmp_path / "c"), "--resume"])
    assert mixed.exit_code == 2 and "give one of them" in mixed.output
    # --baseline names a model given here with two or more seeds, checked before any analysis
    bad = CliRunner().invoke(app, [*args, "--baseline", "symvit"])
    assert bad.exit_code == 2 and "valid: none" in bad.output


def test_claims_over_seeds_of_project_runs_resume_and_baseline(tmp_path):
    """Two seeds of a tiny digits run: claims groups them (with each run's own initial weights as the copy);
    --baseline names the group; retraining a run (other weights) makes --resume analyse it and its copy
    again while the other run's analyses are reused."""
    from kpca_attention.train import get_preset, train

    def run(seed: int, lr: float = 1e-3) -> str:
        cfg = get_preset("digits-cpu", output_dir=str(tmp_path / f"m-s{seed}"), epochs=1, train_subset=64,
                         eval_subset=32, batch_size=32, progress=False, num_workers=0, seed=seed, lr=lr,
                         model_kwargs={"depth": 1, "embed_dim": 32})
        return str(train(cfg, overwrite=True).run_dir)

    runs = [run(0), run(1)]
    args = ["claims", *runs, "--dataset", "digits", "--out", str(tmp_path / "c"), "--max-samples", "6",
            "--detail-samples", "0", "--null-samples", "2", "--control-samples", "0", "--no-report",
            "--untrained-baseline", "--threads", "1"]
    first = CliRunner().invoke(app, [*args, "--baseline", "m"])
    assert first.exit_code == 0, first.output
    data = json.loads((tmp_path / "c" / "claims.json").read_text())
    (group,) = data["over_seeds"]
    assert group["label"] == "m" and group["seeds"] == [0, 1] and group["copy_init_seeds"] == [0, 1]
    assert data["over_seeds_baseline"]["baseline"] == "m" and not data["over_seeds_baseline"]["tests"]
    run(1, lr=2e-3)  # seed 1 retrained with other settings: other weights, another recipe
    with counted_analyses() as calls:
        again = CliRunner().invoke(app, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    assert len(calls) == 2 and again.output.count("reused") == 2  # seed 1 and its copy again; seed 0's kept
    assert "over_seeds" not in json.loads((tmp_path / "c" / "claims.json").read_text())  # two recipes now


def test_rejudging_reads_training_logs_only_of_the_run_analysed(tmp_path) -> None:
    """claims --from-analysis looked up a stored model name in the current folder and judged the training
    logs of whatever folder had that name; now only the run with the analysis's dataset, seed and recipe."""
    from run_fixtures import untrained_run

    from kpca_attention.train.checkpoint import read_config, resolve_checkpoint
    from kpca_attention.train.resolve import run_identity

    run = untrained_run(tmp_path / "m", seed=0)
    ident = run_identity(read_config(resolve_checkpoint(run)))
    assert kpca_cli._same_run(run, {"name": str(run), **ident})
    assert not kpca_cli._same_run(run, {"name": str(run), **ident, "train_seed": ident["train_seed"] + 1})
    assert not kpca_cli._same_run(run, {"name": str(run), **ident, "recipe": "0" * 16})
    assert not kpca_cli._same_run(tmp_path / "nothing", {"name": "nothing", **ident})
    (tmp_path / "plain").mkdir()
    assert not kpca_cli._same_run(tmp_path / "plain", {"name": "plain", **ident})


def test_analyze_prints_each_measure_with_its_chance_level() -> None:
    # docs/kpca.md: read these numbers with their chance level; analyze printed linear_cka=0.337 alone, and
    # the value its test compares (the units with a null) is not the all-heads mean
    from kpca_attention.cli.kpca import headline

    test = {"alpha": 0.05, "n": 72, "measured": 0.254, "null": 0.312, "p_above": 0.99, "p_below": 0.001}
    summary = {"num_sequences": 4, "num_heads_analysed": 288, "linear_cka": 0.337, "optimal_cosine": 0.229,
               "chance": {"linear_cka": {"perm": test}, "optimal_cosine": {"rot": {**test, "p_below": 0.4,
                                                                                  "p_above": 0.6}}}}
    lines = headline("m", summary).splitlines()
    # 288 = inputs x layers x heads: (input, layer, head) units, not heads; the tests run over the 72 heads
    assert lines[0] == ("m (4 inputs, 288 (input, layer, head) units; means over all of them, chance tests "
                        "over heads):")
    assert lines[2] == ("  linear_cka = 0.337; on the 72 heads (each averaged over the inputs with a null) "
                        "0.254 against chance 0.312 (tokens permuted): below chance")
    assert lines[1].endswith("(V rotated): not distinguished from chance")  # its verdict's null: V rotated
    assert lines[3] == "  kernel_cka = n/a; no chance level (no null drawn)"


def test_claims_feeds_texts_to_the_text_model_and_the_dataset_to_the_image_model(tmp_path) -> None:
    """MiniLM and an image run judged in one call: --texts goes to MiniLM, --dataset to the image run (it
    was refused, as if --texts were meant for the image model); --texts with no text model, or --dataset
    with no image model, is still one clear line."""
    from kpca_attention.train import get_preset, train

    cfg = get_preset("digits-cpu", output_dir=str(tmp_path / "img"), epochs=1, train_subset=32,
                     eval_subset=16, batch_size=16, progress=False, num_workers=0,
                     model_kwargs={"depth": 1, "embed_dim": 32})
    img = str(train(cfg).run_dir)
    texts = tmp_path / "t.txt"
    texts.write_text(TEXTS)
    args = ["--max-samples", "4", "--detail-samples", "0", "--null-samples", "2", "--control-samples", "0",
            "--no-report", "--threads", "1"]
    r = CliRunner().invoke(app, ["claims", "all-MiniLM-L6-v2", img, "--texts", str(texts), "--dataset",
                                 "digits", "--out", str(tmp_path / "c"), *args])
    assert r.exit_code == 0, r.output
    inputs = [m["inputs"] for m in json.loads((tmp_path / "c" / "claims.json").read_text())["models"]]
    assert any("texts from" in i for i in inputs) and any("digits" in i for i in inputs), inputs
    for given, says in ((["--texts", str(texts)], "--texts is for text models"),
                        (["--dataset", "digits"], "--images / --dataset are for image models")):
        models = [img] if given[0] == "--texts" else ["all-MiniLM-L6-v2"]
        r = CliRunner().invoke(app, ["claims", *models, *given, "--out", str(tmp_path / "d"), *args])
        assert r.exit_code == 2 and says in r.output, r.output


def test_rejudging_a_damaged_folder_is_one_line_naming_the_file(tmp_path) -> None:
    """An analysis or claims.json of the wrong outline (a list, a summary that is a string, nesting deeper
    than Python's parser, a packed column that is not one) was a traceback; now one line naming the file."""
    from run_fixtures import untrained_run

    run = untrained_run(tmp_path / "m")
    made = CliRunner().invoke(app, ["claims", str(run), "--dataset", "digits", "--max-samples", "4",
                                    "--null-samples", "3", "--control-samples", "0", "--detail-samples", "0",
                                    "--no-report", "-o", str(tmp_path / "c")])
    assert made.exit_code == 0, made.output
    stored = json.loads((tmp_path / "c" / "analysis_m.json").read_text())
    records = stored["records"]
    damaged = {"a list": json.dumps([stored]), "a string summary": json.dumps({**stored, "summary": "x"}),
               "deep": "[" * 200000 + "]" * 200000,
               "a packed column": json.dumps({**stored, "records": {**records, "columns": "zz"}})}
    for what, text in damaged.items():
        (tmp_path / "c" / "analysis_m.json").write_text(text)
        res = CliRunner().invoke(app, ["claims", "--from-analysis", str(tmp_path / "c")])
        assert res.exit_code == 2, (what, res.output, res.exception)
        file = tmp_path / "c" / "analysis_m.json"
        says = f"error: {file}: not an analysis this tool wrote (damaged or edited)"
        assert res.output.startswith(says), (what, res.output)
    (tmp_path / "c" / "analysis_m.json").write_text(json.dumps(stored))
    (tmp_path / "c" / "claims.json").write_text("[1, 2]")
    res = CliRunner().invoke(app, ["claims", "--from-analysis", str(tmp_path / "c")])
    assert res.exit_code == 2, res.output
    assert "claims.json is not a claims table this tool wrote" in res.output, res.output


def test_texts_are_read_only_as_far_as_asked_and_huge_lines_refused(tmp_path, monkeypatch) -> None:
    """analyze --texts read and split the whole file (2 GB for a 456 MB file) to keep three lines, and one
    79 MB line made the tokenizer abort the process; now the file is read as far as the texts asked for,
    and a line longer than MAX_TEXT_CHARS is one clear error."""
    from kpca_attention.kpca import load as load_mod

    f = tmp_path / "t.txt"
    f.write_text("one\n\n  two \r\nthree\u2028four\nfive\n")
    assert load_mod.read_texts(f) == ["one", "two", "three", "four", "five"]
    assert load_mod.read_texts(f, 2) == ["one", "two"]
    assert load_mod.read_texts(f, 4) == ["one", "two", "three", "four"]
    monkeypatch.setattr(load_mod, "MAX_TEXT_CHARS", 10)
    f.write_text("short\n" + "x" * 10 + "\r\n" + "y" * 11 + "\nafter\n")
    assert load_mod.read_texts(f, 2) == ["short", "x" * 10]  # not read as far as the long line
    with pytest.raises(ValueError, match=r"line 3 is longer than 10 characters"):
        load_mod.read_texts(f)
    # the file is read only as far as the texts asked for: bytes that are no UTF-8 far below are never decoded
    f.write_bytes("".join(f"line {i}\n" for i in range(20000)).encode() + b"\xff\xfe bad\n")
    assert load_mod.read_texts(f, 3) == ["line 0", "line 1", "line 2"]
    with pytest.raises(UnicodeDecodeError):
        load_mod.read_texts(f)


def test_the_chance_figure_compares_each_measure_with_its_nulls_on_the_same_inputs() -> None:
    """alignment_vs_chance.png drew each layer's measure averaged over every input against nulls averaged over
    the first --null-samples inputs (an optimal cosine 0.294 under a null of 0.311, both 0.311 on the same
    inputs), and only the permutation and Gaussian nulls - not the rotated one the optimal cosine's verdict
    uses. Both now come from the same units, with every null held."""
    from kpca_attention.report.kpca_figures import chance_by_layer

    nan = float("nan")
    # two layers x two inputs, the second input without nulls (beyond --null-samples)
    rec = {"layer": [0, 0, 1, 1], "linear_cka": [0.5, 0.9, 0.3, 0.7],
           "linear_cka_null_perm": [0.1, nan, 0.2, nan], "linear_cka_null_gauss": [0.05, nan, 0.06, nan],
           "linear_cka_null_rot": [0.5, nan, 0.3, nan],
           "optimal_cosine": [0.4, 0.8, 0.2, 0.6], "optimal_cosine_null_perm": [0.4, nan, 0.2, nan],
           "optimal_cosine_null_rot": [0.3, nan, 0.25, nan],
           "optimal_cosine_null_gauss": [0.5, nan, 0.5, nan]}
    chance = {m: {k: {"n": 2} for k in ("perm", "gauss", "rot")} for m in ("linear_cka", "optimal_cosine")}
    series = chance_by_layer({"records": rec, "summary": {"chance": chance}})
    cka, cos = series["linear_cka"], series["optimal_cosine"]
    assert cka["layers"] == [0, 1] and cka["measured"] == [0.5, 0.3]  # the inputs with nulls only
    assert cka["null_perm"] == [0.1, 0.2] and cka["null_rot"] == [0.5, 0.3] and cka["verdict"] == "perm"
    assert cos["measured"] == [0.4, 0.2] and cos["null_rot"] == [0.3, 0.25] and cos["verdict"] == "rot"
    assert "null_perm" not in cos  # its measured value by construction
    assert chance_by_layer({"records": {k: v for k, v in rec.items() if k != "layer"}}) == {}


def test_claims_from_claims_draws_a_stored_table_again_without_its_analyses(tmp_path, copy_committed):
    """results/ does not commit the analyses (over 5 MB), so a committed claims folder could not be drawn
    again with newer plotting or reading notes (kpca-vision's seed plots kept the old legend). --from-claims
    writes claims.md and the plots over seeds from claims.json alone, the tests over seeds computed again."""
    import kpca_attention.kpca.load as load_mod

    folder = copy_committed("kpca-vision", tmp_path / "v")
    stored = json.loads((folder / "claims.json").read_text())
    for f in folder.glob("seeds_*.png"):
        f.unlink()
    (folder / "claims.md").unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load_mod, "load_for_analysis", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
        res = CliRunner().invoke(app, ["claims", "--from-claims", str(folder), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    # the folder drawn from is left as it was; the table and its tests over seeds come out as stored
    assert not (folder / "claims.md").exists()
    assert json.loads((tmp_path / "out" / "claims.json").read_text()) == stored
    table = (tmp_path / "out" / "claims.md").read_text()
    assert "## Over training seeds" in table and "### Against symvit, paired by training seed" in table
    for png in ("seeds_symvit.png", "seeds_rpc_official.png", "seeds_vit.png", "seeds_vs_symvit.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000
    # in place by default
    assert CliRunner().invoke(app, ["claims", "--from-claims", str(folder)]).exit_code == 0
    assert (folder / "claims.md").read_text() == table
    # user errors: one line each, exit 2
    for args, words in ((["--from-claims", str(tmp_path / "none")], "no claims.json"),
                        (["symvit", "--from-claims", str(folder)], "not both"),
                        (["--from-claims", str(folder), "--from-analysis", str(folder)], "not both"),
                        (["--from-claims", str(folder), "--resume"], "give one of them")):
        res = CliRunner().invoke(app, ["claims", *args])
        assert res.exit_code == 2 and words in res.output, (args, res.output)
    bad = dict(stored, models=[{"model": "m", "rows": 3}])
    (folder / "claims.json").write_text(json.dumps(bad))
    res = CliRunner().invoke(app, ["claims", "--from-claims", str(folder)])
    assert res.exit_code == 2 and "damaged or edited" in res.output, res.output
    (folder / "claims.json").write_text(json.dumps(dict(stored, models="three")))
    res = CliRunner().invoke(app, ["claims", "--from-claims", str(folder)])
    assert res.exit_code == 2 and "damaged or edited" in res.output, res.output
