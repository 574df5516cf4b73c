"""Why does PAP's forward scale less than SDPA from one thread to two? A diagnostic, not a target.

On the Intel Xeon (docs/benchmarks.md) ``pap`` without a graph scales 1.36x from one thread to
two where one SDPA call scales 1.73x, and no nesting of thread teams explained it. The suspect left is
memory traffic: the four steps write and read ~119 MB of scores at B 64, which two cores share one memory
path for. This script measures, side by side at each thread count (interleaved repeats, medians):

* ``stream``  - memory bandwidth: ``y.copy_(x)`` and ``x.add_(y)`` over ``--mbytes`` MB (GB/s);
* ``gemm``    - a compute-bound batched product, PAP's step shape (B*H, N, D) x (B*H, D, N), on operands
  small enough to stay in the caches (GFLOP/s);
* ``sdpa``    - one symmetric attention at (B, H, N, D);
* ``pap``     - :func:`kpca_attention.pap.pap` (4 steps, lambda 4) at the same shape, no graph;

and prints each one's speed-up from the first thread count to the others. Reading: if the copy scales
about as little as ``pap`` does while the GEMM scales near 2x, the call is bound by the shared memory path
(more threads cannot help; fewer bytes can); if the copy scales near 2x too, the cause is elsewhere.

    .venv/bin/python benchmarks/bench_threads.py [--threads 1,2] [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kpca_attention.machine import cpu_model, retain_freed_memory
from kpca_attention.pap import pap


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, dict[int, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (the first is the base)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--mbytes", type=int, default=119,
                   help="size of the copied buffers (default: PAP's scores at B 64)")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    retain_freed_memory()
    torch.manual_seed(0)
    n_float = args.mbytes * 2**20 // 4
    x, y = torch.rand(n_float), torch.rand(n_float)
    B, H, N, D = args.batch, 3, 197, 64
    k, v = torch.randn(B, H, N, D) / D**0.25, torch.randn(B, H, N, D)
    a, b = torch.randn(24, N, D), torch.randn(24, D, N)  # 24 heads: ~2.4 MB, in the caches
    gemm_flops = 2 * 24 * N * N * D * 8  # 8 products a call
    work: dict[str, tuple[Callable[[], object], float, str]] = {
        "stream copy": (lambda: y.copy_(x), 2 * x.numel() * 4 / 1e9, "GB/s"),
        "stream add": (lambda: x.add_(y, alpha=1e-9), 3 * x.numel() * 4 / 1e9, "GB/s"),
        "gemm (in cache)": (lambda: [torch.bmm(a, b) for _ in range(8)], gemm_flops / 1e9, "GFLOP/s"),
        "sdpa": (lambda: F.scaled_dot_product_attention(k, k, v), 1.0, "calls/s"),
        "pap": (lambda: pap(k, v, n_iter=4, lam=4.0), 1.0, "calls/s"),
    }
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, capability "
          f"{torch.backends.cpu.get_cpu_capability()}; buffers {args.mbytes} MB; (B, H, N, D) = "
          f"{(B, H, N, D)}")
    rates: dict[str, dict[int, float]] = {name: {} for name in work}
    with torch.no_grad():
        for t in threads:
            torch.set_num_threads(t)
            for fn, _, _ in work.values():
                fn()  # warm-up at this count
            times: dict[str, list[float]] = {name: [] for name in work}
            for _ in range(args.repeats):
                for name, (fn, _, _) in work.items():
                    times[name].append(_time(fn))
            for name, (_, amount, _) in work.items():
                rates[name][t] = amount / statistics.median(times[name])
    base = threads[0]
    head = f"{'':18s}" + "".join(f"{t:>9d} thread(s)" for t in threads) + "".join(
        f"  {t} / {base} thr" for t in threads[1:])
    print(head)
    for name, (_, _, unit) in work.items():
        r = rates[name]
        print(f"{name:18s}" + "".join(f"{r[t]:9.1f} {unit:<9s}" for t in threads)
              + "".join(f"  {r[t] / r[base]:9.2f}x" for t in threads[1:]))
    print("Reading: the speed-up column of pap next to those of the copy (memory-bound) and the GEMM "
          "(compute-bound).")
    return rates


if __name__ == "__main__":
    main()
