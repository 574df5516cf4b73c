"""Speed of the robust-attention family against one SDPA call.

For each mechanism of :data:`MECHANISMS` (a table: add a row per mechanism), the attention core of one
layer - its ``attend_state`` (or ``attend``) on per-head q, k, v, with the cross-layer state a later
layer sees - is timed forward and forward+backward against ``F.scaled_dot_product_attention(q, k, v)``
at the papers' shape (B 64, H 3, N 197, D 64), at 1 and 2 threads. Calls are interleaved (mechanism,
SDPA, mechanism, ...) so both see the same machine state; the ratio of the medians is printed side by
side for both thread counts, with PASS/FAIL against the issue's target.

    .venv/bin/python benchmarks/bench_family.py                  # full (idle machine)
    .venv/bin/python benchmarks/bench_family.py --repeats 3 --batch 8   # a quick check that it runs
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from kpca_attention.attention import (
    EllipticalAttention,
    KdeAttention,
    NeuTRENOAttention,
    PIDAttention,
    PositionAwareAttention,
    RobustAttention,
    TwicingAttention,
)
from kpca_attention.machine import cpu_model, retain_freed_memory
from kpca_attention.pap import kernels


@dataclass(frozen=True)
class Row:
    """One mechanism: its label, the issue's target ratio, the layer and the state a later layer sees."""

    label: str
    #: the issue's target ratio; None: a path timed side by side with its mechanism's (no verdict)
    target: float | None
    layer: Callable[[int, int], torch.nn.Module]
    state: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = field(default=lambda qkv: {})
    #: False: with the compiled kernels off (``kernels.eager_only``), to time a path side by side with them
    compiled: bool = True


def _prev(qkv: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"v_prev": (qkv["v"] + 0.1 * torch.randn_like(qkv["v"])).detach()}


def _v0(qkv: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"v0": torch.randn_like(qkv["v"]).requires_grad_()}


def _pid(qkv: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    v = qkv["v"]
    return {"v0": torch.randn_like(v).requires_grad_(), "pid_integral": torch.randn_like(v),
            "pid_error": torch.randn_like(v)}


#: the mechanisms timed, in print order (targets: NeuTRENO / Elliptical <= 1.3x)
MECHANISMS: dict[str, Row] = {
    "neutreno": Row("NeuTRENO", 1.3, lambda dim, h: NeuTRENOAttention(dim, h), _v0),
    "pid": Row("PIDformer", 1.3, lambda dim, h: PIDAttention(dim, h), _pid),
    # the same with its feedback as eager ops (no one-pass kernel): what the forward was before
    "pid_eager": Row("PIDformer, eager feedback", None, lambda dim, h: PIDAttention(dim, h), _pid,
                     compiled=False),
    "elliptical": Row("Elliptical", 1.3, lambda dim, h: EllipticalAttention(dim, h), _prev),
    "twicing": Row("Twicing", 2.3, lambda dim, h: TwicingAttention(dim, h)),
    "kde": Row("KDE", 1.3, lambda dim, h: KdeAttention(dim, h)),
    "rkde": Row("RKDE-Huber", 3.5, lambda dim, h: RobustAttention(dim, h)),
    # the same on eager ops alone (no compiled kernels: another CPU, KPCA_ATTENTION_KERNELS=0): the column
    # sums and their backward a few heads at a time (row "kernels formed" until 2026-12-01, when all the
    # heads' Gram kernels were formed)
    "rkde_formed": Row("RKDE-Huber, eager ops", 3.5, lambda dim, h: RobustAttention(dim, h),
                       compiled=False),
    # W_p built for 197 tokens (DeiT-tiny); another --tokens resizes it (a square grid plus the class token)
    "rvt": Row("Position-aware scaling", 2.5, lambda dim, h: PositionAwareAttention(dim, h, num_tokens=197)),
}


def _inputs(b: int, h: int, n: int, d: int, grad: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(b, h, n, d, generator=g).requires_grad_(grad) for k in ("q", "k", "v")}


def _fns(row: Row, b: int, h: int, n: int, d: int, backward: bool) -> dict[str, Callable[[], Any]]:
    layer = row.layer(h * d, h).eval()
    qkv = _inputs(b, h, n, d, backward)
    state = row.state(qkv)
    grad = torch.randn(b, h, n, d)

    def mech() -> None:
        with contextlib.nullcontext() if row.compiled else kernels.eager_only():
            if hasattr(layer, "attend_state"):
                out = layer.attend_state(qkv, None, False, state)[0]
            else:
                out = layer.attend(qkv, None, False)
        if backward:
            out.backward(grad)

    def sdpa() -> None:
        out = F.scaled_dot_product_attention(qkv["q"], qkv["k"], qkv["v"])
        if backward:
            out.backward(grad)

    return {"mech": mech, "sdpa": sdpa}


def measure(row: Row, shape: tuple[int, int, int, int], backward: bool, repeats: int) -> tuple[float, float]:
    """Median seconds of the mechanism and of SDPA, interleaved, after one warm-up call of each."""
    fns = _fns(row, *shape, backward)
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.set_grad_enabled(backward):
        for f in fns.values():
            f()
        for _ in range(repeats):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
    return statistics.median(times["mech"]), statistics.median(times["sdpa"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--tokens", type=int, default=197)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--only", default="", help="comma-separated keys of MECHANISMS (default: all)")
    args = p.parse_args()
    shape = (args.batch, args.heads, args.tokens, args.head_dim)
    threads = [int(t) for t in args.threads.split(",")]
    keys = [k for k in args.only.split(",") if k] or list(MECHANISMS)
    retained = retain_freed_memory()  # as the command line does (kpca_attention.machine)
    print(f"torch {torch.__version__}, {os.cpu_count()} logical CPUs ({cpu_model()}), "
          f"freed memory {'retained' if retained else 'returned to the OS'}, "
          f"load average {os.getloadavg()[0]:.1f}; shape B,H,N,D = {shape}; {args.repeats} repeats, "
          "medians, interleaved with one SDPA call")
    # a throwaway round first: in a fresh process the first row measured paid for the heap's first touches
    # (three quiet runs put NeuTRENO, always first, at 1.21-1.35x and its SDPA at 35-48 ms, others' at 33)
    for t in threads:
        torch.set_num_threads(t)
        for backward in (False, True):
            measure(MECHANISMS[keys[0]], shape, backward, 3)
    head = " | ".join(f"{t} thr fwd | {t} thr fwd+bwd" for t in threads)
    print(f"| mechanism | target | {head} | verdict |")
    print("|---|---|" + "---|---|" * len(threads) + "---|")
    for key in keys:
        row = MECHANISMS[key]
        cells, ok = [], True
        for t in threads:
            torch.set_num_threads(t)
            for backward in (False, True):
                m, s = measure(row, shape, backward, args.repeats)
                ratio = m / s
                ok &= row.target is None or ratio <= row.target
                cells.append(f"{ratio:.2f}x ({m * 1e3:.1f} / {s * 1e3:.1f} ms)")
        target, verdict = ("-", "side by side") if row.target is None else \
            (f"<= {row.target}x", "PASS" if ok else "FAIL")
        print(f"| {row.label} | {target} | " + " | ".join(cells) + f" | {verdict} |")


if __name__ == "__main__":
    main()
