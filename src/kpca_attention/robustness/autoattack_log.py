"""AutoAttack's robust accuracy after each of its attacks, as it reports them (APGD-CE, APGD-T, FAB-T,
Square in the standard version): the breakdown AutoAttack and RobustBench users read.

pyautoattack computes it on every run but only logs it (``robust accuracy after APGD-CE: 48.00%`` on its
``auto-attack`` logger, when the AutoAttack object is verbose). :func:`run_autoattack` runs an evaluation
and, inside :func:`robust_after_each_attack`, reads those records into a :class:`RobustAfter` - counts
of images still robust after each attack, summed over every AutoAttack run in the block (a benchmark runs
one per chunk of images). The records are read, never shown: a filter on the logger keeps its debug
output away from the user's handlers, and the logger's level and the object's ``verbose`` are restored.
Its warnings (a randomised model, points with zero gradient) reach the user once per evaluation each: it
repeats them for every batch and restart (18 times for one condition), so a repeat - the same words with
other numbers - is dropped and counted, and one line after the evaluation says how many were.
"""

from __future__ import annotations

import contextvars
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

__all__ = ["RobustAfter", "robust_after_each_attack", "run_autoattack"]

_LOGGER = "auto-attack"
_AFTER = re.compile(r"robust accuracy after (\S+): ([0-9.]+)%")
_INITIAL = re.compile(r"initial accuracy: ([0-9.]+)%")


@dataclass
class RobustAfter:
    """Images still classified correctly after each attack, in AutoAttack's order (``clean`` first: before
    any attack), summed over the runs recorded; ``images``: how many images those runs had."""

    counts: dict[str, int] = field(default_factory=dict)
    images: int = 0

    def add(self, counts: dict[str, int], images: int) -> None:
        for name, k in counts.items():
            self.counts[name] = self.counts.get(name, 0) + k
        self.images += images


_RECORDING: contextvars.ContextVar[RobustAfter | None] = contextvars.ContextVar(
    "kpca_attention_autoattack_robust_after", default=None)


@contextmanager
def robust_after_each_attack() -> Iterator[RobustAfter]:
    """Within this block every :func:`run_autoattack` adds its per-attack counts to the yielded record."""
    record = RobustAfter()
    token = _RECORDING.set(record)
    try:
        yield record
    finally:
        _RECORDING.reset(token)


class _Reader(logging.Filter):
    """Takes AutoAttack's progress records (debug level) into ``seen`` and drops them; passes the rest
    (its warnings about randomised or gradient-masking models) on to the user's handlers, each kind once:
    a repeat (the same words, other numbers) is counted in ``repeats``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, float] = {}
        self.repeats: dict[str, list] = {}  # kind (numbers blanked) -> [its first message, repeats dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno > logging.DEBUG:
            kind = re.sub(r"[0-9.]+", "#", message)
            if kind not in self.repeats:
                self.repeats[kind] = [message, 0]
                return True
            self.repeats[kind][1] += 1
            return False
        if (m := _INITIAL.match(message)) is not None:
            self.seen["clean"] = float(m.group(1)) / 100
        elif (m := _AFTER.match(message)) is not None:
            self.seen[m.group(1).lower()] = float(m.group(2)) / 100
        return False


def run_autoattack(aa: Any, x: Tensor, y: Tensor, batch_size: int) -> Tensor:
    """``aa.run_standard_evaluation(x, y)``'s adversarial images; inside :func:`robust_after_each_attack`
    its robust accuracy after each attack is recorded too. An attack AutoAttack skipped (no image left
    robust) counts the images left before it (none)."""
    record = _RECORDING.get()
    if record is None:
        return aa.run_standard_evaluation(x, y, batch_size=batch_size)[0]
    logger = logging.getLogger(_LOGGER)
    reader, level, verbose = _Reader(), logger.level, aa.verbose
    logger.addFilter(reader)
    logger.setLevel(logging.DEBUG)
    aa.verbose = True
    try:
        x_adv = aa.run_standard_evaluation(x, y, batch_size=batch_size)[0]
    finally:
        aa.verbose = verbose
        logger.setLevel(level)
        logger.removeFilter(reader)
    for first, k in reader.repeats.values():
        if k:
            logger.warning("AutoAttack gave the warning %r %d more time%s in this evaluation (other batches "
                           "and restarts; not shown)", first[:80] + ("..." if len(first) > 80 else ""), k,
                           "s" if k > 1 else "")
    n = len(y)
    counts, left = {}, n
    for name in ["clean", *aa.attacks_to_run]:
        left = round(reader.seen[name] * n) if name in reader.seen else left  # 2 decimals of a percent
        counts[name] = left
    record.add(counts, n)
    return x_adv
