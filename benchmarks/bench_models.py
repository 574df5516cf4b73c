"""Throughput of RPC-SymViT-tiny against SymViT-tiny, inference and training.

Both models at 224 px, batch 8, on the CPU; RPC-SymViT runs Principal Attention Pursuit with 4
iterations in the first block (the official README's setting), every other block is identical.
Timed side by side in one process with interleaved repeats (sym, rpc, sym, rpc, ...) and medians:

* inference - ``model(x)`` under ``torch.inference_mode()`` in eval mode;
* training  - forward, cross-entropy, backward and an AdamW step in train mode.

Ratio = images/s of RPC-SymViT / images/s of SymViT; targets >= 0.9 for inference and >= 0.95 for
training, each printed with PASS/FAIL (the paper's Table 11, on an A100, gives 1.00 for inference and
0.96 for training). The CPU model and the load average are printed with the numbers.

With each ratio come two computed references:

* a 95 % interval: percentile bootstrap over the repeats (``scipy.stats.bootstrap``, paired: repeat i
  of both models ran back to back), of the ratio of the median step times - how far the machine's
  run-to-run noise moves the verdict;
* the **attention ceiling**: the ratio RPC-SymViT would reach if PAP cost exactly ``rpc_iters``
  attention passes and nothing else, ``T_sym / (T_sym + (rpc_iters - 1) * T_attn)``, with ``T_attn``
  one SDPA pass at block 1's shape (forward; forward + backward for training) timed in the same
  interleaved rounds. PAP's own overhead is what separates the measured ratio from it.

It also prints the training throughput of the demo (``runs/demo/results.json``) when the demo ran.

    .venv/bin/python benchmarks/bench_models.py
    .venv/bin/python benchmarks/bench_models.py --repeats 9 --threads 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

import kpca_attention  # noqa: F401  (registers the models in timm)
from kpca_attention.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pap import cpu_model, memory_line  # noqa: E402

TARGETS = {"inference": 0.9, "training": 0.95}  # training target on a CPU (the paper: 0.963, Table 11)
PAPER = {"inference": 1.00, "training": 0.96}  # Table 11 (A100)
ATTENTION = "attention"  # one SDPA pass at block 1's shape: the ceiling's unit

MODELS = {
    "SymViT-tiny": ("symvit_tiny_patch16_224", {}),
    "RPC-SymViT-tiny": ("rpc_symvit_tiny_patch16_224",
                        {"rpc_iters": 4, "rpc_lambda": 4.0, "rpc_layers": "first"}),
}


def _step_fns(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Callable[[], None]]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def infer() -> None:
        model.eval()
        with torch.inference_mode():
            model(x)

    def train() -> None:
        model.train()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return {"inference": infer, "training": train}


def _attention_fns(model: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], None]]:
    """One SDPA pass at the shape of block 1's attention, as the models see it (for the ceiling)."""
    attn = model.blocks[0].attn
    seen: list[tuple[int, ...]] = []
    hook = attn.register_forward_hook(lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    with torch.inference_mode():
        model.eval()
        model(x)
    hook.remove()
    b, n, c = seen[0]
    h = attn.num_heads
    k, v = (torch.randn(b, h, n, c // h) * 0.3 for _ in range(2))
    g = torch.randn(b, h, n, c // h)

    def infer() -> None:
        with torch.inference_mode():
            F.scaled_dot_product_attention(k, k, v)

    def train() -> None:
        kk, vv = k.clone().requires_grad_(), v.clone().requires_grad_()
        F.scaled_dot_product_attention(kk, kk, vv).backward(g)

    return {"inference": infer, "training": train}


def ratio_interval(t_sym: list[float], t_rpc: list[float]) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of ``median(t_sym) / median(t_rpc)`` (paired repeats)."""
    if len(t_sym) < 3:
        return float("nan"), float("nan")
    res = stats.bootstrap(
        (np.asarray(t_sym), np.asarray(t_rpc)), lambda a, b: np.median(a) / np.median(b), paired=True,
        vectorized=False, n_resamples=2000, method="percentile", random_state=0,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats per model and mode (interleaved)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", default=None,
                    help="comma-separated thread counts, each measured (default: 1 and torch's default)")
    ap.add_argument("--demo-results", default="runs/demo/results.json")
    args = ap.parse_args()
    default_threads = torch.get_num_threads()
    counts = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, default_threads})
    for n in counts:
        torch.set_num_threads(n)
        measure(args)
    demo = Path(args.demo_results)
    if demo.exists():
        res = json.loads(demo.read_text())["results"]
        for label, hist in res["training"].items():
            print(f"demo training throughput {label}: {hist['images_per_s']:.1f} images/s "
                  f"({hist['steps']:.0f} steps in {hist['train_time_s'] / 60:.1f} min)")
    else:
        print(f"(no {demo}: run `make demo` for the demo's training throughput)")


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Time both models at the current thread count; print and return the ratios."""
    torch.manual_seed(0)
    x = torch.rand(args.batch, 3, args.img_size, args.img_size)
    y = torch.randint(0, 1000, (args.batch,))
    fns = {}
    for label, (name, kw) in MODELS.items():
        torch.manual_seed(0)
        model = create_model(name, img_size=args.img_size, **kw)
        fns[label] = _step_fns(model, x, y)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{label}: {name} {kw}, {n_params / 1e6:.2f} M parameters")
    fns[ATTENTION] = _attention_fns(model, x)
    n_iter = MODELS["RPC-SymViT-tiny"][1]["rpc_iters"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} logical CPUs "
          f"({cpu_model()}), {memory_line()}, load average {os.getloadavg()[0]:.1f}, "
          f"batch {args.batch}, {args.img_size} px")

    results: dict[str, dict[str, float]] = {}
    lines = []
    for mode in ("inference", "training"):
        for label in fns:  # warm-up (allocator, first-call overheads)
            for _ in range(args.warmup):
                fns[label][mode]()
        times: dict[str, list[float]] = {label: [] for label in fns}
        for _ in range(args.repeats):
            for label in fns:  # interleaved: both models see the same machine state
                t0 = time.perf_counter()
                fns[label][mode]()
                times[label].append(time.perf_counter() - t0)
        results[mode] = {label: args.batch / statistics.median(ts) for label, ts in times.items()}
        sym, rpc = (results[mode][label] for label in MODELS)
        spread = {label: (min(ts), max(ts)) for label, ts in times.items() if label in MODELS}
        spread_text = ", ".join(f"{k} {a:.3f}/{b:.3f}" for k, (a, b) in spread.items())
        print(f"{mode:9s}: SymViT-tiny {sym:7.2f} img/s, RPC-SymViT-tiny {rpc:7.2f} img/s, "
              f"ratio {rpc / sym:.3f}   (per-step min/max s: {spread_text})")
        t_sym, t_rpc, t_attn = (statistics.median(times[label]) for label in (*MODELS, ATTENTION))
        low, high = ratio_interval(times["SymViT-tiny"], times["RPC-SymViT-tiny"])
        ceiling = t_sym / (t_sym + (n_iter - 1) * t_attn)
        verdict = "PASS" if rpc / sym >= TARGETS[mode] else "FAIL"
        lines.append(
            f"{mode} {rpc / sym:.3f} [95% CI {low:.3f}-{high:.3f}] (target >= {TARGETS[mode]}, paper "
            f"{PAPER[mode]:.2f}) {verdict}; attention ceiling {ceiling:.3f} (one SDPA pass "
            f"{t_attn * 1e3:.1f} ms of a {t_sym * 1e3:.0f} ms step; PAP's overhead beyond {n_iter} passes "
            f"{(t_rpc - t_sym - (n_iter - 1) * t_attn) * 1e3:.1f} ms)"
        )
    ratios = {mode: results[mode]["RPC-SymViT-tiny"] / results[mode]["SymViT-tiny"] for mode in results}
    print(f"RATIO ({torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}): "
          + "\n  ".join(["", *lines]) + "\n")
    return ratios


if __name__ == "__main__":
    main()
