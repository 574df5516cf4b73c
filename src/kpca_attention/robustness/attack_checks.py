"""Signs of gradient masking in one model's attack results, from its per-image correctness.

A model can look robust because the attacks cannot follow its gradients (masked, shattered or noisy
gradients) rather than because it is robust. The standard checks of an evaluation (Carlini et al. 2019,
"On Evaluating Adversarial Robustness", section 5 and its checklist; Athalye et al. 2018's "characteristic
behaviours" of obfuscated gradients; AutoAttack's flag ``check_square_sr``) compare attacks run on the same
images, and each expects one attack to leave at most as many images correct as another:

==========================  ===================================================================
rule                        expected
==========================  ===================================================================
``iterative >= one-step``   an iterative gradient attack (PGD, APGD, C&W, SLD) at least as strong
                            as a one-step one (FGSM) at the same budget (both plain or both adaptive)
``adaptive >= plain``       an adaptive attack (gradients through the parts a layer computes
                            without them, :mod:`kpca_attention.attention.adaptive`) at least as
                            strong as the same attack without
``white-box >= black-box``  the strongest iterative gradient attack at least as strong as a
                            gradient-free one (Square, SPSA) at the same budget (AutoAttack's flag)
``attack >= noise``         every attack at least as strong as uniform noise of the same budget
``larger budget``           an attack at a larger budget at least as strong as at a smaller one
==========================  ===================================================================

A check fails when the attack expected to be stronger leaves more than ``tolerance`` (AutoAttack's 0.2 % of
the images) more images correct. Its ``missed`` is the share of images the weaker attack broke and the
stronger left correct - a per-image view of the same question. ``white-box >= black-box`` fails on
``missed`` instead, as AutoAttack's flag does: more than 0.2 % of the images broken by the gradient-free
attack and left correct by *every* iterative one (a gradient attack can win on the total while the
gradient-free one finds images it cannot - masking on some images is what the rule is for). A failure is
a sign, not proof, of an evaluation that overstates robustness; passing every check is not proof of the
opposite (no check here runs an unbounded or adaptive attack).

Attacks of one threat (norm, protocol, budget) are compared on their common images: every attack of a
study runs on a prefix of one fixed image list (:func:`~kpca_attention.tasks.classification.suites.
evaluate_image_suites`), so the first ``min(n_a, n_b)`` images are the same images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

__all__ = ["TOLERANCE", "RULES", "KINDS", "AttackResult", "Check", "attack_kind", "masking_checks"]

#: AutoAttack's tolerance in ``check_square_sr`` (a fraction of the images)
TOLERANCE = 0.002
#: the rules, in the order checks are listed
RULES: tuple[str, ...] = ("iterative >= one-step", "adaptive >= plain", "white-box >= black-box",
                          "attack >= noise", "larger budget")

#: the kinds of attack :func:`attack_kind` tells apart
KINDS: tuple[str, ...] = ("one-step", "iterative", "gradient-free", "noise")

_ONE_STEP = frozenset({"fgsm"})
_GRADIENT_FREE = frozenset({"square", "spsa"})
_NOISE = frozenset({"noise"})


def attack_kind(method: str, options: Mapping[str, Any] | None = None) -> str:
    """``one-step``, ``iterative`` (gradient-based, several steps), ``gradient-free`` or ``noise`` of an
    attack method (:data:`~kpca_attention.robustness.attacks.METHODS`); AutoAttack running Square alone is
    gradient-free, with any gradient attack it is iterative."""
    if method in _ONE_STEP:
        return "one-step"
    if method in _GRADIENT_FREE:
        return "gradient-free"
    if method in _NOISE:
        return "noise"
    if method == "autoattack":
        attacks = (options or {}).get("attacks")
        if attacks and all(a == "square" for a in attacks):
            return "gradient-free"
    return "iterative"


@dataclass(frozen=True)
class AttackResult:
    """One attack at one budget on one model: ``correct`` per image (the attack's image list, a prefix of
    the study's), ``eps`` in pixel units and ``eps_text`` as reports write it (``"4/255"``);
    ``adaptive_of``: for an adaptive attack, the name of the same attack without (its twin)."""

    name: str
    kind: str
    norm: str
    protocol: str
    eps: float
    eps_text: str
    correct: np.ndarray
    adaptive_of: str | None = None

    @property
    def threat(self) -> str:
        return f"{self.norm} {self.eps_text}" + ("" if self.protocol == "pixel" else f" ({self.protocol})")


@dataclass(frozen=True)
class Check:
    """One comparison: ``stronger`` expected to leave at most as many of the ``n`` common images correct
    as ``weaker``. ``excess``: top-1 under ``stronger`` minus under ``weaker`` (a fraction; above
    ``tolerance`` fails); ``missed``: the share of images ``weaker`` broke and ``stronger`` left
    correct."""

    rule: str
    threat: str
    stronger: str
    weaker: str
    n: int
    excess: float
    missed: float
    tolerance: float = TOLERANCE
    #: what fails the check: ``"excess"`` (the totals) or ``"missed"`` (per image: AutoAttack's flag)
    criterion: str = "excess"

    @property
    def passed(self) -> bool:
        # in whole images: one image of 500 is exactly AutoAttack's 0.2 %, which passes
        value = self.missed if self.criterion == "missed" else self.excess
        return round(value * self.n) <= self.tolerance * self.n + 1e-9

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What is compared, the same in every run of a study: (rule, threat, stronger, weaker)."""
        return self.rule, self.threat, self.stronger, self.weaker


def _compare(rule: str, threat: str, strong: AttackResult | tuple[str, np.ndarray], weak: AttackResult,
             tolerance: float) -> Check:
    s_name, s_bits = (strong.name, strong.correct) if isinstance(strong, AttackResult) else strong
    n = min(len(s_bits), len(weak.correct))
    if n == 0:
        raise ValueError(f"no common images to compare {s_name} with {weak.name} at {threat}")
    s = np.asarray(s_bits[:n], dtype=bool)
    w = np.asarray(weak.correct[:n], dtype=bool)
    return Check(rule, threat, s_name, weak.name, n, float(s.mean() - w.mean()), float((s & ~w).mean()),
                 tolerance)


def masking_checks(results: Sequence[AttackResult], tolerance: float = TOLERANCE) -> list[Check]:
    """Every check of :data:`RULES` the attacks of one run allow, in rule order (see the module)."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    out: dict[str, list[Check]] = {rule: [] for rule in RULES}
    results = sorted(results, key=lambda r: (r.norm, r.protocol, r.eps, r.name))
    groups: dict[tuple[str, str, str], list[AttackResult]] = {}
    for r in results:
        groups.setdefault((r.norm, r.protocol, r.eps_text), []).append(r)
    for rs in groups.values():
        threat = rs[0].threat
        kind = {k: [r for r in rs if r.kind == k] for k in KINDS}
        for it in kind["iterative"]:
            for one in kind["one-step"]:
                if (it.adaptive_of is None) == (one.adaptive_of is None):  # both plain or both adaptive
                    out[RULES[0]].append(_compare(RULES[0], threat, it, one, tolerance))
        plain = {r.name: r for r in rs if r.adaptive_of is None}
        for ad in [r for r in rs if r.adaptive_of in plain]:
            out[RULES[1]].append(_compare(RULES[1], threat, ad, plain[ad.adaptive_of], tolerance))
        for free in kind["gradient-free"] if kind["iterative"] else []:
            out[RULES[2]].append(_against_white_box(threat, kind["iterative"], free, tolerance))
        for noise in kind["noise"]:
            for att in [r for r in rs if r.kind != "noise"]:
                out[RULES[3]].append(_compare(RULES[3], threat, att, noise, tolerance))
    per_attack: dict[tuple[str, str, str], list[AttackResult]] = {}
    for r in results:
        per_attack.setdefault((r.name, r.norm, r.protocol), []).append(r)
    for rs in per_attack.values():
        ordered = sorted(rs, key=lambda r: r.eps)
        for small, large in zip(ordered, ordered[1:], strict=False):
            if large.eps > small.eps:
                out[RULES[4]].append(_compare(
                    RULES[4], f"{small.threat} -> {large.eps_text}",
                    (f"{large.name} {large.eps_text}", large.correct),
                    replace(small, name=f"{small.name} {small.eps_text}"), tolerance))
    return [c for rule in RULES for c in out[rule]]


def _against_white_box(threat: str, iterative: Sequence[AttackResult], free: AttackResult,
                       tolerance: float) -> Check:
    """A gradient-free attack against the iterative attack with the lowest top-1 on their common images
    (AutoAttack's comparison), named ``best of A, B`` when there are several (the best may differ between
    runs); ``missed``: images the gradient-free attack broke and *every* iterative attack left correct."""
    n = min([len(free.correct)] + [len(r.correct) for r in iterative])
    best = min(iterative, key=lambda r: (float(np.mean(r.correct[:n])), r.name))
    chk = _compare(RULES[2], threat, (best.name, best.correct[:n]), free, tolerance)
    robust_to_all = np.logical_and.reduce([np.asarray(r.correct[:n], dtype=bool) for r in iterative])
    missed = float((robust_to_all & ~np.asarray(free.correct[:n], dtype=bool)).mean())
    name = best.name if len(iterative) == 1 else "best of " + ", ".join(sorted(r.name for r in iterative))
    return replace(chk, stronger=name, missed=missed, criterion="missed")
