"""Training configuration: one dataclass, named presets, command-line overrides.

A run is fully described by a :class:`TrainConfig`; it is written as ``config.json`` next to every
checkpoint, so :func:`kpca_attention.train.load_model` can rebuild the model and ``--resume`` can
refuse a checkpoint made with a different recipe.

Presets (:data:`PRESETS`):

* ``deit`` - the paper's ImageNet recipe (DeiT, Touvron et al. 2021, as in the official code):
  AdamW, weight decay 0.05, lr 5e-4 * global_batch / 512, cosine schedule with 5 warm-up epochs
  from 1e-6 down to 1e-5, drop path 0.1, label smoothing 0.1 through timm's ``Mixup`` (mixup 0.8,
  cutmix 1.0) and ``SoftTargetCrossEntropy``, RandAugment ``rand-m9-mstd0.5-inc1``, random erasing
  0.25, repeated augmentation x3 under DDP, EMA of the weights, AMP on CUDA, 300 epochs.
* ``lm`` - the paper's language-model recipe: Adam, lr 2.5e-4, 2000 warm-up steps, batch 96,
  context 256 (the paper trains 500k steps on WikiText-103).
* ``ade20k-segmenter`` - Segmenter's ADE20K recipe (Strudel et al. 2021, official config): SGD
  (timm's ``sgd``: Nesterov momentum 0.9), lr 1e-3, no weight decay, polynomial decay (power 0.9) to
  1e-5 per step, global batch 8, crop 512, 64 epochs (~160k iterations), drop path 0.1, decoder dropout 0.1.
* ``fmnist-cpu``, ``digits-cpu``, ``bible-cpu``, ``fmnist-seg-cpu`` (Segmenter on the Fashion-MNIST
  scenes) - small recipes that train in minutes on a CPU. The image ones hold a validation split out of
  the training data (``val_size`` 2000, 200 and 1000 images) for the held-out numbers during training;
  ``deit`` and ``ade20k-segmenter`` keep the papers' protocol (held out = ImageNet's / ADE20K's
  validation set, the set they report on), and ``train`` warns that choices made on it are made on test
  data.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..checks import Bool, Choice, Int, Real, Text, check_choice, check_real
from ..tasks import get as get_task
from ..tasks import names as task_names

__all__ = ["TrainConfig", "PRESETS", "DEVICES", "get_preset", "apply_overrides", "parse_override",
           "check_device"]

#: the devices a run may name (``auto``: CUDA when available, else CPU)
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


def check_device(device: Any, name: str = "device") -> str:
    """``device`` if it is one of :data:`DEVICES`; else a ``ValueError`` naming the valid ones."""
    return check_choice(device, name, DEVICES)


def _dict(v: Any, n: str) -> Any:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError(f"{n} must be a dict with string keys, e.g. {{'rpc_iters': 4}}; got {v!r}")
    return v


#: timm.create_model's keywords that load weights from elsewhere: a run's weights are its checkpoint's, and
#: nothing is downloaded at run time, so a config (a downloaded run's too) may not set them
LOADER_KEYWORDS = frozenset({"pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path",
                             "cache_dir", "pretrained_strict"})


def _model_kwargs(v: Any, n: str) -> Any:
    _dict(v, n)
    if bad := sorted(LOADER_KEYWORDS & set(v)):
        raise ValueError(f"{n} may not set {', '.join(bad)}: the weights come from the run's checkpoint (or "
                         "a timm NAME@FILE), never from a download or another file; remove them")
    return v


#: timm's learning-rate schedules (``timm.scheduler.create_scheduler_v2``'s names)
SCHEDULERS = ("constant", "cosine", "multistep", "plateau", "poly", "rsqrt", "step", "tanh")


def _check_optimizer(name: str) -> None:
    """``opt`` must be a name of timm's optimizer registry (optionally ``lookahead_<name>``)."""
    import timm.optim

    valid = timm.optim.list_optimizers()
    if name.lower().removeprefix("lookahead_") not in valid:
        raise ValueError(f"opt {name!r} is not an optimizer of timm's registry; valid: {', '.join(valid)} "
                         "(or lookahead_<name>)")


def _betas(v: Any, n: str) -> Any:
    if v is None:
        return v
    if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) or len(v) != 2:
        raise ValueError(f"{n} must be None or two numbers in [0, 1), e.g. (0.9, 0.999); got {v!r}")
    for b in v:
        check_real(b, f"{n} entry", min=0, max=1, max_open=True)
    return v


_PROBABILITY = Real(min=0, max=1)
_FRACTION = Real(min=0, max=1, max_open=True)
_POSITIVE = Real(min=0, min_open=True)
_NONNEGATIVE = Real(min=0)
_SEED = Int(min=0, max=2**63 - 1)

# One check per field: types and ranges, each raising a ValueError that names the field, the value
# and what is valid. A test makes sure every field of TrainConfig has one.
FIELD_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "task": lambda v, n: check_choice(v, n, task_names()), "model": Text(), "model_kwargs": _model_kwargs,
    "dataset": Text(), "data_root": Text(allow_none=True), "img_size": Int(min=1, allow_none=True),
    "train_subset": Int(min=1, allow_none=True), "eval_subset": Int(min=1, allow_none=True),
    "val_size": Int(min=1, allow_none=True), "val_seed": _SEED,
    "epochs": Int(min=1), "max_steps": Int(min=1, allow_none=True), "batch_size": Int(min=1),
    "eval_batch_size": Int(min=1), "opt": Text(), "lr": Real(min=0, min_open=True, allow_none=True),
    "lr_base": _POSITIVE, "lr_base_size": Int(min=1), "weight_decay": _NONNEGATIVE,
    "opt_eps": Real(min=0, min_open=True, allow_none=True), "opt_betas": _betas,
    "clip_grad": Real(min=0, min_open=True, allow_none=True),
    "sched": Choice(SCHEDULERS), "warmup_epochs": _NONNEGATIVE, "warmup_steps": Int(min=0, allow_none=True),
    "warmup_lr": _NONNEGATIVE, "min_lr": _NONNEGATIVE, "decay_rate": _POSITIVE, "sched_on_steps": Bool(),
    "drop_path": _FRACTION, "smoothing": _FRACTION, "mixup": _NONNEGATIVE, "cutmix": _NONNEGATIVE,
    "mixup_prob": _PROBABILITY, "mixup_switch_prob": _PROBABILITY,
    "mixup_mode": Choice(("batch", "pair", "elem")), "auto_augment": Text(allow_none=True),
    "color_jitter": _NONNEGATIVE, "reprob": _PROBABILITY, "remode": Choice(("pixel", "rand", "const")),
    "recount": Int(min=1), "augment": Bool(), "hflip": _PROBABILITY, "train_interpolation": Text(),
    "repeated_aug": Int(min=0), "model_ema": Bool(), "model_ema_decay": _PROBABILITY,
    "context": Int(min=1), "vocab": Choice(("word", "char")),
    "amp": Bool(allow_none=True), "compile": Bool(), "device": check_device, "num_workers": Int(min=0),
    "seed": _SEED, "output_dir": Text(),
    "checkpoint_every_steps": Int(min=1, allow_none=True), "log_every_steps": Int(min=1),
    "eval_every_epochs": Int(min=1), "progress": Bool(), "preset": Text(allow_none=True),
}  # fmt: skip


@dataclass
class TrainConfig:
    """Everything a training run depends on. ``None`` means "derived" (see the field comments)."""

    # --- what to train ---------------------------------------------------------------------
    task: str = "vision"  # a registered task (kpca_attention.tasks.names())
    model: str = "symvit_mini_patch4_28"
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"rpc_iters": 4, "rpc_lambda": 4}
    dataset: str = "fashion-mnist"
    data_root: str | None = None
    img_size: int | None = None  # None: the dataset's native size
    train_subset: int | None = None  # N training examples (images: a seeded sample; LM: the first N windows)
    eval_subset: int | None = None  # N held-out examples evaluated each epoch (as train_subset); None: all
    # the validation split: val_size training examples (drawn with val_seed, the same for every training
    # seed) held out for the per-epoch evaluation; None - the setting of runs made before it existed -
    # evaluates on the test split (image tasks); language models validate on the corpus's valid split
    val_size: int | None = None
    val_seed: int = 0
    # --- schedule ----------------------------------------------------------------------------
    epochs: int = 10
    max_steps: int | None = None  # stop after this many optimizer steps (the schedule still spans `epochs`)
    batch_size: int = 128  # per process
    eval_batch_size: int = 256
    # --- optimizer (timm.optim.create_optimizer_v2) -------------------------------------------
    opt: str = "adamw"
    lr: float | None = None  # None: lr_base * global_batch / lr_base_size (linear scaling rule)
    lr_base: float = 5e-4
    lr_base_size: int = 512
    weight_decay: float = 0.05
    opt_eps: float | None = None
    opt_betas: tuple[float, float] | None = None
    clip_grad: float | None = None
    # --- lr schedule (timm.scheduler.create_scheduler_v2) -------------------------------------
    sched: str = "cosine"
    warmup_epochs: float = 5.0
    warmup_steps: int | None = None  # overrides warmup_epochs; implies per-step scheduling
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    decay_rate: float = 0.1  # timm's decay_rate: step/multistep factor, or the power of sched="poly"
    sched_on_steps: bool = True  # update the lr every optimizer step (timm's step_update), not per epoch
    # --- regularisation and augmentation ------------------------------------------------------
    drop_path: float = 0.0
    smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    mixup_mode: str = "batch"
    auto_augment: str | None = None  # e.g. "rand-m9-mstd0.5-inc1"
    color_jitter: float = 0.3
    reprob: float = 0.0
    remode: str = "pixel"
    recount: int = 1
    augment: bool = True  # the dataset's training transform (small images: padded crop + flip)
    hflip: float = 0.5
    train_interpolation: str = "bicubic"
    repeated_aug: int = 0  # timm RepeatAugSampler repeats (only when world size > 1, as timm; else a warning)
    model_ema: bool = False
    model_ema_decay: float = 0.99996
    # --- language model -----------------------------------------------------------------------
    context: int = 256
    vocab: str = "word"  # "word" | "char"
    # --- runtime ------------------------------------------------------------------------------
    amp: bool | None = None  # None: on for CUDA, off on CPU
    # torch.compile the model for the training steps (inductor; evaluation stays eager): on a GPU the
    # mini models' steps are bound by Python (~150 ms of it per 8 ms of GPU work measured on an H100)
    compile: bool = False
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    num_workers: int = 0
    seed: int = 0
    output_dir: str = "runs/train"
    checkpoint_every_steps: int | None = None  # also checkpoint mid-epoch (resume stays exact)
    log_every_steps: int = 20
    eval_every_epochs: int = 1
    progress: bool = True
    preset: str | None = None  # name of the preset this config started from (informational)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range (:data:`FIELD_CHECKS`).

        Raises:
            ValueError: one line naming the field, the value and what is valid, e.g.
                ``"epochs must be an integer >= 1; got 'abc'"``. ``bool`` is not a number here.
        """
        for f in dataclasses.fields(self):
            FIELD_CHECKS[f.name](getattr(self, f.name), f.name)
        get_task(self.task).check_config(self)
        _check_optimizer(self.opt)
        if self.lr is not None:  # a derived peak depends on the processes: checked when training starts
            self.check_schedule()
        if self.opt_betas is not None:
            self.opt_betas = tuple(float(b) for b in self.opt_betas)  # JSON gives a list

    def check_schedule(self, world_size: int = 1) -> None:
        """A ValueError when ``min_lr`` (or, with a warm-up, ``warmup_lr``) is above the run's peak learning
        rate (:meth:`learning_rate` at ``world_size`` processes): the schedule (a warm-up from warmup_lr to
        the peak, a decay to min_lr) would rise past its peak. ``validate`` checks a given ``lr``; the
        training loop checks the linear scaling rule's once the number of processes is known."""
        warms = bool(self.warmup_steps) if self.warmup_steps is not None else self.warmup_epochs > 0
        peak = self.learning_rate(world_size)
        for name in ("min_lr", "warmup_lr") if warms else ("min_lr",):
            if getattr(self, name) > peak:
                if self.lr is not None:
                    raise ValueError(f"{name} {getattr(self, name)} is above lr {self.lr}: the schedule (a "
                                     "warm-up from warmup_lr to lr, a decay to min_lr) would rise past lr; "
                                     f"set {name} <= lr")
                raise ValueError(
                    f"{name} {getattr(self, name)} is above the learning rate {peak:.3g} that lr None "
                    f"derives (lr_base {self.lr_base} x global batch {self.batch_size * world_size} / "
                    f"lr_base_size {self.lr_base_size}): the schedule would rise past its peak; set lr, a "
                    f"larger batch, or {name} <= {peak:.3g}")

    # --- derived values -----------------------------------------------------------------------
    def learning_rate(self, world_size: int = 1) -> float:
        """The peak learning rate: ``lr`` if given, else the linear scaling rule."""
        if self.lr is not None:
            return self.lr
        return self.lr_base * self.batch_size * world_size / self.lr_base_size

    def warmup_length(self, updates_per_epoch: int) -> float:
        """The warm-up in epochs (``warmup_steps`` converted at ``updates_per_epoch``, else
        ``warmup_epochs``)."""
        if self.warmup_steps is not None:
            return self.warmup_steps / updates_per_epoch
        return self.warmup_epochs

    def warmup_note(self, updates_per_epoch: int) -> str | None:
        """A warning when the warm-up outlasts the schedule (the learning rate never reaches its peak),
        else None. Not refused: a recipe shortened for a smoke test (``--set epochs=1``) does this."""
        warm = self.warmup_length(updates_per_epoch)
        if warm <= self.epochs:
            return None
        what = f"warmup_epochs {self.warmup_epochs:g}"
        if self.warmup_steps is not None:
            what = (f"warmup_steps {self.warmup_steps} ({warm:.3g} epochs at {updates_per_epoch} updates "
                    "an epoch)")
        return (f"{what} outlasts epochs {self.epochs}: the learning rate ends in the warm-up at about "
                f"{self.epochs / warm:.0%} of the way from warmup_lr to lr and never decays")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {unknown}; valid: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls.from_dict(json.loads(text))


_DEIT = dict(
    task="vision", model="symvit_tiny_patch16_224", dataset="imagenet", img_size=224,
    epochs=300, batch_size=128, eval_batch_size=256,
    opt="adamw", lr=None, lr_base=5e-4, lr_base_size=512, weight_decay=0.05,
    sched="cosine", warmup_epochs=5.0, warmup_lr=1e-6, min_lr=1e-5, sched_on_steps=False,
    drop_path=0.1, smoothing=0.1, mixup=0.8, cutmix=1.0, mixup_prob=1.0, mixup_switch_prob=0.5,
    auto_augment="rand-m9-mstd0.5-inc1", color_jitter=0.3, reprob=0.25, remode="pixel", recount=1,
    train_interpolation="bicubic", repeated_aug=3, model_ema=True, model_ema_decay=0.99996,
    amp=None, num_workers=8, output_dir="runs/deit",
)

PRESETS: dict[str, dict[str, Any]] = {
    # DeiT steps the lr once per epoch (timm's sched_on_updates=False); so do we, but we do step it.
    "deit": _DEIT,
    # The paper's LM recipe: Adam, lr 2.5e-4, 2000 warm-up steps, batch 96, context 256. The paper
    # gives no decay; we decay by cosine to 0 over the run (documented in docs and the report).
    "lm": dict(
        task="lm", model="symlm", dataset="wikitext-103", vocab="word", context=256,
        epochs=20, batch_size=96, eval_batch_size=16, opt="adam", lr=2.5e-4, weight_decay=0.0,
        sched="cosine", warmup_steps=2000, warmup_lr=1e-7, min_lr=0.0, sched_on_steps=True,
        output_dir="runs/lm",
    ),
    # Minutes on a CPU: no Mixup/RandAugment (they slow convergence of short runs), mild smoothing.
    "fmnist-cpu": dict(
        task="vision", model="symvit_mini_patch4_28", dataset="fashion-mnist",
        epochs=4, batch_size=128, eval_batch_size=500, opt="adamw", lr=2e-3, weight_decay=0.05,
        sched="cosine", warmup_epochs=0.5, warmup_lr=1e-5, min_lr=1e-5, sched_on_steps=True,
        drop_path=0.0, smoothing=0.1, hflip=0.5, val_size=2000, output_dir="runs/fmnist",
    ),
    "digits-cpu": dict(
        task="vision", model="symvit_mini_patch4_28", dataset="digits",
        epochs=10, batch_size=64, eval_batch_size=256, opt="adamw", lr=2e-3, weight_decay=0.05,
        sched="cosine", warmup_epochs=1.0, warmup_lr=1e-5, min_lr=1e-5, sched_on_steps=True,
        smoothing=0.0, hflip=0.0, val_size=200, output_dir="runs/digits",
    ),
    # Segmenter's ADE20K recipe (official config: batch 8 in total, so pass batch_size=8 // processes).
    "ade20k-segmenter": dict(
        task="segmentation", model="segmenter_symvit_tiny_patch16_512", dataset="ade20k", img_size=512,
        epochs=64, batch_size=8, eval_batch_size=1, opt="sgd", lr=1e-3, weight_decay=0.0,
        sched="poly", decay_rate=0.9, warmup_epochs=0.0, warmup_lr=1e-6, min_lr=1e-5, sched_on_steps=True,
        drop_path=0.1, smoothing=0.0, hflip=0.5, eval_every_epochs=2, num_workers=8,
        output_dir="runs/ade20k-segmenter",
    ),
    # Minutes on a CPU: the mini encoder on 32-px Fashion-MNIST scenes with the linear decoder (at 32 px the
    # mask transformer ran at half the speed and learned slower in the first 150 steps: docs/segmentation.md),
    # AdamW (SGD at 1e-3 barely moves in a few thousand steps from scratch), flips only.
    "fmnist-seg-cpu": dict(
        task="segmentation", model="segmenter_symvit_mini_patch4_32", dataset="fashion-mnist-scenes",
        model_kwargs={"decoder": "linear"},
        img_size=32, epochs=2, train_subset=30000, val_size=1000, batch_size=64, eval_batch_size=250,
        opt="adamw", lr=3e-3, weight_decay=0.05, sched="cosine", warmup_epochs=0.1, warmup_lr=1e-5,
        min_lr=1e-5, sched_on_steps=True, smoothing=0.0, hflip=0.5, output_dir="runs/fmnist-seg",
    ),
    "bible-cpu": dict(
        task="lm", model="symlm", dataset="bible-kjv", vocab="char", context=128,
        model_kwargs={"preset": "small"},
        epochs=1, train_subset=9600, batch_size=32, eval_batch_size=32, eval_subset=64,
        opt="adam", lr=1e-3, weight_decay=0.0, sched="cosine", warmup_steps=50, warmup_lr=1e-6,
        min_lr=1e-5, sched_on_steps=True, output_dir="runs/bible",
    ),
}


def get_preset(name: str, **overrides: Any) -> TrainConfig:
    """The :class:`TrainConfig` of preset ``name`` with keyword ``overrides`` applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    data = {**PRESETS[name], "preset": name}
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    data.update(overrides)
    return TrainConfig.from_dict(data)


def parse_override(item: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, value)``; the value is a Python literal when it parses as one
    (``lr=1e-3``, ``amp=False``, ``img_size=None``, ``opt_betas=(0.9,0.95)``), else a string.
    ``model_kwargs.rpc_iters=6`` sets one entry of a dict field."""
    if "=" not in item:
        raise ValueError(f"override {item!r} must look like key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = raw.strip()
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        value = lowered == "true"
    elif lowered in ("none", "null"):
        value = None
    return key, value


def apply_overrides(cfg: TrainConfig, items: list[str] | dict[str, Any]) -> TrainConfig:
    """A new config with ``key=value`` strings (or a mapping) applied.

    Each value is checked as it is applied, so an error names the key it came from (``--set
    epochs=abc``: ``"epochs must be an integer >= 1; got 'abc'"``); unknown keys are an error. Values
    of ``model_kwargs.NAME`` keys are checked by the model when it is built."""
    pairs = list(items.items()) if isinstance(items, dict) else [parse_override(s) for s in items]
    keys = [k for k, _ in pairs]
    if twice := sorted({k for k in keys if keys.count(k) > 1 and isinstance(k, str)}):
        raise ValueError(f"{', '.join(twice)} set twice: give each key once")
    data = cfg.to_dict()
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for key, value in pairs:
        if not isinstance(key, str) or not key:
            raise ValueError(f"override keys must be non-empty field names; got {key!r}")
        if "." in key:
            head, sub = key.split(".", 1)
            if head not in fields or not isinstance(data.get(head), dict) or not sub:
                raise ValueError(f"{key!r}: only dict fields (model_kwargs) take dotted keys")
            data[head] = {**data[head], sub: value}
        elif key not in fields:
            raise ValueError(f"unknown config key {key!r}; valid: {', '.join(sorted(fields))}")
        else:
            FIELD_CHECKS[key](value, key)  # names the key, whatever else is wrong
            data[key] = value
    return TrainConfig.from_dict(data)
