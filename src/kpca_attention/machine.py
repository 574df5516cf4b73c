"""What machine a number was measured on: CPU model, threads, library versions."""

from __future__ import annotations

import ctypes
import os
import platform
import re
from functools import lru_cache
from typing import Any

__all__ = ["cpu_model", "machine_info", "run_machine_info", "machine_kind", "retain_freed_memory"]


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(gpu: bool = True) -> dict[str, Any]:
    """CPU model, the vector instructions torch's CPU kernels use (``cpu_capability``: hosts of one CPU
    model name differ here - see :func:`machine_kind`), logical CPUs, torch threads, torch version and the
    GPU (if one is used) with the settings that decide whether its kernels repeat bit for bit (cuDNN's
    deterministic / benchmark / TF32 flags, TF32 matmuls, torch's deterministic algorithms)."""
    import torch

    info: dict[str, Any] = {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                            "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                            "torch": torch.__version__}
    if gpu and torch.cuda.is_available():  # gpu=False: a CPU run's record (asking would start CUDA)
        info["gpu"] = torch.cuda.get_device_name(0)
        # what decides whether a GPU run repeats bit for bit (nothing here requests determinism: recorded)
        info["cudnn"] = {"deterministic": torch.backends.cudnn.deterministic,
                         "benchmark": torch.backends.cudnn.benchmark,
                         "allow_tf32": torch.backends.cudnn.allow_tf32}
        info["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        info["deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    return info


def run_machine_info(device: str) -> dict[str, Any]:
    """:func:`machine_info` of a run on ``device`` ("cpu", "cuda", "cuda:0"), with the device: a run pinned to
    the CPU of a GPU host records no GPU (and asking for it would start CUDA)."""
    device = str(device)
    return {**machine_info(gpu=not device.startswith("cpu")), "device": device}


def machine_kind(info: dict[str, Any] | None = None) -> str:
    """The kind of machine of :func:`machine_info` (default: this one): the GPU's name where one was
    present (and the run's recorded ``device``, where there is one, was not the CPU), else the CPU model.
    A study trains on one kind: the same run on an AMD EPYC and on an
    Intel Xeon takes other floating-point paths (seen: epoch-1 loss 0.98994 against 0.98986 for the same
    seed, and held-out accuracy a point apart by epoch 2), so runs of two kinds differ by more than their
    seeds. How much depends on the harness: the language study's Symlm and RPC-Symlm seed 0, trained again on
    an AMD EPYC (2026-11-30), end within 1.6e-5 test perplexity of the Xeon's runs (relative 3e-7; the
    spread over seeds is 0.3; the largest of ten runs compared across the kinds, 0.08 of a seed SD), so that
    study was finished there with ``--any-machine``
    (``results/language/machine_replica.md``, ``benchmarks/machine_replica.py``).

    The kind is the CPU model name only, though hosts of one name can differ below it: an "AMD EPYC" VM
    whose torch reports AVX2 (2026-11-27) gave rpc-seeds' SymViT seed 0 an epoch-1 training loss of
    1.024820 and held-out top-1 80.3 % where the committed run (an "AMD EPYC" whose torch reported AVX512
    on 2026-11-25) has 1.024557 and 79.5 % - the same code (the code of the committed run, checked out,
    gave 1.024820 too on that VM). ``cpu_capability`` is recorded since, and reports count the runs per
    capability (report/study.py); the kind does not include it, so runs recorded before it stay comparable."""
    info = machine_info() if info is None else info
    if info.get("gpu") and info.get("device") != "cpu":  # a CPU-pinned run on a GPU host ran on its CPU
        return str(info["gpu"])
    # the clock a hypervisor appends to the model name ("... @ 2.80GHz") is not a floating-point path: the
    # language study's Symlm seed 0 trained on "Intel(R) Xeon(R) Processor @ 2.80GHz" (2026-11-26) gave
    # the first epoch's training and validation losses of its run on "Intel(R) Xeon(R) Processor" to
    # every printed digit (6.158196356210364, 4.70145937233917)
    return re.sub(r"\s*@\s*[\d.]+\s*[GM]Hz\s*$", "", str(info.get("cpu") or "unknown")) or "unknown"


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


@lru_cache(maxsize=1)
def retain_freed_memory() -> bool:
    """Keep memory that torch frees inside the process instead of handing it back to the OS (glibc).

    A training or attack step allocates and frees the same tensors call after call. glibc hands large
    freed blocks back to the OS (blocks of more than its mmap threshold, and the heap's top past its
    trim threshold), so the next call touches fresh pages: measured on an Intel Xeon VM, 2-6 us a page
    fault, and e.g. 24,700 faults (~50-150 ms) in one RKDE attention backward at B 64. This raises the
    mmap threshold to glibc's maximum (32 MiB) and the trim threshold to 1 GiB, so freed blocks are
    reused: what ``torch.backends.xeon.run_cpu`` does by preloading jemalloc with decay times of
    hours. Peak memory is unchanged (the freed memory is what the process already held at its peak).
    Blocks above 32 MiB still come from the OS each time: code that needs them on a hot path keeps its
    own buffers (``pap.fused.SavedBuffers``).

    Process-wide, so the command line calls it at start; a library user calls it from their script.
    ``KPCA_ATTENTION_RETAIN_MEMORY=0`` turns it off. Returns whether the settings were applied (False on
    a C library other than glibc, or when turned off).
    """
    if os.environ.get("KPCA_ATTENTION_RETAIN_MEMORY", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in
               ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20)))
