"""Atomic, verifiable checkpoints and exact resume.

Layout of a run directory::

    <output_dir>/
      config.json                      the TrainConfig of the run
      checkpoints/
        latest.json                    {"name": "e0003-s00001234", "finished": false}  (os.replace)
        e0003-s00001234/               one checkpoint, a directory:
          model.safetensors            weights of the model (DDP unwrapped)       - safetensors
          ema.safetensors              EMA weights (only with model_ema)          - safetensors
          state.pt                     optimizer, lr scheduler, AMP scaler, progress counters,
                                       RNG states (python, numpy, torch CPU/CUDA) of every rank -
                                       tensors, lists and numbers only: ``torch.load(weights_only=True)``
          config.json
          COMPLETE                     written last: size and SHA-256 of every file above

A checkpoint is written into ``<name>.tmp-<pid>/``, every file is fsync'ed, ``COMPLETE`` goes last,
then the directory is renamed into place and ``latest.json`` is replaced atomically, so a crash
leaves either the old or the new checkpoint, never a half-written one that looks whole. Reading
verifies sizes and hashes against ``COMPLETE``: a corrupt or truncated checkpoint raises
:class:`CheckpointError` naming the file, never falls back to a fresh start.

Resume semantics: the data order of epoch ``e`` is a function of ``(seed, e)`` (the samplers are
epoch-seeded), and the random augmentation of each sample is seeded by ``(seed, e, rank, position in
the epoch)`` (:mod:`kpca_attention.train.data`), so a checkpoint taken after ``k`` batches of an epoch
resumes by skipping those ``k`` batches without loading them; Mixup, dropout and drop-path draw from
the process RNGs, which are restored. On the CPU a resumed run therefore equals the uninterrupted
run bitwise, at epoch boundaries and mid-epoch (``checkpoint_every_steps``); on GPUs up to the
non-determinism of the kernels.

Settings with the weights: every ``.safetensors`` file written here records, in its metadata under
:data:`SETTINGS_KEY`, the options of every attention layer (:func:`attention_settings`: the layer class
and each option of its ``parameter_constraints``: PAP's ``n_iter``, ``lam``, ``threshold``, ...). These
options change no parameter shape, so a strict load alone would accept weights trained with other
settings; :func:`load_weights` refuses them, naming the fields that differ, unless
``override_settings=True``.
"""

from __future__ import annotations

import inspect
import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import nn

from ..io import fsync_dir as _fsync_dir
from ..io import new_file_mode, read_json, sha256_file, write_json_atomic
from ..machine import machine_kind, run_machine_info
from ..models.sizing import meta_model
from ..modules import model_device
from ..tasks import get as get_task
from .config import TrainConfig
from .distributed import resolve_device
from .hf import offline
from .rundir import LATEST_FILE, CheckpointError, entry_in, read_config

__all__ = [
    "CheckpointError",
    "training_machines",
    "save_checkpoint",
    "load_checkpoint",
    "resolve_checkpoint",
    "load_model",
    "capture_rng",
    "restore_rng",
    "attention_settings",
    "save_weights",
    "check_settings",
    "check_shapes",
    "SETTINGS_KEY",
]

#: the safetensors metadata entry holding :func:`attention_settings` of the model the weights belong to
SETTINGS_KEY = "kpca_attention.attention_settings"

MODEL_FILE = "model.safetensors"
EMA_FILE = "ema.safetensors"
STATE_FILE = "state.pt"
CONFIG_FILE = "config.json"
MARKER_FILE = "COMPLETE"


# --- RNG state as tensors / lists (weights_only-loadable) -------------------------------------


def capture_rng() -> dict[str, Any]:
    """The state of python's ``random``, numpy's global RNG, torch's CPU (and CUDA) generators."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss_next],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- the settings stored with the weights -------------------------------------------------------


def attention_settings(model: nn.Module) -> list[dict[str, Any]]:
    """One entry per attention layer of ``model`` (module order): ``{"layer": name, "class": ...,
    option: value, ...}`` for each option of the layer's ``parameter_constraints`` it holds."""
    from ..attention.base import HeadsAttention

    out = []
    for name, m in model.named_modules():
        if isinstance(m, HeadsAttention):
            opts = {k: getattr(m, k) for k in sorted(m.parameter_constraints) if hasattr(m, k)}
            out.append({"layer": name, "class": type(m).__name__,
                        **json.loads(json.dumps(opts, default=str))})
    return out


#: attention options renamed since weights recorded them: old name -> new name (``apply`` hid
#: ``nn.Module.apply``)
RENAMED_OPTIONS: dict[str, str] = {"apply": "applied"}


def _option_defaults(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{layer name: {option: its constructor default}}`` of the model's attention layers (JSON-normalised
    as :func:`attention_settings` records values)."""
    from ..attention.base import HeadsAttention

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, HeadsAttention):
            found: dict[str, Any] = {}
            for cls in type(m).__mro__:  # a subclass passes options on to its bases through **kwargs
                if "__init__" in vars(cls):
                    for k, p in inspect.signature(cls.__init__).parameters.items():
                        if p.default is not inspect.Parameter.empty:
                            found.setdefault(k, p.default)
            out[name] = json.loads(json.dumps(found, default=str))
    return out


def _base_class(name: Any) -> Any:
    return name.partition("[")[0] if isinstance(name, str) else name


def _settings_differ(saved: list[dict[str, Any]], now: list[dict[str, Any]],
                     defaults: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between the recorded and the model's attention settings. An option renamed since is read
    under its new name; an option the weights do not record (added to the layer after they were written)
    passes when the model holds its default, the value the weights were trained with."""
    differ: list[str] = []
    if len(saved) != len(now):
        differ.append(f"attention layers: {len(saved)} (weights) vs {len(now)} (model)")
    for old, new in zip(saved, now, strict=False):  # a count mismatch is reported above
        old = {RENAMED_OPTIONS.get(k, k): v for k, v in old.items()}
        # a configured class's name lists its options ("NeuTRENOAttention[lam=0.4, applied=True]"); each of
        # them is also recorded on its own and compared below, under the rename and default rules
        old["class"], new = _base_class(old.get("class")), {**new, "class": _base_class(new.get("class"))}
        layer_defaults = defaults.get(new["layer"], {})
        for k in sorted((set(old) | set(new)) - {"layer"}):
            if k not in old and k in layer_defaults and new.get(k) == layer_defaults[k]:
                continue
            if old.get(k) != new.get(k):
                differ.append(f"{new['layer']}.{k}: {old.get(k)!r} (weights) vs {new.get(k)!r} (model)")
    return differ


def save_weights(model: nn.Module, file: str | os.PathLike) -> None:
    """``safetensors.torch.save_model`` with :func:`attention_settings` in the file's metadata."""
    meta = {SETTINGS_KEY: json.dumps(attention_settings(model), sort_keys=True)}
    safetensors.torch.save_model(model, str(file), metadata=meta)
    os.chmod(file, new_file_mode())  # safetensors writes 0600; a checkpoint's other files get the umask's


def check_settings(model: nn.Module, file: str | os.PathLike, *, override_settings: bool = False) -> None:
    """Refuse weights ``file`` whose recorded attention settings differ from ``model``'s (a file
    without recorded settings passes: written before they were recorded, or by another tool)."""
    try:
        with safetensors.safe_open(str(file), "pt") as f:
            meta = f.metadata() or {}
    except Exception:  # noqa: BLE001 - not a safetensors file: the weights loader reports it
        return
    if override_settings or SETTINGS_KEY not in meta:
        return
    try:
        saved = json.loads(meta[SETTINGS_KEY])
    except (json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"weights {file}: the recorded settings are not valid JSON ({e})") from e
    if not (isinstance(saved, list) and all(isinstance(x, dict) and isinstance(x.get("layer"), str)
                                            for x in saved)):
        raise CheckpointError(f"weights {file}: the recorded settings ({SETTINGS_KEY}) are not a list of "
                              "attention layers' options (damaged, or written by another tool)")
    differ = _settings_differ(saved, attention_settings(model), _option_defaults(model))
    if differ:
        more = f" (+{len(differ) - 4} more)" if len(differ) > 4 else ""
        raise CheckpointError(f"weights {file} belong to a model with other attention settings: "
                              f"{'; '.join(differ[:4])}{more}; build the model with the weights' settings, "
                              "or load them anyway from Python (load_model / load_weights with "
                              "override_settings=True)")


# --- writing ----------------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def checkpoint_name(epoch: int, global_step: int) -> str:
    return f"e{epoch:04d}-s{global_step:08d}"


def _write_error(where: Path, e: Exception) -> str:
    """One line saying why a checkpoint could not be written: torch.save and safetensors report a full
    disk as stream errors ("basic_ios::clear", "unexpected pos"), so the free space is checked too."""
    import errno

    free = None
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        pass
    if getattr(e, "errno", None) == errno.ENOSPC or (free is not None and free < (64 << 20)):
        return (f"cannot write a checkpoint in {where}: no space left on device "
                f"({free or 0} bytes free); the previous checkpoint is kept")
    return f"cannot write a checkpoint in {where}: {type(e).__name__}: {e}; the previous checkpoint is kept"


def _write_checkpoint_files(tmp: Path, *, model: nn.Module, config: TrainConfig, state: dict[str, Any],
                            ema: nn.Module | None, finished: bool,
                            extra_files: dict[str, Callable[[Path], None]] | None,
                            machines: list[dict[str, Any]]) -> None:
    """Every file of one checkpoint into the temporary folder ``tmp``, ``COMPLETE`` last."""
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    progress = state["progress"]
    files = [MODEL_FILE, STATE_FILE, CONFIG_FILE]
    save_weights(model, tmp / MODEL_FILE)
    if ema is not None:
        save_weights(ema, tmp / EMA_FILE)
        files.append(EMA_FILE)
    torch.save(state, tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(config.to_json())
    for fname, writer in (extra_files or {}).items():
        writer(tmp / fname)
        files.append(fname)
    for fname in files:
        _fsync_file(tmp / fname)
    marker = {
        "files": {f: {"size": (tmp / f).stat().st_size, "sha256": sha256_file(tmp / f)} for f in files},
        "progress": {k: progress[k] for k in ("epoch", "step_in_epoch", "global_step")},
        "finished": finished,
        "machines": machines,
    }
    write_json_atomic(tmp / MARKER_FILE, marker)
    _fsync_dir(tmp)


def save_checkpoint(
    run_dir: str | Path,
    *,
    model: nn.Module,
    config: TrainConfig,
    state: dict[str, Any],
    ema: nn.Module | None = None,
    finished: bool = False,
    keep: int = 2,
    extra_files: dict[str, Callable[[Path], None]] | None = None,
    machines_before: Sequence[dict[str, Any]] = (),
) -> Path:
    """Write one checkpoint of ``run_dir`` atomically and point ``latest.json`` at it.

    Args:
        model: the unwrapped model (not the DDP wrapper).
        state: ``torch.save``-able mapping of tensors/lists/numbers: optimizer, scheduler, scaler,
            rng, progress (``epoch``, ``step_in_epoch``, ``global_step``).
        finished: mark the run as complete (the demo skips finished runs).
        keep: how many checkpoints to keep (older ones are deleted after the new one is in place).
        extra_files: ``{file name: writer(path)}`` for more files (an LM's ``vocab.json``); they are
            hashed into ``COMPLETE`` like the rest.
        machines_before: the machines that trained the run this one resumes from another directory
            (:func:`training_machines` of it), the start of this run's list while it has none.
    Returns:
        The checkpoint directory.
    """
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    progress = state["progress"]
    name = checkpoint_name(int(progress["epoch"]), int(progress["global_step"]))
    final = ckpt_root / name
    tmp = ckpt_root / f".{name}.tmp-{os.getpid()}"
    machines = training_machines(run_dir) or list(machines_before)
    here = run_machine_info(model_device(model).type)
    if not machines or machine_kind(machines[-1]) != machine_kind(here):
        machines.append(here)  # the machines that trained it, in order: one, unless resumed elsewhere
    try:
        _write_checkpoint_files(tmp, model=model, config=config, state=state, ema=ema, finished=finished,
                                extra_files=extra_files, machines=machines)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave half a checkpoint behind
        if isinstance(e, Exception):
            raise CheckpointError(_write_error(ckpt_root, e)) from e
        raise
    if final.exists():  # same name: an earlier attempt of this very step; replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    try:
        write_json_atomic(ckpt_root / LATEST_FILE, {"name": name, "finished": finished})
    except OSError as e:
        raise CheckpointError(_write_error(ckpt_root, e)) from e
    # prune old checkpoints only after the new one is in place
    ckpts = sorted(p for p in ckpt_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    for old in ckpts[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


# --- reading ----------------------------------------------------------------------------------


def training_machines(path: str | Path) -> list[dict[str, Any]]:
    """The machines that trained a run up to its latest checkpoint (``path``: the run or one checkpoint),
    in order, as :func:`~kpca_attention.machine.machine_info` recorded them with the device: one entry,
    or one per change of machine kind where it was resumed elsewhere. Empty for checkpoints written before
    this was recorded, or for a run without a checkpoint."""
    try:
        ckpt = resolve_checkpoint(path)
    except (CheckpointError, FileNotFoundError):
        return []
    marker = read_json(ckpt / MARKER_FILE)
    found = marker.get("machines") if isinstance(marker, dict) else None
    return [dict(m) for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a run directory, its ``checkpoints/`` folder, or the checkpoint
    directory itself. Raises FileNotFoundError / CheckpointError naming what is missing."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint path {p} does not exist")
    if (p / MARKER_FILE).exists() or (p / MODEL_FILE).exists():
        return p
    for root in (p / "checkpoints", p):
        latest = root / LATEST_FILE
        if latest.exists():
            try:
                name = json.loads(latest.read_text())["name"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                why = "no \"name\" of a checkpoint in it" if isinstance(e, (KeyError, TypeError)) else str(e)
                raise CheckpointError(
                    f"{latest} is corrupt ({why}); delete it to pick a checkpoint by hand") from e
            ckpt = entry_in(root, name, latest)
            if not ckpt.is_dir():
                raise CheckpointError(f"{latest} points to {ckpt}, which does not exist")
            return ckpt
    raise FileNotFoundError(
        f"no checkpoint in {p}: expected a run directory with checkpoints/{LATEST_FILE} "
        f"or a checkpoint directory holding {MARKER_FILE}"
    )


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Check every file against the ``COMPLETE`` marker; return the marker."""
    marker_path = ckpt / MARKER_FILE
    if not marker_path.exists():
        raise CheckpointError(
            f"checkpoint {ckpt} is incomplete: {marker_path} is missing (the write was interrupted)"
        )
    try:
        marker = json.loads(marker_path.read_text())
        files = marker["files"]
    except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(f"checkpoint marker {marker_path} is corrupt: {e}") from e
    if not isinstance(files, dict) or not files:  # a list or a string broke below; none verifies nothing
        raise CheckpointError(f"checkpoint marker {marker_path} is corrupt: its \"files\" must map each file "
                              "of the checkpoint to its size and hash")
    for fname, meta in files.items():
        f = entry_in(ckpt, fname, marker_path)
        if not f.exists():
            raise CheckpointError(f"checkpoint file {f} is missing")
        if (not f.is_file() or not isinstance(meta, dict) or not isinstance(meta.get("size"), int)
                or not isinstance(meta.get("sha256"), str)):
            raise CheckpointError(f"checkpoint file {f} is not a regular file with its size and hash in "
                                  f"{marker_path}")
        size = f.stat().st_size
        if size != meta["size"]:
            raise CheckpointError(
                f"checkpoint file {f} is truncated or corrupt: {size} bytes, expected {meta['size']}")
        if sha256_file(f) != meta["sha256"]:
            raise CheckpointError(f"checkpoint file {f} is corrupt: SHA-256 does not match {marker_path}")
    return marker


def check_shapes(model: nn.Module, file: str | os.PathLike) -> None:
    """Refuse weights ``file`` whose tensor names or shapes (read from its header, no tensor loaded) differ
    from ``model``'s state dict; ``model`` may live on the meta device (:func:`~..models.sizing.meta_model`),
    so a config that does not match its weights is refused before its model is allocated. Tied parameters
    are saved under one of their names, so a name missing from the file is fine when a twin is there."""
    try:
        with safetensors.safe_open(str(file), "pt") as f:
            saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for malformed headers
        raise CheckpointError(f"cannot read weights {file}: {e}") from e
    state = model.state_dict(keep_vars=True)
    twins: dict[int, list[str]] = {}
    for k, t in state.items():
        twins.setdefault(id(t), []).append(k)
    missing = [k for k, t in state.items() if not any(n in saved for n in twins[id(t)])]
    unexpected = [k for k in saved if k not in state]
    shapes = [f"{k} {list(saved[k])} in the file, {list(state[k].shape)} in the model"
              for k in saved if k in state and saved[k] != tuple(state[k].shape)]
    if missing or unexpected or shapes:
        parts = [f"missing {sorted(missing)[:8]}" if missing else "",
                 f"unexpected {sorted(unexpected)[:8]}" if unexpected else "",
                 f"other shapes: {'; '.join(shapes[:3])}" if shapes else ""]
        raise CheckpointError(f"weights {file} do not match the model: {', '.join(p for p in parts if p)}")


def load_weights(module: nn.Module, file: Path, device: str | torch.device = "cpu", *,
                 override_settings: bool = False) -> None:
    """Strict safetensors load (missing or unexpected keys are an error, unlike the official code);
    weights recorded with other attention settings are refused (:func:`check_settings`)."""
    check_settings(module, file, override_settings=override_settings)
    check_shapes(module, file)  # names and shapes, from the header: nothing loaded into a wrong model
    try:
        safetensors.torch.load_model(module, str(file), strict=False, device=str(device))
    except Exception as e:  # safetensors raises its own error types for malformed headers
        raise CheckpointError(f"cannot read weights {file}: {e}") from e


def load_checkpoint(path: str | Path) -> tuple[Path, TrainConfig, dict[str, Any], dict[str, Any]]:
    """Verify and read a checkpoint: ``(directory, config, state, marker)``. Weights are loaded
    separately with :func:`load_weights` into a model built from ``config``."""
    ckpt = resolve_checkpoint(path)
    marker = verify_checkpoint(ckpt)
    config = read_config(ckpt)
    f = ckpt / STATE_FILE
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        text = str(e)
        if "weights_only" in text:  # torch advises weights_only=False: never, for a file it just refused
            raise CheckpointError(f"training state {f} holds pickled objects, not only tensors and plain "
                                  "values: refused, never unpickled (a checkpoint of this package holds "
                                  "none; the file was changed or written by other code)") from e
        raise CheckpointError(f"cannot read training state {f}: {text.splitlines()[0] if text else e}") from e
    return ckpt, config, state, marker


@offline()  # a run's weights are its own: nothing reaches the network while the model is built
def load_model(
    path: str | Path, device: str | torch.device = "cpu", *, ema: bool = False, verify: bool = True,
    override_settings: bool = False,
) -> tuple[nn.Module, TrainConfig]:
    """Rebuild the trained model of a checkpoint, in eval mode on ``device``.

    Args:
        path: a run directory (its latest checkpoint is used) or one checkpoint directory.
        device: where the model goes: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (checked before anything is
            read or built).
        ema: load the EMA weights instead of the raw ones (runs trained with ``model_ema``).
        verify: check sizes and hashes against the ``COMPLETE`` marker first.
        override_settings: load weights recorded with other attention settings than the model built
            from the config (refused otherwise).
    Returns:
        ``(model, config)``: for vision a :class:`~kpca_attention.models.normalize.NormalizedModel`
        taking images (B, C, H, W) in [0, 1]; for LMs the language model, with the training
        vocabulary as ``model.vocab`` (a :class:`kpca_attention.data.text.Vocab`).
    """
    device = resolve_device(device)  # an unknown device, or CUDA without a GPU: before anything is built
    ckpt = resolve_checkpoint(path)
    if verify:
        verify_checkpoint(ckpt)
    config = read_config(ckpt)
    task = get_task(config.task)
    try:
        info = task.checkpoint_info(config, ckpt)  # e.g. the LM's vocabulary
    except (FileNotFoundError, ValueError) as e:
        raise CheckpointError(str(e)) from e
    wfile = ckpt / (EMA_FILE if ema else MODEL_FILE)
    if ema and not wfile.exists():
        raise CheckpointError(f"{ckpt} has no EMA weights ({EMA_FILE}); the run had model_ema=False")
    shell = meta_model(lambda: task.build_model(config, info))
    if shell is not None:  # names and shapes first: a config.json that asks for a huge model is refused here
        check_shapes(shell, wfile)
    model = task.build_model(config, info)
    load_weights(model, wfile, override_settings=override_settings)
    return model.to(device).eval(), config
