"""The one seeded draw of a subset: which ``n`` of ``total`` examples a ``subset`` argument, a study's
fixed test images or a validation sample hold. Results depend on these indices (a study's per-example
files pair up across models by them), so every subset of the package draws through here."""

from __future__ import annotations

import torch

__all__ = ["seeded_indices"]


def seeded_indices(total: int, n: int, seed: int) -> list[int]:
    """``n`` of ``range(total)`` drawn with ``seed``, in index order (class-mixed, unlike the first ``n``):
    ``torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:n]``, sorted."""
    if not 0 <= n <= total:
        raise ValueError(f"cannot draw {n} of {total} examples")
    pick = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:n]
    return pick.sort().values.tolist()
