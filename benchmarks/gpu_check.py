"""GPU readiness of the package: what has to work on a CUDA machine, run in one command.

    make gpu-check          # or: .venv/bin/python benchmarks/gpu_check.py [--json out.json]

Without a CUDA device it prints one line saying so and exits 0. With one, in order:

1. ``tests``     - the tests that need CUDA (``pytest -k cuda``: they skip themselves on the CPU);
2. ``pap``       - pap on CUDA against the float64 transcription of Algorithm 1 (values and the
   hand-written backward), then the pap / SDPA time ratio, forward and forward + backward, in float32
   and under bf16 autocast (B=64 H=3 N=197 D=64, n_iter=4);
3. ``compile``   - whether ``torch.compile(pap)`` is faster than eager pap (forward and forward+backward);
4. ``models``    - training throughput of RPC-SymViT-tiny / SymViT-tiny with AMP (bf16) at batch 128,
   224 px (the paper's Table 11 gives 0.963 on an A100), eager and under ``torch.compile`` (which fuses
   PAP's update), the ratio with a 95 % interval over paired blocks, and the peak memory of each;
5. ``torchrun``  - a 1-GPU ``torchrun`` run of the ``deit`` preset (RPC-SymViT-tiny) for a few steps on
   a synthetic ImageFolder written to a temporary folder (NCCL process group, AMP, EMA, checkpoint);
6. ``large``     - what ``vision-large`` would cost on this GPU: its own training runs for a few steps each
   (batches made on the GPU), eager and compiled, and four processes side by side, and the projected
   training time of the whole study (needs Fashion-MNIST: $FASHION_MNIST_ROOT);
7. ``study``     - ``rpc-depth12`` through the study engine on this GPU: one RPC run trained briefly and
   evaluated with the full suites there, and the whole study's time projected from it (Fashion-MNIST).

Each part prints PASS/FAIL (or its numbers) and the script goes on after a failure; the exit status is
1 when any part failed. ``--json`` writes every number (with the GPU model) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (64, 3, 197, 64)


def _cuda_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls (after two warm-up calls), synchronised."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, timed in turns (same GPU clocks and temperature for all): one
    step per block of :func:`_paired_blocks`, after two warm-up calls of each."""
    for fn in fns.values():
        fn()
        fn()
    return {name: statistics.median(ts) for name, ts in _paired_blocks(fns, repeats, 1).items()}


# ----------------------------------------------------------------------------- parts


def part_tests() -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda", str(ROOT / "tests")]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tail = (res.stdout + res.stderr).strip().splitlines()[-1:] or [""]
    print(f"  {' '.join(cmd[2:])}: {tail[0]}")
    # exit status 5 = nothing collected (no test needs CUDA): not a failure of the GPU path
    return {"returncode": res.returncode, "summary": tail[0], "ok": res.returncode in (0, 5)}


def _pap_cases(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, amp: bool,
               pap_fn: Callable) -> dict[str, Callable[[], object]]:
    kg, vg = k.clone().requires_grad_(), v.clone().requires_grad_()

    def ctx():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp)

    def fwd(f: Callable) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad(), ctx():
                return f(k, v)
        return run

    def fwd_bwd(f: Callable) -> Callable[[], object]:
        def run() -> object:
            kg.grad = vg.grad = None
            with ctx():
                out = f(kg, vg)
            out.float().backward(g)
            return out
        return run

    sdpa = lambda a, b: F.scaled_dot_product_attention(a, a, b)  # noqa: E731
    return {"sdpa forward": fwd(sdpa), "pap forward": fwd(pap_fn),
            "sdpa forward+backward": fwd_bwd(sdpa), "pap forward+backward": fwd_bwd(pap_fn)}


def part_pap(repeats: int) -> dict:
    from kpca_attention.pap import pap

    sys.path.insert(0, str(ROOT / "tests"))
    from pap_reference import pap_reference

    # correctness of the CUDA path (SDPA kernels, the fused update's backward) against float64. Keys at
    # half the unit scale: with unit-variance keys of width 64 the step-4 softmax is one-hot, the float64
    # k-gradient is ~1e-14 and any float32 result is "off" by 1e9 relative (measured on the H100 and on
    # the CPU alike); at 0.5 every gradient is O(1) and float32 lands near 1e-6.
    gen = torch.Generator().manual_seed(0)
    k, v, g = (torch.randn(2, 3, 64, 64, generator=gen) for _ in range(3))
    k = 0.5 * k
    k64, v64 = k.double().requires_grad_(), v.double().requires_grad_()
    ref = pap_reference(k64, v64, 4, 4.0)
    ref.backward(g.double())
    kc, vc = k.cuda().requires_grad_(), v.cuda().requires_grad_()
    out = pap(kc, vc, 4, 4.0)
    out.backward(g.cuda())

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.detach().double().cpu() - b.detach()).abs().max() / b.detach().abs().max())

    errs = {"out": rel(out, ref), "grad_v": rel(vc.grad, v64.grad), "grad_k": rel(kc.grad, k64.grad)}
    # float32 on a GPU may use TF32 in matmuls (about 3e-4)
    ok = errs["out"] < 1e-3 and errs["grad_v"] < 1e-2 and errs["grad_k"] < 1e-2
    print("  pap on CUDA vs float64 Algorithm 1 (relative max error): "
          + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()) + f"  {'PASS' if ok else 'FAIL'}")

    res: dict = {"errors_vs_float64": errs, "ok": ok}
    gen = torch.Generator().manual_seed(1)
    k, v, g = (torch.randn(SHAPE, generator=gen).cuda() for _ in range(3))
    for label, amp in (("float32", False), ("bf16 autocast", True)):
        med = _interleaved(_pap_cases(k, v, g, amp, lambda a, b: pap(a, b, 4, 4.0)), repeats)
        fw = med["pap forward"] / med["sdpa forward"]
        fb = med["pap forward+backward"] / med["sdpa forward+backward"]
        ms = {n: t * 1e3 for n, t in med.items()}
        print(f"  {label:14s} forward: sdpa {ms['sdpa forward']:7.2f} ms, pap {ms['pap forward']:7.2f} ms "
              f"= {fw:.2f}x;  forward+backward: sdpa {ms['sdpa forward+backward']:7.2f} ms, "
              f"pap {ms['pap forward+backward']:7.2f} ms = {fb:.2f}x")
        res[label] = {"ms": {n: t * 1e3 for n, t in med.items()}, "forward": fw, "forward+backward": fb}
    return res


def part_compile(repeats: int) -> dict:
    from kpca_attention.pap import pap

    gen = torch.Generator().manual_seed(2)
    k, v, g = (torch.randn(SHAPE, generator=gen).cuda() for _ in range(3))
    compiled = torch.compile(lambda a, b: pap(a, b, 4, 4.0))
    eager = _pap_cases(k, v, g, False, lambda a, b: pap(a, b, 4, 4.0))
    comp = _pap_cases(k, v, g, False, compiled)
    t0 = time.perf_counter()
    comp["pap forward"]()
    comp["pap forward+backward"]()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    med = _interleaved({"eager forward": eager["pap forward"], "compiled forward": comp["pap forward"],
                        "eager forward+backward": eager["pap forward+backward"],
                        "compiled forward+backward": comp["pap forward+backward"]}, repeats)
    with torch.no_grad():
        diff = float((compiled(k, v) - pap(k, v, 4, 4.0)).abs().max())
    sp_f = med["eager forward"] / med["compiled forward"]
    sp_b = med["eager forward+backward"] / med["compiled forward+backward"]
    print(f"  torch.compile(pap): compile {compile_s:.0f} s; speed-up forward {sp_f:.2f}x, "
          f"forward+backward {sp_b:.2f}x; max |compiled - eager| = {diff:.1e}  "
          f"({'helps' if min(sp_f, sp_b) > 1.05 else 'does not help'})")
    return {"compile_s": compile_s, "speedup_forward": sp_f, "speedup_forward+backward": sp_b,
            "max_abs_diff": diff, "ms": {n: t * 1e3 for n, t in med.items()}}


def _ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """Mean of per-block ratios and its 95 % t interval (blocks timed in turns, so each ratio is paired)."""
    from scipy import stats

    m = statistics.fmean(ratios)
    if len(ratios) < 2:
        return m, math.nan, math.nan
    half = stats.t.ppf(0.975, len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return m, m - half, m + half


def _paired_blocks(steps: dict[str, Callable[[], object]], blocks: int,
                   per_block: int) -> dict[str, list[float]]:
    """Seconds per step of each function in ``blocks`` blocks of ``per_block`` steps, the functions taking
    turns inside each block (first one, then the other, swapping the order every block)."""
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for b in range(blocks):
        for n in (names if b % 2 == 0 else names[::-1]):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(per_block):
                steps[n]()
            torch.cuda.synchronize()
            times[n].append((time.perf_counter() - t0) / per_block)
    return times


def part_models(blocks: int, batch: int, per_block: int = 10, compiled: bool = True) -> dict:
    """RPC-SymViT-tiny / SymViT-tiny training throughput with bf16 AMP at 224 px, eager and (``compiled``)
    under ``torch.compile`` (which fuses PAP's elementwise update between the attention passes: the GPU's
    fused update). The ratio is measured in ``blocks`` paired blocks of ``per_block`` steps each, and
    given with a 95 % t interval over the blocks."""
    import kpca_attention  # noqa: F401  (registers the models in timm)
    from kpca_attention.models import create_model

    models = {"SymViT-tiny": ("symvit_tiny_patch16_224", {}),
              "RPC-SymViT-tiny": ("rpc_symvit_tiny_patch16_224",
                                  {"rpc_iters": 4, "rpc_lambda": 4.0, "rpc_layers": "first"})}
    x = torch.rand(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    out: dict = {"batch": batch, "blocks": blocks, "steps_per_block": per_block}
    for mode in ("eager", "compiled") if compiled else ("eager",):
        steps, peaks, warm = {}, {}, {}
        for label, (name, kw) in models.items():
            torch.manual_seed(0)
            model = create_model(name, **kw).cuda().train()
            net = torch.compile(model) if mode == "compiled" else model
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step(net=net, opt=opt) -> None:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(net(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            warm[label] = time.perf_counter() - t0
            peaks[label] = torch.cuda.max_memory_allocated() / 2**30
            steps[label] = step
        times = _paired_blocks(steps, blocks, per_block)
        ratios = [ts / tr for ts, tr in zip(times["SymViT-tiny"], times["RPC-SymViT-tiny"], strict=True)]
        mean, lo, hi = _ratio_interval(ratios)
        ips = {label: batch / statistics.median(ts) for label, ts in times.items()}
        print(f"  training {mode}, bf16 AMP, batch {batch}: SymViT-tiny {ips['SymViT-tiny']:.0f} img/s "
              f"(peak {peaks['SymViT-tiny']:.2f} GiB), RPC-SymViT-tiny {ips['RPC-SymViT-tiny']:.0f} img/s "
              f"(peak {peaks['RPC-SymViT-tiny']:.2f} GiB): ratio {mean:.3f} (95 % interval {lo:.3f}-{hi:.3f} "
              f"over {blocks} blocks of {per_block} steps; paper, A100: 0.963)"
              + (f"; first 3 steps (compilation) {warm['SymViT-tiny']:.0f} / {warm['RPC-SymViT-tiny']:.0f} s"
                 if mode == "compiled" else ""))
        out[mode] = {"images_per_s": ips, "ratio": mean, "ratio_ci95": [lo, hi], "block_ratios": ratios,
                     "peak_memory_gib": peaks, "first_steps_s": warm}
    return out


def _epoch_images(cfg) -> int:
    """Training images in one epoch of ``cfg``: the length of its task's training split (the validation
    images and ``train_subset`` taken into account), read from the data, not assumed."""
    from kpca_attention import tasks

    return len(tasks.get(cfg.task).datasets(cfg, with_eval=False).train)


def part_large(steps: int, device: str = "cuda") -> dict:
    """How long ``vision-large`` would take on this GPU: its exact training runs (DeiT-Tiny width and depth,
    float32, crop / flip, batch 128) for ``steps`` steps each, in the settings that can change the speed
    but not the batches - eager and ``torch.compile``, and four such processes at once - then the projected
    training time of the study (its runs x its epochs x the images of its training split). Fashion-MNIST
    is held in memory, so its batches are made on the GPU in one step each (``DeviceBatches``; loader
    processes do not apply). Needs Fashion-MNIST ($FASHION_MNIST_ROOT)."""
    import dataclasses
    import shutil

    from kpca_attention.data.images import FASHION_MNIST_ROOT
    from kpca_attention.studies import STUDIES
    from kpca_attention.train.logger import read_csv
    from kpca_attention.train.loop import train

    root = os.environ.get("FASHION_MNIST_ROOT", FASHION_MNIST_ROOT)
    if not Path(root, "train-images-idx3-ubyte.gz").exists():
        print(f"  skipped: no Fashion-MNIST under {root} (set $FASHION_MNIST_ROOT)")
        return {"skipped": f"no Fashion-MNIST under {root}"}
    study = STUDIES["vision-large"]()
    variants = {v.slug: v for v in study.variants}
    tmp = Path(tempfile.mkdtemp(prefix="large-"))

    def config(slug: str, name: str, **changes):
        cfg = study.train_config(variants[slug], 0, str(tmp / name))
        return dataclasses.replace(cfg, max_steps=steps, log_every_steps=max(steps // 8, 1), progress=False,
                                   checkpoint_every_steps=None, device=device, **changes)

    def images_per_s(run: Path) -> float:
        rows = read_csv(run / "steps.csv")
        ips = [r["images_per_s"] for r in rows][2:]  # the first windows hold start-up and compilation
        return statistics.median(ips) if ips else math.nan

    res: dict = {"steps": steps}
    try:
        # AMP is not the study's recipe (float32): timed to size what a recipe with the paper's mixed
        # precision (DeiT's training code, which the official RPC code builds on) would save
        for label, slug, changes in (("symvit (as the study runs)", "symvit", {}),
                                     ("symvit, torch.compile", "symvit", {"compile": True}),
                                     ("rpc_official, torch.compile", "rpc_official", {"compile": True}),
                                     ("symvit, AMP (not the recipe)", "symvit", {"amp": True}),
                                     ("symvit, AMP + torch.compile (not the recipe)", "symvit",
                                      {"amp": True, "compile": True})):
            name = f"run{len(res)}"
            t0 = time.perf_counter()
            train(config(slug, name, **changes))
            wall = time.perf_counter() - t0
            ips = images_per_s(tmp / name)
            res[label] = {"images_per_s": ips, "wall_s": wall}
            print(f"  vision-large {label}: {ips:.0f} img/s ({steps} steps in {wall:.0f} s)")
        # four processes side by side, eager and compiled: what fills the GPU
        import pickle
        code = ("import sys, pickle; from kpca_attention.train.loop import train; "
                "train(pickle.load(open(sys.argv[1], 'rb')))")
        for mode, changes in (("eager", {}), ("compiled", {"compile": True})):
            procs = []
            for i in range(4):
                cfg = config("symvit", f"par-{mode}{i}", seed=i, **changes)
                (tmp / f"par-{mode}{i}.pkl").write_bytes(pickle.dumps(cfg))
                procs.append(subprocess.Popen([sys.executable, "-c", code, str(tmp / f"par-{mode}{i}.pkl")],
                                              cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "2"}))
            rcs = [p.wait() for p in procs]
            each = [images_per_s(tmp / f"par-{mode}{i}") if rc == 0 else math.nan for i, rc in enumerate(rcs)]
            res[f"4 processes side by side, {mode}"] = {"images_per_s_each": each,
                                                         "images_per_s_total": sum(each)}
            print(f"  vision-large 4 processes side by side ({mode}): "
                  + ", ".join(f"{e:.0f}" for e in each) + f" img/s, {sum(each):.0f} together")
        cfg0 = config("symvit", "size")
        total_images = len(study.runs()) * cfg0.epochs * _epoch_images(cfg0)
        best = max([v["images_per_s"] for k, v in res.items() if isinstance(v, dict) and "images_per_s" in v
                    and "not the recipe" not in k]
                   + [v["images_per_s_total"] for v in res.values() if isinstance(v, dict)
                      and "images_per_s_total" in v])
        res["projected_training_minutes_at_best"] = total_images / best / 60
        print(f"  projected: the study's {total_images / 1e6:.1f} M training images at {best:.0f} img/s take "
              f"{total_images / best / 60:.0f} min of this GPU (evaluation not counted)")
        amp = max(v["images_per_s"] for k, v in res.items() if "not the recipe" in k)
        res["projected_training_minutes_amp_one_process"] = total_images / amp / 60
        print(f"  with AMP (not the recipe), one process at {amp:.0f} img/s: "
              f"{total_images / amp / 60:.0f} min")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def part_study(train_images: int, workers: int) -> dict:
    """``rpc-depth12`` on this GPU: its RPC run trained briefly (``train_images``, one epoch) and evaluated
    with the study's full suites through the study engine, which trains and evaluates on the GPU; then the
    whole study (its runs x its epochs x the images of its training split) projected from the measured
    training images/s and evaluation time. Needs Fashion-MNIST ($FASHION_MNIST_ROOT)."""
    from kpca_attention.report.study import load_study_results
    from kpca_attention.studies import get_study, run_study

    study = get_study("rpc-depth12")
    toy = study.replace(seeds=(0,), recipe={**study.recipe, "epochs": 1, "train_subset": train_images})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_study(toy, Path(tmp) / "out", Path(tmp) / "runs", progress=False, checks=False,
                  only=("rpc12_official",), loader_workers=workers)
        wall = time.perf_counter() - t0
        _, res = load_study_results(Path(tmp) / "out")
    run = res["rpc12_official"][0]["run"]
    gpu, ips, train_s = run["machine"].get("gpu"), run["images_per_s"], run["train_time_s"]
    eval_s = wall - train_s  # the suites (and the corrupted images, made once per study) and the trace
    cfg = study.train_config(study.variant("rpc12_official"), 0, "x")
    images = cfg.epochs * _epoch_images(cfg)
    runs = len(study.runs())
    projected = runs * (images / ips + eval_s)
    ok = gpu is not None
    print(f"  rpc-depth12 RPC run on {gpu or 'the CPU (no GPU recorded: FAIL)'}: training {ips:.0f} img/s, "
          f"evaluation with the full suites {eval_s:.0f} s; the study's {runs} runs projected at "
          f"{projected / 60:.0f} minutes one after another (the SymViT rows train faster)  "
          f"{'PASS' if ok else 'FAIL'}")
    return {"gpu": gpu, "images_per_s": ips, "train_time_s": train_s, "eval_s": eval_s, "wall_s": wall,
            "projected_study_s": projected, "ok": ok}


def _synthetic_imagefolder(root: Path, classes: int = 2, per_class: int = 16) -> None:
    """A tiny ImageFolder (random 64 px PNGs) with train/ and val/ splits."""
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = (torch.rand(64, 64, 3, generator=gen) * 255).to(torch.uint8).numpy()
                Image.fromarray(img).save(folder / f"{i}.png")


def part_torchrun() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        _synthetic_imagefolder(data)
        torchrun = Path(sys.executable).with_name("torchrun")
        cmd = [str(torchrun), "--standalone", "--nproc_per_node", "1", "-m", "kpca_attention.cli", "train",
               "--preset", "deit", "--model", "rpc_symvit_tiny_patch16_224", "--dataset", "imagefolder",
               "--data-root", str(data), "--epochs", "1", "--max-steps", "3", "--batch-size", "8",
               "--num-workers", "0", "--output-dir", str(Path(tmp) / "run"), "--device", "cuda",
               "--no-progress"]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ})
        wall = time.perf_counter() - t0
        files = sorted(p.name for p in (Path(tmp) / "run").glob("*")) if (Path(tmp) / "run").exists() else []
    ok = res.returncode == 0
    print(f"  torchrun deit preset (rpc_symvit_tiny, 3 steps, synthetic ImageFolder): exit {res.returncode} "
          f"in {wall:.0f} s; run folder: {', '.join(files) or '-'}  {'PASS' if ok else 'FAIL'}")
    if not ok:
        print("    " + "\n    ".join((res.stdout + res.stderr).strip().splitlines()[-15:]))
    return {"returncode": res.returncode, "wall_s": wall, "files": files, "ok": ok}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128, help="batch of the model throughput part")
    ap.add_argument("--parts", default="tests,pap,compile,models,torchrun,large,study")
    ap.add_argument("--blocks", type=int, default=40,
                    help="paired blocks of the models part (40: an interval ~0.05 wide)")
    ap.add_argument("--large-steps", type=int, default=160,
                    help="training steps per setting of the large part")
    ap.add_argument("--workers", type=int, default=6,
                    help="the study part's --loader-workers (for datasets read from disk; in-memory "
                         "Fashion-MNIST is batched on the GPU without them)")
    ap.add_argument("--study-images", type=int, default=5_800,
                    help="training images of the study part's brief run (one epoch over a tenth of the set)")
    ap.add_argument("--json", type=Path, default=None, help="write all results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device visible to torch {torch.__version__} "
              f"(built for CUDA {torch.version.cuda}): nothing to check")
        return 0
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability "
          f"{props.major}.{props.minor}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    parts = {"tests": part_tests, "pap": lambda: part_pap(args.repeats),
             "compile": lambda: part_compile(args.repeats),
             "models": lambda: part_models(args.blocks, args.batch), "torchrun": part_torchrun,
             "large": lambda: part_large(args.large_steps),
             "study": lambda: part_study(args.study_images, args.workers)}
    from kpca_attention.io import write_json_atomic

    results: dict = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda}
    failed = []
    for name in args.parts.split(","):
        print(f"[{name}]")
        try:
            results[name] = parts[name]()
            if results[name].get("ok") is False:
                failed.append(name)
        except Exception as exc:  # report and go on: one broken part must not hide the others
            failed.append(name)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  FAIL {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=3)
        if args.json is not None:  # after every part: a run stopped at a time limit keeps what it measured
            write_json_atomic(args.json, results)
    print("gpu_check: " + (f"FAILED parts: {', '.join(failed)}" if failed else "all parts ran"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
