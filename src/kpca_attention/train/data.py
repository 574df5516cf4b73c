"""Data loading for training: samplers whose order and augmentation are functions of the seed.

* The order of epoch ``e`` comes from an epoch-seeded sampler (torch ``DistributedSampler``, also in
  one process, or timm's ``RepeatAugSampler`` for repeated augmentation under DDP).
* :class:`SeededSampler` pairs every index with a seed derived from ``(seed, epoch, rank, position)``
  and :class:`SeededAugmentation` runs the dataset's random transform under that seed (python,
  numpy and torch RNGs, restored afterwards). So augmentation does not depend on worker processes or
  on what ran before, and a mid-epoch resume can skip the first ``k`` batches without loading them.
  Repeated augmentation keeps its point: the repeats of one image sit at different positions and get
  different seeds.
* In-memory image datasets (Fashion-MNIST, digits) skip the ``DataLoader``: :class:`DeviceBatches` makes
  each batch in one vectorised step where the model is, from the same indices and seeds, to the same
  values (their transform draws from a generator seeded per image:
  :class:`~kpca_attention.data.images.CropFlip`).
* Every ``DataLoader`` gets its own ``torch.Generator``: creating an iterator otherwise draws a base
  seed from the global torch RNG, which would make the training trajectory depend on when
  iterators were created (and break exact resume).
"""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset

from ..tasks import get as get_task
from .config import TrainConfig
from .distributed import DistInfo

__all__ = [
    "SeededSampler",
    "SeededAugmentation",
    "DeviceBatches",
    "seeded_source",
    "seeded_rngs",
    "preserved_rngs",
    "mix_seed",
    "Loaders",
    "build_loaders",
    "shard",
]

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 steps): cheap, well mixed, platform independent."""
    z = 0x9E3779B97F4A7C15
    for p in parts:
        z = (z ^ (int(p) & _MASK64)) & _MASK64
        z = (z + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z = z ^ (z >> 31)
    return z >> 1


@contextmanager
def preserved_rngs() -> Iterator[None]:
    """Run a block without disturbing python's, numpy's and torch's (CPU, CUDA) global RNGs."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextmanager
def seeded_rngs(seed: int) -> Iterator[None]:
    """Seed python, numpy and torch (CPU) with ``seed`` inside the block; restore them after."""
    with preserved_rngs():
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        torch.manual_seed(seed)
        yield


def draws_random(ds: Dataset) -> bool:
    """Whether items of ``ds`` may draw random numbers: its ``random_items`` attribute (through
    ``Subset`` wrappers), True for datasets that do not say."""
    while isinstance(ds, Subset):
        ds = ds.dataset
    return bool(getattr(ds, "random_items", True))


def seeded_source(ds: Dataset) -> tuple[Any, Tensor] | None:
    """``(dataset, index map)`` when the dataset under ``ds``'s ``Subset`` wrappers makes its items from
    seeds it is given (``seeded_items``: :class:`kpca_attention.data.images.TensorImageDataset`), the map
    taking ``ds``'s indices to that dataset's; ``None`` for any other dataset."""
    chain = []
    while isinstance(ds, Subset):
        chain.append(ds.indices)
        ds = ds.dataset
    if not getattr(ds, "seeded_items", False):
        return None
    index = torch.arange(len(ds))  # type: ignore[arg-type]
    for indices in reversed(chain):  # the innermost Subset first
        index = index[torch.as_tensor(list(indices), dtype=torch.long)]
    return ds, index


class SeededAugmentation(Dataset):
    """``ds[(index, seed)]`` = ``base[index]`` computed under :func:`seeded_rngs` ``(seed)``.

    Items of a dataset that draws no random numbers (:func:`draws_random`; e.g. Fashion-MNIST without
    augmentation) are returned as they are: seeding and restoring python's, numpy's and torch's
    generators costs ~0.6 ms per item, which was 87 ms of every 128-image batch - about a third of a
    CPU training step of the mini ViT, and the whole step on a GPU. An in-memory dataset that takes the
    seed itself (:func:`seeded_source`) makes the item from it directly, without touching the global
    generators. The values are the same either way."""

    def __init__(self, base: Dataset) -> None:
        self.base = base
        self.seeded = draws_random(base)
        self.source = seeded_source(base)

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, item: tuple[int, int]) -> Any:
        index, seed = item
        if self.source is not None:
            ds, index_map = self.source
            x, y = ds.seeded_batch(index_map[index : index + 1], [seed])
            return x[0], int(y[0])
        if not self.seeded:
            return self.base[index]
        with seeded_rngs(seed):
            return self.base[index]


class DeviceBatches:
    """The training batches of an in-memory dataset (:func:`seeded_source`), each made in one vectorised
    step on ``device``: the sampler's ``(index, seed)`` pairs taken ``batch_size`` at a time (an incomplete
    last batch dropped, as the ``DataLoader`` does with ``drop_last``), the images gathered where the
    model is and augmented there. The same batches, to the bit, as a ``DataLoader`` over ``dataset`` with
    any number of loader processes - without a Python call per image (on a GPU the per-image loader was
    the limit: ``docs/training.md``). ``num_workers`` does not apply: nothing is left for a worker to do."""

    def __init__(self, dataset: SeededAugmentation, sampler: SeededSampler, batch_size: int,
                 device: torch.device) -> None:
        if dataset.source is None:
            raise TypeError("DeviceBatches needs an in-memory dataset that takes its items' seeds")
        self.dataset, self.sampler, self.batch_size, self.device = dataset, sampler, batch_size, device

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        ds, index_map = self.dataset.source  # type: ignore[misc]
        pairs = iter(self.sampler)
        while len(chunk := list(itertools.islice(pairs, self.batch_size))) == self.batch_size:
            indices = index_map[torch.tensor([i for i, _ in chunk], dtype=torch.long)]
            yield ds.seeded_batch(indices, [s for _, s in chunk], self.device)


class SeededSampler(Sampler):
    """Yields ``(index, sample_seed)`` from an epoch-seeded ``base`` sampler, optionally starting at
    position ``start`` of the epoch (mid-epoch resume). ``set_epoch`` resets ``start`` to 0."""

    def __init__(self, base: Sampler, seed: int, rank: int = 0) -> None:
        self.base, self.seed, self.rank = base, seed, rank
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for pos, index in enumerate(self.base):
            if pos >= self.start:
                yield int(index), mix_seed(self.seed, self.epoch, self.rank, pos)

    def __len__(self) -> int:
        return max(len(self.base) - self.start, 0)  # type: ignore[arg-type]


def shard(dataset: Dataset, dist: DistInfo) -> Dataset:
    """Rank ``r`` of ``w`` gets items ``r, r + w, ...`` (evaluation: every item exactly once)."""
    if not dist.distributed:
        return dataset
    return Subset(dataset, range(dist.rank, len(dataset), dist.world_size))  # type: ignore[arg-type]


@dataclass
class Loaders:
    train: DataLoader | DeviceBatches
    eval: DataLoader | None
    sampler: SeededSampler
    info: dict[str, Any]  # what the model is built with (the task's Splits.info)

    @property
    def updates_per_epoch(self) -> int:
        return len(self.sampler.base) // self.train.batch_size  # type: ignore[arg-type, operator]


def _repeat_aug_sampler(train_set: Dataset, cfg: TrainConfig, dist: DistInfo) -> Sampler:
    """timm's ``RepeatAugSampler`` (DeiT's repeated augmentation), its shuffle seeded by (seed, epoch): timm
    seeds it with the epoch alone, which gave every training seed the same data order."""
    from timm.data.distributed_sampler import RepeatAugSampler

    class SeededRepeatAugSampler(RepeatAugSampler):
        def set_epoch(self, epoch: int) -> None:
            super().set_epoch(mix_seed(cfg.seed, epoch))  # timm reads the epoch only as the shuffle's seed

    sampler = SeededRepeatAugSampler(train_set, num_replicas=dist.world_size, rank=dist.rank, shuffle=True,
                                     num_repeats=cfg.repeated_aug)
    sampler.set_epoch(0)
    return sampler


def _base_sampler(train_set: Dataset, cfg: TrainConfig, dist: DistInfo) -> Sampler:
    if dist.distributed and cfg.repeated_aug > 1:
        return _repeat_aug_sampler(train_set, cfg, dist)
    if cfg.repeated_aug > 1:  # as timm's train.py: repeats are spread over processes, so one has none
        warnings.warn(f"repeated_aug={cfg.repeated_aug} is not applied: repeated augmentation (timm's "
                      "RepeatAugSampler) runs with more than one process (torchrun), and this run has one",
                      stacklevel=2)
    # DistributedSampler also in one process: epoch-seeded shuffling with our seed.
    return DistributedSampler(train_set, num_replicas=dist.world_size, rank=dist.rank,
                              shuffle=True, seed=cfg.seed, drop_last=True)


def _loader(ds: Dataset, batch_size: int, cfg: TrainConfig, dist: DistInfo, *, sampler: Sampler | None,
            drop_last: bool, seed: int) -> DataLoader:
    return DataLoader(
        ds, batch_size=batch_size, sampler=sampler, shuffle=False, drop_last=drop_last,
        num_workers=cfg.num_workers, pin_memory=dist.device.type == "cuda",
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=False,  # workers must see the sampler's new epoch
    )


def build_loaders(cfg: TrainConfig, dist: DistInfo, *, with_eval: bool = True) -> Loaders:
    """The training loader and the held-out one (the validation split; see
    :meth:`kpca_attention.tasks.Task.datasets`) of ``cfg``'s task."""
    splits = get_task(cfg.task).datasets(cfg, with_eval=with_eval)
    train_set, eval_set, info = splits.train, splits.held_out, splits.info
    if len(train_set) < cfg.batch_size * dist.world_size:
        raise ValueError(
            f"training set has {len(train_set)} examples, fewer than one global batch "
            f"({cfg.batch_size} x {dist.world_size} processes); lower batch_size or raise train_subset"
        )
    sampler = SeededSampler(_base_sampler(train_set, cfg, dist), cfg.seed, dist.rank)
    items = SeededAugmentation(train_set)
    train: DataLoader | DeviceBatches
    if items.source is not None:  # in memory: whole batches made where the model is
        train = DeviceBatches(items, sampler, cfg.batch_size, dist.device)
    else:
        train = _loader(items, cfg.batch_size, cfg, dist, sampler=sampler, drop_last=True,
                        seed=mix_seed(cfg.seed, dist.rank, 1))
    ev = None
    if eval_set is not None:
        ev = _loader(shard(eval_set, dist), cfg.eval_batch_size, cfg, dist, sampler=None,
                     drop_last=False, seed=mix_seed(cfg.seed, dist.rank, 2))
    return Loaders(train=train, eval=ev, sampler=sampler, info=info)
