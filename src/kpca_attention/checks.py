"""Argument checks shared by the public functions and the configuration: one line naming the option,
the value and what is valid, raised before any work is done.

Every check raises ``ValueError`` (also for a value of the wrong type), so a command-line front end
needs to catch one exception class to print the message. ``bool`` is never accepted as a number
(``True`` is an ``int`` in Python, but ``epochs=True`` is a mistake, not 1 epoch).

Example:
    >>> check_int(20, "steps", min=1)
    20
    >>> check_real(0.5, "rate", min=0, max=1)
    0.5

A function or command with many options declares them in one table, as scikit-learn's
``_parameter_constraints``, and checks them all at once before any work:

    >>> OPTIONS = {"batch_size": Int(min=1), "rate": Real(min=0, max=1), "order": Choice(("abs", "signed"))}
    >>> check_parameters({"batch_size": 16, "rate": 0.5, "order": "abs"}, OPTIONS, cli=True)
    {'batch_size': 16, 'rate': 0.5, 'order': 'abs'}

:func:`check_count` bounds a count by what the input holds (``--n`` images of a 10,000-image split).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["check_int", "check_real", "check_choice", "check_slug", "describe_range", "check_count",
           "check_parameters", "Int", "Real", "Bool", "Text", "Choice", "option_name", "error_line"]


def describe_range(kind: str, min: float | None = None, max: float | None = None, *,
                   min_open: bool = False, max_open: bool = False, allow_none: bool = False) -> str:
    """What is valid, in words: ``"an integer >= 1"``, ``"a finite number in [0, 1)"``, ``"... or None"``."""
    def fmt(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    if min is not None and max is not None:
        text = f"{kind} in {'(' if min_open else '['}{fmt(min)}, {fmt(max)}{')' if max_open else ']'}"
    elif min is not None:
        text = f"{kind} {'>' if min_open else '>='} {fmt(min)}"
    elif max is not None:
        text = f"{kind} {'<' if max_open else '<='} {fmt(max)}"
    else:
        text = kind
    return text + (" or None" if allow_none else "")


def _is_option(name: str) -> bool:
    """``name`` is a command-line option (``--epochs``): there None is leaving the option out, so the
    message does not offer it as a value."""
    return name.startswith("--")


def check_int(value: Any, name: str, *, min: int | None = None, max: int | None = None,
              allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` if it is an integer (Python or NumPy, not bool) in ``[min, max]``.

    Raises:
        ValueError: ``"<name> must be an integer >= 1; got 'abc'"``.
    """
    if value is None and allow_none:
        return None
    valid = describe_range("an integer", min, max, allow_none=allow_none and not _is_option(name))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {valid}; got {value!r}")
    if (min is not None and value < min) or (max is not None and value > max):
        raise ValueError(f"{name} must be {valid}; got {value!r}")
    return int(value)


def check_real(value: Any, name: str, *, min: float | None = None, max: float | None = None,
               min_open: bool = False, max_open: bool = False, allow_none: bool = False,
               allow_inf: bool = False) -> float | None:
    """``value`` as a ``float`` if it is a real number (not bool), finite (unless ``allow_inf``), not
    NaN, and in the interval given by ``min``/``max`` (closed ends unless ``min_open``/``max_open``).

    Raises:
        ValueError: ``"<name> must be a finite number > 0; got 'fast'"``.
    """
    if value is None and allow_none:
        return None
    kind = "a number (inf allowed)" if allow_inf else "a finite number"
    valid = describe_range(kind, min, max, min_open=min_open, max_open=max_open,
                           allow_none=allow_none and not _is_option(name))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {valid}; got {value!r}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be {valid}; got {value!r}")
    if min is not None and (v < min or (min_open and v == min)):
        raise ValueError(f"{name} must be {valid}; got {value!r}")
    if max is not None and (v > max or (max_open and v == max)):
        raise ValueError(f"{name} must be {valid}; got {value!r}")
    return v


def check_choice(value: Any, name: str, choices: Collection[Any]) -> Any:
    """``value`` if it is one of ``choices``; else ``ValueError`` listing them."""
    try:
        ok = value in choices
    except TypeError:  # unhashable value against a set
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")
    return value


def check_slug(value: Any, name: str) -> str:
    """``value`` if it can name files inside a folder: letters, digits, ``_`` and ``.``, not dots alone (so
    no separator, no ``..``); else ``ValueError``. Study variants' slugs, which name their result files and
    plots, also when read back from a downloaded folder's ``settings.json``."""
    if not (isinstance(value, str) and value and all(ch.isalnum() or ch in "_." for ch in value)
            and value.strip(".")):
        raise ValueError(f"{name} {value!r}: use letters, digits, '_' and '.' only")
    return value


def check_count(value: Any, name: str, available: int, what: str, *, min: int = 1,
                allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` in ``[min, available]``: a count of items bounded by what the input holds.

    ``what`` says what ``available`` counts, so the message names the limit's source:
    ``"--n must be an integer in [1, 10000] (the images of the test split of digits); got 1000000000"``.
    """
    if value is None and allow_none:
        return None
    check_int(value, name, min=min, allow_none=allow_none)
    if value > available:
        valid = describe_range("an integer", min, available)
        raise ValueError(f"{name} must be {valid} ({what}); got {value!r}")
    return int(value)


def option_name(key: str, cli: bool) -> str:
    """``"batch_size"`` as the user typed it: ``"--batch-size"`` on the command line, else unchanged."""
    return "--" + key.replace("_", "-") if cli else key


@dataclass(frozen=True)
class Int:
    """One row of a constraints table: an integer in ``[min, max]`` (:func:`check_int`)."""

    min: int | None = None
    max: int | None = None
    allow_none: bool = False

    def __call__(self, value: Any, name: str) -> int | None:
        return check_int(value, name, min=self.min, max=self.max, allow_none=self.allow_none)


@dataclass(frozen=True)
class Real:
    """One row of a constraints table: a real number in an interval (:func:`check_real`)."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False
    allow_none: bool = False
    allow_inf: bool = False

    def __call__(self, value: Any, name: str) -> float | None:
        return check_real(value, name, min=self.min, max=self.max, min_open=self.min_open,
                          max_open=self.max_open, allow_none=self.allow_none, allow_inf=self.allow_inf)


@dataclass(frozen=True)
class Bool:
    """One row of a constraints table: ``True`` or ``False`` (not 1 or "yes"), or None if ``allow_none``."""

    allow_none: bool = False

    def __call__(self, value: Any, name: str) -> bool | None:
        if value is None and self.allow_none:
            return None
        if not isinstance(value, bool):
            none = " or None" if self.allow_none and not _is_option(name) else ""
            raise ValueError(f"{name} must be True or False{none}; got {value!r}")
        return value


@dataclass(frozen=True)
class Text:
    """One row of a constraints table: a non-empty string, or None if ``allow_none``."""

    allow_none: bool = False

    def __call__(self, value: Any, name: str) -> str | None:
        if (value is None and self.allow_none) or (isinstance(value, str) and value):
            return value
        none = " or None" if self.allow_none and not _is_option(name) else ""
        raise ValueError(f"{name} must be a non-empty string{none}; got {value!r}")


@dataclass(frozen=True)
class Choice:
    """One row of a constraints table: one of ``choices`` (:func:`check_choice`)."""

    choices: tuple[Any, ...]
    allow_none: bool = False

    def __call__(self, value: Any, name: str) -> Any:
        if value is None and self.allow_none:
            return None
        return check_choice(value, name, self.choices)


def check_parameters(values: Mapping[str, Any], constraints: Mapping[str, Any], *,
                     cli: bool = False) -> dict[str, Any]:
    """Check every entry of ``values`` that ``constraints`` names (a table ``{name: Int(...) | Real(...)
    | Bool(...) | Text(...) | Choice(...) | callable(value, name)}``) and return the checked values; the
    first bad one raises its one-line ``ValueError``. ``cli``: the message names the option as typed
    (``--batch-size``)."""
    return {key: constraints[key](value, option_name(key, cli)) if key in constraints else value
            for key, value in values.items()}


def error_line(e: BaseException) -> str:
    """An exception as one line for a user: the first line of its message (its class name if it has
    none), the system's words for an ``OSError`` (``path: no such file or directory``, not ``[Errno 2]``),
    and the missing file's name for a ``FileNotFoundError`` that does not say it."""
    text = str(e).strip()
    msg = text.splitlines()[0] if text else type(e).__name__
    if isinstance(e, OSError) and e.strerror and msg.startswith("[Errno"):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror[0].lower()}{e.strerror[1:]}"
    if isinstance(e, FileNotFoundError) and e.filename and str(e.filename) not in msg:
        msg = f"{msg}: {e.filename}"
    return msg
