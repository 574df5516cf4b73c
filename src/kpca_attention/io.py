"""Files written so that a crash never leaves half of one: the package's one atomic JSON writer.

Every JSON file the package writes (results, summaries, checkpoint markers, ``latest.json``) goes
through :func:`write_json_atomic`: a temporary file in the same folder, ``fsync``, ``os.replace``,
then an ``fsync`` of the folder, so a reader sees the old file or the new one, never a mix, and a
power cut after the call returns keeps the new one. :func:`write_text_atomic` does the same for text
(reports). :func:`read_json` returns ``None`` for a missing or unreadable file (a cache miss).

:func:`output_path` is the one place that turns a name given by a user (a label, a model name, a path
used as a name) into a path inside an output folder: a name that would leave the folder (``..``, an
absolute path, a symbolic link pointing out) is refused before anything is written.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import lzma
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "write_json_atomic", "write_text_atomic", "read_json", "json_ready", "fsync_dir",
           "sha256_file", "output_path", "pack_bytes", "unpack_bytes", "new_file_mode", "check_output",
           "folder_lock"]


def check_output(path: str | os.PathLike | None, what: str, *, folder: bool) -> None:
    """Refuse, before any work, an output that cannot be written: a ``folder`` that exists as a file, or a
    file that exists as a folder or whose parent is a file (``ValueError`` naming ``what``: ``--json``)."""
    if path is None:
        return
    p = Path(path)
    if folder and p.is_file():
        raise ValueError(f"{what} {p} is a file: give a folder (it is created if missing)")
    if not folder and p.is_dir():
        raise ValueError(f"{what} {p} is a folder: give a file name")
    if not folder and any(parent.is_file() for parent in p.parents):
        raise ValueError(f"{what} {p}: a folder on its path is a file")


def output_path(out: str | os.PathLike, *names: str | os.PathLike, what: str = "name") -> Path:
    """``out / names[0] / names[1] ...``, refused when it does not stay inside ``out``.

    Every file name derived from user input goes through here. ``names`` may hold sub-folders
    (``"results/x.json"``); an empty name, an absolute path, a ``..`` that climbs out of ``out`` and a
    symbolic link (already on disk, anywhere along the path) that points outside ``out`` are refused.

    Raises:
        ValueError: ``"<what> '../x' would write outside the output folder OUT; give a plain name"``.
    """
    base = Path(out)
    path = base
    for name in names:
        text = os.fspath(name)
        if not text or not text.strip() or Path(text).is_absolute() or "\x00" in text:
            raise ValueError(f"{what} {text!r} is not a valid file name inside the output folder {base}; "
                             "give a plain, non-empty name")
        path = path / text
    root = base.resolve()
    target = path.resolve()  # follows symbolic links that exist, normalises '..'
    if target != root and root not in target.parents:
        shown = os.path.join(*map(os.fspath, names)) if names else ""
        raise ValueError(f"{what} {shown!r} would write outside the output folder {base} (to {target}); "
                         "give a plain name without '..', '/' at the start or links leading out")
    return path


def fsync_dir(path: str | os.PathLike) -> None:
    """``fsync`` a directory (its entries), where the file system allows opening one."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def json_ready(obj: Any) -> Any:
    """``obj`` with mapping keys turned into strings, tuples into lists and non-finite floats into
    ``None`` (strict JSON has no NaN / Infinity), recursively."""
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:  # numpy / torch scalars
        return json_ready(obj.item())
    return obj


def new_file_mode() -> int:
    """The permissions open() gives a new file now (0o666 less the umask): mkstemp's temporary files are
    0600, which a result, a plot or a cache file renamed into place would keep (unreadable to a
    collaborator). The umask is read from /proc (Linux), else by setting and restoring it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """A temporary file beside ``path`` (folders created, the process's usual permissions) to write to;
    renamed over ``path`` when the block ends without an error, deleted otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    try:
        os.fchmod(fd, new_file_mode())
        os.close(fd)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike) -> Iterator[None]:
    """An exclusive ``flock`` on the folder itself (no lock file left beside the files it guards); waits.
    For read-modify-write of files that several processes update (a result store, a study's settings);
    the kernel releases it when its holder dies, so it never goes stale."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(path.parent)
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (sorted keys, :func:`json_ready`) atomically; returns the path."""
    text = json.dumps(json_ready(obj), indent=indent, sort_keys=True, allow_nan=False)
    return write_text_atomic(path, text + "\n")


def read_json(path: str | os.PathLike) -> Any | None:
    """The JSON in ``path``, or ``None`` when it is missing or unreadable (then it is recomputed)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # deep nesting: unreadable
        return None


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pack_bytes(raw: bytes) -> str:
    """Bytes as compact JSON-safe text: xz (``lzma`` preset 9e), then base85 (``base64.b85encode``: no
    character JSON escapes; it adds 25 % where base64 adds 33 %). The per-example arrays of the result files
    (segmentation's pixel counts, language's per-token NLLs) are stored this way."""
    return base64.b85encode(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)).decode("ascii")


#: the most bytes :func:`unpack_bytes` unpacks when its caller knows no bound (a result item is far smaller)
UNPACK_LIMIT = 1 << 30


def unpack_bytes(text: str, max_size: int = UNPACK_LIMIT) -> bytes:
    """The bytes of :func:`pack_bytes` (``ValueError`` / ``lzma.LZMAError`` on text it did not write), at
    most ``max_size`` of them: a few hundred KB of xz can unpack to gigabytes (a decompression bomb in a
    downloaded result or analysis file), so a caller that knows the size passes it, and more is refused."""
    dec = lzma.LZMADecompressor()
    out = dec.decompress(base64.b85decode(text), max_length=max_size + 1)
    if len(out) > max_size or not dec.eof:
        raise ValueError(f"packed data unpacks to more than the {max_size} bytes it may hold (damaged, or a "
                         "decompression bomb)")
    return out
