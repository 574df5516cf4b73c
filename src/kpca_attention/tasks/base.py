"""The :class:`Task` interface: what the training loop, the study engine, the study report and the
command line ask of a task (image classification, semantic segmentation, causal language modelling).

A task holds everything that differs between them: its datasets (training, validation, test), the model
it builds from a :class:`~kpca_attention.train.TrainConfig`, its loss, its held-out metrics and the
unit its throughput is counted in, its evaluation suites (per-example items into the one
:class:`~kpca_attention.robustness.store.ResultStore`), the batches the PAP trace runs on, and the
sections it adds to a study report (:class:`StudySections`). Everything above the tasks asks the task
object (``kpca_attention.tasks.get(cfg.task)``), never compares task names.

A task sees a run's config duck-typed (``cfg``: a ``TrainConfig``; this layer sits below ``train``).

The validation split (:func:`validation_split`): a task carves a fixed set of ``cfg.val_size`` examples
from its training data with ``cfg.val_seed`` (the same for every training seed); the held-out numbers
during training are measured on it and the test split is left to the suites at the end. ``val_size``
None is the legacy setting of runs made before the split existed (held out: the test split).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..checks import check_int
from ..data.sampling import seeded_indices
from ..modules import eval_mode
from ..plotting import bar_style

__all__ = ["Task", "Splits", "Objective", "StudySections", "SeedMetric", "validation_split", "seeded_sample",
           "has_pap_layers", "all_reduce_sum", "sum_over_loader", "autocast"]


def autocast(device: torch.device, amp: bool) -> Any:
    """Mixed precision when ``amp``: float16 autocast on CUDA, bfloat16 elsewhere (the CPU); else nothing.
    Training (``train/loop.py``) and every task's evaluation run under this one."""
    if not amp:
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16)


def all_reduce_sum(t: Tensor) -> Tensor:
    """Sum over processes (in place) when ``torch.distributed`` is initialised (DDP); identity otherwise:
    held-out metrics are sums over each rank's shard."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


@torch.no_grad()
def sum_over_loader(model: nn.Module, loader: Any, device: torch.device, size: int,
                    step: Callable[[Tensor, Tensor, Tensor], None], *, progress: bool, desc: str,
                    counted: int | None = None, unit: str = "examples") -> Tensor:
    """The held-out sums of an evaluation: ``step(x, y, sums)`` adds one batch's to ``sums`` (float64,
    ``size`` entries on ``device``) for every batch ``(x, y)`` of ``loader`` moved to ``device``, with
    ``model`` in evaluation mode (its mode restored after) and no gradients; then summed over DDP ranks.
    ``counted``: the index of the count among the sums; zero there (an empty loader) is an error."""
    sums = torch.zeros(size, dtype=torch.float64, device=device)
    with eval_mode(model):
        for x, y in tqdm(loader, desc=desc, disable=None if progress else True, leave=False):
            step(x.to(device, non_blocking=True), y.to(device, non_blocking=True), sums)
    all_reduce_sum(sums)
    if counted is not None and sums[counted].item() == 0:
        raise ValueError(f"{desc}: no {unit} to evaluate (the loader is empty)")
    return sums


@dataclass
class Splits:
    """A task's training data: ``train`` (what the loader yields), ``held_out`` (the per-epoch evaluation:
    the validation split, or the legacy test subset; None when not asked for) and ``info`` (what the
    model is built with: ``num_classes``, ``in_chans``; ``vocab`` for language models)."""

    train: Dataset
    held_out: Dataset | None
    info: dict[str, Any]


@dataclass
class Objective:
    """The training loss of a task: ``loss(net, x, y) -> scalar`` and an optional batch transform
    ``mix(x, y) -> (x, y)`` applied before it (Mixup / CutMix)."""

    loss: Callable[[nn.Module, Tensor, Tensor], Tensor]
    mix: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None


def validation_split(n: int, val_size: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """``(training, validation)`` indices of a training set of ``n`` examples: ``val_size`` indices drawn
    with ``torch.randperm`` under ``seed`` are the validation split, the others the training split; both
    sorted. A pure function of ``(n, val_size, seed)``: the same in every process and on every call."""
    check_int(val_size, "val_size", min=1, max=n - 1)
    check_int(seed, "val_seed", min=0)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[val_size:].sort().values.tolist(), perm[:val_size].sort().values.tolist()


def seeded_sample(indices: Sequence[int], n: int | None, seed: int = 0) -> list[int]:
    """``n`` of ``indices`` drawn with ``seed`` (in their order), or all of them when ``n`` is None or
    not smaller - the sampling rule of the datasets' ``subset`` arguments, on a list of indices."""
    if n is None or n >= len(indices):
        return list(indices)
    return [indices[i] for i in seeded_indices(len(indices), n, seed)]


def has_pap_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds an attention layer that runs Principal Attention Pursuit."""
    from ..attention import RPCAttention

    return any(isinstance(m, RPCAttention) for m in model.modules())


class Task(ABC):
    """One task (see the module docstring). Subclasses are registered in :mod:`kpca_attention.tasks`."""

    #: the task's name: the value of ``TrainConfig.task`` (and of committed configs)
    name: ClassVar[str]
    #: in words, for reports and errors
    title: ClassVar[str]
    #: what one training example is called in logs ("images", "windows", "scenes")
    unit: ClassVar[str]
    #: the key of the training throughput in ``epochs.csv`` (``images_per_s`` / ``tokens_per_s``)
    throughput_key: ClassVar[str]
    #: the held-out metrics of :meth:`evaluate` logged each epoch (as ``eval_<key>``)
    held_out_metrics: ClassVar[tuple[str, ...]]
    #: the models take token ids in their own vocabulary (``model.vocab``; else images in [0, 1])
    takes_tokens: ClassVar[bool] = False
    #: the models attend causally (a prefix of a sequence sees only itself: the KPCA analysis reads them
    #: per prefix)
    causal: ClassVar[bool] = False
    #: the models predict per pixel (their encoder is not separated from the decoder)
    dense: ClassVar[bool] = False
    #: the suites class of this task's studies
    suites_type: ClassVar[type]
    #: RobustBench's threat models (Linf, L2, corruptions) apply: an image classifier on [0, 1] inputs
    robustbench: ClassVar[bool] = False
    #: the ``TrainConfig`` fields this task reads among those only some tasks read (``context`` for a
    #: language model, ``hflip`` for images); every field no task lists is read by every task. A fresh run
    #: that changes a field other tasks list and its own does not is refused
    #: (:func:`kpca_attention.tasks.unused_settings`), rather than recorded as if it applied
    config_fields: ClassVar[frozenset[str]] = frozenset()
    #: the options of :meth:`evaluate_split` this task reads, with their defaults (a language model's
    #: sliding-window ``stride``); ``evaluate`` refuses an option the checkpoint's task does not read set to
    #: other than its default (:func:`kpca_attention.tasks.unread_options`), rather than ignore it
    evaluate_options: ClassVar[Mapping[str, Any]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def owns(self, model: nn.Module) -> bool:
        """Whether ``model`` (possibly inside a ``NormalizedModel``) is one of this task's models."""
        return False

    def owns_name(self, name: str) -> bool:
        """Whether the model name ``name`` builds one of this task's models (:func:`owns` before building:
        ``train`` refuses a model of another task than its preset's)."""
        return False

    # --- configs ----------------------------------------------------------------------------------
    def check_config(self, cfg: Any) -> None:  # noqa: B027 - a hook: most tasks accept every config
        """Raise a ``ValueError`` naming the field for settings this task cannot train with."""

    def held_out_note(self, cfg: Any) -> str | None:
        """A warning when the held-out numbers of training under ``cfg`` come from the test split (no
        validation split to choose on), else None."""
        return None

    def split_name(self, cfg: Any, split: str) -> str:
        """The split ``split`` of ``cfg``'s data actually is (``kpca-attention evaluate``'s JSON)."""
        return split

    def data_info(self, cfg: Any) -> Any:
        """What the model is built from besides ``cfg`` (image tasks: the dataset's
        :class:`~kpca_attention.data.images.ImageDatasetInfo`: classes, channels, size, statistics)."""
        return None

    # --- data -------------------------------------------------------------------------------------
    @abstractmethod
    def datasets(self, cfg: Any, *, with_eval: bool = True) -> Splits:
        """The training split and the held-out split of ``cfg`` (see :class:`Splits`)."""

    @abstractmethod
    def test_set(self, cfg: Any) -> Any:
        """The test data the suites evaluate at the end (a dataset, or a corpus)."""

    def sample_tokens(self, cfg: Any, n: int, vocab: Any) -> tuple[Tensor, str]:
        """A token task's default inputs for the KPCA analysis and the PAP trace of a trained model: ``n``
        held-out token windows ``(n, length)`` of ``cfg``'s data in the model's ``vocab``, and a description
        of them. Image tasks are analysed on their test images instead."""
        raise ValueError(f"task {self.name!r} names no default token inputs for its models: give --texts "
                         "FILE (one text per line)")

    # --- the model --------------------------------------------------------------------------------
    @abstractmethod
    def build_model(self, cfg: Any, info: Mapping[str, Any] | None = None) -> nn.Module:
        """The model of ``cfg`` (random init); ``info``: :attr:`Splits.info` (default: derived)."""

    def checkpoint_files(self, info: Mapping[str, Any]) -> dict[str, Callable[[Path], None]]:
        """Files a checkpoint holds besides the weights: ``{name: writer(path)}``."""
        return {}

    def checkpoint_info(self, cfg: Any, ckpt: Path) -> dict[str, Any]:
        """The :attr:`Splits.info` a checkpoint's model is rebuilt with, read from the files of
        :meth:`checkpoint_files` (``ValueError`` / ``FileNotFoundError`` when one is missing or bad)."""
        return {}

    # --- training ---------------------------------------------------------------------------------
    @abstractmethod
    def objective(self, cfg: Any, info: Mapping[str, Any]) -> Objective:
        """The training loss (and batch transform) of ``cfg``."""

    def count(self, y: Tensor) -> int:
        """How many throughput units a batch with targets ``y`` holds (examples; tokens for LMs)."""
        return int(y.shape[0])

    @abstractmethod
    def evaluate(self, model: nn.Module, loader: Any, device: torch.device | str, *, cfg: Any,
                 amp: bool = False, progress: bool = False, desc: str = "eval") -> dict[str, float]:
        """The held-out metrics of ``model`` over ``loader`` (under DDP summed over ranks); at least the
        keys of :attr:`held_out_metrics`."""

    @abstractmethod
    def evaluate_split(self, model: nn.Module, cfg: Any, split: str, *, subset: int | None,
                       batch_size: int, device: torch.device, progress: bool,
                       **options: Any) -> dict[str, float | int]:
        """The metrics of a trained ``model`` on ``split`` of its dataset (``kpca-attention evaluate``);
        counts (tokens, context) as integers. ``options``: those of :attr:`evaluate_options`."""

    # --- studies ----------------------------------------------------------------------------------
    def check_suites(self, suites: Any) -> None:
        """Refuse suites of another task (a study's suites must measure what its models do)."""
        if not isinstance(suites, self.suites_type):
            raise ValueError(f"task {self.name!r} ({self.title}) is evaluated with "
                             f"{self.suites_type.__name__}, got {type(suites).__name__}")

    def has_pap(self, cfg: Any) -> bool:
        """Whether the model of ``cfg`` runs Principal Attention Pursuit: built untrained (cheap; the
        global random generators are left as they were), not loaded."""
        with torch.random.fork_rng(devices=[]):
            return has_pap_layers(self.build_model(cfg))

    @abstractmethod
    def evaluate_suites(self, suites: Any, model: nn.Module | Callable[[], nn.Module], cfg: Any,
                        store: Any, base_key: Mapping[str, Any], *, has_pap: bool = False,
                        cache_dir: str | Path | None = None, seed: int | None = None,
                        log: Callable[[str], None] = print, progress: bool = True) -> dict[str, Any]:
        """Every item of ``suites`` for one trained model on the test data of ``cfg``, reusing the items of
        ``store`` (a :class:`~kpca_attention.robustness.store.ResultStore`) whose key (``base_key`` + the
        item's parameters) matches.

        Args:
            model: the model, or a function returning it (called only if some item must be computed).
            has_pap: the model runs PAP (:meth:`has_pap`): suites may measure PAP's inner quantities.
            cache_dir: where expensive inputs (corrupted images) may be cached.
            seed: the training seed of this model (some suites run on some seeds only).
        """

    @abstractmethod
    def trace_batches(self, suites: Any, cfg: Any, n: int) -> Any:
        """``n`` fixed test inputs in batches, for the PAP trace of a trained model."""

    @abstractmethod
    def sections(self, settings: Mapping[str, Any]) -> StudySections:
        """What this task adds to the report of a study folder with ``settings``."""


Runs = dict[str, dict[int, dict[str, Any]]]


@dataclass
class SeedMetric:
    """One seed-level metric of a study's verdicts: ``values`` ``{slug: {seed: value}}`` in ``unit``
    (e.g. top-1 in percent, so that differences are in percentage points), the good direction, and the
    metric's key (the key of a declared margin) and column title. ``seeds``: the only seeds the study
    evaluates this metric on (an expensive attack on the first seed), None for every seed trained."""

    key: str
    title: str
    unit: str
    higher_is_better: bool
    values: dict[str, dict[int, float]]
    seeds: tuple[int, ...] | None = None


class StudySections(ABC):
    """A task's part of the one study report (:func:`kpca_attention.report.study.write_study_report`
    lays out the frame: header, training and evaluation settings, the regenerate line, the main table with
    throughput, paired differences, the PAP trace, study-wide checks, training curves and plots; a task
    gives the metrics and the sections between them).

    The writer calls, in this order: :meth:`keep` for every run read, :meth:`select` once, :meth:`prepare`
    (``self.res``, ``self.slugs``, ``self.label``, ``self.base`` set; it sets ``self.met``), :meth:`keys`
    (kept as ``self.keys_``), :meth:`summary_extra`, the header, table and paired hooks,
    :meth:`sections_before_trace`, :meth:`sections_after_trace`, :meth:`plots`. The paired hooks draw
    from one generator shared in that order (the bootstrap intervals depend on it)."""

    #: the heading of the main table
    table_title: str = "## Metrics (mean ± std over seeds)"
    #: appended to the training sentence (what pairing the runs of one seed share)
    training_note: str = ""
    #: appended to the paired-differences heading (its unit)
    paired_unit: str = ""
    #: the header of the throughput column
    throughput_title: str = "train img/s"
    #: the PAP-trace section: heading, paragraph, and whether one sentence per traced run follows
    trace_heading: str = "## PAP trace of the RPC layers on test inputs"
    trace_note: str = ("Is the sparse component S of Principal Attention Pursuit ever non-zero? tau / max|K| "
                       "above 1 means the first step shrinks nothing; s_density is the fraction of non-zero "
                       "entries of S.")
    trace_statements: bool = False
    #: ``summary.json`` holds the mean of each metric per variant (``means``)
    summary_means: bool = True
    #: the held-out metric of ``epochs.csv`` drawn as training curves: (key, y label, scale, log axis)
    curve: tuple[str, str, float, bool] = ("eval_top1", "held-out top-1 during training (%)", 100, False)
    #: the verdicts' unit: a metric of ``self.met`` times ``verdict_scale`` is in ``verdict_unit``
    verdict_scale: float = 100
    verdict_unit: str = "percentage points"
    #: the unit of a metric's values in ``seed_metrics`` (leaderboard columns and axes)
    value_unit: str = "%"
    #: the metrics are better when higher (accuracies, mIoU; not perplexity)
    higher_is_better: bool = True
    #: the last line of the report: where the per-run results are
    footer: str = "Per-run results: `results/<variant>-s<seed>.json`; paired statistics: `summary.json`."

    def __init__(self, settings: Mapping[str, Any], throughput_key: str) -> None:
        self.settings = dict(settings)
        self.throughput_key = throughput_key
        self.res: Runs = {}
        self.met: dict[str, dict[int, dict[str, Any]]] = {}
        self.keys_: list[str] = []
        self.slugs: list[str] = []
        self.label: dict[str, str] = {}
        self.base: str = str(settings.get("baseline", ""))
        #: the study's result files read that are not sealed (legacy), named in the report's header
        self.unsealed: list[Any] = []

    # --- reading ------------------------------------------------------------------------------------
    def structure(self, items: Mapping[str, Any]) -> dict[str, Any]:
        """One run's flat ``{item name: result}`` in the shape :meth:`keep` and :meth:`metrics` read
        (default: as stored; the image tasks nest ``corruptions/<name>/<severity>`` and the like)."""
        return dict(items)

    def keep(self, r: dict[str, Any]) -> dict[str, Any] | None:
        """One run's structured items as the report reads them, or None to leave the run out (default:
        runs with a training summary and a ``clean`` item)."""
        return r if "run" in r and "clean" in r else None

    def select(self, res: Runs) -> Runs:
        """All runs read; may drop runs (e.g. still in evaluation, named in ``settings["incomplete"]``)."""
        return res

    # --- numbers ------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Compute ``self.met``: ``{slug: {seed: metrics}}`` (``summary.json``'s ``metrics``)."""
        self.met = {s: {sd: self.metrics(r) for sd, r in self.res[s].items()} for s in self.slugs}

    @abstractmethod
    def metrics(self, r: Mapping[str, Any]) -> dict[str, Any]:
        """The metrics of one run."""

    def summary_extra(self) -> dict[str, Any]:
        """Entries ``summary.json`` always holds besides ``study``, ``baseline``, ``metrics``, ``paired``."""
        return {}

    @abstractmethod
    def keys(self) -> list[str]:
        """The metric keys of the main and paired tables, in column order."""

    @abstractmethod
    def title(self, key: str) -> str:
        """The column title of a metric key."""

    def cell(self, values: Sequence[float | None]) -> str:
        """A metric's cell of the main table from its per-seed values."""
        from ..tables import fmt_pm

        return fmt_pm(values)

    def seed_metrics(self) -> list[SeedMetric]:
        """The seed-level metrics the verdicts compare (default: every key of :meth:`keys`, scaled by
        :attr:`verdict_scale`; the finite values only)."""
        import math

        out = []
        for k in self.keys_:
            vals = {s: {sd: self.verdict_scale * float(m[k]) for sd, m in sorted(self.met[s].items())
                        if m.get(k) is not None and math.isfinite(m[k])} for s in self.slugs}
            out.append(SeedMetric(k, self.title(k), self.verdict_unit, self.higher_is_better, vals,
                                  self.metric_seeds(k)))
        return out

    def metric_seeds(self, key: str) -> tuple[int, ...] | None:
        """The only seeds the study's suites evaluate metric ``key`` on (None: every seed trained)."""
        return None

    def evaluation(self) -> str:
        """The sentence saying what was evaluated and how."""
        return "Evaluation: see the suites in settings.json."

    def row_extras(self, s: str, seeds: list[int], summary: dict[str, Any]) -> dict[str, str]:
        """Extra cells of the main table's row of variant ``s`` (after the metrics)."""
        return {}

    def extra_columns(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """``{key: header}`` of the extra cells shown."""
        return {}

    def table_notes(self, columns: Mapping[str, str]) -> list[str]:
        """Lines under the main table."""
        return []

    # --- paired differences -------------------------------------------------------------------------
    def paired_note(self) -> str:
        """The paragraph under the paired-differences heading: what each cell holds."""
        return ""

    @abstractmethod
    def seed_noise(self, b0: int, b1: int, rng: np.random.Generator,
                   summary: dict[str, Any]) -> dict[str, str]:
        """The cells of the baseline's seed ``b1`` against its seed ``b0`` (training noise)."""

    @abstractmethod
    def paired(self, s: str, rng: np.random.Generator, summary: dict[str, Any]) -> dict[str, str] | None:
        """The cells of variant ``s`` against the baseline (and its ``summary["paired"]`` entries); None
        leaves the row out."""

    # --- sections and plots -------------------------------------------------------------------------
    def sections_before_trace(self, out: Path, summary: dict[str, Any]) -> list[str]:
        return []

    def sections_after_trace(self, out: Path, summary: dict[str, Any]) -> list[str]:
        return []

    def plots(self, out: Path, summary: dict[str, Any]) -> tuple[list[Path], list[Path]]:
        """``(plots before the training curves, plots after them)``."""
        return [], []


def bar_plot(ax: Any, values: Mapping[str, Sequence[float]], slugs: Sequence[str], label: Mapping[str, str],
             rotation: int) -> None:
    """One bar per variant (mean, written above it) with its seeds as dots, on matplotlib axes ``ax``. The
    axis starts at 0: a bar's length is its value (an axis cut just below the bars made a 2-point gap look
    like a doubling); differences between variants are the reports' forest plots."""
    for i, s in enumerate(slugs):
        vals = list(values.get(s, ()))
        if vals:
            mean = float(np.mean(vals))
            ax.bar(i, mean, alpha=0.6, **bar_style(i))
            ax.scatter([i] * len(vals), vals, color="k", s=10, zorder=3)
            ax.annotate(f"{mean:.1f}", (i, max(mean, max(vals))), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=6, rotation=90 if len(slugs) > 6 else 0)
    ax.set_ylim(0, None)
    ax.margins(y=0.12)
    ax.set_xticks(range(len(slugs)), [label[s] for s in slugs], rotation=rotation, ha="right", fontsize=7)
