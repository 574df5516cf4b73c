"""Training throughput and peak memory of every mechanism of the ``zoo`` study, side by side (issue 25).

The models are the variants of :func:`kpca_attention.studies.zoo.zoo_study` (ViT, SymViT, RPC-SymViT and
the robust-attention family, the 64-wide 4-block mini ViT on 28 px Fashion-MNIST, preset ``fmnist-cpu``),
built by the study's own training code path: ``cfg = study.train_config(variant, seed, ...)``,
``study.task.build_model(cfg)`` (``create_model(name, num_classes=10, in_chans=1, img_size=28,
drop_path_rate=cfg.drop_path, **kwargs)`` wrapped in ``NormalizedModel``, as ``train/loop.py`` does), the
optimizer of ``train/loop.py`` (``timm.optim.create_optimizer_v2``: AdamW at the recipe's learning rate
and weight decay) and the task's loss (``study.task.objective``: cross-entropy, the recipe has no label
smoothing). The learning-rate schedule is left out (it costs nothing per step). A training step is:
forward on a fixed batch of random 28 x 28 one-channel images in [0, 1] (the recipe's batch size, 128;
``--batch`` overrides), the loss, backward, the optimizer step.

* Throughput: all models in this one process; ``--warmup`` steps of each, then ``--repeats`` rounds of
  one timed step (``time.perf_counter``) per model, interleaved, so that every model sees the same
  machine state. Per model: the median ms/step, images/s (batch / median), and its images/s as a ratio
  to the ViT (slug ``vit``, the study's baseline) and to SymViT (``symvit``): the ratio of the medians,
  with the min-max over repeats of the per-round ratio (the two steps of a round ran back to back).
* Peak training memory: each model in a fresh subprocess (this script with ``--one SLUG``): build the
  model and optimizer, one warm-up step (the optimizer state now exists), read the resident set size
  (``/proc/self/statm``), run ``--memory-steps`` steps, then the peak resident set size minus that RSS
  = the training working set beyond the model at rest (activations kept for backward, gradients,
  temporaries), in MiB. This is CPU RSS: an upper bound of the tensor memory, moved by the allocator
  (glibc keeps freed memory; what the warm-up step freed may still be resident before the steps).
  The peak is ``VmHWM`` of ``/proc/self/status``, reset just before the steps by writing ``5`` to
  ``/proc/self/clear_refs``; ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` is NOT used for it because
  a child started by ``subprocess`` (vfork + exec) inherits its parent's peak in ``ru_maxrss`` (it is
  still recorded in the JSON, as ``ru_maxrss_mib``). Where ``clear_refs`` cannot be written the peak is
  the child's lifetime ``VmHWM`` (which includes the warm-up step). With ``--device cuda`` the model is
  on the GPU and the measure is the right one there: ``torch.cuda.reset_peak_memory_stats()``, the
  steps, ``torch.cuda.max_memory_allocated()`` minus the memory allocated before them.

No target and no PASS/FAIL: this is a record. Exit status 1, with one line, if a model fails to build.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_zoo.py --json results/zoo-cost.json   # full
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_zoo.py --repeats 2 --warmup 1 --batch 8 \\
        --only vit,symvit,rpc_official,neutreno                                                # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from kpca_attention.machine import cpu_model
from kpca_attention.studies.spec import Study, Variant
from kpca_attention.studies.zoo import zoo_study

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pap import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINES = {"vit": "/ ViT", "symvit": "/ SymViT"}  # slug -> column


class BuildError(RuntimeError):
    """A variant's model (or optimizer) could not be built."""


def build(study: Study, variant: Variant, batch: int | None, device: torch.device
          ) -> tuple[torch.nn.Module, Callable[[], None], tuple[int, ...]]:
    """``(model, step, input shape)`` of one variant, as the study trains it (seed 0 before the model is
    built): ``step()`` runs forward, loss, backward and the optimizer step on one fixed random batch."""
    import timm.optim

    cfg = study.train_config(variant, study.seeds[0], "unused")
    data = study.task.data_info(cfg)
    info = {"num_classes": data.num_classes, "in_chans": data.in_chans}
    try:
        torch.manual_seed(0)
        model = study.task.build_model(cfg, info).to(device).train()
        opt = timm.optim.create_optimizer_v2(model, opt=cfg.opt, lr=cfg.learning_rate(1),
                                             weight_decay=cfg.weight_decay)
    except Exception as e:  # any failure is reported as one line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise BuildError(f"{variant.slug}: {variant.model} {dict(variant.kwargs) or ''} failed to build: "
                         f"{type(e).__name__}: {first}") from e
    objective = study.task.objective(cfg, info)
    bs = batch or cfg.batch_size
    size = cfg.img_size or data.img_size
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(bs, data.in_chans, size, size, generator=gen).to(device)
    y = torch.randint(0, data.num_classes, (bs,), generator=gen).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> None:
        xb, yb = objective.mix(x, y) if objective.mix is not None else (x, y)
        loss = objective.loss(model, xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()

    return model, step, tuple(x.shape)


def throughput(steps: dict[str, Callable[[], None]], warmup: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per step of every model: ``warmup`` untimed steps each, then ``repeats`` rounds of one
    timed step per model (interleaved)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {slug: [] for slug in steps}
    for _ in range(repeats):
        for slug, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[slug].append(time.perf_counter() - t0)
    return times


def ratio(times: dict[str, list[float]], slug: str, base: str) -> dict[str, float] | None:
    """images/s of ``slug`` over images/s of ``base``: the ratio of the medians, and the min and max of
    the per-round ratio (rounds are interleaved: round i of both ran back to back). None without ``base``."""
    if base not in times:
        return None
    per_round = [b / t for b, t in zip(times[base], times[slug], strict=True)]
    return {"ratio": statistics.median(times[base]) / statistics.median(times[slug]),
            "min": min(per_round), "max": max(per_round)}


def _rss_bytes() -> int:
    """Current resident set size (``/proc/self/statm``, second field, in pages)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _vm_hwm_bytes() -> int:
    """Peak resident set size of this process's memory map (``VmHWM``, resettable via clear_refs)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def measure_memory(step: Callable[[], None], steps: int, device: torch.device) -> dict[str, Any]:
    """The training working set (MiB) beyond the model at rest: one warm-up step, then the peak during
    ``steps`` steps minus the memory before them (CPU: RSS; CUDA: ``max_memory_allocated``)."""
    import resource

    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        for _ in range(steps):
            step()
        peak = torch.cuda.max_memory_allocated()
        return {"peak_mib": (peak - before) / 2**20, "at_rest_mib": before / 2**20,
                "method": "torch.cuda.max_memory_allocated - memory_allocated before the steps"}
    before = _rss_bytes()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        method = "VmHWM reset before the steps - RSS before (CPU RSS)"
    except OSError:
        method = "lifetime VmHWM - RSS before (CPU RSS; clear_refs not writable)"
    for _ in range(steps):
        step()
    peak = _vm_hwm_bytes()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"peak_mib": (peak - before) / 2**20, "at_rest_mib": before / 2**20, "method": method,
            "ru_maxrss_mib": maxrss / 2**20}


def one(study: Study, slug: str, args: argparse.Namespace) -> int:
    """``--one SLUG`` (the subprocess): measure one variant's memory, print it as one JSON line."""
    variant = next(v for v in study.variants if v.slug == slug)
    device = torch.device(args.device)
    try:
        model, step, _ = build(study, variant, args.batch, device)
    except BuildError as e:
        print(f"bench_zoo: {e}", file=sys.stderr)
        return 1
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"slug": slug, "params": params, **measure_memory(step, args.memory_steps, device)}))
    return 0


def memory_in_subprocess(slug: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run this script with ``--one SLUG`` in a fresh Python process; its JSON line, parsed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", slug, "--threads", str(args.threads),
           "--memory-steps", str(args.memory_steps), "--device", args.device]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        raise BuildError(last.removeprefix("bench_zoo: "))
    return json.loads(res.stdout.strip().splitlines()[-1])


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _ratio_cell(r: dict[str, float] | None) -> str:
    return "-" if r is None else f"{r['ratio']:.2f} [{r['min']:.2f}-{r['max']:.2f}]"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds, one step per model each")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the study recipe's)")
    p.add_argument("--memory-steps", type=int, default=3, help="steps during which the peak is taken")
    p.add_argument("--only", default="", help="comma-separated slugs of the zoo study (default: all)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--json", type=Path, default=None, help="write every number and the machine here")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the memory subprocess
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    study = zoo_study()
    slugs = [v.slug for v in study.variants]
    chosen = [s for s in args.only.split(",") if s] or slugs
    unknown = [s for s in chosen if s not in slugs]
    if unknown:
        print(f"bench_zoo: unknown slug(s) {', '.join(unknown)}; valid: {', '.join(slugs)}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_zoo: --device cuda but no CUDA device is available", file=sys.stderr)
        return 1
    if args.one is not None:
        if args.one not in slugs:
            print(f"bench_zoo: unknown slug {args.one}", file=sys.stderr)
            return 2
        return one(study, args.one, args)

    device = torch.device(args.device)
    variants = [v for v in study.variants if v.slug in chosen]
    models, steps = {}, {}
    try:
        for v in variants:
            models[v.slug], steps[v.slug], shape = build(study, v, args.batch, device)
    except BuildError as e:
        print(f"bench_zoo: {e}", file=sys.stderr)
        return 1
    print(machine_line())
    batch = shape[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, batch "
          f"{' x '.join(map(str, shape))}, {args.warmup} warm-up steps, {args.repeats} interleaved rounds, "
          "medians")
    times = throughput(steps, args.warmup, args.repeats)
    del models, steps
    try:
        memory = {v.slug: memory_in_subprocess(v.slug, args) for v in variants}
    except BuildError as e:
        print(f"bench_zoo: {e}", file=sys.stderr)
        return 1

    rows = []
    print()
    print("| mechanism | params | ms/step | images/s | / ViT | / SymViT | peak training memory (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for v in variants:
        med = statistics.median(times[v.slug])
        ratios = {base: ratio(times, v.slug, base) for base in BASELINES}
        mem = memory[v.slug]
        rows.append({"slug": v.slug, "label": v.label, "model": v.model, "kwargs": dict(v.kwargs),
                     "params": mem["params"], "ms_per_step": med * 1e3, "images_per_s": batch / med,
                     "step_s": times[v.slug], "vs": ratios, "memory": mem})
        print(f"| {v.label} | {mem['params']:,} | {med * 1e3:.1f} | {batch / med:.0f} | "
              f"{_ratio_cell(ratios['vit'])} | {_ratio_cell(ratios['symvit'])} | {mem['peak_mib']:.1f} |")
    print("\nratios: images/s over the baseline's, ratio of medians [min-max of the per-round ratio]; "
          f"memory: {memory[variants[0].slug]['method']}, {args.memory_steps} steps after one warm-up step, "
          "each model in its own process")
    if args.json is not None:
        out = {"benchmark": "bench_zoo", "study": study.name, "date": datetime.now(timezone.utc).isoformat(
            timespec="seconds"), "commit": _commit(), "cpu": cpu_model(), "logical_cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "torch": torch.__version__, "threads": args.threads,
            "device": args.device, "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "batch": batch, "warmup": args.warmup, "repeats": args.repeats,
            "memory_steps": args.memory_steps, "rows": rows}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
