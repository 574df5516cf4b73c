"""Bad inputs are refused where they enter, before any work, with one line naming the option, the
value and what is valid: attacks, the training configuration, evaluation, datasets, corruptions and
the word-swap attack. The models used here fail the test if they are ever called."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca_attention.checks import check_choice, check_int, check_real
from kpca_attention.data.images import build_image_dataset
from kpca_attention.data.text import Vocab
from kpca_attention.robustness import attacks as A
from kpca_attention.robustness.sweep import eps_sweep
from kpca_attention.train.config import FIELD_CHECKS, PRESETS, TrainConfig, apply_overrides, get_preset
from kpca_attention.train.evaluate import evaluate_checkpoint, evaluate_lm, evaluate_vision


class _MustNotRun(nn.Module):
    """A model whose forward fails the test: validation must happen before any work."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the model ran although the arguments were invalid")


def _images(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 8, 8, generator=g), torch.arange(n) % 3


# ----------------------------------------------------------------------------------------- checks


def test_check_helpers() -> None:
    assert check_int(3, "k", min=1) == 3 and check_int(None, "k", allow_none=True) is None
    assert check_real(2, "x", min=0) == 2.0 and check_real(math.inf, "x", allow_inf=True) == math.inf
    for bad in (True, 1.5, "3", None):
        with pytest.raises(ValueError, match=r"k must be an integer >= 1; got"):
            check_int(bad, "k", min=1)
    with pytest.raises(ValueError, match=r"x must be a finite number in \[0, 1\); got 1"):
        check_real(1, "x", min=0, max=1, max_open=True)
    for bad in (math.nan, math.inf, False, "0.5"):
        with pytest.raises(ValueError, match="x must be a finite number"):
            check_real(bad, "x")
    with pytest.raises(ValueError, match=r"x must be a finite number > 0; got 0"):
        check_real(0, "x", min=0, min_open=True)
    with pytest.raises(ValueError, match="c must be one of a, b; got 'z'"):
        check_choice("z", "c", ("a", "b"))
    with pytest.raises(ValueError, match="must be one of"):
        check_choice([1], "c", {"a"})  # unhashable


# ---------------------------------------------------------------------------------------- attacks

BAD_ATTACK_OPTIONS = [
    ("pgd", 2 / 255, {"steps": -3}, "pgd: steps must be an integer >= 1; got -3"),
    ("pgd", 2 / 255, {"steps": 0}, "pgd: steps must be an integer >= 1; got 0"),
    ("pgd", 2 / 255, {"steps": 2.5}, "pgd: steps must be an integer >= 1; got 2.5"),
    ("pgd", 2 / 255, {"steps": True}, "pgd: steps must be an integer >= 1; got True"),
    ("pgd", 2 / 255, {"alpha": 0.0}, "pgd: alpha must be a finite number > 0; got 0.0"),
    ("pgd", 2 / 255, {"alpha": math.nan}, "pgd: alpha must be a finite number > 0; got nan"),
    ("pgd", 2 / 255, {"random_start": 1}, "pgd: random_start must be True or False; got 1"),
    ("pgd", -1.0, {}, r"pgd: eps must be a finite number >= 0; got -1.0"),
    ("pgd", math.inf, {}, r"pgd: eps must be a finite number >= 0; got inf"),
    ("fgsm", math.nan, {}, r"fgsm: eps must be a finite number >= 0; got nan"),
    ("fgsm", "0.1", {}, r"fgsm: eps must be a finite number >= 0; got '0.1'"),
    ("cw", -0.5, {}, r"cw: eps must be a number \(inf allowed\) >= 0; got -0.5"),
    ("cw", 1.0, {"c": -1}, "cw: c must be a finite number > 0; got -1"),
    ("cw", 1.0, {"kappa": -0.1}, "cw: kappa must be a finite number >= 0; got -0.1"),
    ("cw", 1.0, {"lr": 0}, "cw: lr must be a finite number > 0; got 0"),
    ("spsa", 0.1, {"nb_iter": 0}, "spsa: nb_iter must be an integer >= 1; got 0"),
    ("spsa", 0.1, {"nb_sample": -2}, "spsa: nb_sample must be an integer >= 1; got -2"),
    ("spsa", 0.1, {"max_batch_size": 0}, "spsa: max_batch_size must be an integer >= 1; got 0"),
    ("spsa", 0.1, {"delta": -0.01}, "spsa: delta must be a finite number > 0; got -0.01"),
    ("sld", 2.0, {"sparsity": 1.0}, r"sld: sparsity must be a finite number in \[0, 1\); got 1.0"),
    ("sld", 2.0, {"step_size": -1.0}, "sld: step_size must be a finite number > 0 or None; got -1.0"),
    ("square", 0.1, {"n_queries": 0}, "square: n_queries must be an integer >= 1; got 0"),
    ("square", 0.1, {"p_init": 0}, r"square: p_init must be a finite number in \(0, 1\]; got 0"),
    ("autoattack", 0.1, {"version": "fast"}, "autoattack: version must be one of standard, plus, rand"),
    ("autoattack", 0.1, {"attacks": ["apgd-ce", "pgd"]}, "autoattack: attacks entry must be one of"),
    ("autoattack", 0.1, {"attacks": "apgd-ce"}, "autoattack: attacks must be a non-empty list"),
    ("autoattack", 0.1, {"attacks": ["apgd-ce"], "version": "plus"}, "either version= .* or attacks="),
    ("autoattack", 0.1, {"batch_size": 0}, "batch_size must be an integer >= 1; got 0"),
    ("noise", 0.1, {"seed": -1}, "noise: seed must be an integer in"),
    ("noise", 0.1, {"seed": 1.5}, "noise: seed must be an integer in"),
    ("fgsm", 0.1, {"steps": 3}, "unknown options for fgsm: steps; valid: adaptive, seed"),
    ("deepfool", 0.1, {}, "unknown attack 'deepfool'; valid: fgsm, pgd"),
    # an Linf budget written in grey levels (8 for 8/255) covers the whole [0, 1] range
    ("pgd", 8.0, {}, r"pgd: eps 8: an Linf budget is in pixel units.*write 8/255"),
    ("square", 1.0, {}, r"square: eps 1: an Linf budget is in pixel units"),
    ("autoattack", 4.0, {"norm": "Linf"}, r"autoattack: eps 4: an Linf budget"),
]


def test_pixel_budget_bound_only_for_linf_in_pixels() -> None:
    """L2 and L1 budgets grow with the image (CW at 8, SLD at 12 are budgets), AutoAttack's L2 too, and the
    lab protocol's Linf budget is in normalised units (a range ~4.4 wide): none of them is refused."""
    A.check_attack_options("cw", 8.0, {})
    A.check_attack_options("sld", 12.0, {})
    A.check_attack_options("autoattack", 4.0, {"norm": "L2"})
    A.check_attack_options("pgd", 1.5, {}, protocol="lab")
    A.check_attack_options("pgd", 254 / 255, {})


@pytest.mark.parametrize(("method", "eps", "options", "message"), BAD_ATTACK_OPTIONS)
def test_attack_options_refused_before_any_work(method, eps, options, message) -> None:
    """``attack(model, x, y, "pgd", 2/255, steps=-3)`` used to run only PGD's random start and report
    it as the attack; every option is now checked (the model must not run)."""
    x, y = _images()
    with pytest.raises(ValueError, match=message):
        A.attack(_MustNotRun(), x, y, method, eps, **options)
    with pytest.raises(ValueError, match=message):
        A.evaluate_attack(_MustNotRun(), (x, y), method, eps, progress=False, **options)
    with pytest.raises(ValueError, match=message):
        A.check_attack_options(method, eps, options)


def test_attack_bad_images_and_labels_refused() -> None:
    x, y = _images()
    model = _MustNotRun()
    with pytest.raises(ValueError, match="empty batch"):
        A.attack(model, x[:0], y[:0], "pgd", 0.1)
    nan = x.clone()
    nan[1, 0, 2, 3] = math.nan
    with pytest.raises(ValueError, match=r"1 NaN/inf values \(in 1 of 4 images\)"):
        A.attack(model, nan, y, "fgsm", 0.1)
    with pytest.raises(ValueError, match="labels must be integer class indices"):
        A.attack(model, x, y.float(), "fgsm", 0.1)
    with pytest.raises(ValueError, match="labels must be class indices >= 0"):
        A.attack(model, x, y - 5, "fgsm", 0.1)
    with pytest.raises(ValueError, match="uint8"):
        A.attack(model, (x * 255).to(torch.uint8), y, "fgsm", 0.1)


def test_evaluate_attack_and_sweep_check_everything_first() -> None:
    x, y = _images()
    model = _MustNotRun()
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1; got 0"):
        A.evaluate_attack(model, (x, y), "fgsm", 0.1, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="n must be an integer >= 1 or None; got 0"):
        A.evaluate_attack(model, (x, y), "fgsm", 0.1, n=0, progress=False)
    with pytest.raises(ValueError, match="no examples to attack"):
        A.evaluate_attack(model, (x[:0], y[:0]), "fgsm", 0.1, progress=False)
    # the bad eps is the last of the list: nothing may run before it is refused
    with pytest.raises(ValueError, match="fgsm: eps must be a finite number >= 0; got -0.1"):
        eps_sweep(model, (x, y), "fgsm", [0.1, 0.2, -0.1], progress=False)
    with pytest.raises(ValueError, match="sld: steps"):
        A.sparse_l1_descent(model, x, y, 1.0, steps=0)
    with pytest.raises(ValueError, match="autoattack: version"):
        A.build_autoattack(model, 0.1, 10, version="fast")


# ------------------------------------------------------------------------------- training config

def test_every_config_field_is_checked() -> None:
    assert {f.name for f in dataclasses.fields(TrainConfig)} == set(FIELD_CHECKS)
    for name in PRESETS:  # the presets themselves pass
        get_preset(name)


@pytest.mark.parametrize(("override", "message"), [
    ("epochs=abc", "epochs must be an integer >= 1; got 'abc'"),
    ("epochs=True", "epochs must be an integer >= 1; got True"),
    ("epochs=2.0", "epochs must be an integer >= 1; got 2.0"),
    ("lr=fast", "lr must be a finite number > 0 or None; got 'fast'"),
    ("lr=-1e-3", "lr must be a finite number > 0 or None; got -0.001"),
    ("lr=inf", "lr must be a finite number > 0 or None; got 'inf'"),
    ("train_subset=1.5", "train_subset must be an integer >= 1 or None; got 1.5"),
    ("eval_subset=0", "eval_subset must be an integer >= 1 or None; got 0"),
    ("img_size=0", "img_size must be an integer >= 1 or None; got 0"),
    ("batch_size=0", "batch_size must be an integer >= 1; got 0"),
    ("eval_batch_size=-4", "eval_batch_size must be an integer >= 1; got -4"),
    ("weight_decay=-0.1", "weight_decay must be a finite number >= 0; got -0.1"),
    ("warmup_epochs=-1", "warmup_epochs must be a finite number >= 0; got -1"),
    ("warmup_steps=-5", "warmup_steps must be an integer >= 0 or None; got -5"),
    ("smoothing=1.0", r"smoothing must be a finite number in \[0, 1\); got 1.0"),
    ("mixup=-0.2", "mixup must be a finite number >= 0; got -0.2"),
    ("mixup_prob=1.5", r"mixup_prob must be a finite number in \[0, 1\]; got 1.5"),
    ("drop_path=1", r"drop_path must be a finite number in \[0, 1\); got 1"),
    ("opt_betas=(0.9,)", r"opt_betas must be None or two numbers in \[0, 1\)"),
    ("opt_betas=(0.9,1.5)", r"opt_betas entry must be a finite number in \[0, 1\); got 1.5"),
    ("clip_grad=0", "clip_grad must be a finite number > 0 or None; got 0"),
    ("seed=-1", "seed must be an integer in"),
    ("num_workers=-1", "num_workers must be an integer >= 0; got -1"),
    ("amp=yes", "amp must be True or False or None; got 'yes'"),
    ("device=foo", "device must be one of auto, cpu, cuda; got 'foo'"),
    ("mixup_mode=all", "mixup_mode must be one of batch, pair, elem; got 'all'"),
    ("model_kwargs=3", "model_kwargs must be a dict"),
    ("model=", "model must be a non-empty string; got ''"),
])
def test_config_override_names_the_key(override: str, message: str) -> None:
    """``--set epochs=abc`` / ``lr=fast`` / ``train_subset=1.5`` used to end in TypeErrors that did not
    name the key (or to be accepted: ``epochs=True`` ran 1 epoch)."""
    cfg = get_preset("fmnist-cpu")
    with pytest.raises(ValueError, match=message):
        apply_overrides(cfg, [override])


def test_config_from_dict_checks_types() -> None:
    with pytest.raises(ValueError, match="epochs must be an integer >= 1; got '3'"):
        TrainConfig.from_dict({"epochs": "3"})
    with pytest.raises(ValueError, match="lr must be a finite number > 0 or None; got nan"):
        TrainConfig(lr=math.nan)
    cfg = apply_overrides(get_preset("fmnist-cpu"), ["lr=None", "opt_betas=[0.9,0.95]"])
    assert cfg.lr is None and cfg.opt_betas == (0.9, 0.95)


# ------------------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 0}, "batch_size must be an integer >= 1 or None; got 0"),
    ({"batch_size": 2.5}, "batch_size must be an integer >= 1 or None; got 2.5"),
    ({"device": "foo"}, "device must be one of auto, cpu, cuda; got 'foo'"),
    ({"subset": -1}, "subset must be an integer >= 1 or None; got -1"),
    ({"stride": 0}, "stride must be an integer >= 1; got 0"),
    ({"split": "dev"}, "split must be one of train, val, valid, test; got 'dev'"),
])
def test_evaluate_checkpoint_checks_before_loading(tmp_path, kwargs, message) -> None:
    """``evaluate --batch-size 0`` and ``--device foo`` were accepted silently (0 fell back to the
    config's batch size, foo to the CPU). The path does not exist: the check must come first."""
    with pytest.raises(ValueError, match=message):
        evaluate_checkpoint(str(tmp_path / "missing"), progress=False, **kwargs)


def test_evaluating_nothing_is_an_error() -> None:
    """An empty loader used to report top-1 = 0 (and a loss of 0) over n = 0 examples."""
    empty = DataLoader(TensorDataset(torch.zeros(0, 1, 4, 4), torch.zeros(0, dtype=torch.long)))
    with pytest.raises(ValueError, match="no examples to evaluate"):
        evaluate_vision(_MustNotRun(), empty)
    with pytest.raises(ValueError, match="no tokens to evaluate"):
        evaluate_lm(_MustNotRun(), empty)


# ---------------------------------------------------------------------------------------- datasets


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"img_size": 0}, "img_size must be an integer >= 1 or None; got 0"),
    ({"img_size": 28.5}, "img_size must be an integer >= 1 or None; got 28.5"),
    ({"subset": 1.5}, "subset must be an integer >= 1 or None; got 1.5"),
    ({"subset": 0}, "subset must be an integer >= 1 or None; got 0"),
    ({"subset": 10, "subset_seed": -1}, "subset_seed must be an integer >= 0 or None; got -1"),
])
def test_image_dataset_options(kwargs, message) -> None:
    """``img_size=0`` silently gave the native size; ``subset=1.5`` failed inside torch."""
    with pytest.raises(ValueError, match=message):
        build_image_dataset("digits", "train", **kwargs)


def test_vocab_build_options() -> None:
    with pytest.raises(ValueError, match="min_freq must be an integer >= 1; got 0.5"):
        Vocab.build("a b c", min_freq=0.5)
    with pytest.raises(ValueError, match=r"max_size \(counting the 2 special .* >= 2 or None; got 1"):
        Vocab.build("a b c", max_size=1)


# ------------------------------------------------------------------------- word swap and metrics


def test_wordswap_options() -> None:
    from kpca_attention.robustness.wordswap import swap_words, wordswap_perplexity

    text = "In the beginning God created the heaven and the earth ."
    for bad in (-0.1, 1.5, math.nan, "0.1", True):
        with pytest.raises(ValueError, match=r"rate must be a finite number in \[0, 1\]"):
            swap_words(text, rate=bad)
    with pytest.raises(ValueError, match="seed must be an integer >= 0; got -1"):
        swap_words(text, seed=-1)
    with pytest.raises(ValueError, match="replacement must be one token"):
        swap_words(text, replacement="A A")

    def encode(_: str) -> torch.Tensor:
        raise AssertionError("encoded although the arguments were invalid")

    for kwargs, message in [({"context": 0}, "context must be an integer >= 1; got 0"),
                            ({"context": 8, "stride": 9}, r"stride must be an integer in \[1, 8\]; got 9"),
                            ({"context": 8, "batch_size": 0}, "batch_size must be an integer >= 1; got 0"),
                            ({"context": 8, "max_tokens": 1}, "max_tokens must be an integer >= 2 or None"),
                            ({"context": 8, "rate": 2.0}, "rate must be")]:
        with pytest.raises(ValueError, match=message):
            wordswap_perplexity(_MustNotRun(), encode, text, **kwargs)


def test_metric_inputs() -> None:
    from kpca_attention.robustness.metrics import accuracy_table, corruption_errors, relative_mce

    errors = {"fog": [0.1, 0.2, math.nan, 0.3, 0.4]}
    base = {"fog": [0.5] * 5}
    with pytest.raises(ValueError, match=r"errors are fractions in \[0, 1\]"):  # NaN gave a NaN CE
        corruption_errors(errors, base)
    with pytest.raises(ValueError, match=r"clean_error must be a finite number in \[0, 1\]; got 5"):
        relative_mce({"fog": [0.2] * 5}, 5, base, 0.1)
    with pytest.raises(ValueError, match="digits must be an integer >= 0; got -1"):
        accuracy_table({"m": {"fog": 50.0}}, digits=-1)
