"""PAP's compiled CPU kernels (``csrc/pap_kernels.cpp``), with the eager ops as the fallback.

Kernels that each make one pass over a block where the eager ops take several - ``cutoff_exp_`` (the
cutoff softmax's max / subtract / clamp / exp / sum, with the exp of SDPA's CPU kernel), ``update_`` (PAP's
update between two softmax steps) and their backward counterparts - and whole loops with no Python between
their steps: ``pap_forward`` (inference) and ``pap_forward_saved`` / ``pap_backward_saved`` (training;
docs/pap.md, section 9, lists them all). They are built by the normal install
(``setup.py``; optional: where no C++ compiler is found, or torch is not importable at build time, the
package installs without them) twice, for AVX2 + FMA and for AVX512; the build matching the vectors of torch's
own kernels is loaded (:data:`BUILD`), only where torch reports AVX2 or AVX512, and used on CPU tensors of
float32 / float64, outside ``torch.compile`` / FX tracing. Set
``KPCA_ATTENTION_KERNELS=0`` (or use :func:`eager_only`) to run the eager ops: both give the same numbers
to rounding (tests/test_pap_kernels.py).

The same extension holds robust KDE attention's ``rkde_colsums`` (``attention/csrc/rkde_kernels.cpp``, a
fragment of the same operator library; attention/kde.py uses it through :func:`active`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["available", "active", "eager_only", "parallel_threads", "BUILD"]

#: which build was loaded ("cpu_kernels_avx512" or "cpu_kernels"), None without kernels
BUILD: str | None = None


def _load() -> Any:
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return None  # built for AVX2 + FMA and AVX512: not loaded where those instructions may be missing
    # one of the two builds of the same source (both register the same operators): 512-bit vectors where
    # torch's own kernels use them, else 256-bit; the AVX2 build where the AVX512 one was not built
    names = ["cpu_kernels_avx512", "cpu_kernels"] if capability == "AVX512" else ["cpu_kernels"]
    for name in names:
        try:
            importlib.import_module(f"{__package__}.{name}")  # registers the operators
        except ImportError:
            continue
        global BUILD
        BUILD = name
        return torch.ops.kpca_attention  # cutoff_exp_, update_, ...: dispatcher operators
    return None


_MODULE = _load()
_ENABLED = os.environ.get("KPCA_ATTENTION_KERNELS", "1").strip() != "0"


def available() -> bool:
    """Whether the compiled kernels were built and can run on this CPU."""
    return _MODULE is not None


def active() -> Any:
    """The kernels' operators (``torch.ops.kpca_attention``) when they are to be used now, else None (the
    eager ops run)."""
    return _MODULE if _ENABLED else None


def parallel_threads() -> int:
    """How many threads the kernels' parallel loops run on now (torch's intra-op thread count; 1 for a build
    without OpenMP, where they run inline; 0 without kernels). Benchmarks print it beside their ratios."""
    return int(_MODULE.parallel_threads()) if _MODULE is not None else 0


@contextlib.contextmanager
def eager_only() -> Iterator[None]:
    """Run PAP's eager ops inside the block (to compare them with the kernels)."""
    global _ENABLED
    before, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = before
