"""Speed of Principal Attention Pursuit against one symmetric softmax attention, on two kinds of keys.

Times, side by side in one run with interleaved repeats (medians):

* ``sdpa``  - one symmetric attention ``F.scaled_dot_product_attention(k, k, v)``;
* ``pap``   - :func:`kpca_attention.pap.pap` with ``n_iter`` softmax steps (default 4), with its compiled
  CPU kernels where they are built (``pap_eager``: the same under ``kernels.eager_only()``);
* ``naive`` - a straightforward transcription of Algorithm 1 (``tests/pap_reference.py``: S, X, the
  N x N softmax matrix and Y all formed), to show what the fused implementation buys;
* ``no_s`` / ``no_dual`` - the ablations ``pap(..., sparse=False)`` and ``pap(..., dual=False)``,
  reported as ratios to sdpa (no target: they are for experiments, not deployment);

each for the forward pass (under ``no_grad``) and for forward + backward (gradients w.r.t. k and v),
on two inputs of shape (B, H, N, D) = (64, 3, 197, 64):

* ``random``  - Gaussian k and v. PAP's iterates grow on them (docs/pap.md, "Iterate growth") until a
  third of the step-4 probabilities would be subnormal floats: the case that made PAP 26x one
  attention on an Intel Xeon (each subnormal costs a microcode assist there);
* ``trained`` - k and v of block 1 of an RPC-SymViT-tiny trained here for ``--train-steps`` steps on
  Fashion-MNIST at 224 px (nothing is downloaded), captured on 64 test images.

For each input it first prints how the iterates grow over ``--growth-iters`` steps (default 12, beyond
the benchmark's 4; float64 transcription on 8 samples): mean row
norm of X, logit spread per row (max - min of x_i . x_j / sqrt(D)), the share of float32 softmax
probabilities that would be subnormal without a cutoff, the density of S, and which kernel pap's
step takes with an autograd graph and a Function per step (separate queries, dropout, or attention
matrices too large to keep; ``cutoff`` = :func:`kpca_attention.pap.cutoff_attention`, else SDPA).
Without a graph, and in symmetric training whose matrices fit (``PAPSaved``, which the timed forward +
backward below runs), every step on the CPU is the cutoff softmax.

Targets, at every thread count, on every CPU kind: pap forward <= 4.5x sdpa, forward + backward <= 5.0x sdpa.
The ratios depend on the thread count (on a machine whose cores are shared, each multi-threaded op can
stall for a scheduler tick), so the script measures at each count of ``--threads`` (default 1 and 2).

    .venv/bin/python benchmarks/bench_pap.py            # or: make bench
    .venv/bin/python benchmarks/bench_pap.py --threads 2 --repeats 15 --train-steps 0   # random only
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kpca_attention.machine import cpu_model, retain_freed_memory
from kpca_attention.pap import cutoff_attention, kernels, pap, softmax_cutoff

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pap_reference import pap_reference  # noqa: E402

pap_module = importlib.import_module("kpca_attention.pap.algorithm")  # where pap() dispatches its steps


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    built = "compiled kernels on" if kernels.available() else "no compiled kernels (eager ops only)"
    return (f"{cpu_model()}, {os.cpu_count()} logical CPUs, torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, {built}, {memory_line()}, load average {load}")


def memory_line() -> str:
    """Applies :func:`kpca_attention.machine.retain_freed_memory` (as the command line does) and says so."""
    return ("freed memory retained (glibc mallopt)" if retain_freed_memory()
            else "freed memory returned to the OS (C library default)")


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- inputs


def random_keys(shape: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def trained_keys(
    batch: int, steps: int, train_batch: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v ``(batch, 3, 197, 64)`` of block 1 (the PAP block) of an RPC-SymViT-tiny trained ``steps``
    AdamW steps on Fashion-MNIST at 224 px (the Debian package's copy; nothing is downloaded)."""
    import kpca_attention  # noqa: F401  (registers the models in timm)
    from kpca_attention.data.images import build_image_dataset
    from kpca_attention.kpca.capture import QKVCapture
    from kpca_attention.models import create_model

    torch.manual_seed(seed)
    model = create_model("rpc_symvit_tiny_patch16_224", num_classes=10, in_chans=1,
                         rpc_iters=4, rpc_lambda=4.0, rpc_layers="first")
    train = build_image_dataset("fashion-mnist", "train", img_size=224, subset=steps * train_batch)
    loader = torch.utils.data.DataLoader(train, batch_size=train_batch, shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    model.train()
    t0, losses = time.perf_counter(), []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    if losses:
        print(f"trained RPC-SymViT-tiny {len(losses)} steps x {train_batch} images in "
              f"{time.perf_counter() - t0:.0f} s; loss {losses[0]:.2f} -> "
              f"{statistics.mean(losses[-5:]):.2f} (mean of the last 5)")
    test = build_image_dataset("fashion-mnist", "test", img_size=224, subset=batch)
    x = torch.stack([test[i][0] for i in range(batch)])
    model.eval()
    with torch.no_grad(), QKVCapture(model) as cap:
        model(x)
    rec = cap.records[0]
    return rec["k"].contiguous(), rec["v"].contiguous()


# ----------------------------------------------------------------------------- iterate growth


def growth(k: torch.Tensor, v: torch.Tensor, n_iter: int, lam: float, n: int = 8) -> list[dict[str, float]]:
    """Per iteration: mean row norm of X, mean / max logit spread per row, share of float32 softmax
    probabilities below the smallest normal float, S density; and which kernel pap used."""
    history: list[dict[str, torch.Tensor]] = []
    k64, v64 = k[:n].double(), v[:n].double()
    pap_reference(k64, v64, n_iter, lam, history=history)
    tiny = torch.finfo(torch.float32).tiny
    rows = []
    for h in history:
        X = h["X"]
        logits = X @ X.transpose(-2, -1) / math.sqrt(X.shape[-1])
        spread = logits.amax(-1) - logits.amin(-1)
        P = torch.softmax(logits.float(), dim=-1)
        rows.append({
            "x_norm": float(X.norm(dim=-1).mean()),
            "spread_mean": float(spread.mean()),
            "spread_max": float(spread.max()),
            "subnormal": float(((P > 0) & (P < tiny)).double().mean()),
            "s_density": float((h["S"] != 0).double().mean()),
        })
    # the kernel pap chose for each step, on the float32 input of the benchmark (spies on both), with an
    # autograd graph and a Function per step (separate queries, dropout, or attention matrices too large
    # to keep: forced here). Without a graph, and in symmetric training whose matrices fit (PAPSaved),
    # every step on the CPU is the cutoff softmax.
    used: list[str] = []
    real_cutoff, real_sdpa = pap_module.cutoff_step, F.scaled_dot_product_attention
    real_saves = pap_module.saves_probabilities
    pap_module.saves_probabilities = lambda *a: False

    def spy_cutoff(*a, **kw):
        used.append("cutoff")
        return real_cutoff(*a, **kw)

    def spy_sdpa(*a, **kw):
        used.append("sdpa")
        return real_sdpa(*a, **kw)

    pap_module.cutoff_step, F.scaled_dot_product_attention = spy_cutoff, spy_sdpa
    try:
        pap(k.detach().requires_grad_(), v, n_iter, lam)
    finally:
        pap_module.cutoff_step, F.scaled_dot_product_attention = real_cutoff, real_sdpa
        pap_module.saves_probabilities = real_saves
    for r, u in zip(rows, used, strict=True):
        r["kernel"] = u
    return rows


def print_growth(name: str, rows: list[dict]) -> None:
    print(f"\n[{name}] iterate growth (float64 Algorithm 1 on 8 samples; kernel = pap's choice in float32 "
          f"with a Function per step, cutoff {softmax_cutoff(torch.float32):.1f})")
    print(f"  {'step':>4}{'mean |x_i|':>12}{'spread mean':>13}{'spread max':>12}{'subnormal P':>13}"
          f"{'S density':>11}  kernel")
    for t, r in enumerate(rows, 1):
        print(f"  {t:>4}{r['x_norm']:>12.2f}{r['spread_mean']:>13.1f}{r['spread_max']:>12.1f}"
              f"{r['subnormal']:>12.1%}{r['s_density']:>11.3f}  {r['kernel']}")


# ----------------------------------------------------------------------------- timing


def _cases(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, n_iter: int, lam: float,
           extras: bool) -> dict:
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

    def eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with kernels.eager_only():
            return pap(a, b, n_iter, lam)

    fns = {
        "sdpa": lambda a, b: F.scaled_dot_product_attention(a, a, b),
        "pap": lambda a, b: pap(a, b, n_iter, lam),
        "pap_eager": eager,  # the same without the compiled kernels (what they buy)
        "cutoff": lambda a, b: cutoff_attention(a, a, b),  # one softmax step alone (a few % of SDPA)
    }
    if extras:
        fns.update({
            "naive": lambda a, b: pap_reference(a, b, n_iter, lam),
            "no_s": lambda a, b: pap(a, b, n_iter, lam, sparse=False),
            "no_dual": lambda a, b: pap(a, b, n_iter, lam, dual=False),
        })
    cases = {}
    for name, f in fns.items():
        cases[("forward", name)] = fwd(f)
        cases[("forward+backward", name)] = fwd_bwd(f)
    return cases


def bench(k: torch.Tensor, v: torch.Tensor, threads: int, args: argparse.Namespace, extras: bool) -> dict:
    torch.set_num_threads(threads)
    g = torch.randn(k.shape, generator=torch.Generator().manual_seed(2))
    cases = _cases(k, v, g, args.n_iter, args.lam, extras)
    for fn in cases.values():  # warm-up (allocator, thread pool, SDPA kernel choice)
        fn()
    times: dict = {key: [] for key in cases}
    faults: dict = {key: [] for key in cases}
    for r in range(args.repeats):
        for key, fn in cases.items():
            # the naive transcription is slow and its ratio is only illustrative: time it less often
            if key[1] == "naive" and r >= args.naive_repeats:
                continue
            f0 = _minor_faults()
            times[key].append(_timed(fn))
            faults[key].append(_minor_faults() - f0)
    med = {key: statistics.median(ts) for key, ts in times.items()}
    med["faults"] = {key: statistics.mean(fs) for key, fs in faults.items()}
    med["kernel_threads"] = kernels.parallel_threads()  # 1 at several threads: a build without OpenMP
    return med


def _minor_faults() -> int:
    """Minor page faults of this process so far (first touches of freshly mapped memory), or 0 where
    ``resource`` is missing (Windows). Fresh large buffers fault on every 4 KiB page they touch."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def report(name: str, med: dict, threads: int, targets: dict[str, float], extras: bool) -> bool:
    ok = True
    loops = med["kernel_threads"]
    print(f"\n[{name}] threads = {threads}" + (f" (the kernels' parallel loops on {loops})" if loops else ""))
    print(f"  {'pass':<18}{'sdpa ms':>10}{'pap ms':>10}{'pap/sdpa':>10}{'target':>8}  verdict"
          f"{'eager/sdpa':>12}" + (f"{'naive/sdpa':>12}" if extras else ""))
    for phase, target in targets.items():
        s, pp = med[(phase, "sdpa")], med[(phase, "pap")]
        ratio = pp / s
        ok &= ratio <= target
        line = (f"  {phase:<18}{s * 1e3:>10.1f}{pp * 1e3:>10.1f}{ratio:>9.2f}x{target:>7.1f}x  "
                f"{'PASS' if ratio <= target else 'FAIL'}   {med[(phase, 'pap_eager')] / s:>9.2f}x")
        if extras:
            line += f"   {med[(phase, 'naive')] / s:>9.1f}x"
        print(line)
    print("  one cutoff softmax step alone / sdpa (target <= 1.05x): " + "; ".join(
        f"{phase} {med[(phase, 'cutoff')] / med[(phase, 'sdpa')]:.2f}x" for phase in targets))
    if extras:
        for phase in targets:
            s = med[(phase, "sdpa")]
            print(f"  ablations, {phase}: no_s / sdpa = {med[(phase, 'no_s')] / s:.2f}x, "
                  f"no_dual / sdpa = {med[(phase, 'no_dual')] / s:.2f}x")
    f = med["faults"]
    print("  minor page faults per call (mean): " + "; ".join(
        f"{phase} sdpa {f[(phase, 'sdpa')]:.0f}, pap {f[(phase, 'pap')]:.0f}" for phase in targets))
    return ok


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
    p.add_argument("--threads", type=str, default="1,2", help="comma-separated thread counts")
    p.add_argument("--train-steps", type=int, default=20,
                   help="steps of training for the 'trained' keys (0: random keys only)")
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--growth-iters", type=int, default=12,
                   help="iterations of the growth table (longer than n_iter: where the iterates go)")
    p.add_argument("--target-forward", type=float, default=4.5)
    p.add_argument("--target-backward", type=float, default=5.0, help="target of forward+backward")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 when a ratio misses its target (default: only report)")
    args = p.parse_args()
    threads = list(dict.fromkeys(int(t) for t in args.threads.split(",")))
    targets = {"forward": args.target_forward, "forward+backward": args.target_backward}

    print(f"CPU: {machine_line()}")
    print(f"torch {torch.__version__}, float32; B={args.batch} H={args.heads} N={args.tokens} "
          f"D={args.head_dim}, pap n_iter={args.n_iter} lam={args.lam}; median of {args.repeats} "
          f"interleaved repeats ({args.naive_repeats} for naive)")
    # sanity: the fused and the naive implementation compute the same thing
    k, v = random_keys((2, args.heads, args.tokens, args.head_dim), seed=1)
    err = (pap(k, v, args.n_iter, args.lam) - pap_reference(k, v, args.n_iter, args.lam)).abs().max()
    print(f"max |pap - naive| = {err:.2e} (float32, B=2)")

    inputs = {"random": random_keys((args.batch, args.heads, args.tokens, args.head_dim))}
    if args.train_steps > 0:
        if (args.heads, args.tokens, args.head_dim) != (3, 197, 64):
            print("(trained keys have H=3 N=197 D=64 of RPC-SymViT-tiny: skipped for this shape)")
        else:
            torch.set_num_threads(max(threads))
            inputs["trained"] = trained_keys(args.batch, args.train_steps, args.train_batch)
    ok = True
    for name, (k, v) in inputs.items():
        print_growth(name, growth(k, v, max(args.n_iter, args.growth_iters), args.lam))
        for t in threads:
            med = bench(k, v, t, args, extras=name == "random")
            ok &= report(name, med, t, targets, extras=name == "random")
    print(f"\n{'ALL PASS' if ok else 'SOME FAIL'}; load average at the end: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
