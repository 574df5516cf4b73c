"""``kpca-attention robustness CHECKPOINT... --suite corruptions|ood|attacks|wordswap``."""

from __future__ import annotations

from pathlib import Path

import typer

from ..robustness.attacks import METHODS
from ..robustness.corruptions import corruption_names
from ..robustness.run import SUITES, Options, run_robustness
from . import parse_floats, parse_ints, parse_list


def robustness_cmd(
    checkpoints: list[str] = typer.Argument(..., help="Run or checkpoint directories of this project, or image "
                                            "classifiers as timm names with an optional weights file "
                                            "(NAME@FILE; then give --dataset)."),
    dataset: str | None = typer.Option(None, help="Dataset of models that are not checkpoints of this project "
                                       "(fashion-mnist, imagenet, cifar10, ...)."),
    data_root: Path | None = typer.Option(None, help="Dataset folder for --dataset."),
    suite: str = typer.Option("corruptions", "--suite", "-s",
                              help=f"Comma-separated suites: {', '.join(SUITES)}."),
    out: Path = typer.Option(Path("runs/robustness"), "--out", "-o", help="Output directory."),
    labels: str | None = typer.Option(None, help="Comma-separated names for the checkpoints (default: "
                                      "run directory names)."),
    baseline: str | None = typer.Option(None, help="Label of the baseline run for mCE relative to a run "
                                        "(default: the first checkpoint)."),
    split: str = typer.Option("test", help="Image split to evaluate (train | val | test)."),
    n: int | None = typer.Option(None, help="Evaluate corruptions on this many test images (seeded "
                                 "sample; default all)."),
    corruptions: str = typer.Option("common", help="common (the 15 of ImageNet-C) | extra | all | a "
                                    "comma-separated list."),
    severities: str = typer.Option("1,2,3,4,5", help="Comma-separated severities."),
    imagenet_c: Path | None = typer.Option(None, help="Released ImageNet-C tree "
                                           "<root>/<corruption>/<severity>/<wnid>/ instead of corrupting "
                                           "on the fly."),
    cache: bool = typer.Option(True, help="Cache corrupted images on disk (shared by all checkpoints)."),
    method: str = typer.Option("fgsm,pgd", help=f"Attacks, comma-separated: {', '.join(METHODS)}."),
    eps: str | None = typer.Option(None, help="Attack budgets, e.g. 1/255,2/255 (default per method: "
                                   "Linf 1..6/255 as in the paper)."),
    attack_n: int = typer.Option(500, help="Number of test images to attack."),
    steps: int | None = typer.Option(None, help="Steps for pgd/sld/cw (default: 20/20/50)."),
    imagenet_a: Path | None = typer.Option(None, help="ImageNet-A folder (<wnid>/*)."),
    imagenet_r: Path | None = typer.Option(None, help="ImageNet-R folder (<wnid>/*)."),
    imagenet_o: Path | None = typer.Option(None, help="ImageNet-O folder (<wnid>/*)."),
    imagenet_val: Path | None = typer.Option(None, help="ImageNet val folder: ImageNet-O's in-distribution "
                                             "set."),
    lm_splits: str = typer.Option("valid,test", help="Text splits for wordswap."),
    rate: float = typer.Option(0.015, help="Fraction of non-stopword words swapped to AAA."),
    stride: int = typer.Option(1, help="Perplexity window stride (1 = the paper's protocol)."),
    max_tokens: int | None = typer.Option(None, help="Score only the first N tokens of each split."),
    batch_size: int = typer.Option(128, help="Evaluation batch size (windows per forward for LMs)."),
    seed: int = typer.Option(0, help="Seed of corruptions, attacks and the word swap."),
    device: str = typer.Option("auto", help="cpu | cuda | auto."),
    ema: bool = typer.Option(False, help="Use the EMA weights of the checkpoints."),
    progress: bool = typer.Option(True, help="Progress bars."),
) -> None:
    """Robustness of trained checkpoints, side by side: common corruptions (mCE), ImageNet-A/R/O,
    adversarial attacks in pixel space, word swap for language models.

    Writes <out>/<suite>.json, .md tables and .png plots; finished items are kept in <out>/results and
    reused when the command is run again with the same parameters."""
    from ..train.distributed import resolve_device

    suites = parse_list(suite)
    bad = [s for s in suites if s not in SUITES]
    if bad or not suites:
        raise ValueError(f"unknown suite(s) {bad or suite!r}; valid: {', '.join(SUITES)}")
    names = (corruption_names(corruptions) if corruptions in ("common", "extra", "all")
             else parse_list(corruptions))
    attack_options: dict[str, dict[str, int]] = {}
    if steps is not None:
        attack_options = {"pgd": {"steps": steps}, "sld": {"steps": steps}, "cw": {"steps": steps}}
    def opt_str(p: Path | None) -> str | None:
        return None if p is None else str(p)

    opts = Options(
        split=split, n=n, batch_size=batch_size, seed=seed, corruptions=names,
        severities=parse_ints(severities, "--severities"), imagenet_c=opt_str(imagenet_c),
        cache=cache, methods=parse_list(method), eps=parse_floats(eps, "--eps") if eps else None, attack_n=attack_n,
        attack_options=attack_options, imagenet_a=opt_str(imagenet_a), imagenet_r=opt_str(imagenet_r),
        imagenet_o=opt_str(imagenet_o), imagenet_val=opt_str(imagenet_val),
        lm_splits=parse_list(lm_splits), rate=rate, stride=stride, max_tokens=max_tokens, baseline=baseline,
        progress=progress,
    )
    run_robustness([str(c) for c in checkpoints], suites, out, opts,
                   labels=parse_list(labels) if labels else None, device=str(resolve_device(device)), ema=ema,
                   dataset=dataset, data_root=opt_str(data_root))
    for s in suites:
        md = out / f"{s}.md"
        typer.echo(md.read_text())
    typer.echo("reports: " + ", ".join(str(out / f"{s}.md") for s in suites))
