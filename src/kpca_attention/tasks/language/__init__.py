"""Causal language modelling (``TrainConfig.task = "lm"``): the causal LMs of
:mod:`kpca_attention.models.lm` on a corpus (:mod:`kpca_attention.data.text`), next-token cross-entropy,
perplexity held out, throughput in tokens/s, the suites of :mod:`.suites` (sliding-window perplexity and
word swap, per-token NLL; mu / tau along the sequence) and the report sections of :mod:`.report`.

The validation split is the corpus's own ``valid`` split: text disjoint from ``train`` and ``test`` (the
King James Bible: whole chapters, see :mod:`kpca_attention.data.text`), so ``val_size`` is not used.
The vocabulary is built from the train split and stored in every checkpoint as ``vocab.json``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ...checks import check_count
from ..base import Objective, Splits, StudySections, Task, autocast, sum_over_loader
from .data import TokenWindows, build_vocab, corpus, corpus_windows
from .suites import LMSuites

__all__ = ["CausalLanguageModelling", "evaluate_lm", "TokenWindows", "build_vocab", "corpus",
           "corpus_windows", "VOCAB_FILE"]

#: the vocabulary's file in a checkpoint
VOCAB_FILE = "vocab.json"


@torch.no_grad()
def evaluate_lm(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device | str = "cpu",
    *,
    amp: bool = False,
    progress: bool = False,
    desc: str = "eval",
) -> dict[str, float]:
    """Token-level cross-entropy and perplexity over non-overlapping windows ``(x, y)`` (B, L).

    This is the fast per-epoch estimate; the paper's sliding-window protocol is
    :func:`kpca_attention.models.lm.perplexity` (used by ``kpca-attention evaluate``)."""
    device = torch.device(device)

    def step(x: torch.Tensor, y: torch.Tensor, sums: torch.Tensor) -> None:  # loss_sum, tokens
        with autocast(device, amp):
            _, loss = model(x, y)
        sums[0] += loss.double() * y.numel()
        sums[1] += y.numel()

    sums = sum_over_loader(model, loader, device, 2, step, progress=progress, desc=desc, counted=1,
                           unit="tokens")
    n = sums[1].item()
    mean = sums[0].item() / n
    return {"loss": mean, "ppl": math.exp(min(mean, 700.0)), "tokens": int(sums[1].item())}


class CausalLanguageModelling(Task):
    """Causal language modelling (see the module docstring)."""

    name = "lm"
    title = "causal language modelling"
    unit = "windows"
    throughput_key = "tokens_per_s"
    held_out_metrics = ("loss", "ppl")
    takes_tokens = True
    causal = True
    suites_type = LMSuites
    config_fields = frozenset({"context", "vocab"})
    evaluate_options = {"stride": 1}

    def owns(self, model: nn.Module) -> bool:
        from ...models.lm import CausalLM

        return isinstance(model, CausalLM)

    def owns_name(self, name: str) -> bool:
        from ...models.lm import FAMILY_LM_MODELS, LM_MODELS

        return name in LM_MODELS or name in FAMILY_LM_MODELS

    def check_config(self, cfg: Any) -> None:
        for name, default in (("val_size", None), ("val_seed", 0)):  # no split is drawn: nothing to seed
            if getattr(cfg, name) != default:
                raise ValueError(f"task {self.name!r} validates on the corpus's own valid split (text "
                                 f"disjoint from train and test): {name} must be {default}, got "
                                 f"{getattr(cfg, name)}")

    def datasets(self, cfg: Any, *, with_eval: bool = True) -> Splits:
        """Windows of the train split (a random offset per epoch when ``cfg.augment``; ``train_subset``:
        the first N windows) and of the valid split (``eval_subset``: the first N)."""
        text = corpus(cfg.dataset, cfg.data_root)
        vocab = build_vocab(cfg)
        train = TokenWindows(vocab.encode(text.train), cfg.context, random_offset=cfg.augment,
                             limit=cfg.train_subset)
        held = None
        if with_eval:
            held = TokenWindows(vocab.encode(text.valid), cfg.context, limit=cfg.eval_subset)
        return Splits(train, held, {"vocab": vocab, "vocab_size": len(vocab)})

    def test_set(self, cfg: Any) -> Any:
        """The corpus (its ``test`` and ``valid`` splits are scored by the suites)."""
        return corpus(cfg.dataset, cfg.data_root)

    def sample_tokens(self, cfg: Any, n: int, vocab: Any) -> tuple[torch.Tensor, str]:
        """The first ``n`` windows of ``cfg.context`` tokens of the corpus's valid split."""
        windows = corpus_windows(cfg, n, split="valid", vocab=vocab)
        return windows, f"{cfg.dataset} (valid split, first {len(windows)} windows of {cfg.context} tokens)"

    def build_model(self, cfg: Any, info: Mapping[str, Any] | None = None) -> nn.Module:
        """The LM of ``cfg`` (``model_kwargs``: ``preset`` of ``LM_PRESETS`` plus ``LMConfig`` fields), with
        the vocabulary (``info["vocab"]``, default: built from the corpus) as ``model.vocab``."""
        from ...models import create_model

        vocab = (info or {}).get("vocab")
        vocab = vocab if vocab is not None else build_vocab(cfg)
        kw = dict(cfg.model_kwargs)
        kw.setdefault("context", cfg.context)
        model = create_model(cfg.model, vocab_size=len(vocab), **kw)
        model.vocab = vocab  # plain attribute (not a module): for evaluation and attacks
        return model

    def checkpoint_files(self, info: Mapping[str, Any]) -> dict[str, Callable[[Path], None]]:
        return {VOCAB_FILE: info["vocab"].save}

    def checkpoint_info(self, cfg: Any, ckpt: Path) -> dict[str, Any]:
        from ...data.text import Vocab

        vf = Path(ckpt) / VOCAB_FILE
        try:
            return {"vocab": Vocab.load(vf)}
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"language-model vocabulary {vf} is missing or invalid: {e}") from e

    def objective(self, cfg: Any, info: Mapping[str, Any]) -> Objective:
        """Next-token cross-entropy, as the model computes it (``model(x, y) -> (logits, loss)``)."""
        return Objective(lambda net, x, y: net(x, y)[1])

    def count(self, y: torch.Tensor) -> int:
        return int(y.numel())  # tokens

    def evaluate(self, model: nn.Module, loader: Any, device: torch.device | str, *, cfg: Any,
                 amp: bool = False, progress: bool = False, desc: str = "eval") -> dict[str, float]:
        return evaluate_lm(model, loader, device, amp=amp, progress=progress, desc=desc)

    def evaluate_split(self, model: nn.Module, cfg: Any, split: str, *, subset: int | None, batch_size: int,
                       device: torch.device, progress: bool, stride: int = 1) -> dict[str, float | int]:
        """Perplexity of a split with the paper's protocol (:func:`kpca_attention.models.lm.perplexity`,
        window = the training context, ``stride`` 1 = exact); ``subset`` keeps the first N tokens."""
        from ...models.lm import perplexity

        split = {"val": "valid"}.get(split, split)
        vocab = getattr(model, "vocab", None)
        if vocab is None:
            raise ValueError("the model has no .vocab: load it with kpca_attention.train.load_model")
        ids = vocab.encode(corpus(cfg.dataset, cfg.data_root).split(split))
        if subset is not None:
            check_count(subset, "subset", ids.numel(), f"the tokens of the {split} split of {cfg.dataset}")
            ids = ids[:subset]
        model.to(device)
        ppl = perplexity(model, ids, context=cfg.context, batch_size=batch_size, stride=stride,
                         progress=progress)
        return {"ppl": ppl, "tokens": int(ids.numel()), "stride": int(stride), "context": int(cfg.context)}

    def evaluate_suites(self, suites: LMSuites, model: Any, cfg: Any, store: Any,
                        base_key: Mapping[str, Any], *, has_pap: bool = False, **kw: Any) -> dict[str, Any]:
        """:meth:`LMSuites.evaluate` on the corpus of ``cfg``."""
        return suites.evaluate(model, cfg, lambda: self.test_set(cfg), store, base_key, has_pap=has_pap, **kw)

    def trace_batches(self, suites: LMSuites, cfg: Any, n: int) -> list[torch.Tensor]:
        return suites.trace_batches(cfg, n)

    def sections(self, settings: Mapping[str, Any]) -> StudySections:
        from .report import LanguageSections

        return LanguageSections(settings, self.throughput_key)
