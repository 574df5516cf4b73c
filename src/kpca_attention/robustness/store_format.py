"""The compact form of a result file on disk (:mod:`.store`): what a file holds is the items whole; what
it writes is smaller, and reading gives the items back exactly.

Per-example correctness is a '0'/'1' string (:func:`encode_bits`) in every result a reader sees: exact and
readable, so paired statistics (McNemar, bootstrap over images) can be computed later from the files. On
disk each such string of 64 bits or more is packed, eight bits a byte in base64 (:func:`pack_bits`, about a
sixth of the characters: the bits were most of a run's file, and a study's folder must stay small enough to
commit), the file saying so with ``"bits": "packbits-base64"``; reading unpacks them (:func:`unpack_bits`)
before anything else looks at the items, so results, hashes and references are those of the strings. A file
without that entry (the format before) reads as it is; ``kpca-attention results seal`` rewrites it packed.

Shared key parts: a run's file keys each of its ~90 items by the same training settings, so the file holds
each such part once: a key field whose value (an object or a list) is the same in several items is written
once under ``"shared": {field: value}`` and each of those items' keys holds ``{"$shared": field}`` in its
place (:func:`compact_items`). Reading puts the value back (:func:`expand_items`) before anything else
looks at the items, so keys, hashes and references are those of the full keys: a file written before this
format (every key whole) reads the same, and a changed shared part changes the hash of every item using it.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from ..io import json_ready

__all__ = ["ResultIntegrityError", "encode_bits", "decode_bits", "canonical_json", "pack_bits", "unpack_bits",
           "compact_items", "expand_items", "read_file", "file_data", "item_names", "BITS_ENCODING"]


class ResultIntegrityError(ValueError):
    """A result file or item that is damaged or was changed after it was written (names both)."""


def encode_bits(correct: np.ndarray | Tensor | Iterable[bool]) -> str:
    """A boolean vector as a '0'/'1' string."""
    arr = np.asarray(correct.cpu() if isinstance(correct, Tensor) else list(correct), dtype=bool)
    return arr.astype(np.uint8).tobytes().translate(bytes.maketrans(b"\x00\x01", b"01")).decode()


def decode_bits(bits: str) -> np.ndarray:
    """The boolean vector of :func:`encode_bits`."""
    return np.frombuffer(bits.encode(), dtype=np.uint8) == ord("1")


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (sorted keys, no spaces, ASCII, no NaN): what item hashes are
    taken of and what tells equal shared key parts apart."""
    return json.dumps(json_ready(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def read_file(path: Path) -> dict[str, Any] | None:
    """The JSON of a store file, None when there is none; a damaged file is an error (never an empty
    store: its items would silently be recomputed or, in a report, left out)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ResultIntegrityError(f"{path}: cannot read the result file ({e})") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultIntegrityError(f"{path}: the result file is not valid JSON ({e}); delete it to "
                                   "recompute its items") from e
    if not isinstance(data, dict) or not isinstance(data.get("items", {}), dict):
        raise ResultIntegrityError(f"{path}: not a result file (expected {{\"items\": {{...}}}})")
    shared = data.pop("shared", None)
    data["items"] = expand_items(path, data.get("items", {}), shared)
    encoding = data.pop("bits", None)
    if encoding is not None:
        if encoding != BITS_ENCODING:
            raise ResultIntegrityError(f"{path}: its bits are stored as {encoding!r}; this version reads "
                                       f"{BITS_ENCODING!r} (or strings of 0/1)")
        data["items"] = {item: _unpacked_item(path, item, stored) for item, stored in data["items"].items()}
    return data


#: the marker of a packed bit string (:func:`pack_bits`), the file's name for the encoding, and the shortest
#: string packed (a shorter one would not get shorter)
_BITS = "$bits"
BITS_ENCODING = "packbits-base64"
_PACK_MIN = 64


def pack_bits(bits: str) -> dict[str, Any]:
    """A '0'/'1' string as ``{"$bits": base64 of numpy.packbits (first bit the high bit of the first byte),
    "length": number of bits}``."""
    packed = np.packbits(decode_bits(bits)).tobytes()
    return {_BITS: base64.b64encode(packed).decode("ascii"), "length": len(bits)}


def unpack_bits(packed: Mapping[str, Any]) -> str:
    """The '0'/'1' string of :func:`pack_bits`; a damaged one (bad base64, a length that does not fit the
    bytes, padding bits set) is a ValueError."""
    n = packed.get("length")
    try:
        raw = base64.b64decode(packed.get(_BITS), validate=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"its packed bits are not base64 ({e})") from e
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or len(raw) != (n + 7) // 8:
        raise ValueError(f"its packed bits hold {len(raw)} bytes, which is not {n!r} bits")
    arr = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))
    if arr[n:].any():
        raise ValueError("its packed bits have padding bits set")
    return encode_bits(arr[:n])


def _is_packed(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {_BITS, "length"}


def _holds_packed(value: Any) -> bool:
    if isinstance(value, dict):
        return _is_packed(value) or any(_holds_packed(v) for v in value.values())
    return isinstance(value, list) and any(_holds_packed(v) for v in value)


def _packed(value: Any, count: list[int]) -> Any:
    """``value`` with each bit string of :data:`_PACK_MIN` bits or more, at any depth, packed; ``count[0]``
    goes up by one for each string packed (so a writer knows whether it packed anything without a second
    walk)."""
    if isinstance(value, str):
        if len(value) >= _PACK_MIN and not value.strip("01"):
            count[0] += 1
            return pack_bits(value)
        return value
    if isinstance(value, dict):
        return {k: _packed(v, count) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_packed(v, count) for v in value]
    return value


def _unpacked(value: Any) -> Any:
    if _is_packed(value):
        return unpack_bits(value)
    if isinstance(value, dict):
        return {k: _unpacked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpacked(v) for v in value]
    return value


def _unpacked_item(path: Path, item: str, stored: Any) -> Any:
    if not isinstance(stored, dict) or "result" not in stored:
        return stored  # damaged: _verify names it
    try:
        return {**stored, "result": _unpacked(stored["result"])}
    except ValueError as e:
        raise ResultIntegrityError(f"{path}: item {item!r} is damaged: {e}") from e


#: the marker of a key field whose value is the file's ``"shared"`` entry of that name (module docstring)
_SHARED = "$shared"


def _is_marker(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and _SHARED in value


def compact_items(items: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(items, shared)`` as a result file stores them: each key field whose value (an object or a list)
    occurs in two or more items' keys is kept once in ``shared`` (its most frequent value) and replaced by
    ``{"$shared": field}`` in those keys; the rest is unchanged. Keys that already hold such a marker (none
    that the library writes) are left whole, so the file always reads back to ``items``."""
    keys = {item: stored["key"] for item, stored in items.items()
            if isinstance(stored, dict) and isinstance(stored.get("key"), dict)}
    if any(_is_marker(v) for k in keys.values() for v in k.values()):
        return dict(items), {}
    # each key's object / list fields by their canonical text, computed once
    texts = {item: {f: canonical_json(v) for f, v in key.items() if isinstance(v, (dict, list)) and v}
             for item, key in keys.items()}
    counts = Counter((f, t) for by_field in texts.values() for f, t in by_field.items())
    shared_text: dict[str, str] = {}
    for (field, text), n in counts.most_common():
        if n >= 2:
            shared_text.setdefault(field, text)  # the most frequent value of each field
    if not shared_text:
        return dict(items), {}
    shared: dict[str, Any] = {}
    out = dict(items)
    for item, key in keys.items():
        new_key = {}
        for f, v in key.items():
            if f in shared_text and texts[item].get(f) == shared_text[f]:
                shared[f] = v
                v = {_SHARED: f}
            new_key[f] = v
        out[item] = {**items[item], "key": new_key}
    return out, shared


def expand_items(path: Path, items: Mapping[str, Any], shared: Any) -> dict[str, Any]:
    """The items of a result file with every ``{"$shared": field}`` in their keys replaced by a copy of the
    file's ``shared[field]`` (:func:`compact_items` undone; a file without ``shared`` is read as it is); a
    marker without its shared value, or a damaged ``shared`` entry, is a :class:`ResultIntegrityError`."""
    if shared is None:  # a file written whole (the format before, or keys that hold marker-like values)
        return dict(items)
    if not isinstance(shared, dict):
        raise ResultIntegrityError(f"{path}: its \"shared\" entry is damaged (expected an object)")
    out: dict[str, Any] = {}
    for item, stored in items.items():
        key = stored.get("key") if isinstance(stored, dict) else None
        if isinstance(key, dict) and any(_is_marker(v) for v in key.values()):
            whole = {}
            for field, value in key.items():
                if _is_marker(value):
                    name = value[_SHARED]
                    if not isinstance(name, str) or name not in shared:
                        raise ResultIntegrityError(f"{path}: item {item!r} refers to shared part {name!r}, "
                                                   "which the file does not hold")
                    value = json.loads(json.dumps(shared[name]))  # a copy: items never share objects
                whole[field] = value
            stored = {**stored, "key": whole}
        out[item] = stored
    return out


def item_names(items: Mapping[str, Any], reuses: Any) -> list[str]:
    """The sorted names of a file's own items and of those its reference takes (a sealed file lists them)."""
    taken = reuses.get("sha256") if isinstance(reuses, dict) else None
    return sorted(set(items) | (set(taken) if isinstance(taken, dict) else set()))


def file_data(items: dict[str, Any], reuses: dict[str, Any] | None, *, sealed: bool) -> dict[str, Any]:
    """The JSON a result file holds for ``items`` (whole), in the compact form :func:`read_file` reads
    back: key parts shared, bits packed, the reference and the seal (with the items' names)."""
    items, shared = compact_items(items)
    data: dict[str, Any] = {"items": items}
    if shared:
        data["shared"] = shared
    # bits packed (module docstring), unless a result holds what reads as a packed string: then all whole
    results = [stored.get("result") for stored in items.values() if isinstance(stored, dict)]
    if not any(_holds_packed(r) for r in results):
        packed = [0]
        data["items"] = {item: {**stored, "result": _packed(stored["result"], packed)}
                         if isinstance(stored, dict) and "result" in stored else stored
                         for item, stored in items.items()}
        if packed[0]:
            data["bits"] = BITS_ENCODING
    if reuses is not None:
        data["reuses"] = reuses
    if sealed:
        data["sealed"] = True
        data["sealed_items"] = item_names(items, reuses)
    return data
