"""The data of the language task: corpus -> vocabulary -> token windows.

The vocabulary is built from the TRAIN split (deterministic order, :meth:`Vocab.build`) and stored in
every checkpoint as ``vocab.json``; :func:`kpca_attention.train.load_model` attaches it to the model as
``model.vocab`` so evaluation and attacks encode text exactly as training did.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["TokenWindows", "build_vocab", "corpus", "corpus_windows"]


class TokenWindows(Dataset):
    """Windows of ``context`` tokens: item ``i`` is ``(ids[s : s + L], ids[s + 1 : s + L + 1])`` with
    ``s = i * L`` (+ a random offset in ``[0, L)`` when ``random_offset``, drawn from torch's RNG: under
    training's per-sample seeding that offset is a function of (seed, epoch, position), so window
    boundaries change from epoch to epoch and resume stays exact)."""

    def __init__(self, ids: Tensor, context: int, *, random_offset: bool = False,
                 limit: int | None = None) -> None:
        if ids.dim() != 1:
            raise ValueError(f"ids must be 1-D, got {tuple(ids.shape)}")
        self.ids, self.context, self.random_offset = ids, context, random_offset
        usable = ids.numel() - 1 - (context if random_offset else 0)
        n = max(usable // context, 0)
        self.n = min(n, limit) if limit is not None else n
        if self.n < 1:
            raise ValueError(f"text of {ids.numel()} tokens gives no window of {context} tokens")

    def __len__(self) -> int:
        return self.n

    @property
    def random_items(self) -> bool:
        """Whether an item draws random numbers (a random window offset)."""
        return bool(self.random_offset)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        s = i * self.context
        if self.random_offset:
            s += int(torch.randint(self.context, ()))
        chunk = self.ids[s : s + self.context + 1]
        return chunk[:-1], chunk[1:]


@functools.lru_cache(maxsize=2)
def corpus(name: str, root: str | None) -> Any:
    """The :class:`~kpca_attention.data.text.TextCorpus` ``name`` (cached: read once per process)."""
    from ...data.text import load_corpus

    return load_corpus(name, root)


def build_vocab(cfg: Any) -> Any:
    """The vocabulary of ``cfg`` (``cfg.vocab`` level) built from its corpus's TRAIN split."""
    from ...data.text import Vocab

    return Vocab.build(corpus(cfg.dataset, cfg.data_root).train, level=cfg.vocab)


def corpus_windows(cfg: Any, n: int, *, split: str = "valid", vocab: Any | None = None) -> Tensor:
    """The first ``n`` consecutive windows of ``cfg.context`` tokens of a corpus split, ``(n, context)``,
    encoded with the run's vocabulary (default: the one built from the training split, as training
    builds it): the inputs of the PAP trace and the KPCA analysis of a trained LM."""
    if n < 1:
        raise ValueError(f"the number of windows must be >= 1, got {n}")
    text = corpus(cfg.dataset, cfg.data_root).split(split)
    ids = (vocab if vocab is not None else build_vocab(cfg)).encode(text)
    need = n * cfg.context
    if need > ids.numel():
        raise ValueError(f"{n} windows of {cfg.context} tokens need {need} tokens; the {split} split of "
                         f"{cfg.dataset} has {ids.numel()}")
    return ids[:need].view(n, cfg.context)
