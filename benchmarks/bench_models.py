"""Throughput of RPC-SymViT-tiny against SymViT-tiny, inference and training.

Both models at 224 px, batch 8, on the CPU; RPC-SymViT runs Principal Attention Pursuit with 4
iterations in the first block (the official README's setting), every other block is identical.
Timed side by side in one process with interleaved repeats (sym, rpc, sym, rpc, ...) and medians:

* inference - ``model(x)`` under ``torch.inference_mode()`` in eval mode;
* training  - forward, cross-entropy, backward and an AdamW step in train mode.

Ratio = images/s of RPC-SymViT / images/s of SymViT; targets >= 0.9 for inference and >= 0.93 for
training, each printed with PASS/FAIL (the paper's Table 11, on an A100, gives 1.00 for inference and
0.96 for training). The CPU model and the load average are printed with the numbers.

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

import torch
import torch.nn.functional as F

import kpca_attention  # noqa: F401  (registers the models in timm)
from kpca_attention.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pap import cpu_model  # noqa: E402

TARGETS = {"inference": 0.9, "training": 0.93}

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
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} logical CPUs "
          f"({cpu_model()}), load average {os.getloadavg()[0]:.1f}, "
          f"batch {args.batch}, {args.img_size} px")

    results: dict[str, dict[str, float]] = {}
    for mode in ("inference", "training"):
        for label in MODELS:  # warm-up (allocator, first-call overheads)
            for _ in range(args.warmup):
                fns[label][mode]()
        times: dict[str, list[float]] = {label: [] for label in MODELS}
        for _ in range(args.repeats):
            for label in MODELS:  # interleaved: both models see the same machine state
                t0 = time.perf_counter()
                fns[label][mode]()
                times[label].append(time.perf_counter() - t0)
        results[mode] = {label: args.batch / statistics.median(ts) for label, ts in times.items()}
        sym, rpc = (results[mode][label] for label in MODELS)
        spread = {label: (min(ts), max(ts)) for label, ts in times.items()}
        spread_text = ", ".join(f"{k} {a:.3f}/{b:.3f}" for k, (a, b) in spread.items())
        print(f"{mode:9s}: SymViT-tiny {sym:7.2f} img/s, RPC-SymViT-tiny {rpc:7.2f} img/s, "
              f"ratio {rpc / sym:.3f}   (per-step min/max s: {spread_text})")
    ratios = {mode: results[mode]["RPC-SymViT-tiny"] / results[mode]["SymViT-tiny"] for mode in results}
    verdict = {mode: "PASS" if ratios[mode] >= TARGETS[mode] else "FAIL" for mode in ratios}
    print(f"RATIO ({torch.get_num_threads()} threads) inference {ratios['inference']:.3f} "
          f"(target >= {TARGETS['inference']}, paper 1.00) {verdict['inference']}, training "
          f"{ratios['training']:.3f} (target >= {TARGETS['training']}, paper 0.96) {verdict['training']}; "
          f"load average {os.getloadavg()[0]:.1f}\n")
    return ratios


if __name__ == "__main__":
    main()
