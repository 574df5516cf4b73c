"""``kpca-attention robustness MODEL... --suite corruptions|ood|attacks|wordswap``: a study without
training (:class:`~kpca_attention.studies.spec.Study` whose variants are existing models,
``Variant.source``) over the task's suites, run by the study engine into the one result store and
written up by the one study report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from ..checks import Int, Real, check_parameters, option_name
from ..robustness.attacks import METHODS
from ..robustness.corruptions import CORRUPTION_SUBSETS, corruption_names
from . import THREADS_HELP, parse_floats, parse_ints, parse_list, set_threads

#: images attacked when --attack-n is not given (fewer when the split has fewer)
DEFAULT_ATTACK_N = 500
#: the numeric options of ``robustness``, checked before any model is loaded (messages name the option)
OPTIONS = {"n": Int(min=1, allow_none=True), "attack_n": Int(min=1, allow_none=True), "rate": Real(min=0, max=1),
           "max_tokens": Int(min=2, allow_none=True), "stride": Int(min=1), "batch_size": Int(min=1),
           "seed": Int(min=0)}

#: what the command measures: the image suites (corruptions with mCE, ImageNet-A/R/O, attacks) and the
#: word swap of language models
SUITES: tuple[str, ...] = ("corruptions", "ood", "attacks", "wordswap")
IMAGE_SUITES: tuple[str, ...] = ("corruptions", "ood", "attacks")
#: options that only one suite reads, with their defaults: given for a run without that suite, refused
SUITE_OPTIONS: dict[str, dict[str, Any]] = {
    "corruptions": {"corruptions": "common", "severities": "1,2,3,4,5", "imagenet_c": None},
    "attacks": {"method": "fgsm,pgd", "eps": None, "attack_n": None, "steps": None},
    "ood": {"imagenet_a": None, "imagenet_r": None, "imagenet_o": None, "imagenet_val": None},
    "wordswap": {"lm_splits": "valid,test", "rate": 0.015, "max_tokens": None, "stride": 1},
}


def _refuse_unused(suites: list[str], values: dict[str, Any]) -> None:
    """An option of a suite that does not run (``--eps`` without ``--suite attacks``) is a mistake: say so
    rather than run the other suites without it."""
    for suite, defaults in SUITE_OPTIONS.items():
        given = [option_name(k, cli=True) for k, default in defaults.items() if values[k] != default]
        if suite not in suites and given:
            raise ValueError(f"{', '.join(given)} only {'apply' if len(given) > 1 else 'applies'} to --suite {suite}, which is not among the suites "
                             f"run ({','.join(suites)}): add it, or leave {'them' if len(given) > 1 else 'it'} out")


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
    threads: int | None = typer.Option(None, help=THREADS_HELP),
    labels: str | None = typer.Option(None, help="Comma-separated names for the checkpoints (default: "
                                      "run directory names)."),
    baseline: str | None = typer.Option(None, help="Label of the baseline run for mCE relative to a run "
                                        "(default: the first checkpoint)."),
    split: str = typer.Option("test", help="Image split to evaluate (train | val | test)."),
    n: int | None = typer.Option(None, help="Test images for the clean accuracy (the first N) and the "
                                 "corruptions (a sample of N drawn with --seed); default all."),
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
    attack_n: int | None = typer.Option(None, help="Number of test images to attack (default 500, or all "
                                        "of a smaller split: digits has 360)."),
    steps: int | None = typer.Option(None, help="Steps for pgd/sld/cw (default: 20/20/50)."),
    adaptive: bool = typer.Option(False, help="Also run each gradient attack adaptively (gradients through "
                                  "what layers compute without them, e.g. Elliptical's metric), beside the "
                                  "plain one; the report checks that it is at least as strong."),
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

    A study without training: writes <out>/report.md, summary.json and .png plots (the study report),
    <out>/settings.json, and per-example results per model in <out>/results/<label>.json; finished items
    are reused when the command is run again with the same parameters."""
    from ..io import check_output
    from ..train.distributed import resolve_device

    check_output(out, "--out", folder=True)
    set_threads(threads)
    suites = parse_list(suite, "--suite")
    bad = [s for s in suites if s not in SUITES]
    if bad or not suites:
        raise ValueError(f"unknown suite(s) {bad or suite!r}; valid: {', '.join(SUITES)}")
    _refuse_unused(suites, dict(corruptions=corruptions, severities=severities, imagenet_c=imagenet_c, method=method,
                                eps=eps, attack_n=attack_n, steps=steps, imagenet_a=imagenet_a,
                                imagenet_r=imagenet_r, imagenet_o=imagenet_o, imagenet_val=imagenet_val,
                                lm_splits=lm_splits, rate=rate, max_tokens=max_tokens, stride=stride))
    names = (corruption_names(corruptions) if corruptions in CORRUPTION_SUBSETS
             else parse_list(corruptions, "--corruptions"))
    attack_options: dict[str, dict[str, int]] = {}
    if steps is not None:
        stepped = ("pgd", "sld", "cw")
        if not set(parse_list(method, "--method")) & set(stepped):
            raise ValueError(f"--steps sets the iterations of {', '.join(stepped)}; --method {method} runs none "
                             "of them")
        attack_options = {m: {"steps": steps} for m in stepped}

    def opt_str(p: Path | None) -> str | None:
        return None if p is None else str(p)

    study = robustness_study(
        [str(c) for c in checkpoints], suites, labels=parse_list(labels, "--labels") if labels else None, baseline=baseline,
        dataset=dataset, data_root=opt_str(data_root), ema=ema, device=str(resolve_device(device)),
        split=split, n=n, corruptions=names, severities=parse_ints(severities, "--severities"),
        imagenet_c=opt_str(imagenet_c), methods=parse_list(method, "--method"),
        eps=parse_floats(eps, "--eps") if eps else None, attack_n=attack_n, attack_options=attack_options,
        adaptive=adaptive,
        ood={"imagenet_a": opt_str(imagenet_a), "imagenet_r": opt_str(imagenet_r),
             "imagenet_o": opt_str(imagenet_o), "imagenet_val": opt_str(imagenet_val)},
        lm_splits=parse_list(lm_splits, "--lm-splits"), rate=rate, stride=stride, max_tokens=max_tokens,
        batch_size=batch_size, seed=seed)
    from ..report.study import write_study_report
    from ..studies.engine import run_study
    from .studies import regenerate_command

    run_study(study, out, runs=out, device=str(resolve_device(device)), cache=cache, progress=progress,
              checks=False, report=False, command=regenerate_command(sys.argv[1:], out))
    report = write_study_report(out)  # here a failure is the command's error, not a warning
    text = report.read_text().splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith("|")), len(text))
    table = text[start:next((i for i in range(start, len(text)) if not text[i].startswith("|")), len(text))]
    typer.echo("\n".join(table))  # the main table; paired differences, plots and the rest in the report
    typer.echo(f"report: {report}")


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_." else "_" for ch in label)


def robustness_study(
    paths: list[str], suites: tuple[str, ...], *, labels: tuple[str, ...] | None = None,
    baseline: str | None = None, dataset: str | None = None, data_root: str | None = None, ema: bool = False,
    device: str = "cpu", split: str = "test", n: int | None = None, corruptions: tuple[str, ...] = (),
    severities: tuple[int, ...] = (1, 2, 3, 4, 5), imagenet_c: str | None = None,
    methods: tuple[str, ...] = ("fgsm", "pgd"), eps: tuple[float, ...] | None = None, attack_n: int | None = None,
    attack_options: dict[str, dict[str, int]] | None = None, adaptive: bool = False,
    ood: dict[str, str | None] | None = None,
    lm_splits: tuple[str, ...] = ("valid", "test"), rate: float = 0.015, stride: int = 1,
    max_tokens: int | None = None, batch_size: int = 128, seed: int = 0,
) -> Any:
    """The study the ``robustness`` command runs: one variant per model (``Variant.source``), one seed,
    the suites of the models' task built from the command's options. Every option is checked, and every
    model's config read (a missing checkpoint, an unknown model or a missing ``--dataset`` fail here),
    before anything is evaluated."""
    from ..checks import check_count
    from ..robustness import attacks as A
    from ..studies.sources import LoadedSource, default_labels
    from ..studies.spec import Source, Study, Variant
    from ..tasks import get as get_task
    from ..tasks.classification.suites import Attack, Corruptions, ImageSuites, OODSets
    from ..tasks.language.suites import LMSuites
    from . import refuse_hf_folder

    if not paths:
        raise ValueError("no checkpoints given")
    check_parameters(dict(n=n, attack_n=attack_n, rate=rate, max_tokens=max_tokens, stride=stride,
                          batch_size=batch_size, seed=seed), OPTIONS, cli=True)
    for p in paths:
        refuse_hf_folder(p, "robustness")
    attack_options = attack_options or {}
    if "attacks" in suites:  # every attack option checked before any model is loaded or evaluated
        for m in methods:
            if m not in A.METHODS:
                raise ValueError(f"unknown attack {m!r}; valid: {', '.join(A.METHODS)}")
            for e in (eps if eps is not None else A.DEFAULT_EPS[m]):
                A.check_attack_options(m, e, dict(attack_options.get(m, {})))
    if adaptive:
        gradient = [m for m in A.METHODS if "adaptive" in A.OPTIONS[m]]
        if "attacks" not in suites or not set(methods) & set(gradient):
            raise ValueError(f"--adaptive twins the gradient attacks of --suite attacks ({', '.join(gradient)}); "
                             f"got suites {', '.join(suites)} and methods {', '.join(methods)}")
    names = list(labels) if labels else default_labels(paths)
    if len(names) != len(paths) or len(set(names)) != len(names):
        raise ValueError(f"need one distinct label per checkpoint, got {names} for {len(paths)} checkpoints")
    slugs = [_slug(x) for x in names]
    if len(set(slugs)) != len(slugs):
        same = sorted({x for x, sl in zip(names, slugs, strict=True) if slugs.count(sl) > 1})
        raise ValueError(f"labels {', '.join(map(repr, same))} name the same result file "
                         f"(results/{_slug(same[0])}.json: letters, digits, '_' and '.' are kept, the rest "
                         "becomes '_'): give labels that differ in those")
    if baseline is not None and baseline not in names:  # before any evaluation, not after it
        raise ValueError(f"baseline {baseline!r} is not among the checkpoints' labels: {', '.join(names)}")
    image = [s for s in suites if s in IMAGE_SUITES]
    if image:
        # validated here, before any model is read
        corr = Corruptions(tuple(corruptions), tuple(severities), n=n) if "corruptions" in suites else None
    for key, given in (ood or {}).items():  # a folder named on the command line must be there
        if given is not None and not Path(given).expanduser().is_dir():
            raise ValueError(f"{option_name(key, cli=True)} {given}: no such folder (leave the option out to "
                             "skip that set)")
    for opt, given in (("--imagenet-c", imagenet_c), ("--data-root", data_root)):
        if given is not None and not Path(given).expanduser().is_dir():
            raise ValueError(f"{opt} {given}: no such folder")
    sources = [Source(p, dataset, data_root, ema) for p in paths]
    loaded = {p: LoadedSource(s, device) for p, s in zip(paths, sources, strict=True)}
    configs = {p: src.config for p, src in loaded.items()}
    only_runs = all(src.is_project for src in loaded.values())
    for p, src in loaded.items():  # a project's run records its data: --dataset / --data-root cannot change it
        cfg = configs[p]
        other_root = data_root is not None and (only_runs or cfg.data_root is not None) \
            and (cfg.data_root is None
                 or Path(data_root).expanduser().resolve() != Path(cfg.data_root).expanduser().resolve())
        if src.is_project and ((dataset is not None and dataset != cfg.dataset) or other_root):
            raise ValueError(f"{p} is a run of this project, trained on {cfg.dataset}"
                             f"{f' at {cfg.data_root}' if cfg.data_root else ''}, and is evaluated on that: "
                             "--dataset and --data-root apply to models that are not this project's runs "
                             "(timm names, NAME@FILE); leave them out")
    tasks_ = {p: get_task(cfg.task) for p, cfg in configs.items()}
    task = next(iter(tasks_.values()))
    if any(t is not task for t in tasks_.values()):
        raise ValueError("the models are of different tasks: "
                         + ", ".join(f"{p} ({t.name})" for p, t in tasks_.items()))
    # this command runs two tasks' suites (an image classifier's, a language model's); any other task's run
    # in a study, whose engine asks the task
    text = task.suites_type is LMSuites
    if not text and task.suites_type is not ImageSuites:
        from ..studies import STUDIES

        in_study = (f"its study (kpca-attention study {task.name}) or a study of your own" if task.name in STUDIES
                 else "a study of your own")
        raise ValueError(f"{paths[0]}: robustness evaluates image classifiers and language models, not a "
                         f"{task.title} model (task={task.name!r}); its suites run in {in_study} "
                         "(docs/architecture.md, 'Add a study')")
    if image and text:
        raise ValueError(f"{paths[0]}: the {', '.join(image)} suite(s) need image classifiers, got a "
                         f"{task.title} model (task={task.name!r}); language models take --suite wordswap")
    if "wordswap" in suites and not text:
        raise ValueError(f"{paths[0]}: wordswap needs a language-model checkpoint, got task={task.name!r}")
    if "wordswap" in suites and image:
        raise ValueError("wordswap (language models) and the image suites cannot run on the same models")
    if image and n is not None and "attacks" in suites and "corruptions" not in suites:
        raise ValueError("--n counts the clean and corrupted images; with --suite attacks and no corruptions "
                         "the clean accuracy is measured on the attacked images: set --attack-n instead")
    if image:  # the image counts are bounded by the split the models are evaluated on, before any work
        sizes: dict[tuple[str, str | None], int] = {}
        for cfg in configs.values():
            where = (cfg.dataset, cfg.data_root)
            if where not in sizes:
                data = task.test_set(cfg) if split == "test" else task.builder(cfg)(split, False, None)
                sizes[where] = len(data)
            what = f"the images of the {split} split of {cfg.dataset}"
            check_count(n, "--n", sizes[where], what, allow_none=True)
            if "attacks" in suites and attack_n is not None:
                check_count(attack_n, "--attack-n", sizes[where], what)
        if attack_n is None:  # the default: 500 images, or all of a smaller split
            attack_n = min(DEFAULT_ATTACK_N, *sizes.values())
    if text:
        evaluated: Any = LMSuites(tokens=max_tokens, splits=tuple(lm_splits), swap_rate=rate, swap_seed=seed,
                                  batch_size=batch_size, stride=stride)
    else:
        attacks = tuple(Attack(m, tuple(eps if eps is not None else A.DEFAULT_EPS[m]), n=attack_n,
                               options=dict(attack_options.get(m, {}))) for m in methods) \
            if "attacks" in suites else ()
        if adaptive:  # a twin of each gradient attack, run through the layers' gradient-free parts
            attacks += tuple(Attack(a.method, a.eps, n=a.n, options={**a.options, "adaptive": True},
                                    label=f"{a.method}-adaptive") for a in attacks
                             if "adaptive" in A.OPTIONS[a.method])
        clean = n if "corruptions" in suites or "attacks" not in suites else attack_n
        evaluated = ImageSuites(clean=clean, corruptions=corr, attacks=attacks, data_seed=seed,
                                batch_size=batch_size, attack_batch_size=batch_size,
                                ood=OODSets(**(ood or {})) if "ood" in suites else None, split=split,
                                imagenet_c=imagenet_c)
    variants = tuple(Variant(_slug(lab), lab, p.partition("@")[0], source=src)
                     for lab, p, src in zip(names, paths, sources, strict=True))
    base = _slug(baseline or names[0])
    return Study(name="robustness", title=f"Robustness: {', '.join(names)}", variants=variants, seeds=(0,),
                 preset="", recipe={}, suites=evaluated, baseline=base, task_name=task.name,
                 description=f"Existing models evaluated side by side ({', '.join(suites)}); no training.")
