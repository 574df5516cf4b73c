"""Language-model side of training: corpus -> vocabulary -> token windows, model construction, and the
paper's sliding-window perplexity for ``kpca-attention evaluate``.

The vocabulary is built from the TRAIN split (deterministic order, :meth:`Vocab.build`) and stored in
every checkpoint as ``vocab.json``; :func:`kpca_attention.train.load_model` attaches it to the model as
``model.vocab`` so evaluation and attacks encode text exactly as training did.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from .config import TrainConfig

__all__ = [
    "TokenWindows", "build_vocab", "build_lm", "lm_datasets", "lm_sliding_perplexity", "corpus_windows",
]


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
def _corpus(name: str, root: str | None) -> Any:
    from ..data.text import load_corpus

    return load_corpus(name, root)


def build_vocab(cfg: TrainConfig) -> Any:
    from ..data.text import Vocab

    return Vocab.build(_corpus(cfg.dataset, cfg.data_root).train, level=cfg.vocab)


def corpus_windows(cfg: TrainConfig, n: int, *, split: str = "valid", vocab: Any | None = None) -> Tensor:
    """The first ``n`` consecutive windows of ``cfg.context`` tokens of a corpus split, ``(n, context)``,
    encoded with the run's vocabulary (default: the one built from the training split, as training
    builds it): the inputs of the PAP trace and the KPCA analysis of a trained LM."""
    if n < 1:
        raise ValueError(f"the number of windows must be >= 1, got {n}")
    corpus = _corpus(cfg.dataset, cfg.data_root)
    ids = (vocab if vocab is not None else build_vocab(cfg)).encode(corpus.split(split))
    need = n * cfg.context
    if need > ids.numel():
        raise ValueError(f"{n} windows of {cfg.context} tokens need {need} tokens; the {split} split of "
                         f"{cfg.dataset} has {ids.numel()}")
    return ids[:need].view(n, cfg.context)


def build_lm(cfg: TrainConfig, vocab: Any | None = None) -> nn.Module:
    """The LM of ``cfg`` (``model_kwargs``: ``preset`` of ``LM_PRESETS`` plus ``LMConfig`` fields);
    ``vocab`` defaults to the one built from the corpus."""
    from ..models import create_model

    vocab = vocab if vocab is not None else build_vocab(cfg)
    kw = dict(cfg.model_kwargs)
    kw.setdefault("context", cfg.context)
    model = create_model(cfg.model, vocab_size=len(vocab), **kw)
    model.vocab = vocab  # plain attribute (not a module): for evaluation and attacks
    return model


def lm_datasets(cfg: TrainConfig, *, with_eval: bool = True) -> tuple[Dataset, Dataset | None, dict]:
    corpus = _corpus(cfg.dataset, cfg.data_root)
    vocab = build_vocab(cfg)
    train = TokenWindows(vocab.encode(corpus.train), cfg.context, random_offset=cfg.augment,
                         limit=cfg.train_subset)
    ev = None
    if with_eval:
        ev = TokenWindows(vocab.encode(corpus.valid), cfg.context, limit=cfg.eval_subset)
    return train, ev, {"vocab": vocab, "vocab_size": len(vocab)}


def lm_sliding_perplexity(model: nn.Module, cfg: TrainConfig, *, split: str = "valid",
                          subset: int | None = None, stride: int = 1, batch_size: int = 64,
                          device: Any = "cpu", progress: bool = True) -> dict[str, float]:
    """Perplexity of a split with the paper's protocol (:func:`kpca_attention.models.lm.perplexity`,
    window = the training context, ``stride`` 1 = exact); ``subset`` keeps the first N tokens."""
    from ..models.lm import perplexity

    split = {"val": "valid"}.get(split, split)
    vocab = getattr(model, "vocab", None)
    if vocab is None:
        raise ValueError("the model has no .vocab: load it with kpca_attention.train.load_model")
    ids = vocab.encode(_corpus(cfg.dataset, cfg.data_root).split(split))
    if subset is not None:
        ids = ids[:subset]
    model.to(device)
    ppl = perplexity(model, ids, context=cfg.context, batch_size=batch_size, stride=stride, progress=progress)
    return {"ppl": ppl, "tokens": float(ids.numel()), "stride": float(stride), "context": float(cfg.context)}
