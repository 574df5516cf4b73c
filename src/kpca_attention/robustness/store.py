"""One cache for every evaluation: per-example results of one model, item by item, in one JSON file.

A *result store* is a JSON file ``{"items": {item: {"key": params, "result": ...}}}`` holding every
evaluated item of one model - the clean test set, one corruption at one severity, one attack at one
eps, one OOD set, one text split. ``key`` holds everything that produced the number (weights hash or
training settings, data, subset, seeds, attack options): a stored item is reused only when its key is
equal, and the file is rewritten atomically after each new item, so a killed evaluation loses at most
the item in progress. The ``robustness`` command keeps one store per checkpoint and studies one per
(variant, seed); both evaluate through their task's suites (:mod:`kpca_attention.tasks`).

The file's compact form on disk (correctness bits packed, key parts shared by several items written once)
is :mod:`.store_format`'s: every reader sees the items whole.

Integrity: every item carries ``"sha256"``, the SHA-256 of the canonical JSON of its key and result
(:func:`item_hash`), and a file whose items all carry one is marked ``"sealed": true`` and lists the names
of its items (``"sealed_items"``). Loading (:class:`ResultStore`, hence every reader: the study report, the
engine, the robustness command) checks each hash, each item's summary against its per-example data
(:func:`check_summary`: the stored accuracy against the correctness bits, a perplexity against its mean
NLL) and, in a sealed file, that no item lacks a hash and that the items are those listed (an item deleted
by hand would otherwise read as one not computed yet); any failure is a :class:`ResultIntegrityError`
naming the file and the item. Deleting items on purpose (to compute them again) is recorded with
``kpca-attention results seal``.
A legacy file (no hashes, written before hashes existed) still loads, its summaries checked; new items
written into it are hashed; ``kpca-attention results seal`` verifies it and adds the missing hashes.

Reuse without copies: a study that takes another study's results for a run (``Study.reuse``: the same model,
training and suites) writes a *reference* (:func:`write_reference`) instead of a copy of the file:
``{"items": {}, "reuses": {"study": OTHER, "file": NAME, "sha256": {item: hash}}}``, the other file being
``<results root>/OTHER/results/NAME`` (``OTHER`` a study folder beside this study's, ``NAME`` a file name:
no paths). Loading it reads the named items from that file and checks each against the hash recorded when
it was taken: a changed, missing or moved file is a :class:`ResultIntegrityError`, never a silent
substitute. Items the study computes itself are stored in its own file beside the reference.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..io import folder_lock, json_ready, write_json_atomic
from .common import accuracy_of_hits, topk_hits
from .store_format import (
    ResultIntegrityError,
    canonical_json,
    compact_items,
    decode_bits,
    encode_bits,
    expand_items,
    file_data,
    item_names,
    pack_bits,
    read_file,
    unpack_bits,
)

__all__ = ["ResultStore", "ResultIntegrityError", "encode_bits", "decode_bits", "example_result",
           "example_hits", "join_hits", "normalise_key", "item_hash", "check_summary", "seal_store",
           "store_files", "write_reference", "compact_items", "expand_items", "pack_bits", "unpack_bits"]


def example_result(logits: Tensor, labels: Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, Any]:
    """``{"top1", "top5", "n", "correct"}`` of logits ``(N, K)`` against labels ``(N,)``; ``correct``
    is the per-example top-1 correctness as bits (:func:`encode_bits`), the same hits ``top1`` counts."""
    hits = topk_hits(logits, labels, (1, *(k for k in ks if k != 1)))
    return {**accuracy_of_hits({k: hits[k] for k in ks}), "n": int(labels.numel()),
            "correct": encode_bits(hits[1])}


def example_hits(logits: Tensor, labels: Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, Any]:
    """Per-example top-k hits of logits ``(N, K)`` as bits, ``{"correct": top-1, "correct5": top-5, "n"}``:
    what a chunk of examples stores so that :func:`join_hits` of the chunks gives :func:`example_result`
    of all their logits at once."""
    hits = topk_hits(logits, labels, ks)
    return {"n": int(labels.numel()), **{_bits_name(k): encode_bits(h) for k, h in hits.items()}}


def join_hits(chunks: Iterable[Mapping[str, Any]], ks: tuple[int, ...] = (1, 5)) -> dict[str, Any]:
    """:func:`example_result` (``top1``, ``top5``, ``n``, ``correct``) of the examples of :func:`example_hits`
    chunks, in order."""
    chunks = list(chunks)
    bits = {k: "".join(c[_bits_name(k)] for c in chunks) for k in ks}
    top = accuracy_of_hits({k: torch.from_numpy(decode_bits(b)) for k, b in bits.items()})
    return {**top, "n": len(bits[1]), "correct": bits[1]}


def _bits_name(k: int) -> str:
    return "correct" if k == 1 else f"correct{k}"


def normalise_key(key: Mapping[str, Any]) -> dict[str, Any]:
    """``key`` as it reads back from JSON (tuples -> lists, keys -> str), so the two compare equal."""
    return json.loads(json.dumps(json_ready(key), sort_keys=True))


def _as_read_back(value: Any) -> Any:
    """``value`` as the file gives it back (the JSON the store writes, read again)."""
    return json.loads(json.dumps(json_ready(value), sort_keys=True, allow_nan=False))


def item_hash(key: Any, result: Any) -> str:
    """SHA-256 (hex) of the canonical JSON (sorted keys, no spaces) of ``{"key": key, "result": result}``
    as they read back from the file."""
    text = canonical_json({"key": _as_read_back(key), "result": _as_read_back(result)})
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def check_summary(result: Any) -> str | None:
    """What is wrong with a result whose summary disagrees with its per-example data (None: nothing):
    ``correct`` bits must be '0'/'1', ``n`` of them, and ``top1`` their mean; ``ppl`` must be
    ``exp(nll_mean)``."""
    if not isinstance(result, dict):
        return None
    bits = result.get("correct")
    if isinstance(bits, str):
        if bits.strip("01"):
            return "its correctness bits hold characters other than 0/1"
        n = result.get("n")
        if isinstance(n, int) and n != len(bits):
            return f"n = {n} but it holds {len(bits)} correctness bits"
        top1 = result.get("top1")
        k = bits.count("1")
        if isinstance(top1, (int, float)) and bits and abs(top1 * len(bits) - k) >= 0.5:
            return f"top1 = {top1} but {k} of its {len(bits)} correctness bits are 1 ({k / len(bits):.6f})"
    ppl, nll = result.get("ppl"), result.get("nll_mean")
    if isinstance(ppl, (int, float)) and isinstance(nll, (int, float)) and math.isfinite(nll) and nll < 700:
        if not math.isclose(ppl, math.exp(nll), rel_tol=1e-6):
            return f"ppl = {ppl} but exp(nll_mean) = {math.exp(nll)}"
    return None


#: what to do with an item that fails its checks
_RECOMPUTE = ("to compute it again, delete the item and record the deletion with "
              "`kpca-attention results seal FILE`")


def _is_sealed(data: Mapping[str, Any]) -> bool:
    """Whether a file's items must all carry hashes: marked sealed, or listing its items' names (only a
    sealed file does: removing the mark alone does not make a sealed file legacy)."""
    return bool(data.get("sealed")) or "sealed_items" in data


def _check_names(path: Path, data: dict[str, Any]) -> None:
    """A sealed file lists the names of its items (``"sealed_items"``): an item removed or added by hand is
    an error naming it (files sealed before the list existed have none and are not checked)."""
    listed = data.get("sealed_items")
    if listed is None:
        return
    if not (isinstance(listed, list) and all(isinstance(n, str) for n in listed)):
        raise ResultIntegrityError(f"{path}: its \"sealed_items\" entry is damaged (expected a list of "
                                   "names)")
    held = item_names(data.get("items", {}), data.get("reuses"))
    if held != sorted(listed):
        gone, extra = sorted(set(listed) - set(held)), sorted(set(held) - set(listed))
        parts = (f"removed {gone[:4]}" if gone else "", f"added {extra[:4]}" if extra else "")
        raise ResultIntegrityError(
            f"{path}: its items are not those it was sealed with ({'; '.join(p for p in parts if p)}): a "
            "removed item would read as a run not finished yet. If you removed items on purpose to compute "
            f"them again, record it with `kpca-attention results seal {path}`")


def _verify(path: Path, data: dict[str, Any], *, require_hashes: bool) -> None:
    for item, stored in data.get("items", {}).items():
        where = f"{path}: item {item!r}"
        if not isinstance(stored, dict) or "result" not in stored or "key" not in stored:
            raise ResultIntegrityError(f"{where} is damaged (expected key and result)")
        digest = stored.get("sha256")
        if digest is None and require_hashes:
            raise ResultIntegrityError(f"{where} has no hash in a sealed file (an item was added or replaced "
                                       f"by hand); {_RECOMPUTE}")
        if digest is not None and digest != item_hash(stored["key"], stored["result"]):
            raise ResultIntegrityError(f"{where} was changed after it was written (its SHA-256 does not "
                                       f"match); {_RECOMPUTE}")
        wrong = check_summary(stored["result"])
        if wrong:
            raise ResultIntegrityError(f"{where} disagrees with itself: {wrong}")


def store_files(folder: str | os.PathLike) -> list[Path]:
    """The result files of ``folder``: a study or robustness folder (its ``results/*.json``), a folder of
    result files, or one file."""
    p = Path(folder)
    if p.is_file():
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None
        if not (isinstance(data, dict) and "items" in data):  # never rewrite settings.json, config.json...
            raise ValueError(f"{p} is not a result file (a JSON object holding \"items\"): give a study or "
                             "robustness folder, a folder of result files, or one result file")
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"no such folder or result file: {p}")
    study = (p / "results").is_dir()
    root = p / "results" if study else p
    files = []
    for f in sorted(root.glob("*.json")):
        if f.is_symlink() or not f.is_file():  # a FIFO hangs the read, a link to /dev/zero fills the memory
            raise ResultIntegrityError(f"{f} is not a regular file (a link, a pipe or a device): a result "
                                       "folder holds result files only - remove it")
        text = f.read_text(encoding="utf-8", errors="replace")
        if '"items"' in text:  # a result file (read and verified whole by ResultStore)
            files.append(f)
            continue
        try:  # parsed only when it holds no "items": another JSON file, or one emptied or cut short
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if study or data is None:  # a study's results/ holds result files only; unreadable JSON is damage
            raise ResultIntegrityError(f"{f} is not a readable result file (empty, cut short or not a JSON "
                                       "object holding \"items\"): restore it from the repository or "
                                       "delete it to recompute its run")
    if not files:
        raise FileNotFoundError(f"no result files in {root} (expected *.json holding \"items\")")
    return files


def seal_store(path: str | os.PathLike) -> tuple[int, int]:
    """Verify a store file (hashes present, summaries) and add the missing hashes; mark it sealed.
    Returns ``(items, newly hashed)``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no result file {path}")
    with folder_lock(path.parent):  # the lock a put takes: an item stored meanwhile is not lost
        data = read_file(path)
        if data is None:
            raise FileNotFoundError(f"no result file {path}")
        _verify(path, data, require_hashes=_is_sealed(data))
        reuses = data.get("reuses")
        taken = _reused_items(path, reuses) if reuses is not None else {}
        items = data.get("items", {})
        new = 0
        for stored in items.values():
            if "sha256" not in stored:
                stored["sha256"] = item_hash(stored["key"], stored["result"])
                new += 1
        write_json_atomic(path, file_data(items, reuses, sealed=True), indent=None)
    return len(taken.keys() | items.keys()), new


#: a study folder or a result file name in a reference (a plain name: no separators, no leading dot)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _referenced_path(path: Path, study: str, name: str) -> Path:
    """``<results root>/<study>/results/<name>`` for the result file ``<results root>/<this study>/results/
    <file>`` at ``path``."""
    return path.parent.parent.parent / study / "results" / name


def _reused_items(path: Path, reuses: Any) -> dict[str, dict[str, Any]]:
    """The items the reference in the result file ``path`` takes from another study's file, each checked
    against the hash recorded when it was taken (module docstring)."""
    if not (isinstance(reuses, dict) and isinstance(reuses.get("study"), str)
            and isinstance(reuses.get("file"), str) and isinstance(reuses.get("sha256"), dict)):
        raise ResultIntegrityError(f"{path}: its \"reuses\" entry is damaged (expected study, file and "
                                   "sha256)")
    study, name = reuses["study"], reuses["file"]
    if not (_PLAIN_NAME.fullmatch(study) and _PLAIN_NAME.fullmatch(name) and name.endswith(".json")):
        raise ResultIntegrityError(f"{path}: \"reuses\" names {study!r} / {name!r}; valid: the folder name "
                                   "of a study beside this one and a result file name (*.json), no paths")
    theirs = _referenced_path(path, study, name)
    data = read_file(theirs)
    if data is None:
        raise ResultIntegrityError(f"{path} reuses the items of {theirs}, which is missing (a study's "
                                   "results refer to the files of the studies beside it: keep the results "
                                   "folder whole)")
    if "reuses" in data:
        raise ResultIntegrityError(f"{path} reuses {theirs}, which is itself a reference (one level only)")
    stored = data.get("items", {})
    wanted: dict[str, Any] = reuses["sha256"]
    missing = sorted(set(wanted) - set(stored))
    if missing:
        raise ResultIntegrityError(f"{path} reuses item {missing[0]!r} of {theirs}, which no longer holds "
                                   "it; run the study again to take or compute it anew")
    taken = {item: stored[item] for item in wanted}
    _verify(theirs, {"items": taken}, require_hashes=False)
    for item, digest in wanted.items():
        if item_hash(taken[item]["key"], taken[item]["result"]) != digest:
            raise ResultIntegrityError(f"{path} reuses item {item!r} of {theirs}, which changed since it was "
                                       "taken (its SHA-256 differs); run the study again to take it anew")
    return taken


def write_reference(path: str | os.PathLike, theirs: str | os.PathLike) -> int:
    """Make ``path`` a result file that reuses every item of ``theirs`` - the same run's result file in
    another study folder beside this one - by name and hash instead of a copy (module docstring); returns
    the number of items. Items ``path`` held before are replaced."""
    path, theirs = Path(path), Path(theirs)
    if theirs.resolve().parent.parent.parent != path.resolve().parent.parent.parent \
            or theirs.parent.name != "results":
        raise ValueError(f"{theirs} is not a result file of a study beside {path.parent.parent}")
    data = read_file(theirs)
    if data is None:
        raise FileNotFoundError(f"no result file {theirs}")
    if "reuses" in data:
        raise ValueError(f"{theirs} is itself a reference; refer to the file it reuses")
    _verify(theirs, data, require_hashes=_is_sealed(data))
    _check_names(theirs, data)
    hashes = {item: stored.get("sha256") or item_hash(stored["key"], stored["result"])
              for item, stored in data.get("items", {}).items()}
    reuses = {"study": theirs.parent.parent.name, "file": theirs.name, "sha256": hashes}
    _reused_items(path, reuses)  # the reference resolves from where it is written
    path.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(path.parent):  # not between another writer's read and write of this file
        write_json_atomic(path, file_data({}, reuses, sealed=True), indent=None)
    return len(hashes)


class ResultStore:
    """The items of one model in one JSON file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, *, check_listed: bool = True) -> None:
        """Read and verify ``path`` (a missing file is an empty store); ``check_listed=False`` accepts a
        sealed file whose items differ from the names it was sealed with (``results seal`` records a
        deletion)."""
        self.path = Path(path)
        data = read_file(self.path) or {}
        self._sealed = _is_sealed(data) or not data.get("items")  # a new file is sealed
        _verify(self.path, data, require_hashes=self._sealed)
        if check_listed:
            _check_names(self.path, data)
        self._reuses: dict[str, Any] | None = data.get("reuses")
        #: items taken from another study's file (a reference), and this file's own items
        self._taken = _reused_items(self.path, self._reuses) if self._reuses is not None else {}
        self._own: dict[str, dict[str, Any]] = dict(data.get("items", {}))
        self._items: dict[str, dict[str, Any]] = {**self._taken, **self._own}
        #: the other study's result file this one takes items from (a reference), or None
        self.taken_from = None if self._reuses is None else _referenced_path(
            self.path, self._reuses["study"], self._reuses["file"])
        self.reused = 0
        self.computed = 0

    @property
    def sealed(self) -> bool:
        """Whether every item must carry its hash (a file written by this version, or sealed since); a
        legacy file is not, and an item in it can be edited without a trace until it is sealed."""
        return self._sealed

    def __contains__(self, item: str) -> bool:
        return item in self._items

    def get(self, item: str, key: Mapping[str, Any]) -> Any | None:
        """The stored result of ``item`` if its key equals ``key``, else ``None``."""
        stored = self._items.get(item)
        if isinstance(stored, dict) and stored.get("key") == normalise_key(key) and "result" in stored:
            return stored["result"]
        return None

    def put(self, item: str, key: Mapping[str, Any], result: Any) -> None:
        """Store one item. Two processes may evaluate the same model at once (e.g. ``benchmark`` at two
        budgets): under a lock on the folder, the items another process wrote since this store was read
        are taken in before the file is rewritten, so neither loses the other's."""
        nkey = normalise_key(key)
        mine = {"key": nkey, "result": result, "sha256": item_hash(nkey, result)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(self.path.parent):
            on_disk = read_file(self.path)
            if on_disk is not None:
                # verify what this store does not already hold as read (and verified): another writer's
                # items, or an edit since - not the whole file again on every put
                new = {k: v for k, v in on_disk.get("items", {}).items() if self._own.get(k) != v}
                _verify(self.path, {"items": new}, require_hashes=_is_sealed(on_disk))
                self._own = {**self._own, **new}
            self._own[item] = mine
            self._items = {**self._taken, **self._own}
            # a legacy file stays unsealed (its old items have no hash) until `results seal`
            data = file_data(self._own, self._reuses, sealed=self._sealed)
            write_json_atomic(self.path, data, indent=None)

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

    def run_items(self) -> dict[str, Any]:
        """``{item: result}`` of the items computed from the run the ``run`` item describes: those whose key
        holds every field of the ``run`` item's key with the same value (the training settings, or an
        existing model's weights hash, and the results version). An item stored under another run's key - a
        re-evaluation killed half way after the weights or the protocol changed - is left out, so a report
        never mixes two trainings in one row (it reads the run as missing that item). Everything when there
        is no ``run`` item yet."""
        records = self.records()
        run = records.get("run")
        if run is None or not isinstance(run.get("key"), dict):
            return self.items()
        base = run["key"]
        return {k: r["result"] for k, r in records.items()
                if isinstance(r.get("key"), dict) and all(r["key"].get(f) == v for f, v in base.items())}

    def records(self) -> dict[str, dict[str, Any]]:
        """``{item: {"key": ..., "result": ...}}`` of everything stored (verified when the file was read)."""
        return {k: {"key": v["key"], "result": v["result"]} for k, v in self._items.items()}
