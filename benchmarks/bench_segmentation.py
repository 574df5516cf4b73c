"""Training throughput of the CPU segmentation task: Segmenter-SymViT-mini vs Segmenter-RPC-SymViT-mini
(4 PAP iterations in the first block, lambda 4) on 32-px Fashion-MNIST scenes, batch 64, with the linear
and the mask-transformer decoder.

One training step = forward, per-pixel cross-entropy (ignore 255), backward, AdamW step, on a fixed batch
of real scenes. Timed side by side in one process with interleaved repeats (every model once per round)
and medians; prints the CPU model, the thread count and the load average (the machine may be shared).

    .venv/bin/python benchmarks/bench_segmentation.py
    .venv/bin/python benchmarks/bench_segmentation.py --repeats 9 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from kpca_attention.data.segmentation import FashionMNISTScenes, SceneSpec, segmentation_info
from kpca_attention.machine import cpu_model
from kpca_attention.models import NormalizedModel, create_model

ENCODERS = {
    "Segmenter-SymViT-mini": ("segmenter_symvit_mini_patch4_32", {}),
    "Segmenter-RPC-SymViT-mini": ("segmenter_rpc_symvit_mini_patch4_32", {"rpc_iters": 4, "rpc_lambda": 4.0}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--canvas", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = segmentation_info("fashion-mnist-scenes", img_size=args.canvas)
    scenes = FashionMNISTScenes("train", SceneSpec(canvas=args.canvas))
    x = torch.stack([scenes[i][0] for i in range(args.batch)])
    y = torch.stack([scenes[i][1] for i in range(args.batch)])
    steps = {}
    for decoder in ("linear", "mask_transformer"):
        for label, (name, kw) in ENCODERS.items():
            torch.manual_seed(0)
            net = create_model(name, num_classes=info.num_classes, in_chans=1, img_size=args.canvas,
                               decoder=decoder, **kw)
            model = NormalizedModel(net, info.mean, info.std).train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def step(model: torch.nn.Module = model, opt: torch.optim.Optimizer = opt) -> None:
                loss = F.cross_entropy(model(x), y, ignore_index=255)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            step()  # warm-up
            steps[(decoder, label)] = step
    times: dict[tuple[str, str], list[float]] = {k: [] for k in steps}
    for _ in range(args.repeats):
        for key, step in steps.items():
            t = time.perf_counter()
            step()
            times[key].append(time.perf_counter() - t)
    print(f"CPU: {cpu_model()}; torch threads {args.threads}; load average {os.getloadavg()}")
    print(f"batch {args.batch}, canvas {args.canvas} px, {args.repeats} interleaved repeats, medians")
    for decoder in ("linear", "mask_transformer"):
        ips = {label: args.batch / statistics.median(times[(decoder, label)]) for label in ENCODERS}
        sym, rpc = ips["Segmenter-SymViT-mini"], ips["Segmenter-RPC-SymViT-mini"]
        print(f"{decoder:17s} SymViT {sym:7.1f} img/s   RPC-SymViT {rpc:7.1f} img/s   ratio {rpc / sym:.2f}")


if __name__ == "__main__":
    main()
