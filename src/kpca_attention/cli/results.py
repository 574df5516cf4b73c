"""``kpca-attention results seal|verify FOLDER``: the integrity hashes of result files.

``verify`` checks every item of every result file (hashes, summaries; see
:mod:`kpca_attention.robustness.store`) and names the first damaged one (exit code 2). ``seal`` does the
same for a legacy folder (files written before items carried hashes), then adds the missing hashes and
marks each file sealed; ``verify`` refuses an unsealed file unless ``--allow-unsealed``.

What the hashes detect: damage, and an edit that leaves an item's hash (or its per-example data) as it was;
the list of item names a sealed file holds detects an item removed or added by hand. Beside them ``verify``
refuses a file emptied of its items and, in a study folder, a file holding another
run than the one settings.json gives it (two files swapped or renamed: each run item records its training
config or model). What they cannot: a deliberate forgery - the hash is a public, unkeyed SHA-256, so whoever
edits a value can recompute it - nor a whole file or seed removed, nor the files beside the results
(``settings.json``, ``checks/``, the report; ``kpca-attention leaderboard`` writes the summaries its tables
read again from the sealed results and refuses one that differs). For those, compare with the repository's
history (``git log -p results/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["results_app"]

results_app = typer.Typer(help="Integrity of result files: verify them, or seal a legacy folder.",
                          no_args_is_help=True, add_completion=False, rich_markup_mode=None)

Folder = Annotated[Path, typer.Argument(help="A study or robustness folder (its results/*.json), a folder of "
                                             "result files, or one result file.")]


def seal_cmd(folder: Folder) -> None:
    """Verify every item of FOLDER's result files, then add the missing SHA-256 hashes and seal each file
    with the names of the items it holds (rewritten in the current format: correctness bits packed; no hash
    changes). Items deleted on purpose from a sealed file, to compute them again, are recorded this way."""
    from ..robustness.store import ResultStore, seal_store, store_files

    files = store_files(folder)
    for f in files:  # verify everything before sealing anything (items deleted on purpose are recorded)
        ResultStore(f, check_listed=False)
    for f in files:
        n, new = seal_store(f)
        typer.echo(f"sealed {f} ({n} items, {new} newly hashed)")


def verify_cmd(
    folder: Folder,
    allow_unsealed: Annotated[bool, typer.Option(
        "--allow-unsealed", help="Accept legacy files without hashes (their summaries are still checked).")] = False,
) -> None:
    """Check every hash and per-item summary of FOLDER's result files; refuse a file that is not sealed
    (an item without its hash cannot show an edit) unless --allow-unsealed. The hashes detect damage and
    naive edits, not a deliberate forgery (they are unkeyed): compare with the git history for that."""
    from ..report.study import load_runs, read_settings, result_files
    from ..report.verdicts import planned_seeds
    from ..robustness.store import ResultStore, store_files

    files = store_files(folder)
    stores = {f: ResultStore(f) for f in files}  # each file read and verified once
    empty = [f for f, st in stores.items() if not st.items()]
    if empty:  # a file emptied of every item has nothing left to fail its hashes
        raise ValueError(f"{empty[0]} holds no items (emptied, or never written to): a result file of a run "
                         "holds at least its run's items - restore it or delete it"
                         + (f" ({len(empty)} such files)" if len(empty) > 1 else ""))
    unsealed = [f for f, st in stores.items() if not st.sealed]
    if unsealed and not allow_unsealed:
        raise ValueError(f"{len(unsealed)} of {len(files)} result file(s) in {folder} are not sealed, so an "
                         f"edit of their items cannot be detected (first: {unsealed[0]}); check them and run "
                         "`kpca-attention results seal`, or pass --allow-unsealed")
    studies = sorted({p.parent for p in folder.rglob("settings.json") if (p.parent / "results").is_dir()}
                     | ({folder} if (folder / "settings.json").is_file() else set()))
    missing = []
    for study in studies:  # each file holds the run settings.json gives it (not another's, swapped)
        settings = read_settings(study)
        load_runs(study, settings, keep=lambda r: r)
        for v in settings.get("variants", []):  # planned runs without a file: not run yet, or removed
            lack = sorted(planned_seeds(settings, v["slug"]) - {sd for _f, sd in result_files(study, v)})
            if lack:
                missing.append(f"{study.name}/{v['slug']} seed{'s' * (len(lack) > 1)} "
                               f"{','.join(map(str, lack))}")
    extra = f" ({len(unsealed)} unsealed: summaries only)" if unsealed else ""
    typer.echo(f"{len(files)} result file(s) in {folder}: every item verified{extra}"
               + (f"; each study's files hold the runs they are named for ({len(studies)} "
                  f"stud{'ies' if len(studies) > 1 else 'y'})" if studies else ""))
    if missing:  # a seed removed from results/ (a cherry-pick) shows here as one not run yet
        typer.echo(f"planned by settings.json, no result file (not run yet, or removed): {'; '.join(missing)}")
