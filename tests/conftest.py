"""Shared test fixtures (kept tiny)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def single_thread():
    """Run a test with one intra-op thread. On a machine whose cores are busy with other work,
    every multi-threaded op on a tiny tensor can wait a scheduler tick for its second thread;
    with hundreds of small ops per test (gradcheck) that is 30x slower than one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
