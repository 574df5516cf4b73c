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
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any

__all__ = ["check_int", "check_real", "check_choice", "describe_range"]


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


def check_int(value: Any, name: str, *, min: int | None = None, max: int | None = None,
              allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` if it is an integer (Python or NumPy, not bool) in ``[min, max]``.

    Raises:
        ValueError: ``"<name> must be an integer >= 1; got 'abc'"``.
    """
    if value is None and allow_none:
        return None
    valid = describe_range("an integer", min, max, allow_none=allow_none)
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
    valid = describe_range(kind, min, max, min_open=min_open, max_open=max_open, allow_none=allow_none)
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
