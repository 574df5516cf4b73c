"""KPCA analysis speed.

1. ``kpca-attention analyze all-MiniLM-L6-v2`` over 100 offline texts of up to 128 tokens (King James
   Bible, consecutive verses joined to >= 90 words, truncated at 128 WordPiece tokens): the whole
   pipeline after loading (tokenise, forward with q/k/v hooks, per-(text, layer, head) eigensolver,
   alignment with Hungarian matching, CKA, J_proj both variants, gamma test on the first 10 texts).
   Target: <= 60 s on 2 cores. Wall time and process CPU time, threads 1 and 2 interleaved, medians.
2. Long sequences: one head of N tokens (D = 64, keys with a few dominant directions as in trained
   models): dense ``eigh`` of the full N x N centred Gram matrix vs the randomized top-64 solver,
   with the eigenvalue error and the subspace distance ``||P_dense - P_lowrank||_F`` of the top 64.

    .venv/bin/python benchmarks/bench_kpca.py [--repeats 3] [--threads 1,2] [--texts 100]
        [--long 1024,2048,4096]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from kpca_attention.kpca import kpca_eigen
from kpca_attention.kpca.analysis import AnalysisConfig
from kpca_attention.kpca.load import bible_texts, load_for_analysis
from kpca_attention.kpca.run import analyze_model


def _minilm(loaded, texts, threads: int) -> tuple[float, float, dict]:
    torch.set_num_threads(threads)
    w0, c0 = time.perf_counter(), time.process_time()
    res = analyze_model(loaded, texts=texts, config=AnalysisConfig(), progress=False)
    return time.perf_counter() - w0, time.process_time() - c0, res


def _long(n: int, repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(n, 4, generator=g) @ torch.randn(4, 64, generator=g) + 0.3 * torch.randn(
        n, 64, generator=g
    )
    times: dict[str, list[float]] = {"dense": [], "lowrank": []}
    res = {}
    methods = ["lowrank"] + (["dense"] if n <= 2048 else [])
    for _ in range(repeats):
        for m in methods:
            t0 = time.perf_counter()
            res[m] = kpca_eigen(keys, 64, method=m)
            times[m].append(time.perf_counter() - t0)
    line = f"| {n} | " + " | ".join(
        f"{statistics.median(times[m]):.2f}" if times[m] else "-" for m in ("dense", "lowrank")
    )
    if "dense" in res:
        d, lo = res["dense"], res["lowrank"]
        rel = ((lo.eigenvalues - d.eigenvalues).abs() / d.eigenvalues.abs()).max().item()
        pd, pl = d.eigenvectors, lo.eigenvectors
        sub = (pd @ pd.mT - pl @ pl.mT).norm().item()
        line += f" | {rel:.1e} | {sub:.1e} |"
    else:
        line += " | - | - |"
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--texts", type=int, default=100)
    ap.add_argument("--long", default="1024,2048,4096")
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"load average {load:.1f}"
    )
    loaded = load_for_analysis("all-MiniLM-L6-v2")
    texts = bible_texts(args.texts)
    threads = [int(t) for t in args.threads.split(",")]
    walls: dict[int, list[float]] = {t: [] for t in threads}
    cpus: dict[int, list[float]] = {t: [] for t in threads}
    res = None
    for r in range(args.repeats):
        for t in threads:  # interleaved
            wall, cpu, res = _minilm(loaded, texts, t)
            walls[t].append(wall)
            cpus[t].append(cpu)
            print(f"  repeat {r} threads {t}: wall {wall:.1f} s, cpu {cpu:.1f} s", flush=True)
    s = res["summary"]
    print(
        f"\nall-MiniLM-L6-v2, {s['num_sequences']} texts, mean {s['mean_tokens']:.1f} tokens, "
        f"{s['num_heads_analysed']} (text, layer, head) analyses; load average now {os.getloadavg()[0]:.1f}"
    )
    print("| threads | wall s (median) | CPU s (median) | target | verdict |\n|---|---|---|---|---|")
    for t in threads:
        w = statistics.median(walls[t])
        print(
            f"| {t} | {w:.1f} | {statistics.median(cpus[t]):.1f} | 60 s | {'PASS' if w <= 60 else 'FAIL'} |"
        )
    print(
        f"\nsummary: optimal_cosine {s['optimal_cosine']:.3f}, linear_cka {s['linear_cka']:.3f}, "
        f"kernel_cka {s['kernel_cka']:.3f}, direct_cosine {s['direct_cosine']:.4f}"
    )
    torch.set_num_threads(max(threads))
    print("\n| N | dense eigh s | lowrank top-64 s | max rel. eigenvalue error | subspace distance |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.long.split(",") if x):
        _long(n, max(1, args.repeats // 2))


if __name__ == "__main__":
    main()
