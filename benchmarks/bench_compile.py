"""``torch.compile`` vs eager on the CPU: an RPC vision transformer and an RPC language model.

For each model: the number of graph breaks (``torch._dynamo.explain``, expected 0), the compile time
(the first compiled calls, forward and backward), the largest difference between compiled and eager
outputs, and the throughput of both, timed side by side in one process with interleaved repeats
(eager, compiled, eager, ...) and medians:

* inference - ``model(x)`` under ``torch.no_grad()`` in eval mode;
* training  - forward, cross-entropy, backward and an AdamW step in train mode (the model compiled,
  the optimizer step eager).

Speed-up = compiled throughput / eager throughput. No target: this records what the compiler gives
(inductor's default mode; on the CPU it generates C++ with OpenMP). The CPU model and the load
average are printed with the numbers.

    .venv/bin/python benchmarks/bench_compile.py
    .venv/bin/python benchmarks/bench_compile.py --vit rpc_symvit_tiny_patch16_224 --repeats 9
"""

from __future__ import annotations

import argparse
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


def _vit(name: str, batch: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    model = create_model(name, rpc_iters=4, rpc_lambda=4.0, rpc_layers="first")  # the official setting
    c, h, w = model.pretrained_cfg["input_size"]
    x = torch.randn(batch, c, h, w)
    y = torch.randint(0, model.num_classes, (batch,))
    return model, x, y, lambda m, x, y: F.cross_entropy(m(x), y)


def _lm(batch: int, context: int, vocab: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    model = create_model("rpc_symlm", vocab_size=vocab, preset="small", context=context)
    x = torch.randint(0, vocab, (batch, context))
    y = torch.randint(0, vocab, (batch, context))
    return model, x, y, lambda m, x, y: m(x, y)[1]


def _graph_breaks(model: torch.nn.Module, x: torch.Tensor) -> int:
    torch._dynamo.reset()
    with torch.no_grad():
        return torch._dynamo.explain(model)(x).graph_break_count


def measure(label: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable,
            repeats: int, warmup: int) -> dict[str, float]:
    """Print and return the compiled/eager throughput ratios of one model."""
    n_params = sum(p.numel() for p in model.parameters())
    breaks = _graph_breaks(model, x)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)  # one optimizer: both share the weights

    def infer(m: Callable) -> Callable[[], None]:
        def run() -> None:
            model.eval()
            with torch.no_grad():
                m(x)
        return run

    def train(m: Callable) -> Callable[[], None]:
        def run() -> None:
            model.train()
            loss = loss_fn(m, x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return run

    t0 = time.perf_counter()
    infer(compiled)()
    train(compiled)()
    compile_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        got, expected = compiled(x), model(x)
        if isinstance(got, tuple):  # the language model returns (logits, loss)
            got, expected = got[0], expected[0]
        diff = (got - expected).abs().max().item()
    print(f"{label}: {n_params / 1e6:.2f} M parameters, input {tuple(x.shape)}; graph breaks {breaks}; "
          f"compile {compile_s:.0f} s (first eval + train call); max |compiled - eager| {diff:.2e}")

    ratios = {}
    for mode, make in (("inference", infer), ("training", train)):
        fns = {"eager": make(model), "compiled": make(compiled)}
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeats):
            for k, fn in fns.items():  # interleaved: both see the same machine state
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(ts) for k, ts in times.items()}
        ratios[mode] = med["eager"] / med["compiled"]
        spread = ", ".join(f"{k} {min(ts) * 1e3:.0f}/{max(ts) * 1e3:.0f}" for k, ts in times.items())
        print(f"  {mode:9s}: eager {med['eager'] * 1e3:7.1f} ms, compiled {med['compiled'] * 1e3:7.1f} ms "
              f"per step, speed-up {ratios[mode]:.2f}x   (min/max ms: {spread})")
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vit", default="rpc_symvit_mini_patch4_28", help="vision model (a registered name)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lm-batch", type=int, default=8)
    ap.add_argument("--lm-context", type=int, default=64)
    ap.add_argument("--lm-vocab", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats per variant and mode (interleaved)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} logical CPUs "
          f"({cpu_model()}), load average {os.getloadavg()[0]:.1f}")
    torch.manual_seed(0)
    measure(args.vit, *_vit(args.vit, args.batch), args.repeats, args.warmup)
    torch.manual_seed(0)
    measure("rpc_symlm (small preset)", *_lm(args.lm_batch, args.lm_context, args.lm_vocab), args.repeats,
            args.warmup)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
