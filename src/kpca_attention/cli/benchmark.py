"""``kpca-attention benchmark MODEL --threat-model Linf|L2|corruptions`` and ``kpca-attention leaderboard``."""

from __future__ import annotations

from pathlib import Path

import typer

from . import THREADS_HELP, set_threads


def benchmark_cmd(
    model: str = typer.Argument(..., help="A run directory of this project, or a timm name with local weights NAME@FILE."),
    threat_model: str = typer.Option("Linf", "--threat-model", help="Linf | L2 (AutoAttack) | corruptions."),
    eps: str | None = typer.Option(None, help="Budget in pixel units, e.g. 4/255 (default: RobustBench's for the dataset - CIFAR Linf 8/255 - else Linf 4/255, L2 0.5)."),
    n: int = typer.Option(1000, help="Number of images: the first N of the dataset's committed test-image list."),
    version: str = typer.Option("standard", help="AutoAttack version: standard | rand (randomised defences)."),
    adaptive: bool | None = typer.Option(None, "--adaptive/--no-adaptive", help="Attack through what layers compute without gradient (e.g. Elliptical attention's metric), or as the model computes it; required for such a model."),
    dataset: str | None = typer.Option(None, help="Dataset (default: the run's); its test split is used."),
    data_root: Path | None = typer.Option(None, help="Dataset folder."),
    name: str | None = typer.Option(None, help="Name of the model in the JSON (default: from MODEL)."),
    out: Path = typer.Option(Path("runs/benchmark"), "--out", "-o", help="Output folder: <dataset>/<threat_model>/<eps>/<name>.json and results/<name>.json."),
    device: str = typer.Option("auto", help="cpu | cuda | auto."),
    batch_size: int = typer.Option(100, help="Images per AutoAttack / evaluation batch."),
    threads: int | None = typer.Option(None, help=THREADS_HELP),
) -> None:
    """Clean and robust accuracy with 95% intervals, RobustBench's way (AutoAttack on a fixed, committed
    list of test images, normalisation inside the model, images in [0, 1]); writes a RobustBench-format JSON.
    A model in training mode, randomised without --version rand, with missing / doubled normalisation, or
    computing part of its output without gradient and neither --adaptive nor --no-adaptive is refused with
    one line."""
    from ..io import output_path
    from ..studies.benchmark import benchmark

    if name is not None:  # a file name inside --out, checked before any work
        output_path(out, "results", f"{name}.json", what="--name")
    if threat_model == "corruptions" and version != "standard":
        raise ValueError("--version chooses AutoAttack's version (Linf, L2): corruptions run no attack")
    set_threads(threads)
    benchmark(model, dataset=dataset, threat_model=threat_model, eps=eps, n=n, version=version, name=name,
              adaptive=adaptive,
              data_root=None if data_root is None else str(data_root), out=out, device=device,
              batch_size=batch_size, log=typer.echo)


def leaderboard_cmd(
    results: Path = typer.Option(Path("results"), help="Folder of studies (one sub-folder each, with its "
                                 "settings.json) and/or of benchmark JSONs under <RESULTS>/benchmark/."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder for the leaderboard JSON files "
                                    "(default: <RESULTS>/leaderboard)."),
    markdown: Path | None = typer.Option(None, help="The leaderboard page (default: docs/leaderboard.md for "
                                         "the repository's results/, else <OUT>/leaderboard.md)."),
    results_page: Path | None = typer.Option(None, help="The page whose headline table of claims and "
                                             "verdicts and table of finished seeds (each between its "
                                             "markers) are regenerated too (default: docs/results.md for "
                                             "the repository's results/, else none)."),
) -> None:
    """Regenerate the leaderboard (docs/leaderboard.md and results/leaderboard/*.json), and the headline
    table of claims and verdicts and the table of finished seeds in docs/results.md, from every committed
    study under RESULTS - or, for a folder of your own, its leaderboard beside it. A summary.json those
    tables read that is not what `kpca-attention report` writes from its study's sealed results, and a
    benchmark JSON whose numbers its sealed per-image results do not give, are refused before anything is
    written."""
    from ..io import check_output
    from ..studies.headline import check_summaries, headline_plot, update_results_doc
    from ..studies.leaderboard import write_leaderboard

    if not results.is_dir():
        raise FileNotFoundError(f"--results {results} is not a folder of study results (run from the "
                                "repository's root, or give --results)")
    repo = results.resolve() == Path("results").resolve() and Path("docs/results.md").is_file()
    out = out if out is not None else results / "leaderboard"
    markdown = markdown if markdown is not None else (Path("docs/leaderboard.md") if repo else
                                                      out / "leaderboard.md")
    page = results_page if results_page is not None else (Path("docs/results.md") if repo else None)
    check_output(markdown, "--markdown", folder=False)  # a folder here: one line, not a temp file's name
    studies = any((d / "settings.json").is_file() for d in results.iterdir())
    if not studies and not (results / "benchmark").is_dir():  # else: empty tables over the docs
        itself = " - it is a study itself: give its parent" if (results / "settings.json").is_file() else ""
        raise ValueError(f"--results {results} holds no study folders (sub-folders with a settings.json) "
                         f"and no benchmark/ folder of `kpca-attention benchmark` JSONs{itself}")
    if page is not None and not page.is_file():
        raise FileNotFoundError(f"--results-page {page} does not exist: give the page whose generated "
                                "tables to update (docs/results.md)")
    check_summaries(results)  # the summaries the page's tables read are what their sealed results give
    paths = write_leaderboard(results, out, markdown, repo=repo, sealed_only=True)
    changed = False
    if page is not None:
        headline_plot(out / "headline.png", results)
        changed = update_results_doc(page, results)
    typer.echo(f"wrote {len(paths)} files: {markdown} and {out}/"
               + (f"; {page}: generated tables updated" if changed else ""))
