"""Shared test fixtures (kept tiny)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def single_thread():
    """Run a test with one intra-op thread. On a machine whose cores are busy with other work,
    every multi-threaded op on a tiny tensor can wait a scheduler tick for its second thread;
    with hundreds of small ops per test (gradcheck, tiny models, SVDs) that is 10-100x slower.
    Use it for a whole module with ``pytestmark = pytest.mark.usefixtures("single_thread")``."""
    with _threads(1):
        yield


@pytest.fixture(scope="module")
def single_thread_module():
    """:func:`single_thread` for a whole module, so module-scoped fixtures run single-threaded too."""
    with _threads(1):
        yield
