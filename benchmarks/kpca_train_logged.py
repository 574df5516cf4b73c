"""Train one (variant, seed) of a registered image-classification study with its recipe, logging J_proj every
epoch (``ProjectionLossCallback`` on the first 32 validation images), without the study's evaluation: the
models of ``results/kpca-vision`` (``kpca-attention claims`` then judges P2, "J_proj falls during training",
from the run's ``epochs.csv``). A killed run resumes from its last checkpoint.

    .venv/bin/python benchmarks/kpca_train_logged.py vision symvit 0 runs/kpca-vision
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kpca_attention.data.images import build_image_dataset
from kpca_attention.kpca.callback import ProjectionLossCallback
from kpca_attention.studies import get_study
from kpca_attention.train import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", help="a registered study whose runs classify images (vision, zoo, ...)")
    ap.add_argument("variant", help="the variant's slug")
    ap.add_argument("seed", type=int)
    ap.add_argument("runs", type=Path, help="folder of the runs (the run goes into RUNS/<variant>-s<seed>)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    study = get_study(args.study)
    slugs = [v.slug for v in study.variants]
    if args.variant not in slugs:
        ap.error(f"unknown variant {args.variant!r} of {args.study}; valid: {', '.join(slugs)}")
    variant = study.variants[slugs.index(args.variant)]
    run_dir = args.runs / f"{args.variant}-s{args.seed}"
    cfg = study.train_config(variant, args.seed, str(run_dir))
    cfg.progress = False
    val = build_image_dataset(cfg.dataset, "val", root=cfg.data_root, img_size=cfg.img_size)
    batch = torch.stack([val[i][0] for i in range(32)])
    result = train(cfg, callbacks=[ProjectionLossCallback(batch)], resume=(run_dir / "checkpoints").exists())
    print(result.run_dir)


if __name__ == "__main__":
    main()
