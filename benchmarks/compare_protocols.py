"""How far apart the two attack protocols are on the same model (docs/robustness.md, "pixel vs lab").

PGD-20 at k/255 under ``pixel`` (inputs in [0, 1], normalisation inside the model, clamp: this project's
default) and ``lab`` (the papers' cleverhans protocol: the normalised tensor, eps in normalised units, no
clamp) on the first ``--n`` images of the committed Fashion-MNIST test-image list, for each run given.
Writes ``--out`` (JSON: per model its clean top-1 on the same images, and per budget and protocol top-1
and the number of images) and prints the table with the ratio of robust accuracies lab / pixel. ``lab``
attacks the model's clean prediction and scores the true label, so an image misclassified clean can be
pushed to its right class: lab accuracy can exceed clean accuracy, which ``pixel`` (the true label) cannot.

    python benchmarks/compare_protocols.py runs/studies/rpc-seeds/symvit-s0 \\
        runs/studies/rpc-seeds/rpc_official-s0 --n 500 --out results/protocols/pgd_pixel_vs_lab.json
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Subset

from kpca_attention.data.images import build_image_dataset
from kpca_attention.io import write_json_atomic
from kpca_attention.machine import machine_info
from kpca_attention.robustness.attacks import evaluate_attack
from kpca_attention.robustness.image_ids import load_image_ids
from kpca_attention.train import evaluate_vision
from kpca_attention.train.resolve import resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="project run directories (image classifiers on Fashion-MNIST)")
    ap.add_argument("--n", type=int, default=1000, help="first n images of the committed test-image list")
    ap.add_argument("--eps", default="1,2,4,8", help="budgets k of k/255")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ids = load_image_ids("fashion-mnist")[: args.n]
    data = Subset(build_image_dataset("fashion-mnist", "test"), ids)
    ks = [int(k) for k in args.eps.split(",")]
    out = {"attack": "pgd-20", "n": len(ids), "image_list": "fashion-mnist (first n)",
           "machine": machine_info(), "models": {}}
    print(f"{'model':40s} {'eps':>6s} {'pixel %':>8s} {'lab %':>8s} {'lab/pixel':>9s}")
    for run in args.runs:
        model = resolve_model(run).model
        clean = evaluate_vision(model, DataLoader(data, batch_size=250))["top1"]
        print(f"{run:40s} {'clean':>8s} {100 * clean:8.1f}", flush=True)
        rows: dict = {"clean": clean}
        for k in ks:
            t0 = time.perf_counter()
            acc = {p: evaluate_attack(model, data, "pgd", k / 255, batch_size=250, progress=False,
                                      protocol=p)["top1"] for p in ("pixel", "lab")}
            rows[f"{k}/255"] = {**acc, "lab_over_pixel": acc["lab"] / acc["pixel"] if acc["pixel"] else None,
                                "seconds": time.perf_counter() - t0}
            r = rows[f"{k}/255"]
            ratio = f"{r['lab_over_pixel']:.2f}" if r["lab_over_pixel"] is not None else "-"
            print(f"{run:40s} {k:>4d}/255 {100 * acc['pixel']:8.1f} {100 * acc['lab']:8.1f} {ratio:>9s}",
                  flush=True)
        out["models"][run] = rows
        write_json_atomic(args.out, out)


if __name__ == "__main__":
    main()
