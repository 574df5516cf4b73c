"""``kpca-attention ablate``: where does RPC-Attention's robustness come from? (issue 6, section 3)

On the Fashion-MNIST demo scale (:mod:`kpca_attention.demo`: the ``fmnist-cpu`` recipe, the mini
symmetric ViT, the demo's corruption set and FGSM / PGD-20 in pixel space), trains every variant of
:data:`VARIANTS` for every seed with the same recipe and budget. Under one seed all variants start
from the same weights (the RPC layer is swapped in after timm's init, carrying K/V over) and see the
same batches in the same order (the training loop's seeded sampler), so differences between variants
of one seed are paired. Then, on fixed test images shared by every model:

* clean top-1 (per image), top-1 under the demo's 13 corruptions x 5 severities, FGSM and PGD-20 at
  2 and 4 / 255 (per image: the paired tests need which images each model gets right);
* training throughput (images/s of the training loop, from its ``epochs.csv``);
* the PAP trace (:func:`kpca_attention.pap_trace.trace_model`) of every RPC variant.

:func:`write_ablation_report` turns the per-run results into ``report.md``: mean +- std over seeds,
paired differences against SymViT per seed with a paired t-test, and per-image exact McNemar tests on
the same test images (pooled over seeds), which measure test-set noise but not training noise.

Resumable: a finished checkpoint is not retrained (an interrupted one is resumed exactly) and each
(variant, seed) evaluation is cached in ``results/<variant>-s<seed>.json``, keyed by the settings and
the checkpoint. ``--force`` retrains and re-evaluates.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import typer
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

__all__ = [
    "Variant",
    "VARIANTS",
    "candes_lambda",
    "AblationSettings",
    "ablation_config",
    "train_variant",
    "evaluate_variant",
    "run_ablations",
    "ablate_cmd",
]

MODEL_SIZE = "mini_patch4_28"


def candes_lambda(size: str = MODEL_SIZE) -> float:
    """Candes et al.'s robust-PCA lambda ``1 / sqrt(max(N, D))`` for the key matrix of one head
    (N tokens incl. the class token, D head width) of a size in :data:`kpca_attention.models.vit.ARCHS`."""
    from .models.vit import ARCHS

    arch = ARCHS[size]["arch"]
    img, patch = arch["img_size"], arch["patch_size"]
    n = (img // patch) ** 2 + 1
    d = arch["embed_dim"] // arch["num_heads"]
    return 1.0 / math.sqrt(max(n, d))


@dataclass(frozen=True)
class Variant:
    """One model of the ablation: a registered model name and its ``rpc_*`` options."""

    label: str
    model: str
    kwargs: dict[str, Any]
    what: str


def _variants() -> dict[str, Variant]:
    sym = f"symvit_{MODEL_SIZE}"
    rpc = f"rpc_symvit_{MODEL_SIZE}"
    official = {"rpc_iters": 4, "rpc_lambda": 4.0, "rpc_layers": "first"}  # README; demo's RPC-SymViT
    lam_c = candes_lambda()
    d = 64 // 4
    out = {
        "symvit": Variant("SymViT", sym, {}, "symmetric softmax attention in every block"),
        "rpc_official": Variant(
            "RPC official",
            rpc,
            dict(official),
            "PAP in block 1, 4 iterations, tau = lam * mu, lam = 4, mu_dim = H*D (official code)",
        ),
    }
    for mult in (0.5, 1.0, 2.0):
        out[f"rpc_paper_x{mult:g}"] = Variant(
            f"RPC paper lam x{mult:g}",
            rpc,
            {**official, "rpc_lambda": mult * lam_c, "rpc_threshold": "lambda_over_mu", "rpc_mu_dim": d},
            f"tau = lam / mu, mu_dim = D, lam = {mult:g} x 1/sqrt(max(N, D)) = {mult * lam_c:.4g}",
        )
    out["rpc_no_sparse"] = Variant(
        "RPC S = 0",
        rpc,
        {**official, "rpc_sparse": False},
        "official, S forced to zero: iterated attention with dual feedback",
    )
    out["rpc_no_dual"] = Variant(
        "RPC no dual", rpc, {**official, "rpc_dual": False}, "official, dual update removed (Y = 0)"
    )
    return out


#: slug -> variant, in report order (the baseline first)
VARIANTS: dict[str, Variant] = _variants()
BASELINE = "symvit"


@dataclass
class AblationSettings:
    """Budget and evaluation of every (variant, seed). The default budget (2 epochs over 15k images,
    234 steps of batch 128; 10k clean, 300 corrupted-view and 400 attacked test images) was chosen so
    that 7 variants x 2 seeds fit in about 45-60 minutes on one thread of a CPU shared with other jobs
    (~200 training images/s); it is far from convergence, which the report says."""

    seeds: tuple[int, ...] = (0, 1)
    variants: tuple[str, ...] = tuple(VARIANTS)
    epochs: int = 2
    train_subset: int | None = 15000
    eval_subset: int | None = 1000  # per-epoch evaluation during training (curves only)
    batch_size: int = 128
    clean_images: int | None = None  # the first n test images; None: all 10k
    corrupt_images: int = 300  # fixed test images per (corruption, severity)
    corruptions: tuple[str, ...] = ()  # empty: the demo's DEMO_CORRUPTIONS
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)
    attack_images: int = 400
    attack_eps: tuple[float, ...] = (2 / 255, 4 / 255)
    attacks: tuple[str, ...] = ("fgsm", "pgd")
    trace_images: int = 512
    throughput_repeats: int = 7  # interleaved repeats of the side-by-side throughput measurement
    data_seed: int = 0  # which test images are drawn (the same for every variant and seed)
    extra: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides

    def __post_init__(self) -> None:
        if not self.corruptions:
            from .demo import DEMO_CORRUPTIONS

            self.corruptions = DEMO_CORRUPTIONS
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}; valid: {', '.join(VARIANTS)}")
        if not self.seeds:
            raise ValueError("give at least one seed")

    @classmethod
    def quick(cls, **kw: Any) -> AblationSettings:
        """A minute-scale smoke run (tests)."""
        base = dict(
            epochs=1,
            train_subset=256,
            eval_subset=128,
            clean_images=128,
            corrupt_images=16,
            corruptions=("gaussian_noise", "contrast"),
            severities=(1, 5),
            attack_images=16,
            attack_eps=(2 / 255,),
            trace_images=32,
            throughput_repeats=1,
            extra={"batch_size": 64, "log_every_steps": 2},
        )
        base.update(kw)
        return cls(**base)


def ablation_config(slug: str, seed: int, settings: AblationSettings, out_dir: Path) -> Any:
    """The :class:`~kpca_attention.train.TrainConfig` of one (variant, seed): the demo's recipe."""
    from .train import get_preset

    v = VARIANTS[slug]
    opts: dict[str, Any] = dict(
        model=v.model,
        model_kwargs=dict(v.kwargs),
        epochs=settings.epochs,
        train_subset=settings.train_subset,
        batch_size=settings.batch_size,
        seed=seed,
        output_dir=str(out_dir / "runs" / f"{slug}-s{seed}"),
        warmup_epochs=min(0.5, 0.2 * settings.epochs),
        log_every_steps=10,
        eval_subset=settings.eval_subset,
        checkpoint_every_steps=50,
        device="cpu",
    )
    opts.update(settings.extra)
    return get_preset("fmnist-cpu", **opts)


def train_variant(
    slug: str,
    seed: int,
    settings: AblationSettings,
    out_dir: Path,
    *,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Train (or resume, or skip when finished) one (variant, seed); returns its run directory."""
    from .demo import changed_settings, finished_run
    from .train import train

    cfg = ablation_config(slug, seed, settings, out_dir)
    cfg.progress = progress
    run_dir = Path(cfg.output_dir)
    if force and run_dir.exists():
        shutil.rmtree(run_dir)
    if finished_run(run_dir):
        diff = changed_settings(run_dir, cfg)
        if diff:
            raise ValueError(
                f"{run_dir} was trained with other settings ({', '.join(diff)} differ); rerun with "
                "--force or another --out"
            )
        print(f"[ablate] {slug} seed {seed}: finished checkpoint found, not retrained", flush=True)
        return run_dir
    resume = (run_dir / "checkpoints" / "latest.json").exists()
    print(
        f"[ablate] {slug} seed {seed}: {'resuming' if resume else 'training'} {cfg.model} {cfg.model_kwargs} "
        f"({cfg.epochs} epochs x {cfg.train_subset} images, {torch.get_num_threads()} threads)",
        flush=True,
    )
    train(cfg, resume=resume)
    return run_dir


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def _correct(model: nn.Module, data: Dataset, batch_size: int = 500) -> np.ndarray:
    """Per-example top-1 correctness (bool array) of ``model`` on ``data``."""
    from .robustness.common import collect_logits

    logits, labels = collect_logits(model, data, batch_size=batch_size, progress=False)
    return (logits.argmax(1) == labels).numpy()


def _attack_correct(model: nn.Module, data: Dataset, method: str, eps: float) -> np.ndarray:
    """Per-example top-1 correctness under :func:`kpca_attention.robustness.attack` (paper settings:
    PGD 20 steps of 0.15 eps with random start, seed 0)."""
    from .robustness import attack
    from .robustness.common import eval_mode

    out = []
    for x, y in DataLoader(data, batch_size=100, shuffle=False):
        adv = attack(model, x, y, method, eps, seed=0)
        with eval_mode(model), torch.no_grad():
            out.append((model(adv).argmax(1) == y).numpy())
    return np.concatenate(out)


def _bits(a: np.ndarray) -> str:
    """A bool array as a compact '0'/'1' string (JSON-friendly, exact)."""
    return "".join("1" if b else "0" for b in a.tolist())


def evaluate_variant(
    model: nn.Module, settings: AblationSettings, cache_dir: Path, progress: bool = True
) -> dict[str, Any]:
    """Per-image correctness (as '0'/'1' strings) on the clean test images, every corruption view and
    every attack, plus their accuracies; the PAP trace of RPC models; timings."""
    from tqdm.auto import tqdm

    from .data.images import build_image_dataset
    from .demo import fixed_subset
    from .pap_trace import rpc_layers, trace_model
    from .robustness.corruptions import CorruptedDataset

    t0 = time.perf_counter()
    test = build_image_dataset("fashion-mnist", "test")
    clean_set = test if settings.clean_images is None else Subset(test, range(settings.clean_images))
    res: dict[str, Any] = {"clean": _bits(_correct(model, clean_set))}
    base = fixed_subset(test, settings.corrupt_images, settings.data_seed)
    res["clean_corrupt_subset"] = _bits(_correct(model, base))
    corr: dict[str, dict[str, str]] = {}
    combos = [(c, s) for c in settings.corruptions for s in settings.severities]
    for c, s in tqdm(combos, desc="corruptions", disable=not progress, leave=False):
        view = CorruptedDataset(base, c, s, seed=settings.data_seed, cache_dir=cache_dir)
        view.build_cache(progress=False)
        corr.setdefault(c, {})[str(s)] = _bits(_correct(model, view))
    res["corruptions"] = corr
    t_corr = time.perf_counter()
    att_base = fixed_subset(test, settings.attack_images, settings.data_seed + 1)
    res["clean_attack_subset"] = _bits(_correct(model, att_base))
    res["attacks"] = {
        m: {f"{255 * e:g}": _bits(_attack_correct(model, att_base, m, e)) for e in settings.attack_eps}
        for m in settings.attacks
    }
    t_att = time.perf_counter()
    if rpc_layers(model):
        trace_set = fixed_subset(test, settings.trace_images, settings.data_seed + 2)
        res["trace"] = trace_model(model, DataLoader(trace_set, batch_size=128, shuffle=False))
    res["timing"] = {
        "clean_corrupt_s": t_corr - t0,
        "attack_s": t_att - t_corr,
        "trace_s": time.perf_counter() - t_att,
    }
    return res


def _key(settings: AblationSettings, slug: str, ckpt: str) -> dict[str, Any]:
    s = asdict(settings)
    # which other runs exist, and how throughput is timed, do not change this run's results
    for k in ("seeds", "variants", "throughput_repeats"):
        s.pop(k)
    return json.loads(
        json.dumps({"settings": s, "variant": asdict(VARIANTS[slug]), "checkpoint": ckpt, "version": 1})
    )


def run_ablations(
    out_dir: str | os.PathLike = "runs/ablations",
    settings: AblationSettings | None = None,
    *,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Train and evaluate every (seed, variant) - seed-major, so a cut-short run holds whole seeds -
    writing the report after each one; returns the report's path."""
    from .demo import run_history
    from .robustness.common import read_json, write_json_atomic
    from .train import load_model
    from .train.checkpoint import resolve_checkpoint

    settings = settings or AblationSettings()
    out = Path(out_dir)
    (out / "results").mkdir(parents=True, exist_ok=True)
    report = out / "report.md"
    for seed in settings.seeds:
        for slug in settings.variants:
            t0 = time.perf_counter()
            run_dir = train_variant(slug, seed, settings, out, force=force, progress=progress)
            ckpt = resolve_checkpoint(run_dir)
            key = _key(settings, slug, ckpt.name)
            rfile = out / "results" / f"{slug}-s{seed}.json"
            cached = None if force else read_json(rfile)
            if cached is not None and cached.get("key") == key:
                print(f"[ablate] {slug} seed {seed}: evaluation cached in {rfile}", flush=True)
            else:
                model, _ = load_model(run_dir)
                t1 = time.perf_counter()
                res = evaluate_variant(model, settings, out / "cache", progress=progress)
                res["timing"]["eval_s"] = time.perf_counter() - t1
                res["training"] = run_history(run_dir)
                res["params"] = sum(p.numel() for p in model.parameters())
                res["checkpoint"] = str(ckpt)
                write_json_atomic(rfile, {"key": key, "slug": slug, "seed": seed, "results": res})
                print(
                    f"[ablate] {slug} seed {seed}: done in {time.perf_counter() - t0:.0f} s "
                    f"(clean {np.mean([c == '1' for c in res['clean']]):.4f})",
                    flush=True,
                )
            # the report reads only results of these settings (written here, after the training check
            # that refuses a folder trained with other settings)
            write_json_atomic(out / "settings.json", asdict(settings))
            report = _report(out)
    tfile = out / "throughput.json"
    tkey = {
        "variants": list(settings.variants),
        "batch_size": settings.batch_size,
        "threads": torch.get_num_threads(),
    }
    cached_t = None if force else read_json(tfile)
    if cached_t is None or cached_t.get("key") != tkey:
        print("[ablate] training throughput, all variants side by side", flush=True)
        write_json_atomic(
            tfile,
            {
                "key": tkey,
                "images_per_s": measure_throughput(
                    settings.variants, settings.batch_size, repeats=settings.throughput_repeats
                ),
            },
        )
        report = _report(out)
    sfile = out / "swaps.json"
    skey = {
        "seeds": list(settings.seeds),
        "checkpoints": sorted(
            str(p.relative_to(out)) for p in (out / "runs").glob("*/checkpoints/latest.json")
        ),
    }
    cached_s = None if force else read_json(sfile)
    if cached_s is None or cached_s.get("key") != skey:
        print("[ablate] trained weights with the ablations switched on at inference", flush=True)
        write_json_atomic(sfile, {"key": skey, "rows": swap_checks(out, settings.seeds)})
        report = _report(out)
    return report


#: (trained variant, ablation switched on at inference, what it tests)
SWAPS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("rpc_official", {"rpc_sparse": False}, "official RPC weights, S forced to zero"),
    ("rpc_official", {"rpc_dual": False}, "official RPC weights, dual update removed"),
    ("symvit", {**VARIANTS["rpc_no_dual"].kwargs}, "SymViT weights in the 'RPC no dual' layer"),
    ("symvit", {**VARIANTS["rpc_official"].kwargs}, "SymViT weights in the official RPC layer"),
)


@torch.no_grad()
def swap_checks(
    out_dir: str | os.PathLike, seeds: tuple[int, ...] | list[int], n_images: int = 2000
) -> list[dict[str, Any]]:
    """Does an ablation change the function a *trained* model computes? For each pair of :data:`SWAPS`
    the trained weights are loaded unchanged into the model with the ablation switched on (the
    symmetric RPC layer has SymViT's parameters, so the state dicts match) and compared with the
    original on the first ``n_images`` test images: max |logit difference|, fraction of equal
    predictions, and both accuracies."""
    from .data.images import build_image_dataset
    from .robustness.common import collect_logits
    from .train import load_model
    from .train.build import build_model

    test = Subset(build_image_dataset("fashion-mnist", "test"), range(n_images))
    rows = []
    for seed in seeds:
        for slug, switch, what in SWAPS:
            run_dir = Path(out_dir) / "runs" / f"{slug}-s{seed}"
            if not (run_dir / "checkpoints" / "latest.json").exists():
                continue
            model, cfg = load_model(run_dir)
            cfg2 = type(cfg).from_dict(
                {
                    **cfg.to_dict(),
                    "model": VARIANTS["rpc_official"].model,
                    "model_kwargs": {**cfg.model_kwargs, **switch},
                }
            )
            swapped = build_model(cfg2)
            swapped.load_state_dict(model.state_dict())
            swapped.eval()
            a, labels = collect_logits(model, test, batch_size=500, progress=False)
            b, _ = collect_logits(swapped, test, batch_size=500, progress=False)
            rows.append(
                {
                    "seed": seed,
                    "trained": slug,
                    "switch": switch,
                    "what": what,
                    "max_abs_logit_diff": float((a - b).abs().max()),
                    "same_prediction": float((a.argmax(1) == b.argmax(1)).float().mean()),
                    "acc_trained": float((a.argmax(1) == labels).float().mean()),
                    "acc_swapped": float((b.argmax(1) == labels).float().mean()),
                    "n": n_images,
                }
            )
    return rows


def measure_throughput(
    slugs: tuple[str, ...] | list[str], batch_size: int = 128, repeats: int = 7, steps: int = 3
) -> dict[str, float]:
    """Training images/s of each variant (forward, backward, AdamW step on a fixed batch), measured side
    by side with interleaved repeats (median): on a shared CPU the training loops' own images/s depend
    on what else ran at the time, this comparison much less."""
    import statistics

    from .models import create_model

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(batch_size, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (batch_size,), generator=gen)
    nets = {}
    for slug in slugs:
        v = VARIANTS[slug]
        torch.manual_seed(0)
        net = create_model(v.model, num_classes=10, in_chans=1, **v.kwargs).train()
        nets[slug] = (net, torch.optim.AdamW(net.parameters(), lr=1e-4))

    def run(slug: str, n: int) -> float:
        net, opt = nets[slug]
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return batch_size * n / (time.perf_counter() - t0)

    for slug in slugs:  # warm-up
        run(slug, 1)
    rates: dict[str, list[float]] = {slug: [] for slug in slugs}
    for _ in range(repeats):
        for slug in slugs:
            rates[slug].append(run(slug, steps))
    return {slug: statistics.median(r) for slug, r in rates.items()}


def _report(out: Path) -> Path:
    """Rewrite the report; a failure there must not stop a long run (``--report-only`` redoes it)."""
    from .ablation_report import write_ablation_report

    try:
        return write_ablation_report(out)
    except Exception as e:  # noqa: BLE001 - reported and retried later, the results are safe on disk
        print(
            f"[ablate] warning: report not written ({type(e).__name__}: {e}); the results are cached, "
            "rerun with --report-only",
            flush=True,
        )
        return out / "report.md"


def ablate_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for runs, results and report.md.")] = Path(
        "runs/ablations"
    ),
    seeds: Annotated[str, typer.Option(help="Comma-separated training seeds.")] = "0,1",
    variants: Annotated[
        str | None, typer.Option(help=f"Comma-separated subset of: {', '.join(VARIANTS)} (default all).")
    ] = None,
    epochs: Annotated[int, typer.Option(help="Training epochs per run.")] = AblationSettings.epochs,
    train_subset: Annotated[int, typer.Option(help="Training images (0: all 60000).")] = 15000,
    clean_images: Annotated[int, typer.Option(help="Clean test images (0: all 10000).")] = 0,
    corrupt_images: Annotated[int, typer.Option(help="Test images per corruption and severity.")] = 300,
    attack_images: Annotated[int, typer.Option(help="Test images attacked.")] = 400,
    quick: Annotated[bool, typer.Option(help="A minute-scale smoke run on tiny subsets.")] = False,
    force: Annotated[bool, typer.Option(help="Retrain and re-evaluate everything.")] = False,
    threads: Annotated[int, typer.Option(help="torch threads (1 is fastest on a shared CPU).")] = 1,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
    report_only: Annotated[
        bool, typer.Option(help="Only rewrite report.md from the cached results.")
    ] = False,
) -> None:
    """Ablations of RPC-Attention on Fashion-MNIST (SymViT, official RPC, the paper's threshold with a
    lambda sweep, S forced to zero, no dual update) over seeds: clean / corrupted / FGSM / PGD accuracy,
    throughput, PAP trace, paired tests. Resumable; writes OUT/report.md."""
    # libgomp threads spin while waiting; on a shared CPU that is many times slower (see demo_cmd)
    if "OMP_WAIT_POLICY" not in os.environ and sys.argv[1:2] == ["ablate"]:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "kpca_attention.cli", *sys.argv[1:]])
    torch.set_num_threads(threads)
    if report_only:
        from .ablation_report import write_ablation_report

        print(write_ablation_report(out))
        return
    kw: dict[str, Any] = {}
    try:
        kw["seeds"] = tuple(int(x) for x in seeds.split(",") if x.strip())
        if variants:
            kw["variants"] = tuple(v.strip() for v in variants.split(",") if v.strip())
        if quick:
            settings = AblationSettings.quick(**kw)
        else:
            settings = AblationSettings(
                epochs=epochs,
                train_subset=train_subset or None,
                clean_images=clean_images or None,
                corrupt_images=corrupt_images,
                attack_images=attack_images,
                **kw,
            )
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    print(run_ablations(out, settings, force=force, progress=progress))
