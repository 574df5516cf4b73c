"""``benchmark``: RobustBench-format numbers for any image classifier, the committed test-image lists, the
AutoAttack suite, and the one-line refusals of wrongly wired models."""

from __future__ import annotations

import contextlib
import copy
import json
import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.data.images import build_image_dataset, dataset_info
from kpca_attention.models.normalize import NormalizedModel
from kpca_attention.robustness.image_ids import (
    ID_LISTS,
    IDS_SEED,
    draw_image_ids,
    image_ids_sha256,
    load_image_ids,
)
from kpca_attention.robustness.store import ResultStore
from kpca_attention.studies.benchmark import benchmark, check_model, parse_eps, wilson_interval
from kpca_attention.tasks.classification.suites import (
    AutoAttackSuite,
    ImageSuites,
    evaluate_autoattack,
    evaluate_image_suites,
)

torch.set_num_threads(1)
INFO = dataset_info("digits")
QUIET = {"log": lambda m: None}


@contextlib.contextmanager
def root_log_messages():
    """The messages of every record that reaches the root logger's handlers inside the block."""
    shown: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: shown.append(record.getMessage())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield shown
    finally:
        root.removeHandler(handler)


@pytest.fixture(scope="module")
def digits():
    tr = build_image_dataset("digits", "train")
    x = torch.stack([tr[i][0] for i in range(len(tr))])
    y = torch.tensor([tr[i][1] for i in range(len(tr))])
    return x, y


@pytest.fixture(scope="module")
def net(digits):
    """An MLP trained on normalised digits (what a model without normalisation inside looks like)."""
    x, y = digits
    m, s = torch.tensor(INFO.mean).view(1, -1, 1, 1), torch.tensor(INFO.std).view(1, -1, 1, 1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    for _ in range(120):
        loss = F.cross_entropy(net((x - m) / s), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


def test_the_committed_lists_are_the_documented_draw():
    for dataset, (size, count) in ID_LISTS.items():
        ids = load_image_ids(dataset)
        assert ids == draw_image_ids(size, count, IDS_SEED), dataset
        assert len(set(ids)) == count and 0 <= min(ids) and max(ids) < size
    assert load_image_ids("fashion_mnist", 3) == load_image_ids("fashion-mnist")[:3]
    with pytest.raises(ValueError, match="no committed test-image list"):
        load_image_ids("imagenet")
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 360\]"):
        load_image_ids("digits", 361)


def test_eps_and_intervals():
    assert parse_eps("4/255") == (pytest.approx(4 / 255), "4/255")
    assert parse_eps(8 / 255) == (pytest.approx(8 / 255), "8/255")
    assert parse_eps(0.5) == (0.5, "0.5")
    # one text per budget however it was typed (RobustBench's k/255 for Linf), and never one for two
    assert parse_eps("16/510")[1] == parse_eps(" 8/255")[1] == parse_eps(8 / 255)[1] == "8/255"
    assert parse_eps("0.50", "L2") == parse_eps("1/2", "L2") == (0.5, "0.5")
    assert parse_eps(1.0, "L2") == (1.0, "1.0") and parse_eps(0.2, "L2")[1] == "0.2"  # not 51/255 for L2
    assert parse_eps("0.0313725")[1] == "0.0313725" != parse_eps("8/255")[1]  # another budget
    assert parse_eps(0.03137254)[1] != parse_eps(0.0313725)[1]  # "%g" gave both "0.0313725"
    for bad in ("four", "-1/255", "0", True, "1e309"):  # 1e309: no float (an OverflowError before)
        with pytest.raises(ValueError, match="eps"):
            parse_eps(bad)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and lo == pytest.approx(0.8389, abs=1e-4)  # z^2 / (n + z^2) with z = 1.96
    lo, hi = wilson_interval(50, 100)
    assert (lo, hi) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))


def test_benchmark_linf_writes_a_robustbench_json_and_reuses_its_items(net, tmp_path):
    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    rec = benchmark(good, dataset="digits", n=6, eps="64/255", out=tmp_path, name="mlp", **QUIET)
    path = tmp_path / "digits" / "Linf" / "64_255" / "mlp.json"
    on_disk = json.loads(path.read_text())
    assert on_disk == json.loads(json.dumps(rec))
    for field in ("name", "clean_acc", "autoattack_acc", "eps", "threat_model", "dataset", "reported"):
        assert field in rec
    assert (rec["eps"], rec["threat_model"], rec["protocol"]) == ("64/255", "Linf", "pixel")
    # RobustBench's fields: "reported" is a paper's robust accuracy as a string (none here: ""), the note on
    # how far the record lines up with RobustBench's leaderboard is its "footnote"
    assert rec["reported"] == "" and "not a RobustBench threat model (digits, Linf)" in rec["footnote"]
    assert rec["image_ids_sha256"] == image_ids_sha256("digits") and rec["n"] == 6
    assert float(rec["autoattack_acc"]) <= float(rec["clean_acc"])
    lo, hi = rec["clean_acc_interval"]
    assert lo <= float(rec["clean_acc"]) <= hi
    assert rec["checks"]["top1_given"] > 80  # the known batch: a trained model
    assert rec["checks"]["images"] == 200  # the checks say on how many images they were measured
    assert rec["flags"] == []  # Square broke nothing the gradient attacks left
    store = ResultStore(tmp_path / "results" / "mlp.json")
    items = store.items()
    assert set(items) == {"autoattack/clean", "autoattack/standard-Linf/64",
                          "autoattack/standard-Linf/64/images-0-6"}  # one chunk (batch size >= 6)
    assert len(items["autoattack/standard-Linf/64"]["correct"]) == 6
    again = benchmark(good, dataset="digits", n=6, eps=64 / 255, out=tmp_path, name="mlp", **QUIET)
    assert again["autoattack_acc"] == rec["autoattack_acc"]
    # another model under the same name replaced these results without a word: refused, nothing changed
    other = copy.deepcopy(good)
    with torch.no_grad():
        next(other.parameters()).add_(0.01)
    before = (tmp_path / "results" / "mlp.json").read_bytes()
    with pytest.raises(ValueError, match="holds the results of another model named 'mlp'"):
        benchmark(other, dataset="digits", n=6, eps="64/255", out=tmp_path, name="mlp", **QUIET)
    assert (tmp_path / "results" / "mlp.json").read_bytes() == before
    # the same model under the same name, evaluated otherwise, would replace this benchmark's results (its
    # JSON then no longer matching them): refused, naming what it would replace
    for kw, says in (({"n": 4}, "AutoAttack on 6 images, this one is on 4"),
                     ({"adaptive": True}, "holds a plain \\(not adaptive\\) AutoAttack standard at 64/255"),
                     ({"version": "rand"}, "holds AutoAttack standard, this one is rand")):
        with pytest.raises(ValueError, match=says) as e:
            benchmark(good, dataset="digits", **{"n": 6, **kw}, eps="64/255", out=tmp_path, name="mlp",
                      **QUIET)
        assert "give --name another name" in str(e.value) and "\n" not in str(e.value)
        assert (tmp_path / "results" / "mlp.json").read_bytes() == before
    benchmark(good, dataset="digits", n=4, eps="64/255", out=tmp_path, name="mlp-n4", **QUIET)  # its own name


def test_benchmark_corruptions(net, tmp_path):
    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    rec = benchmark(good, dataset="digits", threat_model="corruptions", n=2, out=tmp_path, name="mlp",
                    **QUIET)
    assert rec["eps"] is None and rec["corruptions_mce"] is None  # mCE is AlexNet's, ImageNet only
    assert "protocol" not in rec  # pixel or lab units scale an attack's budget; a corruption has none
    assert 0 <= float(rec["corruptions_acc"]) <= 100
    assert (tmp_path / "digits" / "corruptions" / "mlp.json").exists()
    items = ResultStore(tmp_path / "results" / "mlp.json")._items
    assert len(items) == 1 + 15 * 5  # clean and 15 corruptions x 5 severities
    # the images are the committed list's first n: an item made on another list is not reused
    assert all(v["key"]["ids_sha256"] == image_ids_sha256("digits") for v in items.values())


def test_wrong_models_are_refused_with_one_line(net, digits):
    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    cases = [
        (net, "expects normalised inputs but gets images in [0, 1]"),  # normalisation missing
        (NormalizedModel(good, INFO.mean, INFO.std).eval(), "normalises its inputs twice"),
    ]
    for model, says in cases:
        with pytest.raises(ValueError) as e:
            benchmark(model, dataset="digits", n=4, **QUIET)
        assert says in str(e.value) and "\n" not in str(e.value)
    good.train()
    with pytest.raises(ValueError, match="training mode"):
        benchmark(good, dataset="digits", n=4, **QUIET)
    good.eval()

    class Noisy(nn.Module):
        def forward(self, x):
            return good(F.dropout(x, 0.1, training=True))

    with pytest.raises(ValueError, match="randomised .* use version 'rand'"):
        benchmark(Noisy().eval(), dataset="digits", n=4, **QUIET)
    # budgets refused before the model is used: an Linf budget of 8 (meant 8/255), one for corruptions
    with pytest.raises(ValueError, match="pixel units.*write 8/255"):
        benchmark(good, dataset="digits", n=4, eps="8", **QUIET)
    with pytest.raises(ValueError, match="covers the whole range$"):  # 255/255: no "write 1/255" advice
        benchmark(good, dataset="digits", n=4, eps="255/255", **QUIET)
    with pytest.raises(ValueError, match="corruptions take none"):
        benchmark(good, dataset="digits", n=4, threat_model="corruptions", eps="8/255", **QUIET)


def test_check_model_sees_hidden_double_normalisation_and_normalised_inputs(net, digits):
    x, y = digits[0][:200], digits[1][:200]
    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    acc = check_model(good, x, y, INFO.mean, INFO.std)
    assert acc["given"] > 0.9

    class Twice(nn.Module):  # a second normalisation written as arithmetic: no module shows it
        def forward(self, x):
            return good((x - 0.9) / 0.05)  # statistics strong enough to cost this MLP accuracy

    with pytest.raises(ValueError, match="normalises its inputs twice .* one normalisation undone"):
        check_model(Twice().eval(), x, y, (0.9,), (0.05,))
    with pytest.raises(ValueError, match=r"inputs must be images in \[0, 1\]"):
        check_model(good, (x - 0.3) / 0.37, y, INFO.mean, INFO.std)


def _timm_weights(tmp_path):
    import timm

    import kpca_attention.models  # noqa: F401  (registers the *_mini_* names in timm)

    torch.manual_seed(0)
    vit = timm.create_model("vit_mini_patch4_28")
    path = tmp_path / "my_vit.pth"
    torch.save(vit.state_dict(), path)
    return f"vit_mini_patch4_28@{path}"


def test_benchmark_a_users_timm_vit_from_a_weights_file(tmp_path):
    spec = _timm_weights(tmp_path)
    rec = benchmark(spec, dataset="digits", n=4, eps="16/255", out=tmp_path / "bm", **QUIET)
    assert rec["name"] == "vit_mini_patch4_28" and rec["architecture"] == "vit_mini_patch4_28"
    assert (tmp_path / "bm" / "digits" / "Linf" / "16_255" / "vit_mini_patch4_28.json").exists()
    with pytest.raises(ValueError, match="give the dataset"):
        benchmark(spec, n=4, **QUIET)


def test_cli_benchmark_and_its_errors(tmp_path):
    spec = _timm_weights(tmp_path)
    res = CliRunner().invoke(app, ["benchmark", spec, "--dataset", "digits", "--n", "3", "--eps", "16/255",
                                   "--device", "cpu", "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "clean accuracy" in res.output and "robust accuracy" in res.output
    for argv, says in ((["--threat-model", "Linf2"], "unknown threat model"),
                       (["--version", "plus"], "unknown AutoAttack version"),
                       (["--eps", "four"], "eps must be"),
                       (["--n", "400"], "n must be an integer in [1, 360]")):
        res = CliRunner().invoke(app, ["benchmark", spec, "--dataset", "digits", *argv,
                                       "-o", str(tmp_path / "o")])
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and says in lines[0], res.output


def test_autoattack_suite_items_carry_the_list_and_protocol(net, tmp_path):
    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    test_set = build_image_dataset("digits", "test")
    store = ResultStore(tmp_path / "m.json")
    suites = ImageSuites(clean=10, autoattack=AutoAttackSuite(eps=(64 / 255,), n=4, seeds=(0,)))
    assert suites.to_dict()["autoattack"]["version"] == "standard"
    out = evaluate_image_suites(good, test_set, suites, store, {"w": 1}, seed=1, dataset="digits", **QUIET,
                                progress=False)
    assert "autoattack" not in out  # seed 1 is not attacked
    out = evaluate_image_suites(good, test_set, suites, store, {"w": 1}, seed=0, dataset="digits", **QUIET,
                                progress=False)
    r = out["autoattack"]["standard-Linf"]["64"]
    assert r["n"] == 4 and r["protocol"] == "pixel" and r["max_norm"] <= 64 / 255 + 1e-6
    key = store._items["autoattack/standard-Linf/64"]["key"]
    assert key["ids_sha256"] == image_ids_sha256("digits") and key["protocol"] == "pixel"
    assert key["version"] == "standard" and key["n"] == 4
    assert "batch" not in key  # the default attack batch (100): the key every item stored so far has
    # in batches of 2 (each one seeded AutoAttack run): another item, named by its batch size
    out = evaluate_image_suites(good, test_set, ImageSuites(clean=10, autoattack=suites.autoattack,
                                                            attack_batch_size=2), store, {"w": 1}, seed=0,
                                dataset="digits", **QUIET, progress=False)
    assert store._items["autoattack/standard-Linf/64"]["key"]["batch"] == 2


def test_autoattack_resumes_at_its_first_missing_chunk(net, tmp_path, monkeypatch):
    """AutoAttack runs chunk by chunk (each chunk one seeded run), each stored when done: an evaluation
    stopped part-way resumes without redoing a finished chunk and gives the uninterrupted numbers."""
    import kpca_attention.robustness.attacks as attacks

    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    test_set = build_image_dataset("digits", "test")
    suite = AutoAttackSuite(eps=(64 / 255,), n=6, seeds=None)
    whole = ResultStore(tmp_path / "whole.json")
    ref = evaluate_autoattack(good, test_set, suite, whole, {"w": 1}, dataset="digits", batch_size=2, **QUIET)
    assert sorted(whole.items()) == ["autoattack/clean", "autoattack/standard-Linf/64",
                                     *(f"autoattack/standard-Linf/64/images-{a}-{a + 2}" for a in (0, 2, 4))]

    real, calls = attacks.attack_logits, []

    def stops_at_the_third_chunk(model, data, *a, **kw):
        calls.append(len(calls))
        if len(calls) == 3:
            raise KeyboardInterrupt  # the session ends
        return real(model, data, *a, **kw)

    monkeypatch.setattr(attacks, "attack_logits", stops_at_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        evaluate_autoattack(good, test_set, suite, ResultStore(tmp_path / "cut.json"), {"w": 1},
                            dataset="digits", batch_size=2, **QUIET)
    calls.clear()
    again = evaluate_autoattack(good, test_set, suite, ResultStore(tmp_path / "cut.json"), {"w": 1},
                                dataset="digits", batch_size=2, **QUIET)
    assert len(calls) == 1  # only the chunk that was missing
    assert again == ref
    # and the joined chunks equal one call over all images (as the committed results were computed)
    from kpca_attention.robustness.image_ids import load_image_ids
    from kpca_attention.robustness.store import example_result

    xs, ys = zip(*(test_set[i] for i in load_image_ids("digits", 6)), strict=True)
    lg, lb, nm = real(good, (torch.stack(xs), torch.as_tensor(ys)), "autoattack", 64 / 255, batch_size=2,
                      progress=False, seed=0, version="standard", norm="Linf")
    r = ref["autoattack"]["standard-Linf"]["64"]
    assert {k: r[k] for k in ("top1", "top5", "n", "correct")} == example_result(lg, lb)
    assert (r["mean_norm"], r["max_norm"]) == (nm.mean().item(), nm.max().item())


def test_a_model_with_gradient_free_layers_is_benchmarked_only_as_the_user_says(tmp_path, monkeypatch):
    """Elliptical attention computes its metric without gradient: benchmarking it needs --adaptive or
    --no-adaptive (refused with one line otherwise); the choice reaches AutoAttack, its items' keys and the
    JSON."""
    import timm

    import kpca_attention.models  # noqa: F401  (registers the models in timm)
    from kpca_attention.attention import EllipticalAttention
    from kpca_attention.robustness import attacks as A

    torch.manual_seed(0)
    ell = timm.create_model("elliptical_vit_mini_patch4_28", num_classes=10)
    model = NormalizedModel(ell, INFO.mean, INFO.std).eval()
    layers = sum(isinstance(m, EllipticalAttention) for m in model.modules())
    assert layers == 4
    with pytest.raises(ValueError, match=r"without gradient \(.*attn.* and \d+ more layers\): attack through "
                                         r"it with --adaptive, or as computed with --no-adaptive"):
        benchmark(model, dataset="digits", n=3, eps="16/255", **QUIET)
    seen = []

    def fake(net, data, method, eps, **kw):  # what AutoAttack was asked, without the hour it takes
        seen.append(kw.get("adaptive", False))
        x, y = data
        return torch.zeros(len(y), 10), y, torch.zeros(len(y))

    monkeypatch.setattr(A, "attack_logits", fake)
    for adaptive in (True, False):
        rec = benchmark(model, dataset="digits", n=3, eps="16/255", adaptive=adaptive, out=tmp_path,
                        name=f"ell-{adaptive}", **QUIET)
        assert seen.pop() is adaptive and (rec["adaptive"], rec["gradient_free_layers"]) == (adaptive, layers)
        key = ResultStore(tmp_path / "results" / f"ell-{adaptive}.json")._items[
            "autoattack/standard-Linf/16"]["key"]
        assert key.get("adaptive", False) is adaptive
    # a model without such layers needs neither, and records adaptive false
    plain = NormalizedModel(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), INFO.mean, INFO.std).eval()
    rec = benchmark(plain, dataset="digits", n=3, eps="16/255", **QUIET)
    assert (rec["adaptive"], rec["gradient_free_layers"]) == (False, 0)


def test_the_default_budget_and_the_robustbench_note_follow_the_dataset() -> None:
    """CIFAR's RobustBench leaderboards are at Linf 8/255 (4/255 was applied to every dataset), and each
    record says how far it lines up with RobustBench (images, corruptions, threat model)."""
    from kpca_attention.studies.benchmark import DEFAULT_EPS, ROBUSTBENCH_EPS, _robustbench_note

    assert ROBUSTBENCH_EPS[("cifar10", "Linf")] == "8/255" == ROBUSTBENCH_EPS[("cifar100", "Linf")]
    assert ROBUSTBENCH_EPS[("imagenet", "Linf")] == DEFAULT_EPS["Linf"] == "4/255"
    assert "not a RobustBench threat model" in _robustbench_note("fashion-mnist", "Linf", "4/255")
    assert "uses 8/255, this record 4/255" in _robustbench_note("cifar10", "Linf", "4/255")
    assert _robustbench_note("cifar10", "Linf", "8/255").startswith("RobustBench's cifar10 Linf budget")
    assert "not RobustBench's corruptions" in _robustbench_note("cifar10", "corruptions", None)


def test_autoattack_reports_its_robust_accuracy_after_each_attack(net, digits, tmp_path):
    # AutoAttack / RobustBench users read "robust accuracy after APGD-CE: x%" per attack; pyautoattack only
    # logs it: the benchmark reads it (run_autoattack), sums it over the chunks and writes it, and its last
    # number is the robust accuracy the per-image results give; nothing of AutoAttack's verbose log reaches
    # the user's handlers, and the logger and the object are left as they were
    from kpca_attention.robustness.autoattack_log import robust_after_each_attack

    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    with root_log_messages() as shown:
        rec = benchmark(good, dataset="digits", n=20, eps="16/255", out=tmp_path, name="mlp", batch_size=8,
                        **QUIET)
    after = rec["autoattack_robust_after"]
    assert list(after) == ["clean", "apgd-ce", "apgd-t", "fab-t", "square"]
    values = [float(v) for v in after.values()]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]  # attacks broke some images
    assert after["clean"] == rec["clean_acc"] and after["square"] == rec["autoattack_acc"]
    assert not [m for m in shown if "robust accuracy" in m or "initial accuracy" in m]
    aa_logger = logging.getLogger("auto-attack")
    assert aa_logger.level == logging.NOTSET and not aa_logger.filters
    with robust_after_each_attack() as outside:
        pass
    assert outside.counts == {} and outside.images == 0  # only runs inside the block are counted
    chunks = [v for k, v in ResultStore(tmp_path / "results" / "mlp.json").items().items() if "images-" in k]
    assert len(chunks) == 3 and all(c["robust_after"]["clean"] <= 8 for c in chunks)  # 8 + 8 + 4 images


def test_a_run_is_benchmarked_on_its_own_dataset_only(tmp_path):
    """A Fashion-MNIST run benchmarked on digits would be at chance and pass every check (each variant
    of the normalisation check is at chance too): refused with one line before any image is read."""
    from kpca_attention.train import get_preset, train

    run = tmp_path / "run"
    train(get_preset("digits-cpu", model_kwargs={"depth": 1}, max_steps=1, train_subset=32, eval_subset=16,
                     batch_size=16, progress=False, output_dir=str(run)))
    with pytest.raises(ValueError, match=r"trained on digits, not fashion-mnist: .*leave out --dataset") as e:
        benchmark(str(run), dataset="fashion-mnist", n=4, out=tmp_path / "bm", **QUIET)
    assert "\n" not in str(e.value) and not (tmp_path / "bm").exists()


def test_a_rand_benchmark_says_why_its_number_and_autoattacks_log_can_differ(net, tmp_path):
    """--version rand: the file's robust accuracy is one more forward pass of a randomised model, which can
    differ from AutoAttack's own count (a reviewer saw 35.00 against 30.00 in one JSON): the JSON says so."""
    from kpca_attention.studies.benchmark import RAND_NOTE

    good = NormalizedModel(net, INFO.mean, INFO.std).eval()

    class Noisy(nn.Module):
        def forward(self, x):
            return good(F.dropout(x, 0.1, training=True))

    rec = benchmark(Noisy().eval(), dataset="digits", n=4, eps="64/255", version="rand", out=tmp_path,
                    name="noisy", **QUIET)
    assert rec["autoattack_acc_note"] == RAND_NOTE and "autoattack_robust_after" in rec
    plain = benchmark(good, dataset="digits", n=4, eps="64/255", out=tmp_path, name="mlp", **QUIET)
    assert "autoattack_acc_note" not in plain


def test_autoattack_flags_square_breaking_what_the_gradient_attacks_left() -> None:
    """AutoAttack's check_square_sr in the JSON: Square, run last, breaking more than 0.2 % of the images
    every gradient attack left correct (a reviewer's quantised model: 46 % after APGD-CE/APGD-T/FAB-T, 36 %
    after Square) is flagged; within the tolerance, or without Square, nothing is."""
    from kpca_attention.studies.benchmark import autoattack_flags

    after = {"clean": 60, "apgd-ce": 46, "apgd-t": 46, "fab-t": 46, "square": 36}
    (flag,) = autoattack_flags(after, 100)
    assert flag.startswith("white-box >= black-box: Square broke 10.00 % of the images") and "masking" in flag
    assert autoattack_flags({**after, "square": 46}, 100) == []
    assert autoattack_flags({**after, "square": 45}, 1000) == []  # 1 of 1000 = 0.1 %: within 0.2 %
    assert autoattack_flags({**after, "square": 43}, 1000) != []  # 0.3 %
    assert autoattack_flags({"clean": 60, "apgd-ce": 30, "apgd-dlr": 29}, 100) == []  # rand: no Square


def test_a_link_inside_out_does_not_carry_the_json_out(net, tmp_path):
    """A security review linked out/digits to a folder elsewhere: the JSON was written there and the
    command said it wrote out/digits/...; refused now, before any image is attacked."""
    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "digits").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="the benchmark JSON .* would write outside the output folder"):
        benchmark(good, dataset="digits", n=4, eps="64/255", out=tmp_path / "out", name="mlp", **QUIET)
    assert not any((tmp_path / "elsewhere").rglob("*")) and not (tmp_path / "out" / "results").exists()


def test_autoattack_s_repeated_warnings_reach_the_user_once_each() -> None:
    """pyautoattack warns of zero-gradient points for every batch and restart (the robustbench review
    counted 18 lines for one condition): each kind of warning is shown once, then one line says how many
    repeats were left out; progress records are still read, and a warning of another kind still shows."""
    from kpca_attention.robustness.autoattack_log import robust_after_each_attack, run_autoattack

    class FakeAutoAttack:
        verbose, attacks_to_run = False, ["apgd-ce"]

        def run_standard_evaluation(self, x, y, batch_size):
            log = logging.getLogger("auto-attack")
            log.debug("initial accuracy: 50.00%")
            for n in (3, 5, 1):
                log.warning(f"there are {n} points with zero gradient! This might lead to unreliable results")
            log.warning("it seems to be a randomized defense! Please use version=\"rand\".")
            log.debug("robust accuracy after APGD-CE: 25.00%")
            return (x,)

    with root_log_messages() as shown, robust_after_each_attack() as after:
        run_autoattack(FakeAutoAttack(), torch.zeros(4, 1), torch.zeros(4), batch_size=4)
    assert after.counts == {"clean": 2, "apgd-ce": 1} and after.images == 4
    assert [m for m in shown if "zero gradient" in m and "more time" not in m] == [
        "there are 3 points with zero gradient! This might lead to unreliable results"]
    assert sum("randomized defense" in m for m in shown) == 1
    (summary,) = [m for m in shown if "more time" in m]
    assert "'there are 3 points with zero gradient!" in summary
    assert "2 more times in this evaluation" in summary


def test_the_leaderboard_refuses_a_benchmark_json_whose_architecture_was_edited(net, tmp_path):
    """The architecture is in every item's key: a JSON that names another architecture than its sealed
    per-image results (an edit - the numbers were already bound) is refused, the true one is listed."""
    from kpca_attention.studies.leaderboard import leaderboard_rows

    good = NormalizedModel(net, INFO.mean, INFO.std).eval()
    rec = benchmark(good, dataset="digits", n=6, eps="64/255", out=tmp_path / "results" / "benchmark",
                    name="mlp", **QUIET)
    keys = [r["key"] for r in ResultStore(tmp_path / "results" / "benchmark" / "results" / "mlp.json")
            .records().values()]
    assert {k["architecture"] for k in keys} == {"NormalizedModel"} == {rec["architecture"]}
    tables, _ = leaderboard_rows(tmp_path / "results")
    (row,) = tables[("digits", "Linf", "64/255", "pixel", "AutoAttack standard")]
    assert row["model"] == "NormalizedModel"
    path = tmp_path / "results" / "benchmark" / "digits" / "Linf" / "64_255" / "mlp.json"
    path.write_text(json.dumps({**rec, "architecture": "WideResNet-70-16"}))
    with pytest.raises(ValueError, match=r"architecture 'WideResNet-70-16' but its sealed per-image "
                                         r"results .* are of NormalizedModel: the JSON was edited"):
        leaderboard_rows(tmp_path / "results")
