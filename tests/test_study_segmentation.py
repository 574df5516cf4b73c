"""The segmentation study end to end on the study engine (quick variant: a few steps on 256 scenes), its
suites (per-image pixel counts, reuse), its report (ratio-metric bootstrap, paired statistics) and the
registered full study's settings."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from kpca_attention.data.segmentation import build_segmentation_dataset
from kpca_attention.models import create_model
from kpca_attention.report.study import load_study_results, write_study_report
from kpca_attention.segmentation import CorruptedSegmentation, metrics_from_areas, segmentation_metrics
from kpca_attention.studies import get_study, run_study
from kpca_attention.studies.segmentation import quick_segmentation_study
from kpca_attention.tasks.images import Corruptions
from kpca_attention.tasks.segmentation.report import (
    bootstrap_metric_diff,
    metrics_from_count_sums,
    segmentation_run_counts,
)
from kpca_attention.tasks.segmentation.suites import (
    SegmentationSuites,
    counts_of_item,
    decode_counts,
    encode_counts,
    evaluation_order,
)
from kpca_attention.train import load_model

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("segmentation")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = run_study(quick_segmentation_study(), out, progress=False)
    finally:
        torch.set_num_threads(before)
    return out, report


# ----------------------------------------------------------------------------- end to end

def test_quick_study_results_and_report(quick) -> None:
    out, report = quick
    settings, res = load_study_results(out)
    assert settings["suites"]["kind"] == "segmentation" and sorted(res) == ["rpc_symvit", "symvit"]
    for slug in res:
        assert sorted(res[slug]) == [0, 1]
        r = res[slug][0]
        assert r["clean"]["n"] == 48 and set(r["corruptions"]) == {"gaussian_noise", "contrast"}
        assert set(r["corruptions"]["contrast"]) == {"1", "5"}
        # the training summary reads the segmentation run's epochs.csv (throughput, eval mIoU per epoch)
        assert r["run"]["images_per_s"] > 0 and r["run"]["steps"] == 4
        assert "eval_miou" in r["run"]["epochs"][-1]
        c = segmentation_run_counts(r)
        assert c["clean"].shape == (48, 3, 11) and c["views"][("contrast", 5)].shape == (24, 3, 11)
    assert "trace" in res["rpc_symvit"][0] and "trace" not in res["symvit"][0]
    text = report.read_text()
    assert "Paired differences against Segmenter-SymViT" in text and "t p" in text
    assert f"{100 * np.mean([res['symvit'][s]['clean']['miou'] for s in (0, 1)]):.1f}" in text
    for png in ("metrics.png", "severity.png", "training_curves.png"):
        assert (out / png).stat().st_size > 1000 and f"]({png})" in text
    summary = json.loads((out / "summary.json").read_text())
    paired = summary["paired"]["rpc_symvit"]["corrupted:miou"]
    assert paired["seeds"] == [0, 1] and paired["seed_ci"] is not None and len(paired["boot_ci"]) == 2
    assert "clean:miou" in summary["seed_noise"]


def test_stored_numbers_equal_segmentation_metrics_on_the_same_images(quick) -> None:
    """The suites' numbers are `segmentation_metrics` of the trained model's predictions on the images the
    suites name (the first `clean` of the fixed order; the corrupted views on its first `n`)."""
    out, _ = quick
    _, res = load_study_results(out)
    suites = quick_segmentation_study().suites
    test = build_segmentation_dataset("fashion-mnist-scenes", "test", img_size=32)
    order = evaluation_order(len(test), suites.data_seed)
    for slug in ("symvit", "rpc_symvit"):
        model, _ = load_model(out / "runs" / f"{slug}-s1")
        model.eval()
        r = res[slug][1]
        for data, n, item in ((test, 48, r["clean"]),
                              (CorruptedSegmentation(test, "contrast", 5, seed=0), 24,
                               r["corruptions"]["contrast"]["5"])):
            xs, ys = zip(*(data[i] for i in order[:n]), strict=True)
            with torch.no_grad():
                pred = model(torch.stack(xs)).argmax(1)
            direct = segmentation_metrics(pred, torch.stack(ys), num_classes=11)
            for k in ("miou", "mean_accuracy", "pixel_accuracy"):
                assert item[k] == pytest.approx(direct[k], abs=1e-12), (slug, k)
            # and the stored per-image counts sum to the same metrics
            sums = counts_of_item(item, r["clean"]).sum(0)
            again = metrics_from_count_sums(sums)
            assert float(again["miou"]) == pytest.approx(direct["miou"], abs=1e-12)


def test_results_are_reused_without_checkpoints(quick, tmp_path, capsys) -> None:
    out, _ = quick
    copy = tmp_path / "committed"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("runs"))  # the results only, as committed
    mtimes = {p: p.stat().st_mtime_ns for p in (copy / "results").glob("*.json")}
    capsys.readouterr()
    run_study(quick_segmentation_study(), copy, progress=False)
    said = capsys.readouterr().out
    assert said.count("nothing to train or evaluate") == 4
    assert not (copy / "runs").exists() or not any((copy / "runs").glob("*-s*"))
    assert mtimes == {p: p.stat().st_mtime_ns for p in (copy / "results").glob("*.json")}
    assert write_study_report(copy).read_text() == (out / "report.md").read_text()


def test_changed_evaluation_recomputes_only_the_new_items(quick, tmp_path, capsys) -> None:
    """Results of a study with more corruptions: the stored items are reused, only the new views are
    computed, from the finished checkpoints."""
    out, _ = quick
    fresh = tmp_path / "more"
    shutil.copytree(out / "results", fresh / "results")
    more = quick_segmentation_study().replace(suites=SegmentationSuites(
        clean=48, batch_size=32, corruptions=Corruptions(("gaussian_noise", "contrast", "fog"), (1, 5), 24)))
    with pytest.raises(ValueError, match="other settings"):  # one folder holds one evaluation
        run_study(more, out, progress=False)
    capsys.readouterr()
    run_study(more, fresh, runs=out / "runs", progress=False, only=("symvit",))
    said = capsys.readouterr().out
    assert said.count("not retrained") == 2 and "training segmenter" not in said
    assert said.count("(2 item(s) computed, 6 reused)") == 2
    _, res = load_study_results(fresh)
    assert set(res["symvit"][0]["corruptions"]) == {"gaussian_noise", "contrast", "fog"}


# ----------------------------------------------------------------------------- pieces

def test_counts_round_trip_and_errors() -> None:
    rng = np.random.default_rng(0)
    for top in (200, 60_000, 5_000_000):
        a = rng.integers(0, top, size=(7, 3, 11))
        enc = encode_counts(a)
        assert enc["dtype"] == {200: "uint8", 60_000: "uint16", 5_000_000: "uint32"}[top]
        assert np.array_equal(decode_counts(json.loads(json.dumps(enc))), a)
    with pytest.raises(ValueError, match="non-negative integers"):
        encode_counts(np.array([1, -1]))
    with pytest.raises(ValueError, match="non-negative integers"):
        encode_counts(np.array([0.5]))
    with pytest.raises(ValueError, match="not an encoded counts array"):
        decode_counts({"shape": [2], "dtype": "uint8", "xz_base85": "nonsense"})
    with pytest.raises(ValueError, match="pass the clean item"):
        counts_of_item({"counts": encode_counts(np.zeros((2, 2, 3), dtype=np.int64))})


def test_vectorised_metrics_equal_metrics_from_areas() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        k = 6
        label = rng.integers(0, 50, size=k) * (rng.random(k) < 0.6)  # some classes absent
        pred = rng.integers(0, 50, size=k) * (rng.random(k) < 0.6)
        inter = np.minimum(label, pred) * (rng.random(k) < 0.8)
        ref = metrics_from_areas(inter, pred, label)
        got = metrics_from_count_sums(np.stack([inter, pred, label]))
        for m in ("miou", "mean_accuracy", "pixel_accuracy"):
            if np.isnan(ref[m]):
                assert np.isnan(got[m])
            else:
                assert float(got[m]) == pytest.approx(ref[m], abs=1e-12)


def _counts(rng: np.random.Generator, n: int, k: int, hit: float) -> np.ndarray:
    """Fake per-image counts (n, 3, K): every image 100 px of one class, `hit` of them predicted right."""
    out = np.zeros((n, 3, k), dtype=np.int64)
    cls = rng.integers(0, k, size=n)
    right = (rng.random(n) < hit) * 100
    out[np.arange(n), 2, cls] = 100
    out[np.arange(n), 0, cls] = right
    out[np.arange(n), 1, cls] = right
    out[np.arange(n), 1, (cls + 1) % k] = 100 - right
    return out


def test_bootstrap_metric_diff() -> None:
    rng = np.random.default_rng(2)
    a = [_counts(rng, 200, 4, 0.9)[None] for _ in range(2)]
    same = bootstrap_metric_diff(a, a, rng=0, n_boot=200)
    assert all(v == (0.0, 0.0) for v in same.values())
    b = [_counts(rng, 200, 4, 0.5)[None] for _ in range(2)]
    ci = bootstrap_metric_diff(a, b, rng=0, n_boot=500)
    miou = [float(metrics_from_count_sums(x[0].sum(0))["miou"]) for x in (*a, *b)]
    point = 100 * (np.mean(miou[:2]) - np.mean(miou[2:]))
    assert ci["miou"][0] > 0 and ci["miou"][0] < point < ci["miou"][1]
    with pytest.raises(ValueError, match="one shape"):
        bootstrap_metric_diff(a, [x[:, :100] for x in b])


def test_suites_validation() -> None:
    with pytest.raises(ValueError, match="corruptions.n must be <= clean"):
        SegmentationSuites(clean=10, corruptions=Corruptions(("contrast",), (1,), 20))
    with pytest.raises(ValueError, match="batch size"):
        SegmentationSuites(batch_size=0)
    assert SegmentationSuites().to_dict()["kind"] == "segmentation"
    # a shorter prefix of the fixed order is a subset of a longer one (corrupted images are clean images)
    assert evaluation_order(100, 3)[:10] == evaluation_order(100, 3)[:40][:10]


def test_registered_study_settings() -> None:
    s = get_study("segmentation")
    assert s.seeds == (0, 1, 2) and s.preset == "fmnist-seg-cpu" and s.baseline == "symvit"
    rpc = s.variant("rpc_symvit")
    assert rpc.kwargs == {"decoder": "linear", "rpc_iters": 4, "rpc_lambda": 4.0, "rpc_layers": "first"}
    cfg = s.train_config(rpc, 0, "runs/x")
    assert cfg.task == "segmentation" and cfg.train_subset is None and cfg.epochs == 4
    assert cfg.model_kwargs["decoder"] == "linear"
    assert len(s.suites.corruptions.names) == 15 and s.suites.corruptions.severities == (1, 2, 3, 4, 5)
    assert s.suites.corruptions.n <= s.suites.clean
    for v in s.variants:  # every variant builds as the preset builds it
        create_model(v.model, num_classes=11, in_chans=1, img_size=32, **v.kwargs)
