"""The models and inputs of the KPCA analysis: :func:`load_for_analysis` resolves ``MODEL`` through the
package's one model specifier (:func:`kpca_attention.train.resolve.resolve_model`: a checkpoint, a
timm name with an optional ``@weights`` file, a Hugging Face folder, all-MiniLM-L6-v2); the rest
builds inputs (texts, the King James Bible, image folders)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import torch
from torch import Tensor

from ..train.distributed import resolve_device
from ..train.resolve import MINILM_NAMES, LoadedModel, resolve_model

__all__ = [
    "LoadedModel",
    "load_for_analysis",
    "read_texts",
    "bible_texts",
    "load_image_folder",
    "MINILM_NAMES",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def load_for_analysis(name: str, *, pretrained: bool = True, device: str = "cpu") -> LoadedModel:
    """The model ``name`` (:func:`kpca_attention.train.resolve.resolve_model`: a checkpoint, a timm name
    with an optional ``@weights`` file, a Hugging Face folder, all-MiniLM-L6-v2) for the KPCA analysis:
    image classifiers and language models (causal: ``info["causal"]``); segmentation checkpoints are
    refused (their encoder is not separated from the decoder here)."""
    device = str(resolve_device(device))  # an unknown name or CUDA without a GPU: one line, before loading
    loaded = resolve_model(name, pretrained=pretrained, device=device)
    if loaded.task is not None and loaded.task.dense:
        raise ValueError(f"{name}: checkpoints of task {loaded.task.name!r} are not supported by the KPCA "
                         "analysis (image classifiers, language models and Hugging Face / timm models are)")
    return loaded

# ----------------------------------------------------------------------------- inputs


#: the longest line :func:`read_texts` takes, in characters: an analysis reads a few hundred tokens of a text,
#: and the tokenizer aborts the process (no Python error) on lines of tens of megabytes
MAX_TEXT_CHARS = 1_000_000


def read_texts(path: str | Path, limit: int | None = None) -> list[str]:
    """One text per non-empty line of a UTF-8 file (the first ``limit``; the file is read only that far).
    A line longer than :data:`MAX_TEXT_CHARS` is refused."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"text file {p} does not exist")
    texts: list[str] = []
    with p.open(encoding="utf-8") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_TEXT_CHARS + 2), ""), 1):
            if len(line.rstrip("\r\n")) > MAX_TEXT_CHARS:
                raise ValueError(f"{p}: line {number} is longer than {MAX_TEXT_CHARS:,} characters; give one "
                                 "text per line (the analysis reads the first --max-length tokens of each)")
            texts += [t.strip() for t in line.splitlines() if t.strip()]  # also U+2028 and the like
            if limit and len(texts) >= limit:
                break
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
        raise FileNotFoundError(f"image folder {root} " + ("is a file: give the folder of the images"
                                                           if root.exists() else "does not exist"))
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

    def read(f: Path) -> torch.Tensor:
        try:
            with Image.open(f) as im:
                return tf(im.convert(mode))
        except OSError as e:  # PIL's UnidentifiedImageError among them: a traceback before
            raise ValueError(f"{f} is not a readable image ({type(e).__name__}: {e})") from e

    return torch.stack([read(f) for f in files])
