"""``kpca-attention analyze``, ``claims`` and ``pap-trace``: the KPCA diagnostics and the PAP trace."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
import typer

from ..checks import Choice, Int, check_parameters
from ..io import check_output, output_path, read_json, sha256_file, write_json_atomic
from . import set_threads

__all__ = ["analyze_cmd", "claims_cmd", "check_options", "headline"]

#: file name prefix of an untrained copy's analysis in a claims folder (``claims --untrained-baseline``)
BASELINE_PREFIX = "untrained_baseline_"

#: the options of analyze, claims and pap-trace, checked before any model is loaded
#: (AnalysisConfig checks its own fields: order, scale, centering, the sample counts)
OPTIONS = {
    "max_samples": Int(min=1),
    "max_length": Int(min=1),
    "batch_size": Int(min=1),
    "prefixes": Int(min=1),
    "detail_samples": Int(min=0),
    "null_samples": Int(min=0),
    "null_draws": Int(min=1),
    "control_samples": Int(min=0),
    "threads": Int(min=1, allow_none=True),
    "split": Choice(("train", "val", "test")),
}


def headline(model: str, summary: dict[str, Any]) -> str:
    """The lines ``analyze`` prints: each alignment measure over every head, then on the units its chance
    test used (the inputs with a null: ``--null-samples``) against the null its verdict is read against,
    and that verdict (docs/kpca.md: a number without its chance level says nothing); then J_proj and its
    two terms."""
    from ..kpca.chance import NULL_LABELS, chance_word, verdict_null
    from ..kpca.claims import fmt

    lines = [f"{model} ({summary.get('num_sequences', '?')} inputs, {summary.get('num_heads_analysed', '?')} "
             "(input, layer, head) units; means over all of them, chance tests over heads):"]
    for k in ("optimal_cosine", "linear_cka", "kernel_cka", "direct_cosine"):
        tests = (summary.get("chance") or {}).get(k) or {}
        kind = verdict_null(k, tests)
        test = tests.get(kind)
        chance = ("no chance level (no null drawn)" if not test else
                  f"on the {test.get('n')} heads (each averaged over the inputs with a null) "
                  f"{fmt(test.get('measured'))} against chance "
                  f"{fmt(test.get('null'))} ({NULL_LABELS[kind]}): {chance_word(test)}")
        lines.append(f"  {k} = {fmt(summary.get(k))}; {chance}")
    lines.append("  " + ", ".join(f"{k} = {fmt(summary.get(k))}"
                                  for k in ("j_proj", "phi_norm_sq", "h_norm_sq")))
    return "\n".join(lines)


def _stored(res: dict[str, Any]) -> dict[str, Any]:
    """An analysis as its JSON file holds it: the per-record columns packed (exact, 40 % of the text)."""
    from ..kpca.analysis import pack_records

    return {**res, "records": pack_records(res["records"])} if res.get("records") else res


def check_options(several_models: bool = False, **values: Any) -> None:
    """Every option of the command against :data:`OPTIONS`, and the inputs' combination, before any work."""
    from ..kpca.run import check_input_options

    check_parameters(values, OPTIONS, cli=True)
    check_input_options(texts=values.get("texts"), images=values.get("images"), dataset=values.get("dataset"),
                        several_models=several_models)


def _config(
    order: str,
    scale: str,
    centering: str,
    eigensolver: str,
    bandwidth: str,
    detail_samples: int,
    critique_exact: bool,
    no_optimal: bool,
    null_samples: int,
    null_draws: int,
    control_samples: int,
):
    from ..kpca.analysis import AnalysisConfig
    from ..kpca.gram import METHODS

    Choice(METHODS)(eigensolver, "--eigensolver")  # the config calls it "method": name the option
    return AnalysisConfig(
        order=order,
        scale=scale,
        centering=centering,
        method=eigensolver,
        bandwidth="critique" if critique_exact else bandwidth,
        row_eps=1e-8 if critique_exact else 0.0,
        cka_eps=1e-10 if critique_exact else 0.0,
        optimal=not no_optimal,
        detail_samples=detail_samples,
        null_samples=null_samples,
        null_draws=null_draws,
        control_samples=control_samples,
    )


# options shared by analyze and claims
_NULL_SAMPLES = typer.Option(20, help="inputs whose alignment also gets the nulls (tokens permuted, Gaussian "
                                       "V, V rotated)")
_NULL_DRAWS = typer.Option(10, help="seeded draws per null, averaged")
_CONTROL_SAMPLES = typer.Option(2, help="inputs that get the positive control (V_hat + noise at known SNRs)")


def _model_and_inputs(name: str, pretrained: bool, device: str, **inputs: Any) -> tuple[Any, Any]:
    """``(loaded model, ModelInputs)`` for ``analyze`` and ``claims`` (user errors propagate to the
    CLI's one error handler)."""
    from ..kpca.load import load_for_analysis
    from ..kpca.run import resolve_inputs

    loaded = load_for_analysis(name, pretrained=pretrained, device=device)
    return loaded, resolve_inputs(loaded, **inputs)


_PREFIXES = typer.Option(4, help="causal models (LMs, decoders): nested prefixes analysed per sequence, "
                                 "the last the whole sequence (docs/kpca.md)")


def analyze_cmd(
    model: str = typer.Argument(
        ..., help="all-MiniLM-L6-v2, a timm or Hugging Face name, or a checkpoint path"
    ),
    images: Path = typer.Option(None, "--images", help="folder of images (.jpg/.png...) for image models"),
    texts: Path = typer.Option(None, "--texts", help="text file, one text per line, for text models"),
    dataset: str = typer.Option(None, "--dataset", help="image dataset name (kpca_attention.data.images)"),
    split: str = typer.Option("test", help="dataset split"),
    data_root: str = typer.Option(None, "--data-root", help="dataset root folder"),
    json_out: Path = typer.Option(..., "--json", help="write the results JSON here"),
    report: Path = typer.Option(None, "--out", "-o", "--report", help="write plots and report.md into this folder"),
    max_samples: int = typer.Option(100, help="analyse at most this many texts / images"),
    max_length: int = typer.Option(128, help="text models: truncate to this many tokens"),
    batch_size: int = typer.Option(16, help="inputs per forward pass"),
    special_tokens: bool = typer.Option(
        True, "--special-tokens/--no-special-tokens", help="keep [CLS]/[SEP] in the per-sequence analysis"
    ),
    keep_padding: bool = typer.Option(
        False, help="analyse padded positions too (as the critique's text script)"
    ),
    pretrained: bool = typer.Option(True, "--pretrained/--no-pretrained", help="timm: pretrained weights"),
    order: str = typer.Option("abs", help="eigenvector order: abs | signed"),
    scale: str = typer.Option("unit", help="eigenvector scale: unit (critique) | kpca (1/sqrt(N lambda))"),
    centering: str = typer.Option("GHA", help="predicted values: GHA (Thm 1, critique) | HGA"),
    eigensolver: str = typer.Option("auto", help="auto | dense | lowrank"),
    bandwidth: str = typer.Option("kornblith", help="kernel-CKA bandwidth: kornblith | critique"),
    critique_exact: bool = typer.Option(
        False,
        help="critique's conventions: 1e-8 on row norms, 1e-10 on the linear-CKA denominator, its bandwidth",
    ),
    optimal: bool = typer.Option(True, "--optimal/--no-optimal",
                                 help="the optimal alignment (Hungarian matching); --no-optimal skips it"),
    detail_samples: int = typer.Option(
        10, help="inputs that also get the gamma test and standardised eigenvalues"
    ),
    null_samples: int = _NULL_SAMPLES,
    null_draws: int = _NULL_DRAWS,
    control_samples: int = _CONTROL_SAMPLES,
    prefixes: int = _PREFIXES,
    device: str = typer.Option("auto", help="cpu | cuda | auto."),
    threads: int = typer.Option(None, help="CPU threads (default: torch's); 1 is fastest on a busy machine"),
) -> None:
    """KPCA diagnostics of every attention layer and head of MODEL (paper Sec. 2 and its critique)."""
    from ..kpca.run import analyze_model
    from ..report.kpca import write_report
    from . import refuse_inside_run

    check_options(max_samples=max_samples, max_length=max_length, batch_size=batch_size, prefixes=prefixes,
                   detail_samples=detail_samples, null_samples=null_samples, null_draws=null_draws,
                   control_samples=control_samples, threads=threads, split=split, texts=texts, images=images,
                   dataset=dataset)
    check_output(json_out, "--json", folder=False)  # before the analysis, not after it
    check_output(report, "--out", folder=True)
    refuse_inside_run(json_out, model, "--json")
    refuse_inside_run(report, model, "--out")
    set_threads(threads)
    cfg = _config(
        order, scale, centering, eigensolver, bandwidth, detail_samples, critique_exact, not optimal,
        null_samples, null_draws, control_samples,
    )
    loaded, inputs = _model_and_inputs(model, pretrained, device, texts=texts, images=images,
                                       dataset=dataset, split=split, data_root=data_root,
                                       max_samples=max_samples)
    res = analyze_model(
        loaded,
        **inputs.kwargs(),
        config=cfg,
        prefixes=prefixes,
        batch_size=batch_size,
        max_length=max_length,
        special_tokens=special_tokens,
        keep_padding=keep_padding,
    )
    res["inputs"] = inputs.description
    write_json_atomic(json_out, _stored(res), indent=1)
    typer.echo(headline(model, res["summary"]))
    typer.echo(f"analysis {res['timing']['total_s']:.1f} s; results in {json_out}")
    if report is not None:
        typer.echo(f"report: {write_report(res, report)}")


def _training_row(row: dict[str, Any]) -> bool:
    return row["claim"].startswith(("P2:", "C2: the change of J_proj"))


def _nan_for_null(obj: Any) -> Any:
    """An analysis as it was before JSON wrote its NaNs (undefined ranks, short inputs) as null: a list of
    numbers gets them back as NaN."""
    if isinstance(obj, dict):
        return {k: _nan_for_null(v) for k, v in obj.items()}
    if isinstance(obj, list):
        if any(isinstance(x, (int, float)) for x in obj) and all(x is None or isinstance(x, (int, float))
                                                                  for x in obj):
            return [float("nan") if x is None else x for x in obj]
        return [_nan_for_null(x) for x in obj]
    return obj


def _read_baseline(path: Path, res: dict[str, Any]) -> dict[str, Any] | None:
    """The untrained copy's analysis stored beside ``res`` (None if there is none), refused when it is not
    readable or was analysed on other inputs or settings (it would be compared with the wrong numbers)."""
    if not path.is_file():
        return None
    base = read_json(path)
    if not isinstance(base, dict) or "summary" not in base:
        raise ValueError(f"{path} is not a readable analysis: delete it, or run claims with "
                         "--untrained-baseline again")
    base = _nan_for_null(base)
    prov = [(r.get("provenance") or {}) for r in (res, base)]
    mine, copy = res.get("model") or {}, base.get("model") or {}
    differ = [key for key, a, b in (
        ("run", (mine.get("recipe"), mine.get("train_seed")), (copy.get("recipe"), copy.get("train_seed"))),
        ("inputs", res.get("inputs"), base.get("inputs")),
        ("inputs", prov[0].get("inputs_sha256"), prov[1].get("inputs_sha256")),
        ("prefixes", prov[0].get("prefixes"), prov[1].get("prefixes")),
        ("config", res.get("config"), base.get("config")),
        ("sequences", res["summary"].get("num_sequences"), base["summary"].get("num_sequences")),
    ) if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True)]  # NaN-safe (NaN != NaN)
    if differ:
        what = ", ".join(dict.fromkeys(differ))
        raise ValueError(f"{path} was analysed with other {what} than the model's analysis: "
                         "delete it, or run claims with --untrained-baseline again")
    return base


def _provenance(loaded: Any, inputs: Any, cfg: Any, prefixes: int) -> dict[str, Any]:
    """What an analysis was computed from, stored with it: ``claims --resume`` reuses a stored analysis only
    when all of it is the same - the network (its class, what the loader knows of it: a run's recipe digest
    and seed, a copy's init seed; a Hugging Face model's config), its weights, the inputs themselves, the
    settings, the prefixes of a causal model, the package's code (:func:`_code_sha256`), torch's version,
    the device and, on a CPU, its vector instructions and the compiled kernels that ran (:func:`_kernels`):
    an analysis made by other code is made again."""
    from ..io import json_ready
    from ..modules import weights_sha256

    model = loaded.model
    network: dict[str, Any] = {"class": type(model).__name__, "info": json_ready(dict(loaded.info))}
    config = getattr(model, "config", None)
    if hasattr(config, "to_json_string"):  # Hugging Face: settings that live outside the weights
        network["config_sha256"] = hashlib.sha256(config.to_json_string().encode()).hexdigest()
    device = next(iter(model.parameters()), torch.empty(0)).device.type
    # the numerics outside this package's code: torch's version and, on a CPU, the vector instructions its
    # kernels use and which of ours ran
    numerics = {"torch": torch.__version__, "device": device}
    if device == "cpu":
        numerics.update(cpu_capability=torch.backends.cpu.get_cpu_capability(), kernels=_kernels())
    return {"network": network, "weights_sha256": weights_sha256(model), "inputs_sha256": inputs.sha256(),
            "prefixes": prefixes, "config": cfg.to_json(), "code_sha256": _code_sha256(), **numerics}


@functools.cache  # the sources of this process: read once, not for every model and copy
def _code_sha256() -> str:
    """SHA-256 over the package's sources - Python and the compiled kernels' C++ (relative path and bytes
    of each, in path order): any change of the code that captures, measures or loads - the whole package,
    not a guess at which modules matter - makes ``--resume`` analyse again. The version string is not
    enough: it changes by release, the code by commit."""
    root = Path(__file__).resolve().parents[1]  # the package: this is its cli/kpca.py
    digest = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cpp", ".h") and p.is_file()):
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def _kernels() -> str:
    """Which PAP / RKDE kernels ran: ``eager``, or the compiled build loaded (AVX2 or AVX512) with the
    SHA-256 of its library - a build made from older sources (not rebuilt after a change) differs too."""
    import sys

    from ..pap import kernels

    if kernels.active() is None or kernels.BUILD is None:
        return "eager"
    lib = Path(sys.modules[f"{kernels.__package__}.{kernels.BUILD}"].__file__ or "")
    return f"{kernels.BUILD} {sha256_file(lib) if lib.is_file() else '?'}"


def _resumed(path: Path, provenance: dict[str, Any]) -> dict[str, Any] | None:
    """The analysis stored at ``path`` when it was computed from ``provenance`` (:func:`_provenance`),
    ready to judge (NaNs back, records unpacked); None when there is none or it was computed from anything
    else."""
    from ..kpca.analysis import unpack_records

    res = read_json(path)  # None when missing or unreadable (a file a crash cut short): analysed again
    if not isinstance(res, dict):
        return None
    stored = res.get("provenance") if isinstance(res.get("provenance"), dict) else {}
    differ = [k for k in sorted(set(stored) | set(provenance))
              if json.dumps(stored.get(k), sort_keys=True) != json.dumps(provenance.get(k), sort_keys=True)]
    if differ:
        typer.echo(f"{path.name}: analysed again (--resume: stored with other {', '.join(differ)})")
        return None
    res = _nan_for_null(res)
    if isinstance(res.get("records"), dict):
        res["records"] = unpack_records(res["records"])
    typer.echo(f"{path.name}: reused (--resume: the same weights, inputs and settings)")
    return res


def _rejudge(folder: Path, report: bool, baseline: str | None, dest: Path | None = None) -> None:
    """``claims --from-analysis FOLDER``: the verdicts again from the analyses a ``claims`` run stored there
    (``analysis_<model>.json``), with the current rules - no model is loaded - written into ``dest``
    (``--out``; default FOLDER itself). A model whose run folder is not here keeps the training-log rows (P2,
    C2 over epochs) the folder's claims.json holds."""
    from ..kpca.analysis import unpack_records
    from ..kpca.claims import judge
    from ..report.kpca import write_claims, write_report
    from ..studies.sources import model_label

    files = sorted(folder.glob("analysis_*.json")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"{folder}: no analysis_<model>.json to judge again (claims writes them into its --out)")
    stored = _stored_claims(folder, "remove it to judge every analysis in the folder")
    before = {m["model"]: m for m in stored.get("models", [])}
    if baseline is None:  # the comparison the folder's claims were written with
        baseline = (stored.get("over_seeds_baseline") or {}).get("baseline")
    order = list(before)
    results = [_stored_analysis(f) for f in files]
    source = {id(r): f for f, r in zip(files, results, strict=True)}
    if before:  # the models the folder's claims were written with, not leftovers of other runs in it
        left = [f.name for f, r in zip(files, results, strict=True) if r["model"]["name"] not in before]
        if left:
            typer.echo(f"not judged (not in {folder / 'claims.json'}): {', '.join(left)}")
        results = [r for r in results if r["model"]["name"] in before]
        if not results:
            raise ValueError(f"{folder}: none of the models in claims.json has its analysis_<model>.json here")
    results.sort(key=lambda r: order.index(r["model"]["name"]) if r["model"]["name"] in order else len(order))
    verdicts = []
    for res in results:
        name = res["model"]["name"]
        run_dir = Path(name) if _same_run(Path(name), res["model"]) else None
        base = _read_baseline(folder / f"{BASELINE_PREFIX}{model_label(name)}.json", res)
        try:
            if isinstance(res.get("records"), dict):
                res["records"] = unpack_records(res["records"])
            verdict = {**judge(res, run_dir=run_dir, untrained=base), "label": model_label(name)}
        except (KeyError, TypeError, AttributeError, IndexError) as e:  # a field of the wrong kind
            raise ValueError(f"{source[id(res)]}: not an analysis this tool wrote (damaged or edited): "
                             f"{type(e).__name__} {e}") from e
        old = before.get(name)
        if run_dir is None and old is not None:  # the logs are not here: the rows judged from them stay
            rows = [r for r in verdict["rows"] if not _training_row(r)]
            kept = [r for r in old["rows"] if _training_row(r)]
            verdict["rows"] = rows[:1] + kept + rows[1:]
        verdicts.append(verdict)
        if report:
            typer.echo(f"report: {write_report(res, output_path(dest or folder, model_label(name)))}")
    typer.echo(write_claims(verdicts, dest or folder, baseline=baseline).read_text())


def _stored_claims(folder: Path, remedy: str) -> dict[str, Any]:
    """FOLDER's claims.json (``{}`` when there is none), its outline checked (a list of models, each named)."""
    stored = read_json(folder / "claims.json") or {}
    if not (isinstance(stored, dict) and isinstance(stored.get("models", []), list)
            and all(isinstance(m, dict) and isinstance(m.get("model"), str) for m in stored.get("models", []))):
        raise ValueError(f"{folder / 'claims.json'} is not a claims table this tool wrote (damaged or edited): "
                         + remedy)
    return stored


def _redraw(folder: Path, baseline: str | None, dest: Path | None = None) -> None:
    """``claims --from-claims FOLDER``: claims.md and the plots over seeds again from FOLDER's claims.json
    alone, written into ``dest`` (default FOLDER): each model's verdict rows as stored, the tests over seeds
    (and against the baseline) computed again from the stored per-seed values with the current engine. For a
    folder whose analyses were not kept (they are large and results/ does not commit them)."""
    from ..report.kpca import write_claims

    if not (folder / "claims.json").is_file():
        raise ValueError(f"{folder}: no claims.json to draw again (claims writes it into its --out)")
    stored = _stored_claims(folder, "run claims on the models again")
    if not stored.get("models"):
        raise ValueError(f"{folder / 'claims.json'} judges no model: nothing to draw")
    if baseline is None:  # the comparison the folder's claims were written with
        baseline = (stored.get("over_seeds_baseline") or {}).get("baseline")
    try:
        path = write_claims(stored["models"], dest or folder, baseline=baseline)
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # a field of the wrong kind
        raise ValueError(f"{folder / 'claims.json'} is not a claims table this tool wrote (damaged or edited): "
                         f"{type(e).__name__} {e}") from e
    typer.echo(path.read_text())


def _stored_analysis(file: Path) -> dict[str, Any]:
    """One ``analysis_<model>.json`` of a claims folder, its outline checked (a model name, records, a
    summary)."""
    res = _nan_for_null(read_json(file))
    if not (isinstance(res, dict) and isinstance(res.get("model"), dict)
            and isinstance(res["model"].get("name"), str) and isinstance(res.get("records"), (list, dict))
            and isinstance(res.get("summary"), dict)):
        raise ValueError(f"{file}: not an analysis this tool wrote (damaged or edited): it needs a model name, "
                         "records and a summary")
    return res


def _same_run(path: Path, model: dict[str, Any]) -> bool:
    """Whether ``path`` (a stored model name, read from the current folder) is the run the analysis was
    made of - a run of this project with the same dataset, training seed and recipe - so its training logs
    may be judged with it (a folder of that name elsewhere was read before, whatever it held)."""
    from ..studies.sources import is_project_run
    from ..train.checkpoint import read_config, resolve_checkpoint
    from ..train.resolve import run_identity

    if not is_project_run(str(path)) or "recipe" not in model:
        return False
    try:
        ident = run_identity(read_config(resolve_checkpoint(path)))
    except (OSError, ValueError, KeyError):
        return False
    return all(model.get(k) == v for k, v in ident.items())


#: ``claims``' default --out
CLAIMS_OUT = Path("runs/claims")  # beside runs/robustness and runs/benchmark


def claims_cmd(
    models: list[str] = typer.Argument(None, help="models to judge (names or checkpoint paths)"),
    out: Path = typer.Option(CLAIMS_OUT, "--out", "-o", help="folder for claims.md and claims.json (with "
                             "--from-analysis or --from-claims: default FOLDER itself)"),
    from_analysis: Path = typer.Option(
        None, "--from-analysis", help="judge the analyses a claims run stored in this folder again (no model "
        "is loaded): the verdicts with the current rules"),
    from_claims: Path = typer.Option(
        None, "--from-claims", help="write claims.md and the plots over seeds again from this folder's "
        "claims.json alone (no analysis needed; no per-model reports): the rows as stored, the tests over "
        "seeds with the current engine"),
    texts: Path = typer.Option(None, "--texts", help="texts for text models (default: King James Bible)"),
    images: Path = typer.Option(None, "--images", help="image folder for image models"),
    dataset: str = typer.Option(None, "--dataset", help="image dataset for image models"),
    split: str = typer.Option("test", help="dataset split"),
    data_root: str = typer.Option(None, "--data-root", help="dataset root folder"),
    max_samples: int = typer.Option(100, help="inputs per model"),
    pretrained: bool = typer.Option(True, "--pretrained/--no-pretrained", help="timm: pretrained weights"),
    detail_samples: int = typer.Option(10, help="inputs that also get the gamma test"),
    null_samples: int = _NULL_SAMPLES,
    null_draws: int = _NULL_DRAWS,
    control_samples: int = _CONTROL_SAMPLES,
    prefixes: int = _PREFIXES,
    report: bool = typer.Option(
        True, "--report/--no-report", help="also write each model's report.md and plots into OUT/<model>/"
    ),
    device: str = typer.Option("auto", help="cpu | cuda | auto."),
    threads: int = typer.Option(None, help="CPU threads (default: torch's); 1 is fastest on a busy machine"),
    baseline: str = typer.Option(
        None, "--baseline", help="a model's name without its seed (runs/symvit-s0 ... -> symvit): every "
        "other model's headline measures against its, paired by training seed (models with two or more seeds)"),
    resume: bool = typer.Option(
        False, "--resume", help="reuse the analyses an earlier run stored in --out (each model's is written "
        "as soon as it is done) where the weights, inputs and settings are the same: a killed run continues"),
    untrained_baseline: bool = typer.Option(
        False, "--untrained-baseline/--no-untrained-baseline",
        help="also analyse each model's architecture with random weights on the same inputs and compare: "
             "what any network of this shape gives without training (doubles the time). A checkpoint of "
             "this project: its run's own initial weights (its training seed); other models: init seed 0"),
) -> None:
    """One table: each empirical claim of the paper and each measure of the critique, per model,
    with the measured value, its chance level and a verdict against a stated threshold or test."""
    from ..kpca.claims import judge
    from ..kpca.load import load_for_analysis
    from ..kpca.run import analyze_model, resolve_inputs
    from ..report.kpca import write_claims, write_report
    from ..train.resolve import untrained_copy

    if sum((from_analysis is not None, from_claims is not None, bool(models))) != 1:
        raise ValueError("give the models to judge, or --from-analysis FOLDER to judge stored analyses again, "
                         "or --from-claims FOLDER to draw a stored table again (one of them, not both)")
    if from_claims is not None:
        if resume or untrained_baseline:
            raise ValueError("--resume and --untrained-baseline are for analysis runs; --from-claims draws the "
                             "table stored in FOLDER again: give one of them")
        given = out != CLAIMS_OUT
        if given:
            check_output(out, "--out", folder=True)
        return _redraw(from_claims, baseline, out if given else None)
    if from_analysis is not None:
        if resume:
            raise ValueError("--resume continues an analysis run (claims MODEL ... --out FOLDER); "
                             "--from-analysis judges the analyses stored in FOLDER again: give one of them")
        if untrained_baseline:
            raise ValueError("--untrained-baseline analyses the models' untrained copies; --from-analysis "
                             "judges stored analyses again (with the untrained_baseline_<model>.json a run "
                             "stored): give one of them")
        # -o given: the judgement goes there and FOLDER is left as it is (it was rewritten in place and -o
        # ignored); the default -o: FOLDER itself, as before
        given = out != CLAIMS_OUT
        if given:
            check_output(out, "--out", folder=True)
        return _rejudge(from_analysis, report, baseline, out if given else None)
    check_options(max_samples=max_samples, prefixes=prefixes, detail_samples=detail_samples,
                   null_samples=null_samples, null_draws=null_draws, control_samples=control_samples,
                   threads=threads, split=split, texts=texts, images=images, dataset=dataset,
                   several_models=len(models or ()) > 1)
    set_threads(threads)
    cfg = _config(
        "abs", "unit", "GHA", "auto", "kornblith", detail_samples, False, False,
        null_samples, null_draws, control_samples,
    )
    from ..studies.sources import model_label

    labels = [model_label(name) for name in models]
    for name, label in zip(models, labels, strict=True):
        if labels.count(label) > 1:
            others = [m for m, lab in zip(models, labels, strict=True) if lab == label]
            raise ValueError(f"models {', '.join(others)} have the same name {label!r}: their results would "
                             "overwrite each other in --out; judge them in separate folders")
        output_path(out, f"analysis_{label}.json", what=f"the name of model {name}")
        output_path(out, f"{BASELINE_PREFIX}{label}.json", what=f"the name of model {name}")
        output_path(out, label, what=f"the name of model {name}")
    # every model and its inputs are checked (loaded once) before any is analysed
    prepared, identity, kinds = [], [], set()
    for name, label in zip(models, labels, strict=True):
        loaded = load_for_analysis(name, pretrained=pretrained, device=device)
        kinds.add("text" if loaded.takes_text else "image")
        # text and image models judged together: --texts feeds the text models, --images / --dataset the
        # image models, each the data it can take
        given = {"texts": texts} if loaded.takes_text else {"images": images, "dataset": dataset}
        prepared.append(resolve_inputs(loaded, **given, split=split, data_root=data_root,
                                       max_samples=max_samples, bible_fallback=True))
        identity.append((label, loaded.info.get("recipe"), loaded.info.get("train_seed")))
    if texts is not None and "text" not in kinds:
        raise ValueError(f"--texts is for text models, and none of {', '.join(models)} is one: give --images DIR "
                         "or --dataset NAME")
    if (images is not None or dataset is not None) and "image" not in kinds:
        raise ValueError(f"--images / --dataset are for image models, and none of {', '.join(models)} is one: "
                         "give --texts FILE")
    if baseline is not None:  # the groups the summary over seeds will form, by the same rule
        from ..report.kpca_seeds import group_names

        valid = list(group_names(identity).values())
        if baseline not in valid:
            raise ValueError(f"--baseline {baseline!r} is not a model given here with two or more seeds of "
                             "one recipe; valid: " + (", ".join(valid) or "none"))
    verdicts = []
    for name, label, inputs in zip(models, labels, prepared, strict=True):
        loaded = load_for_analysis(name, pretrained=pretrained, device=device)
        file = output_path(out, f"analysis_{label}.json")
        prov = _provenance(loaded, inputs, cfg, prefixes)
        res = _resumed(file, prov) if resume else None
        base_file = output_path(out, f"{BASELINE_PREFIX}{label}.json")
        if res is None:
            base_file.unlink(missing_ok=True)  # a copy's analysis belongs to its model's: never an older one
            res = analyze_model(loaded, **inputs.kwargs(), config=cfg, prefixes=prefixes)
            res.update(inputs=inputs.description, provenance=prov)
            write_json_atomic(file, _stored(res), indent=None)
        if report:
            typer.echo(f"report: {write_report(res, output_path(out, label))}")
        base = None
        if untrained_baseline:
            copy = untrained_copy(loaded)
            base_prov = _provenance(copy, inputs, cfg, prefixes)
            base = _resumed(base_file, base_prov) if resume else None
            if base is None:
                base_file.unlink(missing_ok=True)  # never an older run's beside this analysis
                base = analyze_model(copy, **inputs.kwargs(), config=cfg, prefixes=prefixes)
                base.update(inputs=inputs.description, provenance=base_prov)
                # without its per-record columns (half the size of the model's own file): the comparison reads
                # the per-(layer, head) means and the summary
                write_json_atomic(base_file, {k: v for k, v in base.items() if k != "records"}, indent=None)
        else:
            base_file.unlink(missing_ok=True)  # never an older run's
        verdict = judge(res, run_dir=Path(name) if Path(name).exists() else None, untrained=base)
        verdicts.append({**verdict, "label": label})
    md = write_claims(verdicts, out, baseline=baseline)
    typer.echo(md.read_text())
