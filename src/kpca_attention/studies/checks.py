"""Study-wide checks (:class:`~kpca_attention.studies.spec.Check`): measurements over all variants at
once rather than per run."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from .spec import Study

__all__ = ["training_throughput", "throughput_check"]


def training_throughput(study: Study, runs: dict[tuple[str, int], Path], *, repeats: int = 7,
                        steps: int = 3, batch_size: int | None = None) -> dict[str, float]:
    """Training images/s of each variant (forward, backward, AdamW step on a fixed batch), measured
    side by side in this process with interleaved repeats (median): on a shared CPU the training
    loops' own images/s depend on what else ran at the time, this comparison much less (paper Table 11's
    ratio). The input shape comes from the study's dataset."""
    from ..models import create_model

    cfg = study.train_config(study.variants[0], study.seeds[0], "x")
    bs = batch_size or cfg.batch_size
    from ..data.images import build_image_dataset

    x0, _ = build_image_dataset(cfg.dataset, "test")[0]
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(bs, *x0.shape, generator=gen)
    y = torch.randint(0, 10, (bs,), generator=gen)
    nets = {}
    for v in study.variants:
        torch.manual_seed(0)
        net = create_model(v.model, num_classes=10, in_chans=x0.shape[0], **dict(v.kwargs)).train()
        nets[v.slug] = (net, torch.optim.AdamW(net.parameters(), lr=1e-4))

    def run(slug: str, n: int) -> float:
        net, opt = nets[slug]
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return bs * n / (time.perf_counter() - t0)

    for slug in nets:  # warm-up
        run(slug, 1)
    rates: dict[str, list[float]] = {slug: [] for slug in nets}
    for _ in range(repeats):
        for slug in nets:
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
