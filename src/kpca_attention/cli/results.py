"""``kpca-attention results seal|verify FOLDER``: the integrity hashes of result files.

``verify`` checks every item of every result file (hashes, summaries; see
:mod:`kpca_attention.robustness.store`) and names the first damaged one (exit code 2). ``seal`` does the
same for a legacy folder (files written before items carried hashes), then adds the missing hashes and
marks each file sealed, so a later hand edit - or an item added without a hash - is detected.
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
    (rewritten in the current format: correctness bits packed; no hash changes)."""
    from ..robustness.store import ResultStore, seal_store, store_files

    files = store_files(folder)
    for f in files:  # verify everything before sealing anything
        ResultStore(f)
    for f in files:
        n, new = seal_store(f)
        typer.echo(f"sealed {f} ({n} items, {new} newly hashed)")


def verify_cmd(folder: Folder) -> None:
    """Check every hash and per-item summary of FOLDER's result files."""
    from ..robustness.store import ResultStore, store_files

    files = store_files(folder)
    for f in files:
        ResultStore(f)
    typer.echo(f"{len(files)} result file(s) in {folder}: every item verified")
