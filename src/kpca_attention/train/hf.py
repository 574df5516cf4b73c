"""The one place that opens a Hugging Face model folder (or a hub name already in the local cache).

Guarantees, whatever the environment and whatever reaches stdin:

* offline: while a model is loaded (:func:`offline`, around :func:`load_hf_folder`, ``load_model`` and the
  timm loader; the caller's settings come back after it) ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` and
  ``huggingface_hub``'s own switch (read at import time, so setting the variable alone is too late
  once the library is loaded) are set; every ``from_pretrained`` passes ``local_files_only=True``. Nothing is
  downloaded at run time: a hub name loads only from the local cache.
* no code from the folder runs: a folder whose ``config.json`` or ``tokenizer_config.json`` has an
  ``auto_map`` (custom Python classes) is refused before transformers sees it, and every
  ``from_pretrained`` passes ``trust_remote_code=False`` (transformers' interactive prompt never asks).
* a tokenizer is required: a local folder without tokenizer files, or a tokenizer whose token ids do
  not fit the model's embedding, is one clear error, not a failure deep inside a forward pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle  # only for the exception type: nothing is unpickled
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .rundir import CHECKPOINTS, LATEST_FILE, LOCK_FILE, METRIC_FILES

__all__ = ["force_offline", "offline", "load_hf_folder", "TOKENIZER_FILES", "custom_code_of", "is_hf_folder",
           "PROJECT_MARKERS"]

#: files of which a local folder must hold at least one for its tokenizer to load
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "tokenizer.model",
                   "sentencepiece.bpe.model", "merges.txt")


#: files that make a folder a run or checkpoint of this project (train/checkpoint.py, train/rundir.py)
PROJECT_MARKERS = ("COMPLETE", "state.pt", CHECKPOINTS, LATEST_FILE, LOCK_FILE,
                   *(f for f in METRIC_FILES if f != "config.json"))


def is_hf_folder(path: Path) -> bool:
    """A Hugging Face model folder: ``config.json`` and none of the files of a run of this project."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and not any(
        (path / f).exists() for f in PROJECT_MARKERS)


def force_offline() -> None:
    """Switch the Hugging Face hub (used by transformers and timm) to offline mode in this process."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import huggingface_hub.constants as hub_constants

    hub_constants.HF_HUB_OFFLINE = True


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """:func:`force_offline` for the ``with`` block only: the caller's settings come back after it (a
    notebook that loads a run can still download what it asks for afterwards)."""
    import huggingface_hub.constants as hub_constants

    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    constant = hub_constants.HF_HUB_OFFLINE
    force_offline()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        hub_constants.HF_HUB_OFFLINE = constant


def custom_code_of(folder: Path) -> list[str]:
    """The custom classes a local folder asks for (``auto_map`` of its config / tokenizer config)."""
    wanted: list[str] = []
    for fname in ("config.json", "tokenizer_config.json", "preprocessor_config.json"):
        f = folder / fname
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{f} is not valid JSON ({e})") from e
        amap = data.get("auto_map") if isinstance(data, dict) else None
        if amap:
            for v in (amap.values() if isinstance(amap, dict) else [amap]):
                wanted += [str(x) for x in (v if isinstance(v, list) else [v]) if x]
    return wanted


def _check_folder(folder: Path, name: str) -> None:
    if not (folder / "config.json").is_file():
        raise ValueError(f"{name}: {folder} holds no config.json (not a Hugging Face model folder)")
    custom = custom_code_of(folder)
    if custom:
        raise ValueError(f"{name}: the folder asks to run its own Python code ({', '.join(custom[:3])}); "
                         "this package refuses custom code from model folders (trust_remote_code is never "
                         "set): use a model whose architecture transformers ships")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"{name}: {folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                         "save the model's tokenizer into the folder (tokenizer.save_pretrained(folder))")


def _check_tokenizer(tok: Any, model: Any, name: str) -> None:
    ids = tok("a test sentence", add_special_tokens=True).get("input_ids") or []
    if not ids:
        raise ValueError(f"{name}: its tokenizer turns a sentence into no tokens "
                         "(an empty or broken tokenizer)")
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    size = getattr(emb, "num_embeddings", None)
    if size is not None and (max(ids) >= size or len(tok) > size):
        raise ValueError(f"{name}: its tokenizer ({len(tok)} tokens) does not match the model's embedding "
                         f"({size} rows): the tokenizer belongs to another model")


@offline()
def load_hf_folder(src: str | Path, name: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a local Hugging Face folder or of a hub name in the local cache: offline,
    without the folder's code, with eager attention (the KPCA capture reads q/k/v). Errors are
    ``ValueError`` with one line naming ``name``."""
    local = Path(src).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ValueError(f"{name}: {local} is a file, not a Hugging Face model folder")
        _check_folder(local, name)
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    opts = {"local_files_only": True, "trust_remote_code": False}
    # transformers draws its "Loading weights" bar into a log file too; the package's bars show on a terminal
    quiet = not sys.stderr.isatty() and hf_logging.is_progress_bar_enabled()
    try:
        if quiet:
            hf_logging.disable_progress_bar()
        tok = AutoTokenizer.from_pretrained(str(src), **opts)
        model = AutoModel.from_pretrained(str(src), attn_implementation="eager", **opts)
    except pickle.UnpicklingError as e:  # torch's weights_only refusal of a pickled .bin
        raise ValueError(f"{name}: a weights file of the folder holds pickled objects that are not plain "
                         "tensors, and was refused (it is never unpickled); ask for model.safetensors") from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if "trust_remote_code" in str(e) or "custom code" in str(e):
            raise ValueError(f"{name}: the model needs custom code, which this package refuses to run") from e
        where = "" if local.exists() else (" (loaded offline: a hub name must already be in the local "
                                           "Hugging Face cache; give a local model folder instead)")
        raise ValueError(f"cannot load Hugging Face model {name!r}{where}: {first}") from e
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    _check_tokenizer(tok, model, name)
    return model, tok
