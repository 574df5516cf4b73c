"""The claims table on models trained here and on all-MiniLM-L6-v2, offline on a CPU.

Trains SymViT, RPC-SymViT and Scaled-Attention ViT (scalar alpha) - the ``*_mini_patch4_28`` models -
on scikit-learn's digits (preset ``digits-cpu``) with :class:`~kpca_attention.kpca.callback.
ProjectionLossCallback` logging J_proj every epoch (paper's Fig. 1, both scalings), then runs
``kpca-attention claims`` on the three runs and on all-MiniLM-L6-v2 (100 Bible texts).

    .venv/bin/python benchmarks/kpca_claims_demo.py [--out runs/kpca_claims] [--epochs 10]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kpca_attention.data.images import build_image_dataset
from kpca_attention.io import write_json_atomic
from kpca_attention.kpca.callback import ProjectionLossCallback
from kpca_attention.kpca.claims import judge
from kpca_attention.kpca.load import load_for_analysis
from kpca_attention.kpca.run import analyze_model, resolve_inputs
from kpca_attention.report.kpca import write_claims
from kpca_attention.train import get_preset, train

MODELS = {
    "symvit": ("symvit_mini_patch4_28", {}),
    "rpc_symvit": ("rpc_symvit_mini_patch4_28", {}),
    "scaled_vit": ("scaled_vit_mini_patch4_28", {"scaled": "scalar"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/kpca_claims")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--skip-train", action="store_true", help="reuse finished runs under --out")
    args = ap.parse_args()
    out = Path(args.out)
    fixed = torch.stack([build_image_dataset("digits", "test")[i][0] for i in range(32)])
    runs = []
    for key, (model, kwargs) in MODELS.items():
        run_dir = out / key
        if not args.skip_train:
            cfg = get_preset("digits-cpu", model=model, model_kwargs=kwargs, epochs=args.epochs,
                             output_dir=str(run_dir))
            train(cfg, callbacks=[ProjectionLossCallback(fixed)], overwrite=True)
        runs.append(run_dir)
    verdicts = []
    for name in [str(r) for r in runs] + ["all-MiniLM-L6-v2"]:
        loaded = load_for_analysis(name)
        inputs = resolve_inputs(loaded, max_samples=args.samples, bible_fallback=True)
        res = analyze_model(loaded, **inputs.kwargs())
        res["inputs"] = inputs.description
        write_json_atomic(out / f"analysis_{Path(name).name}.json", res, indent=None)
        verdicts.append(judge(res, run_dir=Path(name) if Path(name).exists() else None))
    md = write_claims(verdicts, out)
    print(md.read_text())


if __name__ == "__main__":
    main()
