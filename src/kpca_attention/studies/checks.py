"""Study-wide checks (:class:`~kpca_attention.studies.spec.Check`): measurements over all variants at
once rather than per run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .spec import Study, Variant

__all__ = ["training_throughput", "throughput_check", "step_peak_memory", "training_cost",
           "cost_check", "CostInputs", "cost_inputs"]


Loss = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def _cross_entropy(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(net(x), y)


@dataclass
class CostInputs:
    """What the checks time: ``{slug: (net, AdamW)}`` (every variant built with seed 0), one fixed batch
    ``(x, y)``, the training loss, the unit of throughput (``images`` / ``tokens``) and how many of them one
    batch holds (the task's own count, as training logs it)."""

    nets: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]
    x: torch.Tensor
    y: torch.Tensor
    loss: Loss
    unit: str
    per_step: int


def cost_inputs(study: Study, batch_size: int | None = None) -> CostInputs:
    """What the cost checks time for ``study`` (``batch_size``: default the recipe's). Image studies: a
    random batch of the dataset's image shape and cross-entropy over 10 classes. Token studies (a language
    model): the first training windows of the study's corpus and the task's own next-token loss, each
    variant built by its task (its vocabulary, context and size)."""
    from ..tasks import get as get_task

    cfg = study.train_config(study.variants[0], study.seeds[0], "x")
    bs = batch_size or cfg.batch_size
    task = get_task(cfg.task)
    unit = task.throughput_key.removesuffix("_per_s")  # what training logs: images, tokens
    if task.takes_tokens:
        splits = task.datasets(cfg, with_eval=False)
        x, y = (torch.stack(t) for t in zip(*(splits.train[i] for i in range(bs)), strict=True))
        loss = task.objective(cfg, splits.info).loss

        def build(v: Variant) -> torch.nn.Module:
            return task.build_model(study.train_config(v, study.seeds[0], "x"), splits.info)
    else:
        from ..data.images import build_image_dataset
        from ..models import create_model

        x0, _ = build_image_dataset(cfg.dataset, "test")[0]
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(bs, *x0.shape, generator=gen)
        y = torch.randint(0, 10, (bs,), generator=gen)
        loss = _cross_entropy

        def build(v: Variant) -> torch.nn.Module:
            return create_model(v.model, num_classes=10, in_chans=x0.shape[0], **dict(v.kwargs))
    nets = {}
    for v in study.variants:  # each built from the same seed
        torch.manual_seed(0)
        net = build(v).train()
        nets[v.slug] = (net, torch.optim.AdamW(net.parameters(), lr=1e-4))
    return CostInputs(nets, x, y, loss, unit, task.count(y))


def _step(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          loss: Loss = _cross_entropy) -> None:
    opt.zero_grad(set_to_none=True)
    loss(net, x, y).backward()
    opt.step()


def step_peak_memory(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                     y: torch.Tensor, loss: Loss = _cross_entropy) -> float:
    """Peak CPU tensor memory (MiB) allocated during one training step (forward, backward, AdamW step)
    above what was live before it, from ``torch.profiler``'s CPU memory records (``profile_memory=True``):
    the net allocation of each operator, accumulated in the order the operators start. Memory an operator
    allocates and frees inside itself is not seen, so this is a lower bound of the true peak; it counts the
    activations kept for backward, the gradients and the temporaries between operators. (``tracemalloc``
    does not see tensor storage: torch allocates it outside Python's allocator.) Run one step first, so that
    the optimizer state already exists."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _step(net, opt, x, y, loss)
    cur = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak / 2**20


def training_throughput(study: Study, runs: dict[tuple[str, int], Path], *, repeats: int = 7,
                        steps: int = 3, batch_size: int | None = None) -> dict[str, float]:
    """Training images/s (tokens/s for a language model) of each variant (forward, backward, AdamW step
    on a fixed batch), measured side by side in this process with interleaved repeats (median): on a shared
    CPU the training loops' own speeds depend on what else ran at the time, this comparison much less
    (paper Table 11's ratio). The input shape comes from the study's dataset."""
    return _rates(cost_inputs(study, batch_size), repeats, steps)


def _rates(b: CostInputs, repeats: int, steps: int) -> dict[str, float]:
    def run(slug: str, n: int) -> float:
        net, opt = b.nets[slug]
        t0 = time.perf_counter()
        for _ in range(n):
            _step(net, opt, b.x, b.y, b.loss)
        return b.per_step * n / (time.perf_counter() - t0)

    for slug in b.nets:  # warm-up
        run(slug, 1)
    rates: dict[str, list[float]] = {slug: [] for slug in b.nets}
    for _ in range(repeats):
        for slug in b.nets:
            rates[slug].append(run(slug, steps))
    return {slug: statistics.median(r) for slug, r in rates.items()}


def throughput_check(repeats: int = 7):
    """A :class:`Check` measuring :func:`training_throughput` with ``repeats`` interleaved repeats."""
    from .spec import Check

    return Check("throughput", "Training throughput side by side (images/s, median of interleaved repeats)",
                 _ThroughputRun(repeats), key={"repeats": repeats, "threads": torch.get_num_threads()})


class _ThroughputRun:
    """Picklable callable (studies may run in worker processes)."""

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats

    def __call__(self, study: Study, runs: dict[tuple[str, int], Path]) -> dict[str, float]:
        return training_throughput(study, runs, repeats=self.repeats)


def training_cost(study: Study, runs: dict[tuple[str, int], Path], *, repeats: int = 7, steps: int = 3,
                  batch_size: int | None = None) -> list[dict[str, object]]:
    """Training throughput and peak memory of every variant side by side: one row per variant with its
    images/s or tokens/s (:func:`training_throughput`'s interleaved median), the peak tensor memory of one
    training step (:func:`step_peak_memory`, MiB, at the recipe's batch size) and both as ratios to the
    study's baseline."""
    b = cost_inputs(study, batch_size)
    rates = _rates(b, repeats, steps)  # warms every net up: the optimizer state exists
    peak = {slug: step_peak_memory(net, opt, b.x, b.y, b.loss) for slug, (net, opt) in b.nets.items()}
    base = study.baseline
    label = {v.slug: v.label for v in study.variants}
    return [{"variant": label[s], f"{b.unit}/s": rates[s], f"speed vs {label[base]}": rates[s] / rates[base],
             "peak MiB": peak[s], f"memory vs {label[base]}": peak[s] / peak[base] if peak[base] else None}
            for s in b.nets]


def cost_check(repeats: int = 7):
    """A :class:`Check` measuring :func:`training_cost` (throughput and peak memory side by side)."""
    from .spec import Check

    return Check("cost", "Training throughput and peak memory side by side (images/s or tokens/s: median "
                 "of interleaved repeats; peak MiB: tensor memory of one training step from torch.profiler's "
                 "CPU memory records, a lower bound)", _CostRun(repeats),
                 key={"repeats": repeats, "threads": torch.get_num_threads(), "memory": "torch.profiler"})


class _CostRun(_ThroughputRun):
    def __call__(self, study: Study, runs: dict[tuple[str, int], Path]) -> list[dict[str, object]]:
        return training_cost(study, runs, repeats=self.repeats)
