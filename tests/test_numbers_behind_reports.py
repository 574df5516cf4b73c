"""The computations between per-example results and the numbers a report publishes: attack settings and
measured norms, the lab protocol's PGD, corruptions, word swap, the drops, mCE and paired cells of the study
reports, the leaderboard's threats and intervals, the headline's wording, seeded draws, claims and
Elliptical's causal metric. Each test was written against a mutant that no earlier test caught (a second
mutation review, 2026-11-30) and fails on it; each expected value is computed independently (by hand,
numpy/scipy, or the papers' formulas), never by the code under test."""

import math

import numpy as np
import pytest
import torch
from torch import nn


def _linear_model(seed=0, d=12, k=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(d, k)).eval()


# ---------------------------------------------------------------- robustness/attacks.py
def test_default_linf_grid_is_the_papers_1_to_6_over_255():
    from kpca_attention.robustness.attacks import DEFAULT_EPS, NORMS

    for m, norm in NORMS.items():
        if norm == "Linf":
            assert DEFAULT_EPS[m] == tuple(k / 255 for k in (1, 2, 3, 4, 5, 6)), m


def test_noise_is_uniform_in_minus_eps_eps():
    from kpca_attention.robustness.attacks import attack

    model = _linear_model(d=3 * 8 * 8)
    x = torch.full((16, 3, 8, 8), 0.5)
    y = torch.zeros(16, dtype=torch.long)
    d = attack(model, x, y, "noise", 0.1) - x
    assert d.min() < -0.09 and d.max() > 0.09  # both signs reach the edge of the ball
    assert abs(float(d.mean())) < 0.01  # E U(-eps, eps) = 0 (the one-sided mutant: eps/2 = 0.05)


def test_linf_norm_is_the_largest_absolute_change():
    from kpca_attention.robustness.attacks import perturbation_norm

    d = torch.tensor([[-0.3, 0.1, 0.0], [0.2, -0.1, 0.05]])
    assert perturbation_norm(d, "Linf").tolist() == pytest.approx([0.3, 0.2])
    assert perturbation_norm(d, "L1").tolist() == pytest.approx([0.4, 0.35])
    assert perturbation_norm(d, "L2").tolist() == pytest.approx([math.sqrt(0.1), math.sqrt(0.0525)])


def test_sld_default_step_is_2_5_eps_over_steps(monkeypatch):
    import pyautoattack.autopgd_base as apb

    from kpca_attention.robustness.attacks import sparse_l1_descent

    # without the projection one step moves exactly `step` in L1 (the direction is normalised to L1 length 1)
    monkeypatch.setattr(apb, "L1_projection", lambda x, d, eps: torch.zeros_like(d))
    model = _linear_model(d=3 * 8 * 8)
    x = torch.full((2, 3, 8, 8), 0.5)
    y = torch.zeros(2, dtype=torch.long)
    adv = sparse_l1_descent(model, x, y, eps=0.2, steps=1, sparsity=0.9)
    assert (adv - x).abs().flatten(1).sum(1).tolist() == pytest.approx([2.5 * 0.2] * 2, rel=1e-4)


def test_an_linf_budget_of_1_is_refused():
    from kpca_attention.robustness.attacks import check_pixel_budget

    with pytest.raises(ValueError, match="covers the whole range"):
        check_pixel_budget("Linf", 1.0)


def _fixed_attack(delta):
    def fake(model, x, y, method, eps, protocol="pixel", **options):
        return (x + delta[: len(x)]).clamp(0, 1)

    return fake


def test_measured_norms_are_in_the_attacks_norm_and_max_is_the_max(monkeypatch):
    import kpca_attention.robustness.attacks as A

    model = _linear_model(d=3 * 4 * 4)
    x = torch.full((3, 3, 4, 4), 0.5)
    y = torch.zeros(3, dtype=torch.long)
    delta = torch.zeros_like(x)
    delta[0, 0, 0, 0] = 0.1  # L2 0.1
    delta[1, :, 0, 0] = 0.1  # L2 0.1 * sqrt(3)
    delta[2, 0, :2, :2] = -0.2  # L2 0.4, negative
    monkeypatch.setattr(A, "attack", _fixed_attack(delta))
    l2 = [0.1, 0.1 * math.sqrt(3), 0.4]
    _, _, norms = A.attack_logits(
        model, (x, y), "autoattack", 0.5, progress=False, norm="L2", attacks=["apgd-ce"]
    )
    assert norms.tolist() == pytest.approx(l2, rel=1e-5)  # L2, as the threat model, not Linf
    r = A.evaluate_attack(model, (x, y), "autoattack", 0.5, progress=False, norm="L2", attacks=["apgd-ce"])
    assert r["norm"] == "L2"
    assert r["max_norm"] == pytest.approx(0.4, rel=1e-5) and r["mean_norm"] == pytest.approx(
        np.mean(l2), rel=1e-5
    )


def test_pgd_without_random_start_is_deterministic_and_one_step_is_fgsm():
    from kpca_attention.robustness.attacks import attack

    model = _linear_model(d=3 * 8 * 8)
    torch.manual_seed(1)
    x = torch.rand(8, 3, 8, 8) * 0.8 + 0.1
    y = torch.randint(0, 3, (8,))
    eps = 4 / 255
    a1 = attack(model, x, y, "pgd", eps, steps=1, alpha=eps, random_start=False, seed=1)
    a2 = attack(model, x, y, "pgd", eps, steps=1, alpha=eps, random_start=False, seed=2)
    assert torch.equal(a1, a2)
    # one step of size eps from x, projected to the eps-ball: x + eps * sign(grad) = FGSM (Madry et al.)
    assert torch.allclose(a1, attack(model, x, y, "fgsm", eps), atol=1e-6)


# ---------------------------------------------------------------- robustness/protocol.py (lab)
_MEAN, _STD = (0.2, 0.5, 0.7), (0.25, 0.4, 0.1)


def _norm_model(seed=0):
    from kpca_attention.models.normalize import NormalizedModel

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 6 * 6, 16), nn.Tanh(), nn.Linear(16, 5))
    return NormalizedModel(net, _MEAN, _STD).eval()


def test_lab_pgd_step_is_0_15_eps_in_normalised_units():
    from kpca_attention.robustness.protocol import lab_attack

    model = _norm_model()
    x = torch.rand(6, 3, 6, 6, generator=torch.Generator().manual_seed(3))
    eps = 4 / 255
    adv = lab_attack(model, x, "pgd", eps, steps=1, random_start=False)
    dz = (adv - x) / torch.tensor(_STD).view(1, 3, 1, 1)  # back to normalised units
    # cleverhans: one step of eps_iter = 0.15 eps along sign(grad); nonzero gradient coordinates move by it
    moved = dz.abs()[dz.abs() > 1e-9]
    assert moved.numel() > 0 and torch.allclose(moved, torch.full_like(moved, 0.15 * eps), rtol=1e-2)


def test_lab_pgd_starts_at_a_uniform_point_of_the_ball():
    from kpca_attention.robustness.protocol import lab_attack

    model = _norm_model()
    x = torch.rand(6, 3, 6, 6, generator=torch.Generator().manual_seed(3))
    eps = 8 / 255
    torch.manual_seed(0)
    adv = lab_attack(
        model, x, "pgd", eps, steps=1, alpha=1e-8
    )  # a negligible step: what is left is the start
    dz = ((adv - x) / torch.tensor(_STD).view(1, 3, 1, 1)).flatten()
    assert dz.abs().max() <= eps * (1 + 1e-4)
    # U(-eps, eps): mean |dz| = eps / 2 (the mutant without random start: 0)
    assert float(dz.abs().mean()) == pytest.approx(eps / 2, rel=0.15)


# ---------------------------------------------------------------- robustness/corruptions.py
def test_imagenet_c_folder_reads_the_severity_asked(tmp_path):
    from PIL import Image

    from kpca_attention.robustness.corruptions import imagenet_c_folder

    for s in range(1, 6):
        d = tmp_path / "fog" / str(s) / "n01440764"
        d.mkdir(parents=True)
        Image.fromarray(np.full((4, 4, 3), 40 * s, dtype=np.uint8)).save(d / "a.png")
    for s in range(1, 6):
        img, label = imagenet_c_folder(tmp_path, "fog", s)[0]
        assert label == 0 and round(float(img[0, 0, 0]) * 255) == 40 * s


def test_gray_images_come_back_as_pil_luma_of_the_corrupted_rgb():
    from PIL import Image

    from kpca_attention.robustness.corruptions import corrupt

    g = np.random.default_rng(0).integers(0, 256, (32, 32), dtype=np.uint8)
    gray = corrupt(g, "gaussian_noise", 5, seed=3)
    rgb = corrupt(np.repeat(g[:, :, None], 3, axis=2), "gaussian_noise", 5, seed=3)
    # the same seed draws the same noise for the RGB copy; PIL's convert("L") is ITU-R 601-2 luma
    luma = np.asarray(Image.fromarray(rgb).convert("L")).astype(int)
    assert np.abs(gray.astype(int) - luma).max() <= 1


def test_small_images_are_corrupted_as_the_centre_of_their_reflect_padding():
    from imagecorruptions import corrupt as ic

    from kpca_attention.robustness.corruptions import corrupt

    img = np.tile(np.linspace(0, 255, 28).astype(np.uint8)[None, :, None], (28, 1, 3))
    img[:, :, 1] = img[:, :, 1].T  # vary along both axes
    out = corrupt(img, "contrast", 3, seed=0)  # contrast draws no random numbers
    padded = np.pad(img, ((2, 2), (2, 2), (0, 0)), mode="reflect")  # 28 -> 32, 2 px each side
    want = np.asarray(ic(padded, severity=3, corruption_name="contrast"), dtype=np.uint8)[2:30, 2:30]
    assert np.array_equal(out, want)


def test_tensor_to_uint8_rounds():
    from kpca_attention.robustness.corruptions import tensor_to_uint8

    t = torch.tensor([0.999, 0.5, 1 / 255 * 0.6]).view(3, 1, 1)
    # 254.745 -> 255, 127.5 -> 128 (round half to even: 128), 0.6 -> 1
    assert tensor_to_uint8(t).reshape(-1).tolist() == [255, 128, 1]


# ---------------------------------------------------------------- robustness/wordswap.py
def test_stopwords_are_spared_whatever_their_case():
    from kpca_attention.robustness.wordswap import swap_words

    out, st = swap_words("The cat And THE dog Of", rate=1.0, seed=0)
    assert st["n_candidates"] == 2 and out == "The AAA And THE AAA Of"


def test_the_number_swapped_is_rounded_not_floored():
    from kpca_attention.robustness.wordswap import swap_words

    text = " ".join(f"w{i}" for i in range(100))
    assert swap_words(text, rate=0.017, seed=0)[1]["n_swapped"] == 2  # round(1.7) = 2
    assert swap_words(text, rate=0.013, seed=0)[1]["n_swapped"] == 1  # round(1.3) = 1


def test_wordswap_perplexity_swaps_with_the_seed_given(monkeypatch):
    import kpca_attention.models.lm as lm
    from kpca_attention.robustness.wordswap import swap_words, wordswap_perplexity

    seen = []
    monkeypatch.setattr(lm, "perplexity", lambda model, ids, **kw: float(len(ids)))
    text = " ".join(f"w{i}" for i in range(200))

    def encode(t):
        seen.append(t)
        return torch.arange(len(t.split()))

    wordswap_perplexity(nn.Identity(), encode, text, context=4, rate=0.05, seed=7, progress=False)
    assert seen[1] == swap_words(text, rate=0.05, seed=7)[0]
    assert seen[1] != swap_words(text, rate=0.05, seed=0)[0]


def test_wordswap_perplexity_default_rate_is_the_papers_1_5_percent():
    import inspect

    from kpca_attention.robustness.wordswap import swap_words, wordswap_perplexity

    for f in (swap_words, wordswap_perplexity):
        assert inspect.signature(f).parameters["rate"].default == 0.015


# ---------------------------------------------------------------- tasks/classification/report.py
def _r(bits):
    from kpca_attention.robustness.store_format import encode_bits

    return {
        "correct": encode_bits(np.asarray(bits, dtype=bool)),
        "top1": float(np.mean(bits)),
        "n": len(bits),
    }


def _run():
    # 8 clean images (the first 4 also the corrupted subset), 2 views; an attacked draw of 6 images,
    # fgsm on its first 4
    return {
        "run": {},
        "clean": _r([1, 1, 1, 1, 0, 0, 0, 1]),
        "clean_corrupt_subset": _r([1, 1, 1, 0]),
        "corruptions": {"fog": {"1": _r([1, 0, 1, 0]), "2": _r([0, 0, 1, 0])}},
        "clean_attack_subset": _r([1, 1, 0, 1, 0, 0]),
        "attacks": {"fgsm": {"2": _r([0, 1, 0, 0])}},
    }


def test_drops_are_clean_of_the_same_images_minus_attacked():
    from kpca_attention.tasks.classification.report import run_metrics

    m = run_metrics(_run())
    # corrupted: mean of the 8 view bits = 3/8; clean of those 4 images: 3/4 -> drop +3/8
    assert m["corrupted"] == pytest.approx(3 / 8) and m["drop:corrupted"] == pytest.approx(3 / 4 - 3 / 8)
    # fgsm on the first 4 attacked-draw images: clean 3/4 (bits 1,1,0,1), attacked 1/4 -> drop +1/2
    # (the clean set's first 4 are 4/4, the whole attacked draw 3/6: both give other numbers)
    assert m["fgsm@2"] == pytest.approx(1 / 4) and m["drop:fgsm@2"] == pytest.approx(1 / 2)


def test_mce_and_relative_mce_of_a_run_against_its_baseline():
    from kpca_attention.tasks.classification.report import _mce

    def run(acc5, clean, snow):
        return {
            "corruptions": {
                "fog": {str(s): {"top1": a} for s, a in enumerate(acc5, 1)},
                "snow": {str(s): {"top1": a} for s, a in enumerate(snow, 1)},
            },
            "clean_corrupt_subset": {"top1": clean},
        }

    r = run([0.9, 0.8, 0.7, 0.6, 0.5], 0.95, [0.5, 0.5])
    b = run([0.8, 0.7, 0.6, 0.5, 0.4], 0.90, [0.9, 0.9])
    mce, rel = _mce(r, b)
    # Hendrycks & Dietterich: CE = sum_s E / sum_s E_base = 1.5 / 2.0;
    # relative: (1.5 - 5 * 0.05) / (2.0 - 5 * 0.1)
    # snow has two severities only and is left out (it would give CE 1.0 / 0.2 = 500 %)
    assert mce == pytest.approx(75.0) and rel == pytest.approx(100 * 1.25 / 1.5)


# ---------------------------------------------------------------- studies/leaderboard.py
def _lb_items():
    return {
        "attacks/clean": _r([1, 1, 1, 1, 1, 0]),
        "attacks/fgsm/2": {**_r([1, 0, 1, 1]), "norm": "Linf"},
        "attacks/pgd/2": {**_r([1, 1, 0, 1]), "norm": "Linf"},
        "attacks/noise/2": {**_r([0, 0, 0, 0]), "norm": "Linf"},
        "corruptions/clean": _r([1, 1, 1]),
        "corruptions/fog/1": _r([1, 0, 1]),
        "corruptions/fog/3": _r([0, 0, 1]),
    }


def test_threats_are_the_worst_case_over_attacks_on_the_same_images():
    from kpca_attention.studies.leaderboard import _threats

    settings = {
        "suites": {
            "attacks": [
                {"method": "fgsm", "eps": [2 / 255]},
                {"method": "pgd", "eps": [2 / 255]},
                {"method": "noise", "eps": [2 / 255]},
            ]
        }
    }
    th = _threats(settings, _lb_items())
    (att,) = [v for k, v in th.items() if k[0] == "Linf"]
    # an image counts as robust only if every attack left it correct; noise is not an attack
    assert att["robust"].tolist() == [True, False, False, True] and att["attacks"] == ["fgsm", "pgd"]
    assert att["clean"].tolist() == [True] * 4  # the first 4 of the attacked draw
    (cor,) = [v for k, v in th.items() if k[0] == "corruptions"]
    assert cor["robust"].tolist() == pytest.approx([0.5, 0.0, 1.0])  # mean over the views per image


def test_interval_is_a_95_t_interval_of_the_robust_accuracy():
    from scipy import stats

    from kpca_attention.studies.leaderboard import _interval

    x = [0.50, 0.54, 0.47, 0.52]
    lo, hi, how = _interval(x, None)
    half = stats.t.ppf(0.975, 3) * np.std(x, ddof=1) / 2
    assert (lo, hi) == pytest.approx((np.mean(x) - half, np.mean(x) + half)) and how == "t, 4 seeds"


# ---------------------------------------------------------------- studies/headline.py, studies/cells.py
def test_clip_interval_orders_its_ends():
    from kpca_attention.studies.headline import clip_interval

    assert clip_interval(2.0, -1.0, edge=5.0) == (-1.0, 2.0)
    assert clip_interval(-9.0, 7.0, edge=5.0) == (-5.0, 5.0)


def test_an_equivalent_interval_below_zero_is_said_to_be_below():
    from kpca_attention.studies.headline import _inside_margin_but_not_zero

    cell = {"word": "equivalent", "ci": [-0.5, -0.1], "p_raw": 0.01, "p_holm": 0.03}
    assert "lies below 0" in _inside_margin_but_not_zero(cell)
    assert "lies above 0" in _inside_margin_but_not_zero({**cell, "ci": [0.1, 0.5]})
    assert _inside_margin_but_not_zero({**cell, "ci": [0.0, 0.5]}) == ""


def test_plan_says_when_the_interval_lies_outside_the_margin():
    from kpca_attention.studies.headline import _plan

    assert "the 95 % interval lies outside +-1" in _plan(
        {"margin": 1.0, "ci": [1.2, 2.0], "mean": 1.6, "seeds_to_detect": 3}
    )
    assert "the 95 % interval lies outside +-1" in _plan(
        {"margin": 1.0, "ci": [-2.0, -1.2], "mean": -1.6, "seeds_to_detect": 3}
    )


def test_cell_text_shows_the_interval_low_then_high():
    from kpca_attention.studies.cells import _cell_text

    assert (
        _cell_text({"mean": 0.5, "ci": [-0.1, 1.1], "word": "inconclusive", "n": 3})
        == "+0.50 (-0.10, +1.10) inconclusive"
    )


def test_paired_cells_are_variant_minus_baseline_from_the_bits(quick_demo):
    import json

    from kpca_attention.report.study import load_study_results
    from kpca_attention.robustness.store_format import decode_bits

    out, report = quick_demo
    _, res = load_study_results(out)
    summary = json.loads((out / "summary.json").read_text())
    a, b = res["rpc_symvit"][0], res["symvit"][0]

    def acc(r, path):
        return decode_bits(path(r)["correct"]).mean()

    for key, path in (
        ("clean", lambda r: r["clean"]),
        ("pgd@2", lambda r: r["attacks"]["pgd"]["2"]),
        ("fgsm@2", lambda r: r["attacks"]["fgsm"]["2"]),
    ):
        want = 100 * (acc(a, path) - acc(b, path))
        assert summary["paired"]["rpc_symvit"][key]["seed_mean"] == pytest.approx(want), key

    # the drop table's bracket: (clean of the attacked images - attacked) of the variant minus the baseline's
    def drop(r):
        return (
            decode_bits(r["clean_attack_subset"]["correct"])[:16].mean()
            - decode_bits(r["attacks"]["pgd"]["2"]["correct"]).mean()
        )

    want = 100 * (drop(a) - drop(b))
    text = report.read_text()
    section = text.split("## Robustness as the drop from clean")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("|") and "[" in line)
    assert f"[{want:+.1f}]" in row


# ---------------------------------------------------------------- data/sampling.py, tasks/base.py
def test_seeded_draws_are_the_documented_randperm():
    from kpca_attention.data.sampling import seeded_indices
    from kpca_attention.tasks.base import seeded_sample, validation_split

    perm = torch.randperm(50, generator=torch.Generator().manual_seed(3)).tolist()
    assert seeded_indices(50, 7, 3) == sorted(perm[:7])
    train, val = validation_split(50, 7, seed=3)
    assert val == sorted(perm[:7]) and train == sorted(perm[7:])
    assert not set(train) & set(val) and len(train) + len(val) == 50
    idx = list(range(100, 150))
    assert seeded_sample(idx, 7, seed=3) == [100 + i for i in sorted(perm[:7])]
    assert seeded_sample(idx, 7, seed=4) != seeded_sample(idx, 7, seed=3)


def test_eps_text_writes_l1_and_l2_budgets_as_numbers():
    from kpca_attention.tasks.classification.suites import eps_label, eps_text

    assert eps_text("Linf", eps_label(4 / 255)) == "4/255"
    assert eps_text("L2", eps_label(0.5)) == "0.5"
    assert eps_text("L1", eps_label(4.0)) == "4"


def test_an_attack_on_fewer_images_takes_the_first_of_the_draw(tmp_path):
    from torch.utils.data import TensorDataset

    from kpca_attention.robustness.attacks import attack
    from kpca_attention.robustness.store import ResultStore
    from kpca_attention.robustness.store_format import decode_bits
    from kpca_attention.tasks.classification.suites import (
        Attack,
        ImageSuites,
        evaluate_image_suites,
        fixed_subset,
    )

    model = _norm_model()
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(10, 3, 6, 6, generator=g), torch.randint(0, 5, (10,), generator=g)
    data = TensorDataset(x, y)
    suites = ImageSuites(
        clean=8,
        attacks=(Attack("noise", (0.05,), n=8), Attack("pgd", (0.01,), n=4)),
        batch_size=8,
        attack_batch_size=8,
    )
    out = evaluate_image_suites(
        model, data, suites, ResultStore(tmp_path / "m.json"), {"w": 1}, log=lambda m: None, progress=False
    )
    draw = fixed_subset(data, 8, suites.data_seed + 1)  # the attacked draw: seed data_seed + 1
    xs = torch.stack([draw[i][0] for i in range(4)])
    ys = torch.stack([draw[i][1] for i in range(4)])
    adv = attack(model, xs, ys, "pgd", 0.01, seed=0)
    with torch.no_grad():
        want = (model(adv).argmax(1) == ys).numpy()
    got = decode_bits(next(iter(out["attacks"]["pgd"].values()))["correct"]).tolist()
    assert got == want.tolist()
    assert len(set(want.tolist())) == 2  # the draw's 4 images are not all alike (else the order is unseen)
    # SU5: the stored norms are the measured ones: max and mean of the Linf perturbations of the 8 FGSM images
    from kpca_attention.robustness.attacks import perturbation_norm

    x8 = torch.stack([draw[i][0] for i in range(8)])
    y8 = torch.stack([draw[i][1] for i in range(8)])
    nm = perturbation_norm(attack(model, x8, y8, "noise", 0.05, seed=0) - x8, "Linf")
    r = next(iter(out["attacks"]["noise"].values()))
    assert r["max_norm"] == pytest.approx(float(nm.max()), rel=1e-7) and r["mean_norm"] == pytest.approx(
        float(nm.mean()), rel=1e-7
    )
    assert float(nm.max()) > float(nm.mean())


# ------------------------------------------------ tasks/language/report.py, tasks/segmentation/report.py
def _study(factory, tmp_path_factory, name):
    import json

    from kpca_attention.report.study import load_study_results
    from kpca_attention.studies import run_study

    out = tmp_path_factory.mktemp(name)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode(False):
            run_study(factory(), out, progress=False)
    finally:
        torch.set_num_threads(before)
    return load_study_results(out)[1], json.loads((out / "summary.json").read_text())


def test_language_paired_seed_difference_is_variant_minus_baseline(tmp_path_factory):
    from kpca_attention.studies.language import quick_language_study

    res, summary = _study(quick_language_study, tmp_path_factory, "lang")
    base = "symlm"
    for k in ("ppl/test", "wordswap/test"):
        seeds = sorted(set(res["rpc_symlm"]) & set(res[base]))
        want = np.mean([res["rpc_symlm"][s][k]["ppl"] - res[base][s][k]["ppl"] for s in seeds])
        assert summary["paired"]["rpc_symlm"][k]["mean"] == pytest.approx(want, rel=1e-6), k


def test_segmentation_paired_diffs_are_variant_minus_baseline(tmp_path_factory):
    from kpca_attention.studies.segmentation import quick_segmentation_study

    res, summary = _study(quick_segmentation_study, tmp_path_factory, "seg")
    p = summary["paired"]["rpc_symvit"]["clean:miou"]
    want = [
        100 * (res["rpc_symvit"][s]["clean"]["miou"] - res["symvit"][s]["clean"]["miou"]) for s in p["seeds"]
    ]
    assert p["diffs"] == pytest.approx(want, abs=1e-6)


def test_word_swap_increase_is_attacked_minus_clean():
    from kpca_attention.tasks.language.report import lm_metrics
    from kpca_attention.tasks.language.suites import encode_nll

    clean = np.array([2.0, 2.0, 2.0, 2.0])
    att = np.array([2.0, 2.0, 6.0, 3.0])  # entry 2 predicts the swapped token 3
    items = {
        "run": {},
        "ppl/test": {"ppl": math.exp(clean.mean()), **encode_nll(clean)},
        "wordswap/test": {"ppl": math.exp(att.mean()), **encode_nll(att), "swapped": [3]},
    }
    m = lm_metrics(items)
    assert m["swap_increase/test"] == pytest.approx(math.exp(3.25) - math.exp(2.0))
    # without the swapped token's own prediction (entry 2): exp(mean(2, 2, 3))
    assert m["ctx/test"] == pytest.approx(math.exp(7 / 3), rel=1e-3)
    assert m["clean_ctx/test"] == pytest.approx(math.exp(2.0), rel=1e-3)


# ---------------------------------------------------------------- kpca/claims.py
def test_j_proj_falling_over_training_holds(tmp_path):
    from kpca_attention.kpca.claims import _training_rows

    cols = ["epoch", "kpca/j_proj", "kpca/h_norm_sq", "kpca_official/j_proj", "kpca_official/h_norm_sq"]
    lines = [",".join(cols)] + [f"{e},{5 - e},{10 + e},{5 - e},{10 + e}" for e in range(4)]
    (tmp_path / "epochs.csv").write_text("\n".join(lines) + "\n")
    rows = _training_rows(tmp_path)
    fall = [r for r in rows if r["threshold"] == "last < first epoch"]
    assert len(fall) == 2 and all(r["verdict"] == "holds" for r in fall)  # 5 -> 2: J_proj fell
    (tmp_path / "epochs.csv").write_text("\n".join([lines[0]] + lines[:0:-1]) + "\n")  # reversed: 2 -> 5
    assert all(
        r["verdict"] == "fails" for r in _training_rows(tmp_path) if r["threshold"] == "last < first epoch"
    )


# ---------------------------------------------------------------- attention/elliptical.py
def test_causal_masked_metric_uses_only_past_tokens():
    from kpca_attention.attention.elliptical import elliptical_metric

    g = torch.Generator().manual_seed(0)
    v, v_prev, q = (torch.randn(1, 2, 5, 4, generator=g) for _ in range(3))
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)  # nothing hidden: only causality matters
    with_mask = elliptical_metric(q, None, v, v_prev, mask, is_causal=True)
    no_mask = elliptical_metric(q, None, v, v_prev, None, is_causal=True)  # running mean over the prefix
    assert torch.allclose(with_mask, no_mask, atol=1e-6)
    # by hand: query 0 sees token 0 only
    m0 = (v - v_prev).abs()[..., :1, :] / 5.0
    assert torch.allclose(with_mask[..., :1, :], m0 / m0.amax(-1, keepdim=True), atol=1e-6)


def test_the_drop_tables_bracket_is_the_variants_drop_minus_the_baselines(tmp_path):
    """The bracket of "Robustness as the drop from clean" is the mean paired difference variant - baseline
    of the drops (the quick demo's drops are both 0, so its report could not tell the sign)."""
    from kpca_attention.tasks.classification.report import ClassificationSections

    sec = ClassificationSections({"suites": {"attacks": []}, "baseline": "sym"}, "images_per_s")
    sec.slugs, sec.base, sec.keys_ = ["sym", "rpc"], "sym", ["pgd@2"]
    sec.label, sec.ex = {"sym": "SymViT", "rpc": "RPC"}, {"sym": {}, "rpc": {}}
    sec.met = {"sym": {0: {"drop:pgd@2": 0.30}, 1: {"drop:pgd@2": 0.20}},
               "rpc": {0: {"drop:pgd@2": 0.25}, 1: {"drop:pgd@2": 0.10}}}
    text = "\n".join(sec.sections_before_trace(tmp_path, {}))
    rpc_row = next(line for line in text.splitlines() if line.startswith("| RPC"))
    assert "[-7.5]" in rpc_row  # ((25 - 30) + (10 - 20)) / 2 points: RPC drops less
