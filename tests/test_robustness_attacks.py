"""Attacks on a tiny model trained on scikit-learn digits: they lower accuracy, respect eps, keep
images in [0, 1], leave the model's modes as they were, and the sweep writes a plot."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from kpca_attention.models.normalize import NormalizedModel
from kpca_attention.robustness import attacks as A
from kpca_attention.robustness.sweep import eps_sweep, plot_eps_sweep

pytestmark = pytest.mark.usefixtures("single_thread_module")


@pytest.fixture(scope="module")
def trained(single_thread_module):
    torch.manual_seed(0)
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    y = torch.tensor(d.target)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))
    model = NormalizedModel(net, [0.3], [0.4])
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(150):  # full batch: about a second
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[:1400]), y[:1400]).backward()
        opt.step()
    model.eval()
    xt, yt = x[1400:1432], y[1400:1432]
    with torch.no_grad():
        clean = (model(xt).argmax(1) == yt).float().mean().item()
    assert clean > 0.9
    return model, xt, yt, clean


FAST = {
    "fgsm": ({}, 0.1),
    "pgd": ({"steps": 10}, 0.1),
    "cw": ({"steps": 30, "c": 5.0, "lr": 0.05}, 1.5),
    "spsa": ({"nb_iter": 5, "nb_sample": 32, "lr": 0.05}, 0.15),
    "noise": ({}, 0.1),
    "sld": ({"steps": 10}, 4.0),
    "square": ({"n_queries": 100}, 0.15),
    "autoattack": ({"attacks": ["apgd-ce"]}, 0.1),  # "standard" takes minutes on 2 busy cores
}


def _acc(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


@pytest.mark.parametrize("method", A.METHODS)
def test_attack_budget_range_mode(trained, method):
    model, xt, yt, clean = trained
    options, eps = FAST[method]
    # a training-mode model with one submodule deliberately in eval mode: both flags must come back
    model.train()
    model.model[3].eval()
    adv = A.attack(model, xt, yt, method, eps, **options)
    assert model.training and model.model[1].training and not model.model[3].training
    model.eval()
    assert adv.shape == xt.shape and adv.dtype == xt.dtype
    assert adv.min() >= 0 and adv.max() <= 1
    norm = A.perturbation_norm(adv - xt, A.NORMS[method])
    assert (norm <= eps * (1 + 1e-4) + 1e-6).all(), norm.max()
    acc = _acc(model, adv, yt)
    if method == "noise":
        assert acc >= clean - 0.2  # random noise is not an attack
    else:
        assert acc < clean, f"{method} did not reduce accuracy ({acc} vs {clean})"


def test_gradient_attacks_are_strong_at_large_eps(trained):
    model, xt, yt, _ = trained
    assert _acc(model, A.attack(model, xt, yt, "pgd", 0.3, steps=10, alpha=0.05), yt) < 0.1
    assert _acc(model, A.attack(model, xt, yt, "sld", 12.0, steps=20), yt) < 0.2


def test_attack_is_seeded_and_leaves_global_rng(trained):
    model, xt, yt, _ = trained
    torch.manual_seed(5)
    state = torch.get_rng_state()
    a = A.attack(model, xt, yt, "pgd", 0.05, steps=3, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, A.attack(model, xt, yt, "pgd", 0.05, steps=3, seed=1))
    assert not torch.equal(a, A.attack(model, xt, yt, "pgd", 0.05, steps=3, seed=2))
    assert torch.equal(A.attack(model, xt, yt, "fgsm", 0.0), xt)


def test_attack_input_errors(trained):
    model, xt, yt, _ = trained
    with pytest.raises(ValueError, match="valid: fgsm, pgd"):
        A.attack(model, xt, yt, "deepfool", 0.1)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        A.attack(model, xt * 2 - 1, yt, "fgsm", 0.1)
    with pytest.raises(ValueError, match="unknown options for fgsm: steps"):
        A.attack(model, xt, yt, "fgsm", 0.1, steps=3)
    with pytest.raises(ValueError, match="eps"):
        A.attack(model, xt, yt, "pgd", -1.0)


def test_autoattack_targets_fit_the_number_of_classes(trained):
    model, *_ = trained
    aa = A.build_autoattack(model, 0.1, n_classes=5)
    assert aa.apgd_targeted.n_target_classes == 4 and aa.fab.n_target_classes == 4
    assert aa.attacks_to_run == ["apgd-ce", "apgd-t", "fab-t", "square"]
    aa = A.build_autoattack(model, 0.1, n_classes=1000)
    assert aa.apgd_targeted.n_target_classes == 9


def test_eps_sweep_and_plot(trained, tmp_path):
    model, xt, yt, clean = trained
    sweep = eps_sweep(model, (xt, yt), "fgsm", [0.05, 0.2], batch_size=16, progress=False)
    assert [r["eps"] for r in sweep] == [0.0, 0.05, 0.2]
    assert sweep[0]["top1"] == pytest.approx(clean) and sweep[0]["max_norm"] == 0
    assert sweep[2]["top1"] < sweep[0]["top1"] and sweep[2]["top5"] >= sweep[2]["top1"]
    assert sweep[1]["max_norm"] == pytest.approx(0.05, abs=1e-6) and sweep[1]["n"] == len(xt)
    path = plot_eps_sweep({"tiny": {"fgsm": sweep}, "tiny again": {"fgsm": sweep}}, tmp_path / "s.png")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_standard_autoattack_runs_end_to_end(trained):
    model, xt, yt, _ = trained
    # at a large eps APGD-CE breaks every point and the later attacks find nothing left to do;
    # this checks the "standard" pipeline (model checks, 10 classes, 9 targets) on a real call
    adv = A.attack(model, xt[:8], yt[:8], "autoattack", 0.3)
    assert _acc(model, adv, yt[:8]) == 0.0
    assert A.perturbation_norm(adv - xt[:8], "Linf").max() <= 0.3 + 1e-6


def test_eps_sweep_plot_tells_twelve_models_apart(tmp_path, monkeypatch):
    # one colour per model wraps after matplotlib's ten (C10 = C0): past ten the marker changes, and each
    # model's top-1 and top-5 lines share its colour and marker (solid filled / dashed hollow)
    import kpca_attention.plotting as plotting

    figs = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, path, **kw: figs.append(fig) or Path(path))
    sweep = [{"eps": e, "top1": 0.9 - e, "top5": 1.0 - e, "max_norm": e, "n": 4} for e in (0.0, 0.1)]
    plot_eps_sweep({f"model {i}": {"fgsm": sweep} for i in range(12)}, tmp_path / "s.png")
    lines = figs[0].axes[0].get_lines()
    styles = [(matplotlib.colors.to_hex(ln.get_color()), ln.get_marker(), ln.get_linestyle()) for ln in lines]
    top1, top5 = styles[0::2], styles[1::2]
    assert len(set(top1)) == 12 and all(ls == "-" for *_, ls in top1)
    assert all(a[:2] == b[:2] and b[2] == "--" for a, b in zip(top1, top5, strict=True))


@pytest.mark.parametrize("opts", [{}, {"version": "plus"}, {"version": "rand"}, {"attacks": ["apgd-ce"]},
                                  {"attacks": ["apgd-ce", "square"], "apgd_restarts": 1},
                                  {"attacks": ["fab", "apgd-t"]}, {"attacks": ["fab-t", "fab"]}])
@pytest.mark.parametrize("n_classes", [10, 4])
def test_attack_settings_say_what_pyautoattack_runs(trained, monkeypatch, opts, n_classes):
    """The words a report prints for AutoAttack are what pyautoattack runs: every attack is caught as it
    starts (its perturb replaced by a recorder that returns the images unchanged, so each one runs on every
    image) and its iterations, restarts, EOT draws, target classes and queries are read off the object
    then - in the order of the run. Covers the restarts pyautoattack changes itself: 5 for a custom list
    such as the studies' ["apgd-ce"] and 1 in "standard", FAB-T's 1 left in place for a FAB after it, and
    the target classes fitted to a model with fewer than ten classes."""
    from pyautoattack.autopgd_base import APGDAttack, APGDAttack_targeted
    from pyautoattack.fab_pt import FABAttack_PT
    from pyautoattack.square import SquareAttack

    def runs(a) -> str:
        return f"{a.n_iter} iterations, {a.n_restarts} restart{'s' * (a.n_restarts != 1)}"

    seen = []
    said_by = {
        APGDAttack: lambda a: f"APGD-{a.loss.upper()} ({runs(a)}"
                              + (f", EOT {a.eot_iter})" if a.eot_iter > 1 else ")"),
        APGDAttack_targeted: lambda a: f"APGD-T ({runs(a)}, {a.n_target_classes} target classes)",
        FABAttack_PT: lambda a: (f"FAB-T ({runs(a)}, {a.n_target_classes} target classes)" if a.targeted
                                 else f"FAB ({runs(a)})"),
        SquareAttack: lambda a: f"Square ({a.n_queries} queries)",
    }
    for cls, words in said_by.items():
        monkeypatch.setattr(cls, "perturb",
                            lambda self, x, y=None, *a, _w=words, **k: seen.append(_w(self)) or x)
    model, xt, yt, _ = trained
    aa = A.build_autoattack(model, 0.1, n_classes, version=opts.get("version", "standard"),
                            attacks=opts.get("attacks"), apgd_restarts=opts.get("apgd_restarts"))
    aa.run_standard_evaluation(xt[:4], yt[:4], batch_size=4)
    said = A.attack_settings("autoattack", opts, n_classes=n_classes)
    version = "custom" if "attacks" in opts else opts.get("version", "standard")
    assert said == f"pyautoattack {version}, Linf: " + ", ".join(seen)
    unsure = A.attack_settings("autoattack", opts)  # the model's classes not given: "up to 9"
    assert unsure == said.replace(f"{min(9, n_classes - 1)} target classes", "up to 9 target classes")
    assert A.attack_settings("pgd") == "20 steps of 0.15 eps, random start"
    square = A.attack_settings("square", {"n_queries": 1000})
    assert square.startswith("1000 queries, p_init 0.8, torchattacks' schedule rescaled")
    import inspect

    import torchattacks  # the words say what runs: torchattacks' Square rescales its schedule by default
    assert inspect.signature(torchattacks.Square).parameters["resc_schedule"].default is True
    with pytest.raises(ValueError, match="apgd_restarts"):
        A.attack_settings("autoattack", {"apgd_restarts": 0})


def test_apgd_restarts_reach_pyautoattack(trained, monkeypatch):
    """``apgd_restarts`` sets how often APGD runs on the points still robust; a custom ["apgd-ce"]
    without it restarts 5 times (pyautoattack's constructor), as the studies' APGD-CE did."""
    from pyautoattack.autopgd_base import APGDAttack

    model, xt, yt, _ = trained
    runs = []
    real = APGDAttack.attack_single_run

    def counted(self, x, y, *a, **k):
        runs.append(len(x))
        return real(self, x, y, *a, **k)

    monkeypatch.setattr(APGDAttack, "attack_single_run", counted)
    eps = 1e-4  # too small to flip a point: every restart runs on every correctly classified image
    for restarts, expected in ((None, 5), (1, 1), (2, 2)):
        runs.clear()
        opts = {"attacks": ["apgd-ce"]} | ({} if restarts is None else {"apgd_restarts": restarts})
        A.attack(model, xt[:4], yt[:4], "autoattack", eps, **opts)
        assert len(runs) == expected


def test_attack_defaults_are_the_table(trained):
    """attack() with no options runs :data:`DEFAULTS` (PGD: torchattacks' PGD, 20 steps of 0.15 eps)."""
    import torchattacks as ta

    model, xt, yt, _ = trained
    eps = 0.1
    torch.manual_seed(0)
    ref = ta.PGD(model, eps=eps, alpha=A.PGD_ALPHA * eps, steps=20, random_start=True)(xt, yt)
    assert torch.equal(A.attack(model, xt, yt, "pgd", eps), ref)
    assert A.DEFAULTS["pgd"] == {"steps": 20, "alpha": None, "random_start": True, "adaptive": False}
    assert A.PGD_ALPHA == 0.15


def test_an_attack_leaves_the_parameter_gradients_as_they_were(trained) -> None:
    """torchattacks' CW calls loss.backward(), which filled every parameter's .grad (a training step run
    after an attack would have taken them up); a gradient the caller had set stays exactly as it was."""
    model, x, y, _ = trained
    model.zero_grad(set_to_none=True)
    A.attack(model, x[:4], y[:4], "cw", 1.0, steps=3)
    assert all(p.grad is None for p in model.parameters())
    p0 = next(model.parameters())
    p0.grad = torch.full_like(p0, 0.5)
    A.attack(model, x[:4], y[:4], "cw", 1.0, steps=3)
    assert torch.equal(p0.grad, torch.full_like(p0, 0.5))
    p0.grad = None
