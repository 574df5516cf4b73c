"""Train one (variant, seed) of a registered study with its recipe, logging J_proj every epoch
(``ProjectionLossCallback`` on the first 32 examples of the run's held-out split: the validation images
carved from the training data - for a legacy recipe without a validation split, test images -, or a language
model's first 32 windows of the corpus's valid split), without
the study's evaluation: the models of ``results/kpca-vision`` and ``results/kpca-language``
(``kpca-attention claims`` then judges P2, "J_proj falls during training", from the run's ``epochs.csv``).
The callback draws no random numbers, so the trained weights are those of the study's own run of the same
(variant, seed) on the same kind of machine. A killed run resumes from its last checkpoint, refused if its
epochs were logged on another batch (``jproj_batch.sha256`` in the run folder: P2 compares the first and last
epochs, which must be measured on the same examples).

    .venv/bin/python benchmarks/kpca_train_logged.py vision symvit 0 runs/kpca-vision
    .venv/bin/python benchmarks/kpca_train_logged.py language symlm 0 runs/kpca-language
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kpca_attention.kpca.callback import held_out_callback
from kpca_attention.studies import get_study
from kpca_attention.train import train

BATCH = 32  # examples the callback measures J_proj on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", help="a registered study (vision, zoo, language, ...)")
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
    resume = (run_dir / "checkpoints").exists()
    try:
        callback = held_out_callback(cfg, BATCH, resume=resume, name="the J_proj batch")
    except ValueError as e:
        ap.error(str(e))
    result = train(cfg, callbacks=[callback], resume=resume)
    print(result.run_dir)


if __name__ == "__main__":
    main()
