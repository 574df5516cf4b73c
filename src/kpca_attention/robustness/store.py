"""One cache for every evaluation: per-example results of one model, item by item, in one JSON file.

A *result store* is a JSON file ``{"items": {item: {"key": params, "result": ...}}}`` holding every
evaluated item of one model - the clean test set, one corruption at one severity, one attack at one
eps, one OOD set, one text split. ``key`` holds everything that produced the number (weights hash or
training settings, data, subset, seeds, attack options): a stored item is reused only when its key is
equal, and the file is rewritten atomically after each new item, so a killed evaluation loses at most
the item in progress. The ``robustness`` command keeps one store per checkpoint and studies one per
(variant, seed); both evaluate through :mod:`kpca_attention.robustness.suites`.

Per-example correctness is stored as a '0'/'1' string (:func:`encode_bits`): exact, compact and
readable, so paired statistics (McNemar, bootstrap over images) can be computed later from the files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from ..io import read_json, write_json_atomic

__all__ = ["ResultStore", "encode_bits", "decode_bits", "example_result", "normalise_key"]


def encode_bits(correct: np.ndarray | Tensor | Iterable[bool]) -> str:
    """A boolean vector as a '0'/'1' string."""
    arr = np.asarray(correct.cpu() if isinstance(correct, Tensor) else list(correct), dtype=bool)
    return arr.astype(np.uint8).tobytes().translate(bytes.maketrans(b"\x00\x01", b"01")).decode()


def decode_bits(bits: str) -> np.ndarray:
    """The boolean vector of :func:`encode_bits`."""
    return np.frombuffer(bits.encode(), dtype=np.uint8) == ord("1")


def example_result(logits: Tensor, labels: Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, Any]:
    """``{"top1", "top5", "n", "correct"}`` of logits ``(N, K)`` against labels ``(N,)``; ``correct``
    is the per-example top-1 correctness as bits (:func:`encode_bits`)."""
    from .common import topk_accuracy

    correct = logits.argmax(1) == labels
    return {**topk_accuracy(logits, labels, ks), "n": int(labels.numel()), "correct": encode_bits(correct)}


def normalise_key(key: Mapping[str, Any]) -> dict[str, Any]:
    """``key`` as it reads back from JSON (tuples -> lists, keys -> str), so the two compare equal."""
    from ..io import json_ready

    return json.loads(json.dumps(json_ready(key), sort_keys=True))


class ResultStore:
    """The items of one model in one JSON file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        data = read_json(self.path)
        self._items: dict[str, dict[str, Any]] = dict(data.get("items", {})) if isinstance(data, dict) else {}
        self.reused = 0
        self.computed = 0

    def __contains__(self, item: str) -> bool:
        return item in self._items

    def get(self, item: str, key: Mapping[str, Any]) -> Any | None:
        """The stored result of ``item`` if its key equals ``key``, else ``None``."""
        stored = self._items.get(item)
        if isinstance(stored, dict) and stored.get("key") == normalise_key(key) and "result" in stored:
            return stored["result"]
        return None

    def put(self, item: str, key: Mapping[str, Any], result: Any) -> None:
        self._items[item] = {"key": normalise_key(key), "result": result}
        write_json_atomic(self.path, {"items": self._items}, indent=None)

    def get_or_compute(self, item: str, key: Mapping[str, Any],
                       compute: Callable[[], Any]) -> tuple[Any, bool]:
        """``(result, reused)``: the stored result when its key matches, else ``compute()`` (stored)."""
        hit = self.get(item, key)
        if hit is not None:
            self.reused += 1
            return hit, True
        result = compute()
        self.put(item, key, result)
        self.computed += 1
        return result, False

    def items(self) -> dict[str, Any]:
        """``{item: result}`` of everything stored (whatever its key)."""
        return {k: v["result"] for k, v in self._items.items() if isinstance(v, dict) and "result" in v}
