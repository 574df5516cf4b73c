"""Adversarial attacks in pixel space.

Images are in [0, 1] and the model normalises inside (``NormalizedModel``), so every ``eps`` here is
in pixel units (Linf eps = 1/255 is one grey level). The official RPC-Attention code attacked
ImageNet-*normalised* tensors without clipping, so its eps was about 4.4x *smaller* in pixel units
(eps * std, std ~ 0.226: its 1/255 is ~0.23/255 here) and its adversarial images left the valid range;
by default this module does not repeat that (``protocol="lab"`` does, to line numbers up with theirs).

Where the attack exists in a maintained library we call it:

==========  ======  ===============================================================================
method      norm    implementation
==========  ======  ===============================================================================
fgsm        Linf    ``torchattacks.FGSM``
pgd         Linf    ``torchattacks.PGD`` (paper: 20 steps, step 0.15 * eps; its eps 1..6 are /255 of the
                    normalised tensor, ``protocol="lab"``, about a quarter of that in pixels)
cw          L2      ``torchattacks.CW`` (minimum-norm; results beyond the L2 budget ``eps`` are reverted)
spsa        Linf    ``torchattacks.SPSA`` (gradient-free)
square      Linf    ``torchattacks.Square`` (score-based black box; its p schedule rescaled to the query
                    budget, torchattacks' default - AutoAttack's Square, ``autoattack``, keeps the plain one)
autoattack  Linf    ``pyautoattack.AutoAttack`` version "standard" (APGD-CE, APGD-T, FAB-T, Square)
noise       Linf    uniform noise in [-eps, eps] (a baseline, not an attack: three lines, written here)
sld         L1      sparse L1 descent (Tramer & Boneh 2019), written here: neither torchattacks nor
                    pyautoattack has it (torchattacks' EADL1 is the elastic-net attack, a different
                    method); the L1-ball-and-box projection is pyautoattack's ``L1_projection``.
==========  ======  ===============================================================================

The model is put in eval mode for the attack and every submodule's mode is restored afterwards.

``protocol="lab"`` (fgsm, pgd) runs the papers' protocol instead - the attack on the normalised tensor,
eps in normalised units, no clamp - so that numbers can be read next to theirs (:mod:`.protocol`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..attention.adaptive import adaptive_gradients
from ..checks import Bool, Choice, Int, Real, check_choice, check_int, check_real
from ..modules import eval_mode, kept_grads, model_device
from .common import PGD_ALPHA, topk_accuracy

#: AutoAttack's versions and the attacks a custom one may run (pyautoattack's names).
AUTOATTACK_VERSIONS: tuple[str, ...] = ("standard", "plus", "rand")
AUTOATTACK_ATTACKS: tuple[str, ...] = ("apgd-ce", "apgd-dlr", "apgd-t", "fab", "fab-t", "square")
#: the threat models AutoAttack runs here (``norm=`` option; RobustBench's Linf and L2)
AUTOATTACK_NORMS: tuple[str, ...] = ("Linf", "L2")


def _aa_attacks(v: Any, name: str) -> list[str]:
    if isinstance(v, str) or not isinstance(v, Sequence) or not v:
        raise ValueError(f"{name} must be a non-empty list of {', '.join(AUTOATTACK_ATTACKS)}; got {v!r}")
    for a in v:
        check_choice(a, f"{name} entry", AUTOATTACK_ATTACKS)
    return list(v)


@dataclass(frozen=True)
class Method:
    """One attack method's facts, a row of :data:`ATTACK_METHODS`: the norm of its budget, its default eps
    grid for sweeps (pixel units), and its options, each ``name: (check, default)`` - the check raises a
    ValueError naming option, value and range (:mod:`kpca_attention.checks`); the default is what
    :func:`attack` runs and :func:`attack_settings` reports when the option is not given (the paper's where
    it has one; :data:`NO_DEFAULT`: the library decides, e.g. AutoAttack's version)."""

    norm: str
    eps: tuple[float, ...]
    options: Mapping[str, tuple[Callable[[Any, str], Any], Any]]


#: an option left to the library when not given (no default of ours)
NO_DEFAULT: Any = object()

# Default eps grids, in pixel units. Linf: the paper's numerals 1..6 / 255, here in pixels (the paper's are on
# the normalised tensor: protocol="lab"; in pixels ~4.4x the paper's ImageNet budgets). L2 (CW) and L1 (SLD)
# budgets scale with the image size; these are for the 28-32 px demo images and ImageNet users should pass
# their own (e.g. L2 0.25..3, L1 up to 10-20 at 224 px).
_LINF_EPS = tuple(k / 255 for k in range(1, 7))
_STEPS, _POSITIVE, _FLAG = Int(min=1), Real(min=0, min_open=True), Bool()
_ADAPTIVE = (_FLAG, False)

#: every attack method, one row each (:class:`Method`). PGD's ``alpha`` None is ``PGD_ALPHA * eps``; SLD's
#: ``step_size`` None is its own rule (:func:`sparse_l1_descent`); AutoAttack's restarts None are
#: pyautoattack's per version (:data:`AUTOATTACK_APGD_RESTARTS`).
ATTACK_METHODS: dict[str, Method] = {
    "fgsm": Method("Linf", _LINF_EPS, {"adaptive": _ADAPTIVE}),
    "pgd": Method("Linf", _LINF_EPS, {"steps": (_STEPS, 20), "alpha": (_POSITIVE, None),
                                      "random_start": (_FLAG, True), "adaptive": _ADAPTIVE}),
    "cw": Method("L2", (0.1, 0.25, 0.5, 1.0, 1.5),
                 {"c": (_POSITIVE, 1.0), "kappa": (Real(min=0), 0.0), "steps": (_STEPS, 50),
                  "lr": (_POSITIVE, 0.01), "adaptive": _ADAPTIVE}),
    "spsa": Method("Linf", _LINF_EPS, {"nb_iter": (_STEPS, 40), "delta": (_POSITIVE, 0.01),
                                       "lr": (_POSITIVE, 0.01), "nb_sample": (_STEPS, 128),
                                       "max_batch_size": (_STEPS, 64)}),
    "noise": Method("Linf", _LINF_EPS, {}),
    "sld": Method("L1", (1.0, 2.0, 4.0, 8.0),
                  {"steps": (_STEPS, 20), "adaptive": _ADAPTIVE,
                   "step_size": (Real(min=0, min_open=True, allow_none=True), None),
                   "sparsity": (Real(min=0, max=1, max_open=True), 0.95)}),
    "square": Method("Linf", _LINF_EPS, {"n_queries": (_STEPS, 5000),
                                         "p_init": (Real(min=0, max=1, min_open=True), 0.8)}),
    "autoattack": Method("Linf", _LINF_EPS,
                         {"version": (Choice(AUTOATTACK_VERSIONS), NO_DEFAULT),
                          "attacks": (_aa_attacks, NO_DEFAULT), "batch_size": (_STEPS, NO_DEFAULT),
                          "norm": (Choice(AUTOATTACK_NORMS), "Linf"), "apgd_restarts": (_STEPS, None),
                          "adaptive": _ADAPTIVE}),
}
# views of the table, by what they hold
METHODS: tuple[str, ...] = tuple(ATTACK_METHODS)
NORMS: dict[str, str] = {m: spec.norm for m, spec in ATTACK_METHODS.items()}
DEFAULT_EPS: dict[str, tuple[float, ...]] = {m: spec.eps for m, spec in ATTACK_METHODS.items()}
OPTION_CHECKS: dict[str, dict[str, Callable[[Any, str], Any]]] = {
    m: {k: check for k, (check, _) in spec.options.items()} for m, spec in ATTACK_METHODS.items()}
OPTIONS: dict[str, tuple[str, ...]] = {m: tuple(checks) for m, checks in OPTION_CHECKS.items()}
DEFAULTS: dict[str, dict[str, Any]] = {m: {k: d for k, (_, d) in spec.options.items() if d is not NO_DEFAULT}
                                       for m, spec in ATTACK_METHODS.items()}


def attack_norm(method: str, options: Mapping[str, Any] | None = None) -> str:
    """The norm of ``method``'s budget: its row of :data:`ATTACK_METHODS`, or AutoAttack's ``norm`` option."""
    if method == "autoattack" and options and "norm" in options:
        return str(options["norm"])
    return NORMS[method]


#: the restarts of pyautoattack's untargeted APGD (APGD-CE, APGD-DLR) when ``apgd_restarts`` is not given:
#: its "standard" and "rand" versions set 1, "plus" 5, and a custom list of attacks keeps the constructor's
#: 5 - so ``attacks=["apgd-ce"]`` is APGD-CE with five restarts, at least as strong as the APGD-CE inside
#: AutoAttack standard (one restart)
AUTOATTACK_APGD_RESTARTS: dict[str, int] = {"standard": 1, "rand": 1, "plus": 5, "custom": 5}
#: the attacks each pyautoattack version runs, in its order
AUTOATTACK_VERSION_ATTACKS: dict[str, tuple[str, ...]] = {
    "standard": ("apgd-ce", "apgd-t", "fab-t", "square"),
    "plus": ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t"),
    "rand": ("apgd-ce", "apgd-dlr"),
}
AUTOATTACK_RAND_EOT = 20  # "rand": expectation over 20 draws per gradient
#: the restarts of pyautoattack's untargeted FAB ("standard" runs FAB-T: 1, which stays for a FAB after it)
AUTOATTACK_FAB_RESTARTS: dict[str, int] = {"standard": 1, "rand": 1, "plus": 5, "custom": 5}
#: pyautoattack's other settings that :func:`attack_settings` names: the iterations of APGD and FAB, Square's
#: queries, the target classes of APGD-T and FAB-T (at most; see ``_autoattack_targets``)
AUTOATTACK_ITERATIONS = 100
AUTOATTACK_SQUARE_QUERIES = 5000
AUTOATTACK_TARGETS = 9


def attack_settings(method: str, options: Mapping[str, Any] | None = None, *,
                    n_classes: int | None = None) -> str:
    """What ``method`` runs with these options (the rest at :data:`DEFAULTS`), in words - for reports,
    so that a number can be lined up with a paper's protocol or RobustBench's: e.g. ``"20 steps of
    0.15 eps, random start"`` for PGD, ``"pyautoattack custom, Linf: APGD-CE (100 iterations, 5
    restarts)"`` for ``autoattack`` with ``attacks=["apgd-ce"]``. ``n_classes`` (the model's) gives the
    target count of AutoAttack's targeted attacks, :func:`build_autoattack`'s ``min(9, n_classes - 1)``;
    without it they are said to use "up to 9". An adaptive attack (``adaptive=True``) says so."""
    check_attack_options(method, 0.0, options or {})
    text = _settings(method, {**DEFAULTS[method], **(options or {})}, n_classes)
    return text + ("; adaptive (through every layer's gradient-free parts)" if (options or {}).get("adaptive")
                   else "")


def _settings(method: str, o: Mapping[str, Any], n_classes: int | None) -> str:
    if method == "pgd":
        alpha = f"{PGD_ALPHA:g} eps" if o["alpha"] is None else f"{o['alpha']:g}"
        return f"{o['steps']} steps of {alpha}" + (", random start" if o["random_start"] else "")
    if method == "cw":
        return f"{o['steps']} steps, c {o['c']:g}, kappa {o['kappa']:g}, lr {o['lr']:g}"
    if method == "spsa":
        return (f"{o['nb_iter']} iterations of {o['nb_sample']} samples, delta {o['delta']:g}, "
                f"lr {o['lr']:g}")
    if method == "square":
        return (f"{o['n_queries']} queries, p_init {o['p_init']:g}, torchattacks' schedule rescaled to the "
                "queries (AutoAttack's Square keeps the 10,000-query one)")
    if method == "sld":
        return f"{o['steps']} steps, sparsity {o['sparsity']:g}"
    if method != "autoattack":
        return {"fgsm": "one signed-gradient step", "noise": "uniform noise"}[method]
    version = "custom" if "attacks" in o else o.get("version", "standard")
    restarts = o["apgd_restarts"] or AUTOATTACK_APGD_RESTARTS[version]
    targets = (f"{_autoattack_targets(n_classes)} target classes" if n_classes is not None
               else f"up to {AUTOATTACK_TARGETS} target classes")

    def runs(n: int) -> str:
        return f"{AUTOATTACK_ITERATIONS} iterations, {n} restart{'s' * (n != 1)}"

    parts, fab_restarts = [], AUTOATTACK_FAB_RESTARTS[version]
    for name in o.get("attacks") or AUTOATTACK_VERSION_ATTACKS[version]:
        if name in ("apgd-ce", "apgd-dlr"):
            eot = f", EOT {AUTOATTACK_RAND_EOT}" if version == "rand" else ""
            parts.append(f"{name.upper()} ({runs(restarts)}{eot})")
        elif name == "square":
            parts.append(f"Square ({AUTOATTACK_SQUARE_QUERIES} queries)")
        elif name == "fab":
            parts.append(f"FAB ({runs(fab_restarts)})")
        else:  # apgd-t, fab-t: one restart per target class
            parts.append(f"{name.upper()} ({runs(1)}, {targets})")
            if name == "fab-t":  # pyautoattack sets FAB's restarts to 1 for FAB-T and leaves them there
                fab_restarts = 1
    return f"pyautoattack {version}, {o['norm']}: " + ", ".join(parts)


def _autoattack_targets(n_classes: int) -> int:
    """The targets of APGD-T and FAB-T: pyautoattack's 9, fewer when there are not that many other classes."""
    return min(AUTOATTACK_TARGETS, n_classes - 1)


def _check_method(method: Any) -> None:
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown attack {method!r}; valid: {', '.join(METHODS)}")


#: an Linf budget (pixel units) above which :func:`check_pixel_budget` warns: 0.3, MNIST's standard budget
#: (Madry et al.), the largest in common use (RobustBench: 8/255 and 4/255)
LARGE_LINF = 0.3


def check_pixel_budget(norm: str, eps: float, name: str = "eps") -> None:
    """An Linf budget in pixel units (images in [0, 1]) of 1 or more lets the attack replace the image with
    any other: a budget written in grey levels (8 for 8/255) is refused with the fraction to write
    instead; one above :data:`LARGE_LINF` (0.3) runs, with a warning. L2 and L1
    budgets grow with the image size and have no such bound."""
    if norm == "Linf" and eps >= 1:
        hint = f" (write {eps:g}/255 for {eps:g} grey levels)" if eps > 1 else ""  # 1 may be 255/255 typed
        raise ValueError(f"{name} {eps:g}: an Linf budget is in pixel units, images in [0, 1], and {eps:g} "
                         f"covers the whole range{hint}")
    if norm == "Linf" and eps > LARGE_LINF:  # allowed (a sweep to 0 accuracy), but often a unit slip
        warnings.warn(f"{name} {eps:g} is an Linf budget of {eps * 255:g}/255 in pixel units (images in "
                      f"[0, 1]), past the largest in common use (MNIST's 0.3); for {eps:g} of a grey level "
                      f"write {eps:g}/255, for an L2 budget use an L2 attack", stacklevel=2)


def check_attack_options(method: str, eps: Any, options: Mapping[str, Any], protocol: str = "pixel") -> None:
    """Validate an attack's name, budget and options before any work.

    ``eps`` must be a finite number >= 0 (``inf`` is allowed for ``cw``, a minimum-norm attack), and under
    the pixel protocol an Linf budget below 1 (:func:`check_pixel_budget`);
    every option must be one of :data:`OPTIONS` ``[method]`` or ``seed`` (an integer >= 0), in its
    range: step counts, queries, samples and batch sizes are integers >= 1, step sizes and learning
    rates positive finite numbers, ``kappa`` >= 0, ``sparsity`` in [0, 1), ``p_init`` in (0, 1],
    ``random_start`` a bool. Call it up front (a command line, a sweep) to fail before any
    evaluation.

    Raises:
        ValueError: one line naming the option, the value and what is valid.
    """
    _check_method(method)
    unknown = sorted(set(options) - set(OPTIONS[method]) - {"seed"})
    if unknown:
        raise ValueError(f"unknown options for {method}: {', '.join(unknown)}; "
                         f"valid: {', '.join((*OPTIONS[method], 'seed'))}")
    check_real(eps, f"{method}: eps", min=0, allow_inf=method == "cw")
    for key, value in options.items():
        if key == "seed":
            check_int(value, f"{method}: seed", min=0, max=2**63 - 1)
        else:
            OPTION_CHECKS[method][key](value, f"{method}: {key}")
    if method == "autoattack" and "attacks" in options and "version" in options:
        raise ValueError("autoattack: give either version= (standard, plus, rand) or attacks=[...] "
                         "(a custom version), not both")
    if protocol == "pixel":
        check_pixel_budget(attack_norm(method, options), eps, f"{method}: eps")


def _check_inputs(images: Tensor, labels: Tensor, method: str, eps: float, options: Mapping[str, Any],
                  protocol: str = "pixel") -> None:
    check_attack_options(method, eps, options, protocol)
    if not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError(f"expected images (B, C, H, W), got shape {tuple(getattr(images, 'shape', ()))}")
    if images.shape[0] == 0:
        raise ValueError(f"images is an empty batch (shape {tuple(images.shape)}); give at least one image")
    if not isinstance(labels, Tensor) or labels.shape != (images.shape[0],):
        raise ValueError(f"expected labels ({images.shape[0]},), got {tuple(getattr(labels, 'shape', ()))}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if bool((labels < 0).any()):
        raise ValueError(f"labels must be class indices >= 0, got min {int(labels.min())}")
    if not images.is_floating_point():
        raise ValueError(f"images must be floats in [0, 1] (the model normalises inside); got dtype "
                         f"{images.dtype}")
    finite = torch.isfinite(images)
    if not bool(finite.all()):
        raise ValueError(f"images contain {int((~finite).sum())} NaN/inf values "
                         f"(in {int((~finite).flatten(1).any(1).sum())} of {images.shape[0]} images)")
    if images.min() < 0 or images.max() > 1:
        raise ValueError("images must be floats in [0, 1] (the model normalises inside); got range "
                         f"[{images.min().item():.3g}, {images.max().item():.3g}]")


def perturbation_norm(delta: Tensor, norm: str) -> Tensor:
    """Per-example norm of ``delta`` ``(B, ...)``: ``norm`` in ``"Linf"``, ``"L2"``, ``"L1"``."""
    flat = delta.flatten(1)
    if norm == "Linf":
        return flat.abs().amax(dim=1)
    if norm == "L2":
        return flat.norm(p=2, dim=1)
    if norm == "L1":
        return flat.abs().sum(dim=1)
    raise ValueError(f"unknown norm {norm!r}; valid: Linf, L2, L1")


def sparse_l1_descent(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    eps: float,
    steps: int = 20,
    step_size: float | None = None,
    sparsity: float = 0.95,
) -> Tensor:
    """Sparse L1 descent (Tramer & Boneh, "Adversarial Training and Robustness for Multiple
    Perturbations", NeurIPS 2019): PGD in the L1 ball where each step moves only the coordinates
    whose |gradient| is in the top ``1 - sparsity`` fraction (by the sign of the gradient, the step
    normalised to L1 length ``step_size``), followed by the exact projection onto
    {||delta||_1 <= eps} intersected with the box [0, 1].

    As in Tramer & Boneh's SLIDE, coordinates that sit on the box boundary with the gradient pushing
    them outwards are excluded before picking the top coordinates, so steps are not wasted.
    ``step_size`` defaults to 2.5 * eps / steps (the usual PGD heuristic).

    Args:
        images: ``(B, C, H, W)`` in [0, 1]. labels: ``(B,)``.
    Returns:
        adversarial images ``(B, C, H, W)`` in [0, 1] with ||x_adv - x||_1 <= eps (up to float error).
    """
    from pyautoattack.autopgd_base import L1_projection

    check_attack_options("sld", eps, {"steps": steps, "step_size": step_size, "sparsity": sparsity})
    step = 2.5 * eps / steps if step_size is None else step_size
    x = images.detach()
    delta = torch.zeros_like(x)
    n = x[0].numel()
    k = max(1, int(round((1 - sparsity) * n)))
    for _ in range(steps):
        delta.requires_grad_(True)
        loss = F.cross_entropy(model(x + delta), labels)
        (grad,) = torch.autograd.grad(loss, delta)
        delta = delta.detach()
        g = grad.flatten(1)
        xa = (x + delta).flatten(1)
        blocked = ((xa <= 0) & (g < 0)) | ((xa >= 1) & (g > 0))
        score = g.abs().masked_fill(blocked, -1.0)
        idx = score.topk(k, dim=1).indices
        direction = torch.zeros_like(g).scatter_(1, idx, g.gather(1, idx).sign())
        direction = direction / direction.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
        d = delta.flatten(1) + step * direction
        d = d + L1_projection(x.flatten(1), d, eps).to(d.dtype)  # into L1 ball and [0, 1] box
        delta = (x + d.view_as(x)).clamp(0, 1) - x  # clamp only mops up float round-off
    return (x + delta).detach()


def build_autoattack(
    model: nn.Module,
    eps: float,
    n_classes: int,
    version: str = "standard",
    attacks: Sequence[str] | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    norm: str = "Linf",
    apgd_restarts: int | None = None,
) -> Any:
    """A ``pyautoattack.AutoAttack`` (``norm`` Linf or L2) with the number of target classes fitted to
    the model.

    ``version="standard"`` runs APGD-CE, APGD-T, FAB-T and Square (5000 queries), as in Croce & Hein
    2020; ``attacks=[...]`` picks a subset (version "custom"), e.g. ``["apgd-ce", "apgd-t"]``.
    ``apgd_restarts`` sets the untargeted APGD's restarts; None keeps pyautoattack's
    (:data:`AUTOATTACK_APGD_RESTARTS`: 1 in "standard", 5 in a custom list).
    """
    from pyautoattack import AutoAttack

    if n_classes < 2:
        raise ValueError(f"AutoAttack needs at least 2 classes, got {n_classes}")
    opts: dict[str, Any] = {"seed": seed, "norm": norm}
    opts.update({"attacks": attacks} if attacks is not None else {"version": version})
    if apgd_restarts is not None:
        opts["apgd_restarts"] = apgd_restarts
    check_attack_options("autoattack", eps, opts)
    if attacks is not None:
        aa = AutoAttack(model, eps=eps, norm=norm, version="custom", attacks=list(attacks),
                        device=device, seed=seed)
    else:
        aa = AutoAttack(model, eps=eps, norm=norm, version=version, device=device, seed=seed)
    # pyautoattack sets 9 target classes (right for CIFAR-10 and ImageNet); with fewer classes its
    # targeted attacks would ask for targets that do not exist.
    aa.apgd_targeted.n_target_classes = aa.fab.n_target_classes = _autoattack_targets(n_classes)
    if apgd_restarts is not None:
        aa.apgd.n_restarts = apgd_restarts
    aa.verbose = False
    return aa


def _autoattack(model: nn.Module, x: Tensor, y: Tensor, eps: float, opts: dict[str, Any]) -> Tensor:
    with torch.no_grad():
        n_classes = int(model(x[:1]).shape[1])
    aa = build_autoattack(model, eps, n_classes, version=opts.pop("version", "standard"),
                          attacks=opts.pop("attacks", None), seed=opts.pop("seed", 0), device=x.device,
                          norm=opts.pop("norm"), apgd_restarts=opts.pop("apgd_restarts"))
    from .autoattack_log import run_autoattack

    return run_autoattack(aa, x, y, batch_size=opts.pop("batch_size", len(x)))


def attack(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    method: str,
    eps: float,
    protocol: str = "pixel",
    **options: Any,
) -> Tensor:
    """Adversarial images for ``model`` (which takes [0, 1] images, normalisation inside).

    Args:
        images: ``(B, C, H, W)`` float in [0, 1]. labels: ``(B,)`` class indices.
        method: one of :data:`METHODS`.
        eps: budget in pixel units, in the method's norm (:data:`NORMS`). For ``cw``, CW is a
            minimum-norm attack: adversarial images with L2 perturbation above ``eps`` are replaced by
            the clean image (``eps=inf`` keeps them all).
        options: per method (:data:`OPTIONS`; :func:`check_attack_options` says the ranges), the rest at
            :data:`DEFAULTS` (the paper's where it has one: PGD 20 steps of 0.15 * eps from a random
            start); autoattack: ``version="standard"`` or ``attacks=[...]``, ``norm="Linf"`` or ``"L2"``,
            ``apgd_restarts`` (pyautoattack's by default: 1 in "standard", 5 for a list of attacks);
            all: ``seed=0`` (the global torch RNG is left untouched); gradient attacks: ``adaptive=True``
            differentiates what layers compute without gradient (:mod:`kpca_attention.attention.adaptive`,
            an adaptive attack; outputs unchanged). :func:`attack_settings` says in
            words what a method runs with.
        protocol: ``"pixel"`` (the default: the above) or ``"lab"`` - the papers' protocol for fgsm and
            pgd (:mod:`.protocol`): ``eps`` and ``alpha`` in *normalised* units, the attack on the
            normalised tensor of a ``NormalizedModel``, the clean prediction as the attacked label, and
            no clamp.

    Returns:
        adversarial images ``(B, C, H, W)`` on the images' device: in [0, 1] (``pixel``), or not clamped
        (``lab``; their Linf distance to ``images`` is ``eps * std`` per channel).

    Raises:
        ValueError: before any work, for an unknown method or option, an option out of its range
            (see :func:`check_attack_options`), an empty batch, images that are not finite floats in
            [0, 1], or labels that are not integer class indices.
    """
    from .protocol import check_protocol, lab_attack

    check_protocol(protocol, method)
    _check_inputs(images, labels, method, eps, options, protocol)
    seed = int(options.get("seed", 0))
    opts = {**DEFAULTS[method], **{k: v for k, v in options.items() if k != "seed"}}
    adaptive = bool(opts.pop("adaptive", False))
    device = model_device(model)
    x = images.detach().to(device)
    y = labels.to(device).long()
    if eps == 0:
        return images.detach().clone()

    import torchattacks as ta

    with eval_mode(model), kept_grads(model), adaptive_gradients(model, adaptive), \
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        if protocol == "lab":
            return lab_attack(model, x, method, eps, **opts).to(images.device)
        if method == "fgsm":
            adv = ta.FGSM(model, eps=eps)(x, y)
        elif method == "pgd":
            alpha = PGD_ALPHA * eps if opts["alpha"] is None else opts["alpha"]
            adv = ta.PGD(model, eps=eps, alpha=alpha, steps=opts["steps"],
                         random_start=opts["random_start"])(x, y)
        elif method == "cw":
            adv = ta.CW(model, c=opts["c"], kappa=opts["kappa"], steps=opts["steps"], lr=opts["lr"])(x, y)
            too_far = perturbation_norm(adv - x, "L2") > eps
            adv = torch.where(too_far.view(-1, 1, 1, 1), x, adv)
        elif method == "spsa":
            adv = ta.SPSA(model, eps=eps, delta=opts["delta"], lr=opts["lr"], nb_iter=opts["nb_iter"],
                          nb_sample=opts["nb_sample"], max_batch_size=opts["max_batch_size"])(x, y)
        elif method == "square":
            adv = ta.Square(model, norm="Linf", eps=eps, n_queries=opts["n_queries"], p_init=opts["p_init"],
                            seed=seed)(x, y)
        elif method == "noise":
            adv = (x + torch.empty_like(x).uniform_(-eps, eps)).clamp(0, 1)
        elif method == "sld":
            adv = sparse_l1_descent(model, x, y, eps, steps=opts["steps"], step_size=opts["step_size"],
                                    sparsity=opts["sparsity"])
        else:  # autoattack
            opts["seed"] = seed
            adv = _autoattack(model, x, y, eps, opts)
    return adv.detach().clamp(0, 1).to(images.device)


def _batches(data: Dataset | tuple[Tensor, Tensor], n: int | None, batch_size: int):
    """Yield ``(images, labels)`` batches of the first ``n`` examples (all when ``None``)."""
    if isinstance(data, tuple):
        x, y = data
        n = len(x) if n is None else min(n, len(x))
        for i in range(0, n, batch_size):
            yield x[i : min(i + batch_size, n)], y[i : min(i + batch_size, n)]
        return
    if n is not None:
        data = torch.utils.data.Subset(data, range(min(n, len(data))))  # type: ignore[arg-type]
    for x, y in DataLoader(data, batch_size=batch_size, shuffle=False):
        yield x, torch.as_tensor(y)


def attack_logits(
    model: nn.Module,
    data: Dataset | tuple[Tensor, Tensor],
    method: str,
    eps: float,
    n: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
    protocol: str = "pixel",
    **options: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """Logits ``(N, K)`` on the adversarial versions of the first ``n`` examples of ``data`` (a
    dataset of ``(image in [0, 1], label)`` or a pair of tensors), their labels ``(N,)`` and the
    perturbation norms ``(N,)`` in the method's norm (CPU tensors). Per-example results come from here.

    ``n`` (an integer >= 1, or None for all), ``batch_size`` (an integer >= 1), the method, ``eps`` and
    the options are checked before any example is loaded. ``protocol``: see :func:`attack`; the norms are
    measured in pixel units under either protocol."""
    from .protocol import check_protocol

    check_protocol(protocol, method)
    check_attack_options(method, eps, options, protocol)
    check_int(n, "n", min=1, allow_none=True)
    check_int(batch_size, "batch_size", min=1)
    logits, labels, norms = [], [], []
    device = model_device(model)
    batches = list(_batches(data, n, batch_size))
    bar = tqdm(batches, desc=f"{method} eps={eps:.4g}", disable=None if progress else True, leave=False)
    for x, y in bar:
        adv = attack(model, x, y, method, eps, protocol=protocol, **options)
        norms.append(perturbation_norm(adv - x.to(adv.device), attack_norm(method, options)).cpu())
        with eval_mode(model), torch.no_grad():
            logits.append(model(adv.to(device)).float().cpu())
        labels.append(y.cpu().long())
    if not logits:
        raise ValueError("no examples to attack")
    return torch.cat(logits), torch.cat(labels), torch.cat(norms)


def evaluate_attack(
    model: nn.Module,
    data: Dataset | tuple[Tensor, Tensor],
    method: str,
    eps: float,
    n: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
    protocol: str = "pixel",
    **options: Any,
) -> dict[str, float]:
    """Top-1/top-5 accuracy (fractions) of ``model`` on adversarial versions of the first ``n``
    examples of ``data`` (a dataset of ``(image in [0, 1], label)`` or a pair of tensors), with the
    mean and max perturbation norm in the method's norm (measured, so the budget can be checked)."""
    lg, lb, nm = attack_logits(model, data, method, eps, n, batch_size, progress, protocol, **options)
    return {**topk_accuracy(lg, lb), "n": len(lb), "norm": attack_norm(method, options), "protocol": protocol,
            "mean_norm": nm.mean().item(), "max_norm": nm.max().item()}
