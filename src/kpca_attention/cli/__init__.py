"""The ``kpca-attention`` command line: a thin layer over the library, one module per area.

Conventions shared by every command:

* ``--out/-o`` names every output folder;
* lists are comma-separated in one option (``--seeds 0,1,2``, ``--corruptions fog,snow``), parsed by
  :func:`parse_list` / :func:`parse_ints` / :func:`parse_floats` (fractions allowed: ``1/255``);
* a user error (a missing path, an unknown name, a bad value) prints one line ``error: ...`` saying
  what is wrong and what is valid, and exits with code 2; ``--debug`` (before or after the command)
  shows the traceback instead;
* progress bars appear only on a terminal; in a log file each command prints one line per epoch or
  evaluation stage.
"""

from __future__ import annotations

import functools
import signal
import sys
import warnings
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import typer

from ..checks import error_line

__all__ = ["app", "main", "parse_list", "parse_ints", "parse_floats", "USER_ERRORS", "user_errors",
           "refuse_hf_folder", "set_threads", "THREADS_HELP"]

#: the help of every command's ``--threads`` (docs/robustness.md, "A note on CPU threads")
THREADS_HELP = "CPU threads for torch (default: torch's); 1 is fastest on a busy machine."

app = typer.Typer(
    name="kpca-attention",
    help="RPC-Attention models, robustness evaluation and kernel-PCA diagnostics of attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click errors: one line, not a panel
)

#: show tracebacks of user errors (``--debug``)
DEBUG = False


def parse_list(text: str | None, what: str = "value") -> tuple[str, ...]:
    """``"a, b,c"`` -> ``("a", "b", "c")``; empty or ``None`` -> ``()``. An item given twice is refused
    (``--method fgsm,fgsm`` ran and recorded the attack twice)."""
    if text is None:
        return ()
    return _distinct(tuple(t.strip() for t in text.split(",") if t.strip()), what, text)


def parse_ints(text: str | None, what: str = "value") -> tuple[int, ...]:
    items = parse_list(text, what)
    try:
        values = tuple(int(t) for t in items)
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers such as 0,1,2, got {text!r}") from None
    return _distinct(values, what, text)


def parse_floats(text: str | None, what: str = "value") -> tuple[float, ...]:
    """Comma-separated numbers; fractions allowed, so Linf budgets read as ``1/255,2/255``."""
    items = parse_list(text, what)
    try:
        values = tuple(float(Fraction(t)) for t in items)
    except (ValueError, ZeroDivisionError, OverflowError):  # 1e309: no float
        raise ValueError(f"{what}: expected comma-separated numbers such as 1/255,2/255 or 0.5, "
                         f"got {text!r}") from None
    return _distinct(values, what, text)


def _distinct(values: tuple[Any, ...], what: str, text: str | None) -> tuple[Any, ...]:
    """``values`` when no two are equal (``1,01`` and ``4/255,0.0156862745...`` are the same number)."""
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"{what}: {', '.join(map(str, twice))} given twice in {text!r}; give each once")
    return values


def set_threads(threads: int | None) -> None:
    """``--threads``: torch's CPU threads for this process (None: torch's default); below 1 refused."""
    if threads is None:
        return
    from ..checks import check_int

    check_int(threads, "--threads", min=1)
    import torch

    torch.set_num_threads(threads)


def refuse_hf_folder(spec: str, command: str) -> None:
    """A Hugging Face model folder (``config.json`` and none of a run's files) given to a command that
    takes runs of this project: one line saying so, rather than "COMPLETE is missing"."""
    from pathlib import Path

    from ..train.hf import is_hf_folder

    if is_hf_folder(Path(spec).expanduser()):
        raise ValueError(f"{spec} is a Hugging Face model folder, not a run of this project: {command} takes "
                         "a run or checkpoint directory of this project, or an image classifier as a timm "
                         "NAME@FILE (`kpca-attention analyze` reads Hugging Face folders)")


#: what a run folder of this project holds (train/): an output file must not take one of these names
RUN_FILES = ("config.json", "steps.csv", "epochs.csv", "COMPLETE", "latest.json", "state.pt",
             "model.safetensors", ".lock")
RUN_FOLDERS = ("checkpoints", "tb")


def refuse_inside_run(path: Path | None, spec: str, option: str) -> None:
    """An output file (``--json``) that is one of the files of the run it describes, or lies in its
    checkpoints, would replace it (``evaluate --json RUN/checkpoints/latest.json`` left a run nothing could
    load; ``analyze --json RUN/config.json`` replaced the run's config): refused before any work. Other
    names in the run folder (``RUN/eval.json``) are the user's to choose."""
    from ..studies.sources import is_project_run

    base = spec.partition("@")[0]
    if path is None or not is_project_run(base):
        return
    run, target = Path(base).expanduser().resolve(), Path(path).expanduser().resolve()
    if run.parent.name == "checkpoints" and (run.parent / "latest.json").is_file():
        run = run.parent.parent  # a checkpoint folder: the run around it holds the files to keep
    if run not in target.parents and target != run:
        return
    inside = target.relative_to(run).parts if target != run else ()
    if not inside or inside[0] in RUN_FOLDERS or target.name in RUN_FILES:
        raise ValueError(f"{option} {path} would replace a file of the run {base} (its "
                         f"{', '.join(RUN_FILES[:3])}, checkpoints and logs): give another name or folder")


def _user_errors() -> tuple[type[BaseException], ...]:
    from ..train import CheckpointError
    from ..train.rundir import RunDirBusy

    return (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
            PermissionError, CheckpointError, RunDirBusy,
            FloatingPointError)  # a diverging run: "loss is nan at step 2; lower the lr or check the data"


USER_ERRORS = _user_errors()


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command so that :data:`USER_ERRORS` print one line ``error: ...`` and exit with code 2
    (unless ``--debug``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            if DEBUG:
                raise
            typer.echo(f"error: {error_line(e)}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as e:  # here, not in main(): click turns it into a silent Exit(130) first
            typer.echo("interrupted: finished work is kept (the last whole checkpoint, every finished result "
                       "item); run the same command again to continue (train: --resume)", err=True)
            raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None

    return wrapper

# --- command registrations (one line per command; keep sorted by area) -----------------------
from .train import evaluate_cmd, train_cmd  # noqa: E402, I001
app.command("train")(user_errors(train_cmd))
app.command("evaluate")(user_errors(evaluate_cmd))
from .studies import ablate_cmd, demo_cmd, report_cmd, study_cmd  # noqa: E402, I001
app.command("demo")(user_errors(demo_cmd))
app.command("study")(user_errors(study_cmd))
app.command("ablate")(user_errors(ablate_cmd))
app.command("report")(user_errors(report_cmd))
from .robustness import robustness_cmd  # noqa: E402, I001
app.command("robustness")(user_errors(robustness_cmd))
from .benchmark import benchmark_cmd, leaderboard_cmd  # noqa: E402, I001
app.command("benchmark")(user_errors(benchmark_cmd))
app.command("leaderboard")(user_errors(leaderboard_cmd))
from .kpca import analyze_cmd, claims_cmd  # noqa: E402, I001
from .pap_trace import pap_trace_cmd  # noqa: E402, I001
app.command("analyze")(user_errors(analyze_cmd))
app.command("claims")(user_errors(claims_cmd))
app.command("pap-trace")(user_errors(pap_trace_cmd))
from .results import results_app, seal_cmd, verify_cmd  # noqa: E402, I001
results_app.command("seal")(user_errors(seal_cmd))
results_app.command("verify")(user_errors(verify_cmd))
app.add_typer(results_app, name="results")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's, ``kill``'s) raised in the main thread: a command stops as on Ctrl-C -
    one line saying what is kept, the study's worker processes stopped - and exits 143 (128 + 15)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> None:
    """Entry point. ``--debug`` anywhere on the line shows tracebacks of user errors."""
    global DEBUG
    args = list(sys.argv[1:] if argv is None else argv)
    DEBUG = "--debug" in args
    args = [a for a in args if a != "--debug"]
    from ..machine import retain_freed_memory

    retain_freed_memory()  # the steps free and reallocate the same tensors: keep the pages (see its doc)
    signal.signal(signal.SIGTERM, _raise_terminated)
    if not DEBUG:  # a warning is one line "warning: ...", as an error is "error: ..."
        warnings.formatwarning = lambda message, *_args, **_kwargs: f"warning: {message}\n"
    _refuse_empty_values(args)
    click_error, abort = _click_errors()
    try:  # Ctrl-C in a command: one line from user_errors, exit code 130
        code = app(args=args, prog_name="kpca-attention", standalone_mode=False)
    except click_error as e:
        if type(e).__name__ == "NoArgsIsHelpError" or getattr(e, "exit_code", 1) != 2:
            e.show()  # the command alone (its help), or another error of click's own
            sys.exit(getattr(e, "exit_code", 1))
        # a bad option or value: one line as for the commands' own errors, not click's four
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "kpca-attention"
        typer.echo(f"error: {e.format_message()} (see {where} --help)", err=True)
        sys.exit(2)
    except abort:
        sys.exit(130)
    except Terminated:  # outside a command (while click parses): no work to keep
        sys.exit(143)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)  # an Exit's code, else 0


def _refuse_empty_values(args: list[str]) -> None:
    """An option given an empty value (``-o ""``, ``--out=``: an unset shell variable) is refused: a path
    option took it for the current folder and wrote report.md and plots there."""
    for i, a in enumerate(args):
        name = a.split("=", 1)[0] if a.startswith("--") and "=" in a else None
        empty = (name is not None and a.endswith("=")) or (a == "" and i > 0 and args[i - 1].startswith("-")
                                                           and "=" not in args[i - 1])
        if empty:
            option = name or args[i - 1]
            typer.echo(f"error: {option} is given an empty value (an unset variable?): give a value or leave "
                       "the option out", err=True)
            sys.exit(2)


def _click_errors() -> tuple[type[BaseException], type[BaseException]]:
    """Click's base exception and Abort: typer >= 0.2x carries its own copy of click (``typer._click``),
    earlier versions use the click package."""
    try:
        from typer._click.exceptions import ClickException
    except ImportError:
        from click import ClickException
    return ClickException, getattr(typer, "Abort", ClickException)


if __name__ == "__main__":
    main()
