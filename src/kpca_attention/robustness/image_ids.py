"""Fixed, published subsets of test images (as RobustBench's ``imagenet_test_image_ids.txt``).

Every AutoAttack evaluation and every ``benchmark`` of a dataset attacks the first ``n`` indices of
one list committed with the package, ``robustness/data/<dataset>_test_ids.txt`` (one test-split index
per line), so numbers of different models, machines and sessions are on the same images. The
SHA-256 of the file goes into every result key and JSON.

The lists were drawn once with :func:`draw_image_ids`: ``torch.randperm(size of the test split,
generator=torch.Generator().manual_seed(IDS_SEED))[:count]`` with ``IDS_SEED = 26``, kept in the drawn
(random) order so that any prefix is itself a uniform sample; :data:`ID_LISTS` gives each list's test
split size and count, and ``tests/test_benchmark.py`` checks that the files are this draw.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

__all__ = ["IDS_SEED", "ID_LISTS", "draw_image_ids", "ids_path", "load_image_ids", "image_ids_sha256",
           "ids_key"]

#: the seed the committed lists were drawn with
IDS_SEED = 26
#: dataset -> (size of its test split, number of indices in the committed list)
ID_LISTS: dict[str, tuple[int, int]] = {
    "fashion-mnist": (10000, 1000),
    "cifar10": (10000, 1000),
    "cifar100": (10000, 1000),
    "digits": (360, 360),
}
DATA_DIR = Path(__file__).resolve().parent / "data"


def draw_image_ids(size: int, count: int, seed: int = IDS_SEED) -> list[int]:
    """``count`` distinct indices of ``range(size)`` in random order (a seeded permutation's prefix)."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:count].tolist()


def ids_path(dataset: str) -> Path:
    """The committed list of ``dataset`` (ValueError naming the datasets that have one)."""
    dataset = str(dataset).lower().replace("_", "-")
    if dataset not in ID_LISTS:
        raise ValueError(f"no committed test-image list for dataset {dataset!r}; lists exist for "
                         f"{', '.join(ID_LISTS)} (robustness/data/<dataset>_test_ids.txt)")
    return DATA_DIR / f"{dataset}_test_ids.txt"


def load_image_ids(dataset: str, n: int | None = None) -> list[int]:
    """The first ``n`` indices (all when ``None``) of ``dataset``'s committed list."""
    path = ids_path(dataset)
    ids = [int(line) for line in path.read_text().split()]
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(ids):
            raise ValueError(f"n must be an integer in [1, {len(ids)}] (the {dataset} list has {len(ids)} "
                             f"images), got {n!r}")
        ids = ids[:n]
    return ids


def image_ids_sha256(dataset: str) -> str:
    """SHA-256 of ``dataset``'s committed list file (recorded with every result made on it)."""
    return hashlib.sha256(ids_path(dataset).read_bytes()).hexdigest()


def ids_key(dataset: str) -> dict[str, str]:
    """What a stored result made on ``dataset``'s committed list names in its key: the list and its
    SHA-256 (a changed list is other images)."""
    return {"ids": ids_path(dataset).name, "ids_sha256": image_ids_sha256(dataset)}
