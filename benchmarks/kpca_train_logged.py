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
import hashlib
from pathlib import Path

import torch

from kpca_attention import tasks
from kpca_attention.kpca.callback import ProjectionLossCallback
from kpca_attention.modules import tensor_bytes
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
    held_out = tasks.get(cfg.task).datasets(cfg).held_out
    if held_out is None or len(held_out) < BATCH:
        ap.error(f"{args.study}/{args.variant}: the run's held-out split has fewer than {BATCH} examples")
    batch = torch.stack([held_out[i][0] for i in range(BATCH)])
    digest = hashlib.sha256(tensor_bytes(batch)).hexdigest()
    resume = (run_dir / "checkpoints").exists()
    mark = run_dir / "jproj_batch.sha256"
    if resume and mark.exists() and mark.read_text().strip() != digest:
        ap.error(f"{run_dir} logged J_proj on another batch ({mark}): train it again in another folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    mark.write_text(digest + "\n")
    result = train(cfg, callbacks=[ProjectionLossCallback(batch)], resume=resume)
    print(result.run_dir)


if __name__ == "__main__":
    main()
