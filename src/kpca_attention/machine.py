"""What machine a number was measured on: CPU model, threads, library versions."""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from typing import Any

__all__ = ["cpu_model", "machine_info"]


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


def machine_info() -> dict[str, Any]:
    """CPU model, logical CPUs, torch threads, torch version and the GPU (if one is used)."""
    import torch

    info: dict[str, Any] = {"cpu": cpu_model(), "logical_cpus": os.cpu_count(),
                            "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info
