"""An existing model a study evaluates (:class:`~kpca_attention.studies.spec.Source`): loaded once, with
the training config its task evaluates it under and the fingerprint of its weights (part of every
result's key, so that other weights are never mistaken for these).

"Evaluate a checkpoint" sits here, above the tasks and ``train``: a task evaluates a model it is
handed and never loads one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..io import read_json, sha256_file
from ..modules import weights_sha256
from .spec import Source

__all__ = ["LoadedSource", "default_labels", "model_label", "is_project_run"]


def is_project_run(path: str) -> bool:
    """Whether ``path`` is a run or checkpoint directory of this project."""
    p = Path(path).expanduser()
    return p.exists() and any((p / f).exists() for f in ("COMPLETE", "checkpoints", "latest.json",
                                                           "model.safetensors"))


@dataclass
class LoadedSource:
    """A :class:`Source` on ``device``; the model is loaded on first use (:meth:`load`)."""

    source: Source
    device: str = "cpu"
    _loaded: tuple[nn.Module, Any] | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        return self.source.path

    @functools.cached_property
    def is_project(self) -> bool:
        return is_project_run(self.path)

    @functools.cached_property
    def ckpt_dir(self) -> Path:
        from ..train.checkpoint import resolve_checkpoint

        if not self.is_project:
            raise ValueError(f"{self.path} is not a checkpoint of this project")
        return resolve_checkpoint(self.path)

    @functools.cached_property
    def config(self) -> Any:
        """The run's TrainConfig; for other models one made from ``dataset`` and the model's input size."""
        from ..tasks import of_model
        from ..train import TrainConfig
        from ..train.checkpoint import read_config

        if self.is_project:
            return read_config(self.ckpt_dir)
        size = self._model_and_meta()[1]  # first: an unknown name or a missing path is the error to report
        if not self.source.dataset:
            raise ValueError(f"{self.path}: give --dataset (and --data-root): a model that is not a "
                             "checkpoint of this project does not record what it classifies")
        task = of_model(self._model_and_meta()[0]).name
        return TrainConfig(task=task, model=self.path.partition("@")[0], dataset=self.source.dataset,
                           data_root=self.source.data_root, img_size=int(size[1]))

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the weights file (from the checkpoint's COMPLETE marker when it has one); for
        other models, of the weights file given with ``@`` or of the loaded parameters."""
        if not self.is_project:
            _, _, weights = self.path.partition("@")
            if weights:
                return sha256_file(Path(weights))
            return weights_sha256(self.load())
        from ..train.checkpoint import EMA_FILE, MARKER_FILE, MODEL_FILE

        fname = EMA_FILE if self.source.ema else MODEL_FILE
        marker = read_json(self.ckpt_dir / MARKER_FILE)
        try:
            return str(marker["files"][fname]["sha256"])  # type: ignore[index]
        except (TypeError, KeyError):
            return sha256_file(self.ckpt_dir / fname)

    def _model_and_meta(self) -> tuple[nn.Module, Any]:
        if self._loaded is None:
            if self.is_project:
                from ..train.checkpoint import load_model

                # the checkpoint the fingerprint names (latest.json may have moved on: a run still training)
                model, _ = load_model(self.ckpt_dir, self.device, ema=self.source.ema)
                self._loaded = (model, None)
            else:
                from ..models.normalize import NormalizedModel
                from ..train.resolve import resolve_model

                loaded = resolve_model(self.path, pretrained=False, device=self.device)
                if loaded.takes_text:
                    raise ValueError(f"{self.path} is a text model: the robustness suites of "
                                     "other models take image classifiers")
                model = loaded.model
                if loaded.normalize is not None:  # images enter in [0, 1]; normalise inside
                    model = NormalizedModel(model, *loaded.normalize).to(self.device).eval()
                self._loaded = (model, loaded.input_size)
        return self._loaded

    def load(self) -> nn.Module:
        """The model, eval mode, on ``device`` (images in [0, 1] for image classifiers)."""
        return self._model_and_meta()[0]

    def key(self) -> dict[str, Any]:
        """What identifies the weights and how they are fed (the base of every result's key)."""
        cfg = self.config
        key = {"weights": self.fingerprint, "ema": self.source.ema, "dataset": cfg.dataset,
               "img_size": getattr(cfg, "img_size", None), "context": getattr(cfg, "context", None)}
        if not self.is_project:  # (added only when set: keys stored before stay valid)
            # an imagefolder is its root (another dataset's root is only where a copy of it lives)
            if cfg.dataset == "imagefolder" and self.source.data_root is not None:
                key["data_root"] = str(Path(self.source.data_root).expanduser().resolve())
            if "@" in self.path:  # NAME@FILE: the name sets the normalisation and input size, the file not
                key["model"] = self.path.partition("@")[0]
        return key


def model_label(name: str) -> str:
    """The short name of a model specifier, for labels and file names: a run's folder name (resolved, so
    ``run/checkpoints/..`` is ``run``; a checkpoint folder inside a run names the run:
    ``runs/demo/symvit/checkpoints/e0003`` -> ``symvit``), else the model name without its weights file
    (``NAME@FILE`` -> ``NAME``) and without a namespace (``org/model`` -> ``model``)."""
    path = Path(name).expanduser()
    if not path.exists():
        return Path(str(name).partition("@")[0]).name
    path = path.resolve()
    if path.parent.name == "checkpoints":
        path = path.parent.parent
    return path.name


def default_labels(paths: Sequence[str]) -> list[str]:
    """:func:`model_label` of each path (``runs/demo/symvit`` -> ``symvit``); duplicates get ``-2``,
    ``-3``..."""
    labels = [model_label(p) for p in paths]
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab}-{seen[lab]}")
    return out
