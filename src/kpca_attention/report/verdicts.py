"""Verdict words for paired comparisons over seeds: ``better``, ``worse``, ``equivalent (within +-m)``,
``inconclusive`` (``docs/verdicts.md`` says what each means and which error rates the rule implies).

The rule, for one cell (a metric of a variant against its baseline, ``n`` per-seed paired differences
``variant - baseline``, a margin ``m`` declared before the runs):

1. fewer than 2 seeds: ``inconclusive`` (no test over seeds exists);
2. the two-sided paired t test over seeds is significant after Holm's adjustment over the study's
   family (``p_holm < alpha``): ``better`` or ``worse`` by the sign of the mean difference and the
   metric's direction (``higher_is_better``);
3. otherwise, if the ``1 - 2 alpha`` interval lies inside ``(-m, +m)`` (TOST, :func:`~.stats.tost`):
   ``equivalent (within +-m)``;
4. otherwise ``inconclusive``: the seeds can neither detect a difference nor exclude one of size ``m``.

Error rates this implies (normal per-seed differences): the probability of any ``better``/``worse``
word in a family where no variant differs is at most ``alpha`` (Holm's familywise control; a wrong
sign, a type III error, is rarer still); ``equivalent`` is said of a cell whose true difference is
``+-m`` or larger with probability at most ``alpha`` (per cell: TOST is not adjusted for the family).

:class:`Family` collects a study's seed-level tests, adjusts their p-values together and gives the
verdicts; :func:`verdict` is the rule for one cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..checks import check_int, check_real
from .stats import finite_diffs, holm, mde_paired, seed_test, seeds_to_detect, seeds_to_exclude, tost

__all__ = ["Verdict", "verdict", "Family", "BETTER", "WORSE", "INCONCLUSIVE", "equivalent_word",
           "WORDS_HELP", "verdict_cell", "planned_seeds", "planned_pairs", "INTERIM_NOTE", "decided_word",
           "interim_note", "word_with_note", "table_word"]

BETTER, WORSE, INCONCLUSIVE = "better", "worse", "inconclusive"
WORDS_HELP = {
    BETTER: "significantly better than the baseline over seeds (paired t, Holm-adjusted p < alpha)",
    WORSE: "significantly worse than the baseline over seeds (paired t, Holm-adjusted p < alpha)",
    "equivalent (within +-m)": "no significant difference and the 90 % interval lies inside +-m (TOST, "
                               "a test per cell: not adjusted over the family as the differences are)",
    INCONCLUSIVE: "neither a difference nor equivalence within the margin can be shown with these seeds",
}


def equivalent_word(margin: float) -> str:
    """``"equivalent (within +-0.5)"`` (the margin with ``:g``, in the metric's unit)."""
    return f"equivalent (within +-{margin:g})"


@dataclass(frozen=True)
class Verdict:
    """One cell's verdict and the numbers behind it (differences are ``variant - baseline`` in the
    metric's unit). ``ci`` is the ``1 - alpha`` t interval (95 %), ``tost_ci`` the ``1 - 2 alpha``
    one (90 %); ``mde`` the minimum detectable effect at 80 % power for the observed SD and ``n`` of the
    paired t test at the level of Holm's first step (``alpha / family_size``: a difference this large is
    decided whatever the other tests of the family show; at the raw ``alpha`` it is smaller);
    ``seeds_needed`` the seeds for which TOST at true difference 0 reaches 80 % power to declare
    equivalence within the margin (``None`` if more than the cap, or no margin, or SD unknown);
    ``seeds_to_detect`` the seeds for which the paired t test at the level of Holm's first step over the
    family (``alpha / family_size``) reaches 80 % power if the true difference is the observed mean (same
    SD) - the other way a cell gets decided (``None`` if more than the cap, or mean or SD 0)."""

    word: str
    mean: float | None
    ci: tuple[float, float] | None
    p_raw: float | None
    p_holm: float | None
    tost_p: float | None
    tost_ci: tuple[float, float] | None
    margin: float | None
    mde: float | None
    seeds_needed: int | None
    seeds_to_detect: int | None
    n: int
    sd: float | None
    alpha: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (tuples as lists, ``inf`` as ``None``)."""
        out = asdict(self)
        for k in ("ci", "tost_ci"):
            out[k] = None if out[k] is None else [float(x) for x in out[k]]
        if out["mde"] is not None and not math.isfinite(out["mde"]):
            out["mde"] = None
        return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def verdict(diffs: Sequence[float], margin: float | None, p_adjusted: float | None, alpha: float = 0.05,
            higher_is_better: bool = True, *, power: float = 0.8, max_seeds: int = 1000,
            plan: bool = True, family_size: int = 1) -> Verdict:
    """The verdict word for per-seed paired differences ``diffs`` ``(n,)`` (module docstring: the rule).

    ``margin``: the equivalence margin (> 0, in the metric's unit) declared before the runs, or
    ``None`` (then only ``better``/``worse``/``inconclusive``). ``p_adjusted``: this cell's
    Holm-adjusted p-value from its family (:class:`Family`; a family of one is the raw p); required
    with 2 or more seeds. ``plan=False`` skips ``mde``, ``seeds_needed`` and ``seeds_to_detect``
    (``None``), which cost a root search and a few integrals - for simulations. ``family_size``: the number
    of tests in the cell's Holm family (:attr:`Family.size`), for ``seeds_to_detect``.
    """
    d = finite_diffs(diffs)  # a NaN would pass every comparison below and end up a word
    alpha = check_real(alpha, "alpha", min=0, max=0.5, min_open=True, max_open=True)
    margin = check_real(margin, "margin", min=0, min_open=True, allow_none=True)
    if not isinstance(higher_is_better, (bool, np.bool_)):
        raise ValueError(f"higher_is_better must be True or False; got {higher_is_better!r}")
    max_seeds = check_int(max_seeds, "max_seeds", min=2)
    family_size = check_int(family_size, "family_size", min=1)
    st = seed_test(d, level=1 - alpha)
    n, mean, sd = st["n"], st["mean"], st["std"]
    base: dict[str, Any] = dict(mean=mean, ci=None, p_raw=None, p_holm=None, tost_p=None, tost_ci=None,
                                margin=margin, mde=None, seeds_needed=None, seeds_to_detect=None, n=n, sd=sd,
                                alpha=alpha)
    if n < 2:
        return Verdict(word=INCONCLUSIVE, reason=f"{n} seed{'s' if n != 1 else ''}: a paired t test "
                       "over seeds needs at least 2", **base)
    if sd == 0:  # seed_test gives no p: not a test of the family either (Family.p_raw)
        return Verdict(word=INCONCLUSIVE, reason=f"every paired difference is {_g(mean)}: no spread over the "
                       f"{n} seeds, so no t test (a tie on a stepped metric can be chance)", **base)
    if p_adjusted is None or math.isnan(p_adjusted):
        raise ValueError(f"p_adjusted must be this cell's Holm-adjusted p-value in [0, 1] with {n} seeds; "
                         f"got {p_adjusted!r}")
    p_holm = check_real(p_adjusted, "p_adjusted", min=0, max=1)
    if p_holm < st["p"] - 1e-12:
        raise ValueError(f"p_adjusted ({p_holm:g}) must be >= the raw p-value ({st['p']:g}): "
                         "an adjustment never lowers p")
    base.update(ci=tuple(st["ci"]), p_raw=st["p"], p_holm=p_holm)
    t = tost(d, margin, alpha) if margin is not None else None
    if t is not None:
        base.update(tost_p=t.p, tost_ci=t.ci)
    if plan:
        base["mde"] = mde_paired(sd, n, alpha / family_size, power)
        if margin is not None:
            base["seeds_needed"] = seeds_to_exclude(sd, margin, alpha, power, max_n=max_seeds)
        base["seeds_to_detect"] = seeds_to_detect(mean, sd, alpha / family_size, power, max_n=max_seeds)
    pct = f"{100 * (1 - 2 * alpha):g} %"
    if p_holm < alpha:
        word = BETTER if (mean > 0) == higher_is_better else WORSE
        reason = f"paired t over {n} seeds: p {_g(st['p'])}, Holm-adjusted {_g(p_holm)} < {alpha:g}"
    elif t is not None and t.equivalent:
        word = equivalent_word(margin)
        reason = (f"Holm-adjusted p {_g(p_holm)} >= {alpha:g} and the {pct} interval "
                  f"[{_g(t.ci[0])}, {_g(t.ci[1])}] lies inside +-{margin:g} (TOST p {_g(t.p)})")
    else:
        word = INCONCLUSIVE
        if t is None:
            reason = f"Holm-adjusted p {_g(p_holm)} >= {alpha:g}; no equivalence margin declared"
        else:
            need = base["seeds_needed"]
            more = "" if not plan else (f"; if the true difference were 0, about {need} seeds would exclude "
                                        f"+-{margin:g} at {100 * power:g} % power" if need is not None
                                        else f"; more than {max_seeds} seeds would be needed")
            if t.ci[0] > margin or t.ci[1] < -margin:  # the data speak against equivalence, not for it
                more = (f"; the interval lies wholly outside +-{margin:g}: a difference larger than the "
                        f"margin (one-sided, {100 * alpha:g} % level, not adjusted over the family)")
            reason = (f"Holm-adjusted p {_g(p_holm)} >= {alpha:g} and the {pct} interval "
                      f"[{_g(t.ci[0])}, {_g(t.ci[1])}] is not inside +-{margin:g}{more}")
    return Verdict(word=word, reason=reason, **base)


MarginSpec = float | None | Mapping[Hashable, float | None] | Callable[[Hashable], float | None]
DirectionSpec = bool | Mapping[Hashable, bool] | Callable[[Hashable], bool]


def _lookup(spec: Any, key: Hashable) -> Any:
    if callable(spec):
        return spec(key)
    if isinstance(spec, Mapping):
        if key not in spec:
            raise KeyError(f"no entry for test {key!r}")
        return spec[key]
    return spec


@dataclass
class Family:
    """A study's family of seed-level tests and their Holm-adjusted p-values.

    ``description`` says what the family is (e.g. ``"every (metric, variant) pair of the vision study
    against SymViT"``); :attr:`statement` adds the method and the size and is meant to be stored with
    the results. Keys are any hashable, typically ``(metric, variant)``; tests with fewer than 2
    seeds have no p-value and do not count in the family's size.

    Example:
        >>> fam = Family("two metrics of one variant against the baseline")
        >>> fam.add(("clean", "rpc"), [0.3, -0.2, 0.1]); fam.add(("pgd", "rpc"), [1.2, 0.9, 1.4])
        >>> sorted(fam.p_holm())
        [('clean', 'rpc'), ('pgd', 'rpc')]
    """

    description: str
    tests: dict[Hashable, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError(f"description must say what the family is; got {self.description!r}")

    def add(self, key: Hashable, diffs: Sequence[float]) -> None:
        """Add one test: per-seed paired differences ``(n,)`` of ``key``."""
        if key in self.tests:
            raise ValueError(f"test {key!r} is already in the family")
        d = np.asarray(diffs, dtype=np.float64).ravel()
        if not np.all(np.isfinite(d)):
            raise ValueError(f"paired differences of {key!r} must be finite numbers; got {list(d)}")
        self.tests[key] = d

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.tests)

    def __len__(self) -> int:
        return len(self.tests)

    def p_raw(self) -> dict[Hashable, float | None]:
        """Two-sided paired t-test p-value per test (``None`` with fewer than 2 seeds)."""
        return {k: seed_test(d)["p"] for k, d in self.tests.items()}

    def p_holm(self) -> dict[Hashable, float | None]:
        """Holm-adjusted p-value per test, over all tests of the family that have a p-value."""
        return _holm_of(self.p_raw())

    @property
    def size(self) -> int:
        """Number of tests that count in the adjustment (those with >= 2 seeds)."""
        return _size_of(self.p_raw())

    @property
    def statement(self) -> str:
        """What the family is, to store with the results."""
        if self.size == 0:  # "a family of 0 tests: 1 variant x 4 metrics" read as a contradiction
            return ("no seed-level test: every comparison has fewer than 2 paired seeds, so there is no "
                    f"p-value to adjust (the family would be {self.description})")
        return (f"Holm (1979) step-down over a family of {self.size} two-sided paired t "
                f"test{'s' * (self.size != 1)} over seeds: {self.description}")

    def verdicts(self, margin: MarginSpec, higher_is_better: DirectionSpec = True, alpha: float = 0.05,
                 **kwargs: Any) -> dict[Hashable, Verdict]:
        """:func:`verdict` for every test with its Holm-adjusted p-value. ``margin`` and
        ``higher_is_better`` are one value for all, a mapping by key, or a function of the key
        (e.g. ``lambda key: MARGINS[key[0]]``); ``kwargs`` go to :func:`verdict`."""
        raw = self.p_raw()  # once: each p is a t test, and a simulation builds thousands of families
        adj = _holm_of(raw)
        kwargs.setdefault("family_size", max(_size_of(raw), 1))
        return {k: verdict(d, _lookup(margin, k), adj[k], alpha, _lookup(higher_is_better, k), **kwargs)
                for k, d in self.tests.items()}

    def to_dict(self) -> dict[str, Any]:
        """``{"family": statement, "method", "size", "tests": [{"key", "p_raw", "p_holm"}]}``."""
        raw, adj = self.p_raw(), self.p_holm()
        return {"family": self.statement, "method": "holm", "size": self.size,
                "tests": [{"key": list(k) if isinstance(k, tuple) else k, "p_raw": raw[k], "p_holm": adj[k]}
                          for k in self.tests]}


def _holm_of(raw: Mapping[Hashable, float | None]) -> dict[Hashable, float | None]:
    return dict(zip(raw, holm(list(raw.values())), strict=True))


def _size_of(raw: Mapping[Hashable, float | None]) -> int:
    return sum(p is not None for p in raw.values())


INTERIM_NOTE = (" A verdict on fewer paired seeds than the study plans is interim: it is computed again as "
                "each seed lands, and its error rates (docs/verdicts.md) are those of the verdict read at "
                "the planned seeds, not of every look along the way.")


def planned_seeds(settings: Mapping[str, Any], slug: str) -> set[int]:
    """The seeds the study definition plans for a variant: its own list, else the study's (the first only
    for a variant that evaluates an existing model)."""
    v = next((v for v in settings.get("variants", []) if v["slug"] == slug), {})
    seeds = settings.get("seeds", [])
    return set(seeds[:1] if v.get("source") else v.get("seeds") or seeds)


def planned_pairs(settings: Mapping[str, Any], slug: str, comparator: str,
                  metric_seeds: Sequence[int] | None = None) -> int:
    """How many paired seeds a study's ``settings`` plan for ``slug`` against ``comparator`` (on a metric
    evaluated on ``metric_seeds`` only, if given): a verdict on fewer is interim."""
    both = planned_seeds(settings, slug) & planned_seeds(settings, comparator)
    return len(both if metric_seeds is None else both & set(metric_seeds))


def interim_note(cell: Mapping[str, Any]) -> str | None:
    """``"interim: 12 of 16 planned seeds"`` for a summary cell on fewer paired seeds than its study plans
    (None when the planned seeds are in, or the summary predates the field)."""
    n, planned = cell["n"], cell.get("planned")
    return None if planned is None or n >= planned else f"interim: {n} of {planned} planned seeds"


def word_with_note(word: str, note: str | None) -> str:
    """``word`` with ``note`` in its parentheses: ``"worse (interim)"``, ``"equivalent (within +-0.5;
    interim)"``; ``word`` itself when ``note`` is None."""
    if note is None:
        return word
    return f"{word[:-1]}; {note})" if word.endswith(")") else f"{word} ({note})"


def decided_word(cell: Mapping[str, Any]) -> str:
    """A summary cell's verdict word with its :func:`interim_note`: ``"worse (interim: 12 of 16 planned
    seeds)"``, ``"equivalent (within +-0.5; interim: 12 of 16 planned seeds)"``."""
    return word_with_note(cell["word"], interim_note(cell))


def table_word(v: Verdict, planned: int | None, *, short: bool = False) -> str:
    """The word of a table cell for ``v``: a decided word (not ``inconclusive``) on fewer paired seeds than
    ``planned`` says it is interim - in full (:func:`decided_word`), or as ``"worse (interim)"`` where the
    row already says how many of how many (``short``)."""
    note = None if v.word == INCONCLUSIVE else interim_note({"n": v.n, "planned": planned})
    return word_with_note(v.word, "interim" if short and note is not None else note)


def verdict_cell(summary: Mapping[str, Any], variant: str, metric: str,
                 comparator: str | None = None) -> dict[str, Any] | None:
    """The verdict cell of ``variant`` against ``comparator`` (None: the study's baseline) on ``metric`` in
    a study's ``summary.json`` (``verdicts.cells``, or ``verdicts.also.<comparator>.cells``), or None."""
    ver = summary.get("verdicts") or {}
    if comparator in (None, ver.get("baseline")):
        cells = ver.get("cells") or {}
    else:
        cells = ((ver.get("also") or {}).get(comparator) or {}).get("cells") or {}
    return (cells.get(variant) or {}).get(metric)
