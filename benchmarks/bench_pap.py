"""Speed of Principal Attention Pursuit against one symmetric softmax attention (issue #2, section 6).

Times, side by side in one run with interleaved repeats (medians):

* ``sdpa``  - one symmetric attention ``F.scaled_dot_product_attention(k, k, v)``;
* ``pap``   - :func:`kpca_attention.pap.pap` with ``n_iter`` softmax steps (default 4);
* ``naive`` - a straightforward transcription of Algorithm 1 (``tests/pap_reference.py``: S, X, the
  N x N softmax matrix and Y all formed), to show what the fused implementation buys;
* ``no_s`` / ``no_dual`` - the ablations ``pap(..., sparse=False)`` and ``pap(..., dual=False)``
  (issue 6), reported as ratios to sdpa (no target: they are for experiments, not deployment);

each for the forward pass (under ``no_grad``) and for forward + backward (gradients w.r.t. k and v).
Targets (issue #2): pap forward <= (n + 1) x sdpa, forward + backward <= 1.5 (n + 1) x sdpa.

The ratios depend on the thread count: on a machine whose cores are shared, every multi-threaded
elementwise op can stall for a scheduler tick waiting for its second thread, so the script measures
at each count given by ``--threads`` (default: 1 and torch's default) and reports them separately.

    .venv/bin/python benchmarks/bench_pap.py            # or: make bench
    .venv/bin/python benchmarks/bench_pap.py --threads 2 --repeats 15
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kpca_attention.pap import pap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pap_reference import pap_reference  # noqa: E402


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cases(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, n_iter: int, lam: float) -> dict:
    kg, vg = k.clone().requires_grad_(), v.clone().requires_grad_()

    def fwd(f: Callable) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return f(k, v)
        return run

    def fwd_bwd(f: Callable) -> Callable[[], object]:
        def run() -> object:
            kg.grad = vg.grad = None
            out = f(kg, vg)
            out.backward(g)
            return out
        return run

    fns = {
        "sdpa": lambda a, b: F.scaled_dot_product_attention(a, a, b),
        "pap": lambda a, b: pap(a, b, n_iter, lam),
        "naive": lambda a, b: pap_reference(a, b, n_iter, lam),
        "no_s": lambda a, b: pap(a, b, n_iter, lam, sparse=False),
        "no_dual": lambda a, b: pap(a, b, n_iter, lam, dual=False),
    }
    cases = {}
    for name, f in fns.items():
        cases[("forward", name)] = fwd(f)
        cases[("forward+backward", name)] = fwd_bwd(f)
    return cases


def bench(threads: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, args.tokens, args.head_dim)
    k, v, g = (torch.randn(shape, generator=gen) for _ in range(3))
    cases = _cases(k, v, g, args.n_iter, args.lam)
    for fn in cases.values():  # warm-up (allocator, thread pool, SDPA kernel choice)
        fn()
    times: dict = {key: [] for key in cases}
    for r in range(args.repeats):
        for key, fn in cases.items():
            # the naive transcription is slow and its ratio is only illustrative: time it less often
            if key[1] == "naive" and r >= args.naive_repeats:
                continue
            times[key].append(_timed(fn))
    return {key: statistics.median(ts) for key, ts in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--tokens", type=int, default=197)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--n-iter", type=int, default=4)
    p.add_argument("--lam", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=9, help="interleaved repeats (median reported)")
    p.add_argument("--naive-repeats", type=int, default=3)
    p.add_argument("--threads", type=str, default=None,
                   help=f"comma-separated thread counts; default '1,{torch.get_num_threads()}'")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 when a ratio misses its target (default: only report)")
    args = p.parse_args()
    default_threads = torch.get_num_threads()
    threads = ([1, default_threads] if args.threads is None
               else [int(t) for t in args.threads.split(",")])
    threads = list(dict.fromkeys(threads))

    # sanity: the fused and the naive implementation compute the same thing
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(2, args.heads, args.tokens, args.head_dim, generator=gen) for _ in range(2))
    err = (pap(k, v, args.n_iter, args.lam) - pap_reference(k, v, args.n_iter, args.lam)).abs().max()

    n = args.n_iter
    targets = {"forward": n + 1.0, "forward+backward": 1.5 * (n + 1.0)}
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{default_threads} threads available; float32 CPU")
    print(f"B={args.batch} H={args.heads} N={args.tokens} D={args.head_dim}, pap n_iter={n} lam={args.lam}; "
          f"median of {args.repeats} interleaved repeats ({args.naive_repeats} for naive)")
    print(f"max |pap - naive| = {err:.2e} (float32, B=2)")
    ok = True
    for t in threads:
        med = bench(t, args)
        print(f"\nthreads = {t}")
        print(f"  {'pass':<18}{'sdpa ms':>10}{'pap ms':>10}{'naive ms':>11}{'pap/sdpa':>10}"
              f"{'naive/sdpa':>12}{'target':>8}  verdict")
        for phase, target in targets.items():
            s, pp, nv = (med[(phase, name)] for name in ("sdpa", "pap", "naive"))
            ratio = pp / s
            verdict = "PASS" if ratio <= target else "FAIL"
            ok &= ratio <= target
            print(f"  {phase:<18}{s * 1e3:>10.1f}{pp * 1e3:>10.1f}{nv * 1e3:>11.1f}{ratio:>9.2f}x"
                  f"{nv / s:>11.1f}x{target:>7.1f}x  {verdict}")
        for phase in targets:
            s = med[(phase, "sdpa")]
            print(f"  ablations, {phase}: no_s / sdpa = {med[(phase, 'no_s')] / s:.2f}x, "
                  f"no_dual / sdpa = {med[(phase, 'no_dual')] / s:.2f}x")
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
