"""How much the kind of machine moves a study's numbers: the same (variant, seed) trained and evaluated on two
machines, every recorded number side by side.

A study trains on one kind of machine (``kpca_attention.machine.machine_kind`` says why: the same seed takes
other floating-point paths on an AMD EPYC and an Intel Xeon). This script measures how far apart those paths
end for runs that exist in two study folders - the committed one and a replica trained elsewhere with the same
study, variant and seed (``kpca-attention study NAME --seeds S --variants V --out OTHER --any-machine``) - and
writes a markdown table: per epoch the training loss and held-out perplexity, per evaluation item its headline
number and, for a language model, its per-token NLLs (float16 as stored).

    .venv/bin/python benchmarks/machine_replica.py results/language /work/scratch/xmachine/out \\
        --out results/language/machine_replica.md
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from kpca_attention.machine import machine_kind
from kpca_attention.robustness.store import ResultStore
from kpca_attention.tasks.language.suites import decode_nll

EPOCH_FIELDS = ("train_loss", "eval_loss", "eval_ppl")
ITEM_FIELDS = ("ppl", "nll_mean", "top1", "miou")


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def seed_sd(runs: dict[str, dict], slug: str, item: str, field: str) -> float:
    """The standard deviation over the seeds of ``slug`` (``runs``: a study folder's result items by file
    stem, read once) of one item's number (nan below two seeds): the scale the machine's difference is to be
    read against."""
    values = [float(items[item][field]) for stem, items in runs.items()
              if stem.rsplit("-s", 1)[0] == slug and isinstance(items.get(item), dict)
              and field in items[item]]
    return float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")


def compare_run(a: dict, b: dict, sd=lambda item, field: float("nan")) -> list[tuple[str, ...]]:
    """Rows ``(what, a, b, |a - b|, relative, SD over seeds)`` for every epoch number and evaluation item of
    two runs (``sd(item, field)``: the spread over seeds of an item's number)."""
    rows = []
    ea, eb = a["run"]["epochs"], b["run"]["epochs"]
    if len(ea) != len(eb):
        raise SystemExit(f"the runs have {len(ea)} and {len(eb)} epochs: not replicas of one another")
    for x, y in zip(ea, eb, strict=True):
        for f in EPOCH_FIELDS:
            if f in x and f in y:
                rows.append((f"epoch {int(x['epoch'])} {f}", f"{x[f]:.10g}", f"{y[f]:.10g}",
                             f"{abs(x[f] - y[f]):.2g}", f"{relative(x[f], y[f]):.1e}", ""))
    for item in sorted(set(a) & set(b) - {"run"}):
        ra, rb = a[item], b[item]
        for f in ITEM_FIELDS:
            if f in ra and f in rb:
                va, vb = float(ra[f]), float(rb[f])
                spread = sd(item, f)
                rows.append((f"{item} {f}", f"{va:.10g}", f"{vb:.10g}", f"{abs(va - vb):.2g}",
                             f"{relative(va, vb):.1e}", "" if math.isnan(spread) else f"{spread:.3g}"))
        if ("nll_f16" in ra or "nll_f16_xz" in ra) and ("nll_f16" in rb or "nll_f16_xz" in rb):
            na, nb = decode_nll(ra), decode_nll(rb)
            if na.shape == nb.shape:
                d = np.abs(na - nb)
                rows.append((f"{item} per-token NLL ({na.size} tokens, float16)", "", "",
                             f"max {d.max():.2g}, mean {d.mean():.2g}",
                             f"{(d == 0).mean():.1%} identical", ""))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("first", type=Path, help="a study's results folder (e.g. the committed one)")
    ap.add_argument("second", type=Path, help="the replica's results folder (its study run's --out)")
    ap.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    args = ap.parse_args()
    lines = ["# One seed on two kinds of machine", "",
             f"The runs of `{args.first}` against the same (variant, seed) trained again by the same study, "
             "with the same code, on another kind of machine; every number the runs recorded, side by side "
             "(`benchmarks/machine_replica.py`).", ""]
    firsts = {p.stem: ResultStore(p).items() for p in sorted((args.first / "results").glob("*-s*.json"))}
    found = 0
    for path in sorted((args.second / "results").glob("*-s*.json")):
        if path.stem not in firsts:
            continue
        a, b = firsts[path.stem], ResultStore(path).items()
        if "run" not in a or "run" not in b:
            continue
        found += 1
        ka, kb = machine_kind(a["run"]["machine"]), machine_kind(b["run"]["machine"])
        ta, tb = a["run"].get("train_time_s"), b["run"].get("train_time_s")
        lines += [f"## {path.stem}", "",
                  f"Trained on {ka} ({ta / 60:.0f} min) and on {kb} ({tb / 60:.0f} min)."
                  if ta and tb else f"Trained on {ka} and on {kb}.", "",
                  f"| number | {ka} | {kb} | difference | relative | SD over the study's seeds |",
                  "|---|---|---|---|---|---|"]
        slug = path.stem.rsplit("-s", 1)[0]
        rows = compare_run(a, b, lambda item, field, slug=slug: seed_sd(firsts, slug, item, field))
        lines += [f"| {' | '.join(r)} |" for r in rows]
        worst = max((float(r[4]) for r in rows if r[4] and not r[4].endswith("identical")
                     and math.isfinite(float(r[4]))), default=float("nan"))
        lines += ["", f"Largest relative difference of a recorded number: {worst:.1e}.", ""]
    if not found:
        raise SystemExit(f"no finished run of {args.second} is also in {args.first}")
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
