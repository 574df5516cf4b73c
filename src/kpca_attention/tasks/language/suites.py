"""The evaluation of a causal language model as data, item by item with per-token results, into a
:class:`~kpca_attention.robustness.store.ResultStore` (the language counterpart of
:class:`~kpca_attention.tasks.classification.suites.ImageSuites`).

:class:`LMSuites` says what to measure; :meth:`LMSuites.evaluate` measures it for one model:

* ``ppl/<split>`` - perplexity of the first ``tokens`` tokens of each split with the paper's
  sliding-window protocol (windows of the training context slide one token at a time; every token
  after the first is predicted once, from ``min(context, position)`` preceding tokens);
* ``wordswap/<split>`` - the same on the word-swapped text: ``swap_rate`` of the non-stopword words of
  the WHOLE split replaced by ``AAA`` (:func:`~kpca_attention.robustness.wordswap.swap_words`, seeded),
  then the same first ``tokens`` tokens scored (the swap is 1-for-1, so token positions pair up with
  the clean text);
* ``pap_positions`` (models with RPC layers) - the prefix step size mu, the threshold tau and the
  first PAP step's sparse density along the sequence (:func:`pap_positions`).

Each perplexity item stores the per-token negative log-likelihood as float16 (:func:`encode_nll`: its
high bytes, then its low bytes, xz-compressed, in base85 - about 40 kB per 20k tokens, where base64 of
the raw float16, :func:`encode_f16`, the form of items written before 2026-11-27, takes 53 kB) next to
the exact float64 mean, so paired statistics over tokens (bootstrap, Wilcoxon) can be computed from
committed files (:func:`decode_nll` reads both forms); word-swap items also store the positions of the
swapped tokens within the scored slice.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...checks import check_int, check_real
from ...io import pack_bytes, unpack_bytes
from ...models.lm import token_nll
from ...modules import eval_mode
from ...robustness.store import ResultStore
from .data import corpus_windows

__all__ = ["LMSuites", "token_nll", "encode_f16", "decode_f16", "encode_nll", "decode_nll", "pap_positions",
           "split_ids", "LM_SPLITS"]

LM_SPLITS: tuple[str, ...] = ("valid", "test")


def encode_f16(x: np.ndarray | Tensor) -> str:
    """A 1-D float vector as base64 of its little-endian float16 bytes (values beyond float16's
    range become inf)."""
    with np.errstate(over="ignore"):
        arr = np.asarray(x.detach().cpu() if isinstance(x, Tensor) else x, dtype="<f2").ravel()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def decode_f16(s: str) -> np.ndarray:
    """The float64 vector of :func:`encode_f16`."""
    return np.frombuffer(base64.b64decode(s), dtype="<f2").astype(np.float64)


def encode_nll(x: np.ndarray | Tensor) -> dict[str, str]:
    """Per-token NLLs as stored in an item: ``{"nll_f16_xz": text}``, the float16 values' high bytes (sign,
    exponent, top of the mantissa: they repeat) then their low bytes, xz-compressed, in base85 (no character
    that JSON escapes). Lossless for the float16 values; about 1.5 bytes of text a token where
    :func:`encode_f16` takes 2.7."""
    with np.errstate(over="ignore"):
        arr = np.asarray(x.detach().cpu() if isinstance(x, Tensor) else x, dtype="<f2").ravel()
    u = arr.view("<u2")
    planes = np.concatenate([(u >> 8).astype(np.uint8), (u & 0xFF).astype(np.uint8)])
    return {"nll_f16_xz": pack_bytes(planes.tobytes())}


def decode_nll(result: Mapping[str, Any]) -> np.ndarray:
    """The float64 per-token NLL vector of a perplexity item, in either stored form (:func:`encode_nll`, or
    :func:`encode_f16` under ``"nll_f16"``)."""
    if "nll_f16" in result:
        return decode_f16(result["nll_f16"])
    planes = np.frombuffer(unpack_bytes(result["nll_f16_xz"]), dtype=np.uint8)
    half = planes.size // 2
    u = (planes[:half].astype("<u2") << 8) | planes[half:].astype("<u2")
    return u.view("<f2").astype(np.float64)


def split_ids(model: nn.Module, corpus: Any, split: str, tokens: int | None, *,
              swap: Mapping[str, Any] | None = None) -> tuple[Tensor, dict[str, Any]]:
    """The first ``tokens`` ids of ``split`` of ``corpus`` (a :class:`~kpca_attention.data.text.TextCorpus`)
    in the model's vocabulary (``model.vocab``), optionally word-swapped (``swap``: ``rate``, ``seed``,
    ``replacement`` of :func:`~kpca_attention.robustness.wordswap.swap_words`, applied to the whole
    split before truncation); returns ``(ids, info)`` with the swap statistics and, for a swapped text,
    the swapped positions within the slice (``swapped``: token indices)."""
    from ...robustness.wordswap import swap_words

    vocab = getattr(model, "vocab", None)
    if vocab is None:
        raise ValueError("the model has no .vocab: load it with kpca_attention.train.load_model")
    text = corpus.split(split)
    info: dict[str, Any] = {}
    clean = vocab.encode(text)
    ids = clean
    if swap is not None:
        text, stats = swap_words(text, **swap)
        ids = vocab.encode(text)
        if ids.numel() != clean.numel():
            raise RuntimeError("word swap changed the number of tokens")  # swap_words is 1-for-1
        info.update(stats)
    if tokens is not None:
        if tokens > ids.numel():
            raise ValueError(f"asked for the first {tokens} tokens of {split}, which has {ids.numel()}")
        ids, clean = ids[:tokens], clean[:tokens]
    if swap is not None:
        changed = torch.nonzero(ids != clean).flatten()
        info["swapped"] = changed.tolist()
    return ids, info


def _nll_result(nll: Tensor, context: int, **extra: Any) -> dict[str, Any]:
    mean = float(nll.mean())
    return {"ppl": math.exp(mean), "nll_mean": mean, "tokens": int(nll.numel()), "context": context,
            "stride": 1, **encode_nll(nll), **extra}


@torch.no_grad()
def pap_positions(model: nn.Module, batches: Sequence[Tensor]) -> dict[str, Any]:
    """Mu, tau and the first PAP step along the sequence, for every RPC layer of a causal LM.

    :func:`kpca_attention.pap.pap` with ``return_info=True`` averages its diagnostics over positions;
    here the keys ``K (B, H, N, D)`` of each RPC layer are taken from its ``hook_k`` and the step size
    is recomputed with :func:`kpca_attention.pap.pap_mu` exactly as PAP computes it under the causal
    mask (prefix mu: mu_i from keys j <= i). Per position i (0-based) and layer, means over windows and
    heads of: ``mu``, ``tau`` (lam * mu or lam / mu, the layer's rule), ``k_abs_max`` (max_d |K_id|),
    ``tau_over_kmax`` (tau_i / max_d |K_id|: above 1 row i is not shrunk at step 1) and ``s1_density``
    (fraction of row i shrunk at step 1: S_1 = shrink(K, tau)); later steps shrink
    ``K - L_{t-1} + Y_{t-1}/mu``, which PAP's trace reports only averaged over positions.

    Args:
        batches: token windows ``(B, N)`` (same N across batches).
    Returns:
        ``{"positions": N, "windows": total B, "layers": {name: {quantity: [N floats], "heads": H}}}``
    """
    from ...attention import RPCAttention
    from ...pap import pap_mu, pap_tau

    layers = {name: m for name, m in model.named_modules() if isinstance(m, RPCAttention)}
    if not layers:
        raise ValueError(f"{type(model).__name__} has no RPCAttention layer")
    keys: dict[str, list[Tensor]] = {name: [] for name in layers}
    handles = [m.hook_k.register_forward_hook(lambda _m, _i, k, name=name: keys[name].append(k.detach()))
               for name, m in layers.items()]
    n_windows, n_pos = 0, None
    sums: dict[str, dict[str, Tensor]] = {}
    with eval_mode(model):
        try:
            for x in batches:
                if n_pos is not None and x.shape[1] != n_pos:
                    raise ValueError(f"windows must share one length, got {n_pos} and {x.shape[1]}")
                n_pos = x.shape[1]
                for v in keys.values():
                    v.clear()
                model(x.to(next(model.parameters()).device))
                n_windows += x.shape[0]
                for name, m in layers.items():
                    (k,) = keys[name]
                    k = k.double()
                    mu = pap_mu(k, m.mu_dim, is_causal=True)  # (B, H, N, 1)
                    tau = pap_tau(m.lam, mu, m.threshold)
                    kmax = k.abs().amax(-1, keepdim=True)
                    q = {"mu": mu, "tau": tau, "k_abs_max": kmax, "tau_over_kmax": tau / kmax,
                         "s1_density": (k.abs() > tau).double().mean(-1, keepdim=True)}
                    acc = sums.setdefault(name, {})
                    for key, val in q.items():
                        s = val.squeeze(-1).sum(0)  # (H, N): summed over windows
                        acc[key] = acc[key] + s if key in acc else s
        finally:
            for h in handles:
                h.remove()
    if not n_windows:
        raise ValueError("pap_positions: no batches")
    out: dict[str, Any] = {}
    for name, acc in sums.items():
        per = {key: (v / n_windows) for key, v in acc.items()}  # (H, N)
        out[name] = {key: v.mean(0).tolist() for key, v in per.items()}
        out[name]["heads"] = int(next(iter(per.values())).shape[0])
        out[name]["s1_density_max_head"] = per["s1_density"].amax(0).tolist()
    return {"positions": int(n_pos or 0), "windows": n_windows, "layers": out}


@dataclass(frozen=True)
class LMSuites:
    """What to measure on a causal language model (see the module docstring).

    Args:
        tokens: score the first ``tokens`` tokens of each split (None: the whole split).
        splits: the held-out splits scored (``valid``, ``test``).
        swap_rate, swap_seed, replacement: the word-swap attack (paper: 1.5% -> ``AAA``).
        batch_size: sliding windows per forward.
        positions: token windows (of the training context, from the start of the valid split) for
            :func:`pap_positions` and for the PAP trace.
        stride: the sliding window's stride (1: the paper's protocol; larger: a faster approximation).
    """

    tokens: int | None = 20000
    splits: tuple[str, ...] = LM_SPLITS
    swap_rate: float = 0.015
    swap_seed: int = 0
    replacement: str = "AAA"
    batch_size: int = 64
    positions: int = 256
    stride: int = 1

    #: how ``settings.json`` names these suites (``suites.kind``; read by ``kpca_attention.tasks``)
    kind = "lm"

    def __post_init__(self) -> None:
        check_int(self.tokens, "tokens", min=2, allow_none=True)
        check_int(self.batch_size, "batch_size", min=1)
        check_int(self.positions, "positions", min=1)
        check_int(self.stride, "stride", min=1)
        check_int(self.swap_seed, "swap_seed", min=0)
        check_real(self.swap_rate, "swap_rate", min=0, max=1)
        if not self.splits or any(s not in LM_SPLITS for s in self.splits):
            raise ValueError(f"splits must be a non-empty subset of {LM_SPLITS}, got {self.splits}")
        if not isinstance(self.replacement, str) or not self.replacement or \
                any(c.isspace() for c in self.replacement):
            raise ValueError(f"replacement must be one token without spaces, got {self.replacement!r}")

    def to_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "kind": self.kind}
        if d["stride"] == 1:  # the default, which studies written before the field did not record
            del d["stride"]
        return d

    def trace_batches(self, cfg: Any, n: int) -> list[Tensor]:
        """``n`` consecutive windows of ``cfg.context`` tokens from the start of the valid split, in
        batches of 32, for the PAP trace of a trained model (encoded with the corpus's training
        vocabulary, as the model's own)."""
        check_int(n, "trace windows", min=1)
        windows = corpus_windows(cfg, n, split="valid")
        return list(windows.split(32))

    def evaluate(self, model: nn.Module | Callable[[], nn.Module], cfg: Any, corpus: Callable[[], Any],
                 store: ResultStore, base_key: Mapping[str, Any], *, has_pap: bool,
                 cache_dir: str | Path | None = None, seed: int | None = None,
                 log: Callable[[str], None] = print, progress: bool = True) -> dict[str, Any]:
        """Every item of these suites for one model, reusing the items of ``store`` whose key
        (``base_key`` + the item's parameters) matches.

        Args:
            model: the model (``model.vocab`` set, as :func:`kpca_attention.train.load_model` gives),
                or a function returning it (called only if some item must be computed).
            cfg: the run's TrainConfig (context, dataset). ``corpus``: returns the corpus (read only if an
                item must be computed). ``has_pap``: the model has RPC layers (``pap_positions`` is measured).
                ``cache_dir``, ``seed``, ``progress``: unused (the tasks' common suite interface).
        Returns:
            ``{"ppl": {split: r}, "wordswap": {split: r}, "pap_positions": r?, "timing": {...}}``.
        """
        del cache_dir, seed, progress
        if getattr(cfg, "vocab", "word") != "word":  # before any perplexity: it would be computed, then lost
            raise ValueError("the language suites pair each split's perplexity with its word-swapped "
                             "text's, which needs a word-level vocabulary (a swapped word of another length "
                             f"changes a character model's tokens); this run has vocab={cfg.vocab!r} (the "
                             "bible-cpu preset is character level): train it with --set vocab=word")
        loaded: list[nn.Module] = [model] if isinstance(model, nn.Module) else []

        def net() -> nn.Module:
            if not loaded:
                loaded.append(model())  # type: ignore[operator]
            return loaded[0]

        read: list[Any] = []

        def text() -> Any:
            if not read:
                read.append(corpus())
            return read[0]

        swap = {"rate": self.swap_rate, "seed": self.swap_seed, "replacement": self.replacement}
        common = {"tokens": self.tokens, "context": cfg.context, "stride": self.stride,
                  "dataset": cfg.dataset}
        out: dict[str, Any] = {"ppl": {}, "wordswap": {}}
        timing: dict[str, float] = {}
        for split in self.splits:
            for what, sw in (("ppl", None), ("wordswap", swap)):
                def compute(split: str = split, sw: Mapping[str, Any] | None = sw) -> dict[str, Any]:
                    ids, info = split_ids(net(), text(), split, self.tokens, swap=sw)
                    nll = token_nll(net(), ids, cfg.context, batch_size=self.batch_size, stride=self.stride)
                    return {**_nll_result(nll, cfg.context, **info), "stride": self.stride}

                t0 = time.perf_counter()
                key = {**base_key, **common, "split": split, **({"swap": swap} if sw else {})}
                r, reused = store.get_or_compute(f"{what}/{split}", key, compute)
                out[what][split] = r
                if not reused:
                    timing[f"{what}/{split}"] = time.perf_counter() - t0
                    log(f"  {what} {split}: ppl {r['ppl']:.2f} on {r['tokens']} tokens "
                        f"({timing[f'{what}/{split}']:.0f} s)")
        if has_pap:
            def positions() -> dict[str, Any]:
                return pap_positions(net(), self.trace_batches(cfg, self.positions))

            out["pap_positions"] = store.get_or_compute(
                "pap_positions", {**base_key, "windows": self.positions, "context": cfg.context,
                                  "dataset": cfg.dataset}, positions)[0]
        out["timing"] = timing
        return out
