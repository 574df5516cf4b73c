"""A study as data: which models (variants), which seeds, which training recipe, what to measure.

A :class:`Study` is everything needed to reproduce a comparison; :func:`kpca_attention.studies.run_study`
runs any study. Study definitions (``studies/demo.py``, ``studies/ablations.py``, ``studies/vision.py``)
are a few dozen lines of these dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..checks import check_slug
from ..tasks import Task
from ..tasks import get as get_task
from ..train import TrainConfig, get_preset
from ..train.config import PRESETS

__all__ = ["Variant", "Study", "Check", "Margin", "Source", "Leaderboard"]


@dataclass(frozen=True)
class Source:
    """An existing model a study evaluates instead of training one: ``path`` is the package's one model
    specifier (:func:`kpca_attention.train.resolve.resolve_model`): a run or checkpoint directory of this
    project, or an image classifier as a timm name with an optional local weights file (``NAME@FILE``).
    A model that is not a project checkpoint does not record what it classifies: ``dataset`` (and
    ``data_root``) say it. ``ema``: a project checkpoint's EMA weights."""

    path: str
    dataset: str | None = None
    data_root: str | None = None
    ema: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ValueError(f"a model source needs a path or a model name, got {self.path!r}")


@dataclass(frozen=True)
class Variant:
    """One model of a study: a registered model name and its kwargs, trained by the study - or, with
    ``source``, an existing model that is evaluated only (``model`` then just names it).

    ``slug`` names its files (``<slug>-s<seed>``; ``<slug>`` for a source), ``label`` its rows in tables,
    ``what`` says in words what it is; ``seeds`` restricts it to some of the study's seeds (``None``: all
    of them); ``recipe`` overrides training settings for this variant only. ``kwargs`` update the
    ``model_kwargs`` of the preset and of the recipes (the ``bible-cpu`` preset's ``{"preset": "small"}``
    stays unless a variant sets ``preset``)."""

    slug: str
    label: str
    model: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    what: str = ""
    seeds: tuple[int, ...] | None = None
    recipe: Mapping[str, Any] = field(default_factory=dict)
    source: Source | None = None

    def __post_init__(self) -> None:
        if self.source is not None and not isinstance(self.source, Source):
            raise ValueError(f"variant {self.slug}: source must be a Source, got {self.source!r}")
        check_slug(self.slug, "variant slug")


@dataclass(frozen=True)
class Margin:
    """An equivalence margin declared before a study's runs: ``value`` (> 0, in the metric's report unit:
    percentage points for accuracies and mIoU, perplexity for language models) and ``source``, where it
    comes from (e.g. ``"paper Table 1, clean top-1, RPC-SymViT (4iter/layer1) 70.94 - SymViT 70.44"``).
    A verdict calls a comparison ``equivalent`` only when its 90 % interval lies inside ``+-value``
    (``docs/verdicts.md``).

    ``against``: for a margin of one variant only, the comparator its effect was measured against (a
    variant slug: the baseline, one of ``also_against``, or the comparator of one of the study's
    ``pairs``) - the margin then applies to that comparison alone (RPC-FAN's published gain is over
    FAN, not over a ViT). None: every comparison of the variant."""

    value: float
    source: str
    against: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) \
                or not math.isfinite(self.value) or self.value <= 0:
            raise ValueError(f"margin value must be a finite number > 0, got {self.value!r}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("a margin must say where it comes from (source)")
        if self.against is not None and (not isinstance(self.against, str) or not self.against):
            raise ValueError(f"a margin's comparator (against) is a variant slug, got {self.against!r}")

    def applies_to(self, comparator: str) -> bool:
        """Whether this margin is the one of a comparison against ``comparator``."""
        return self.against is None or self.against == comparator

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"value": float(self.value), "source": self.source}
        if self.against is not None:  # recorded only when set: older settings read as before
            d["against"] = self.against
        return d


@dataclass(frozen=True)
class Leaderboard:
    """A study's leaderboard, written by the one study report: one row per variant with the mean +- std
    over seeds of ``metrics`` (the report's metric keys, e.g. ``("clean", "corrupted", "pgd@4")``; the
    ones a folder has not measured are left out), the paired difference of each against the study's
    baseline with its 95 % interval, verdict word and margin, and a plot of ``plot[1]`` against
    ``plot[0]`` (one point per variant, seed error bars; e.g. clean vs robust accuracy)."""

    metrics: tuple[str, ...]
    plot: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if not self.metrics or not all(isinstance(k, str) and k for k in self.metrics):
            raise ValueError(f"a leaderboard needs metric keys, got {self.metrics!r}")
        if self.plot is not None and (len(self.plot) != 2 or not all(isinstance(k, str) and k
                                                                      for k in self.plot)):
            raise ValueError(f"a leaderboard plot is (x metric key, y metric key), got {self.plot!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": list(self.metrics), "plot": None if self.plot is None else list(self.plot)}


@dataclass(frozen=True)
class Check:
    """An extra measurement of a study as a whole (e.g. side-by-side training throughput): ``run``
    is called as ``run(study, runs) -> JSON-able result`` with ``runs = {(slug, seed): run dir}`` of
    the runs that exist; its result is cached under ``key``."""

    name: str
    title: str
    run: Any  # Callable[[Study, dict[tuple[str, int], Path]], Any]
    key: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Study:
    """A comparison of ``variants`` over ``seeds`` with one training recipe and one evaluation.

    Args:
        name: the study's folder name (``results/<name>``).
        preset: the training preset (:data:`kpca_attention.train.PRESETS`) and ``recipe`` its
            overrides, shared by every run (the seed and the output folder are set per run).
        suites: what each trained model is measured on, the suites of the preset's task
            (:class:`~kpca_attention.tasks.classification.suites.ImageSuites`,
            :class:`~kpca_attention.tasks.segmentation.suites.SegmentationSuites`,
            :class:`~kpca_attention.tasks.language.suites.LMSuites`); the task evaluates them.
        trace: test inputs for the PAP trace of every model with RPC layers (0: none).
        baseline: the slug every variant is compared with (paired statistics, mCE).
        checks: extra study-wide measurements.
        margins: ``{metric key: Margin}``, the equivalence margins declared before the runs (the
            keys are the report's metric keys: ``clean``, ``corrupted``, ``fgsm@8``, ``ppl/test``,
            ``clean:miou``, ...; :mod:`kpca_attention.studies.margins` holds the paper's), and
            ``{(variant slug, metric key): Margin}`` for a margin of one variant only (e.g. each
            mechanism's own paper's effect), which comes before the metric's. A comparison without
            one can be ``better``, ``worse`` or ``inconclusive``, never ``equivalent``.
        also_against: further comparators (variant slugs) besides ``baseline``: the report gives the
            paired verdicts of every other variant against each, in the same Holm family.
        pairs: further single comparisons ``(variant, comparator)`` (e.g. the one a paper reports:
            ``("rpc_fan", "fan")``), each one more row in the same Holm family; the comparator's section of
            the report holds only the variants paired with it.
        reuse: other studies (folder names beside this study's ``--out``) whose per-run results this
            one takes instead of training and evaluating again, when every item has the same key.
        leaderboard: the report's leaderboard table and plot (:class:`Leaderboard`), or None.
        task_name: the task of a study whose variants are all existing models (``Variant.source``;
            ``preset`` may then be empty): what the models do, since no preset says it.
    """

    name: str
    title: str
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...]
    preset: str
    recipe: Mapping[str, Any]
    suites: Any
    baseline: str
    description: str = ""
    trace: int = 0
    checks: tuple[Check, ...] = ()
    margins: Mapping[str | tuple[str, str], Margin] = field(default_factory=dict)
    task_name: str | None = None
    also_against: tuple[str, ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()
    reuse: tuple[str, ...] = ()
    leaderboard: Leaderboard | None = None

    def __post_init__(self) -> None:
        slugs = [v.slug for v in self.variants]
        for k, m in dict(self.margins).items():
            per_variant = isinstance(k, tuple) and len(k) == 2 and all(isinstance(x, str) and x for x in k)
            if not (per_variant or (isinstance(k, str) and k)) or not isinstance(m, Margin):
                raise ValueError("margins map metric keys, or (variant slug, metric key), to "
                                 f"Margin(value, source); got {k!r}: {m!r}")
            if per_variant and k[0] not in slugs:
                raise ValueError(f"margin {k!r}: {k[0]!r} is not a variant; valid: {', '.join(slugs)}")
        if len(set(slugs)) != len(slugs):
            raise ValueError(f"variant slugs must be distinct, got {slugs}")
        if self.baseline not in slugs:
            raise ValueError(f"baseline {self.baseline!r} is not a variant; valid: {', '.join(slugs)}")
        for c in self.also_against:
            if c not in slugs or c == self.baseline or list(self.also_against).count(c) > 1:
                raise ValueError(f"also_against {c!r} must be a variant other than the baseline, named once; "
                                 f"valid: {', '.join(s for s in slugs if s != self.baseline)}")
        for pair in self.pairs:
            ok = (isinstance(pair, tuple) and len(pair) == 2 and pair[0] in slugs and pair[1] in slugs
                  and pair[0] != pair[1] and pair[1] != self.baseline and pair[1] not in self.also_against
                  and list(self.pairs).count(pair) == 1)
            if not ok:
                raise ValueError(f"pairs: {pair!r} must be (variant, comparator), two distinct variants, "
                                 "named once, the comparator neither the baseline nor one of also_against "
                                 f"(those compare every variant already); valid slugs: {', '.join(slugs)}")
        for k, m in dict(self.margins).items():
            if m.against is None:
                continue
            compared = (m.against == self.baseline or m.against in self.also_against
                        or (isinstance(k, tuple) and (k[0], m.against) in self.pairs))
            if not isinstance(k, tuple) or not compared or k[0] == m.against:
                raise ValueError(f"margin {k!r} against {m.against!r}: a margin with a comparator belongs to "
                                 "one variant, (slug, metric), and to a comparison the study makes (against "
                                 "the baseline, one of also_against, or a pair)")
        for r in self.reuse:
            if not isinstance(r, str) or not r or r == self.name or "/" in r or r.startswith("."):
                raise ValueError(f"reuse names another study's folder (beside this one's), got {r!r}")
        if self.leaderboard is not None and not isinstance(self.leaderboard, Leaderboard):
            raise ValueError(f"leaderboard must be a Leaderboard, got {self.leaderboard!r}")
        if not self.seeds:
            raise ValueError("a study needs at least one seed")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be integers >= 0, got {self.seeds}")
        if isinstance(self.trace, bool) or not isinstance(self.trace, int) or self.trace < 0:
            raise ValueError(f"trace images must be an integer >= 0, got {self.trace!r}")
        for v in self.variants:
            extra = set(v.seeds or ()) - set(self.seeds)
            if extra:
                raise ValueError(f"variant {v.slug}: seeds {sorted(extra)} are not among the study's "
                                 f"{self.seeds}")
        trained = [v for v in self.variants if v.source is None]
        for v in trained:  # fail now on a bad recipe, not when that variant's first run starts
            self.train_config(v, (v.seeds or self.seeds)[0], "runs/check")
        if not trained and self.task_name is None:
            raise ValueError("a study of existing models only (every variant has a source) needs task_name")
        self.task.check_suites(self.suites)

    @property
    def evaluate_only(self) -> bool:
        """Every variant is an existing model: nothing is trained."""
        return all(v.source is not None for v in self.variants)

    @property
    def task(self) -> Task:
        """The task every run of the study trains (its preset's, :mod:`kpca_attention.tasks`), or
        ``task_name``'s."""
        if self.task_name is not None:
            return get_task(self.task_name)
        trained = next(v for v in self.variants if v.source is None)
        return get_task(self.train_config(trained, self.seeds[0], "runs/check").task)

    # --- what runs --------------------------------------------------------------------------------
    def variant(self, slug: str) -> Variant:
        for v in self.variants:
            if v.slug == slug:
                return v
        raise ValueError(f"unknown variant {slug!r}; valid: {', '.join(v.slug for v in self.variants)}")

    def runs(self) -> list[tuple[Variant, int]]:
        """Every (variant, seed), seed-major: a study cut short holds whole seeds."""
        return [(v, s) for s in self.seeds for v in self.variants if v.seeds is None or s in v.seeds]

    def train_config(self, variant: Variant, seed: int, run_dir: str) -> TrainConfig:
        """The training config of one run."""
        # the preset's own entry (get_preset below refuses an unknown name), not a second validated config
        recipes = (PRESETS.get(self.preset, {}), dict(self.recipe), dict(variant.recipe))
        model_kwargs = {k: v for r in recipes for k, v in (r.get("model_kwargs") or {}).items()}
        opts = {**dict(self.recipe), **dict(variant.recipe), "model": variant.model,
                "model_kwargs": {**model_kwargs, **dict(variant.kwargs)}, "seed": seed,
                "output_dir": str(run_dir)}
        return get_preset(self.preset, **opts)

    def replace(self, **changes: Any) -> Study:
        """A copy with some fields changed (e.g. ``seeds``), validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The study's settings as JSON-able data (what ``settings.json`` records)."""
        d = {
            "name": self.name, "title": self.title, "preset": self.preset, "recipe": dict(self.recipe),
            "seeds": list(self.seeds), "baseline": self.baseline, "trace": self.trace,
            "task": self.task.name, "suites": self.suites.to_dict(),
            "variants": [_variant_dict(v) for v in self.variants],
            "checks": [c.name for c in self.checks],
            "margins": {k: m.to_dict() for k, m in self.margins.items() if isinstance(k, str)},
        }
        # recorded only when used, so that the settings of the studies before these fields read as before
        per_variant: dict[str, dict[str, Any]] = {}
        for k, m in self.margins.items():
            if isinstance(k, tuple):
                per_variant.setdefault(k[0], {})[k[1]] = m.to_dict()
        if per_variant:
            d["variant_margins"] = per_variant
        if self.also_against:
            d["also_against"] = list(self.also_against)
        if self.pairs:
            d["pairs"] = [list(p) for p in self.pairs]
        if self.reuse:
            d["reuse"] = list(self.reuse)
        if self.leaderboard is not None:
            d["leaderboard"] = self.leaderboard.to_dict()
        return json.loads(json.dumps(d, default=list))

    def margin(self, slug: str, key: str, against: str | None = None) -> Margin | None:
        """The margin of variant ``slug`` on metric ``key`` in its comparison with ``against`` (default:
        the baseline): its own when that applies to this comparator, else the metric's, else None."""
        own = self.margins.get((slug, key))
        if own is not None and own.applies_to(against or self.baseline):
            return own
        return self.margins.get(key)


def _variant_dict(v: Variant) -> dict[str, Any]:
    """A variant as ``settings.json`` records it (``source`` only when it has one, so that the settings
    of trained studies read as before the field existed)."""
    d = {**dataclasses.asdict(v), "kwargs": dict(v.kwargs), "recipe": dict(v.recipe)}
    if d["source"] is None:
        del d["source"]
    return d
