"""The ``kpca-attention`` command line. Each command lives beside the library code it calls and
is registered here, so the CLI stays a thin layer over the library."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="kpca-attention",
    help="RPC-Attention models, robustness evaluation and kernel-PCA diagnostics of attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# --- command registrations (one line per command; keep sorted by area) -----------------------
from .train.cli import evaluate_cmd, train_cmd  # noqa: E402, I001
app.command("train")(train_cmd)
app.command("evaluate")(evaluate_cmd)
from .demo import demo_cmd  # noqa: E402, I001
app.command("demo")(demo_cmd)
from .robustness.cli import robustness_cmd  # noqa: E402, I001
app.command("robustness")(robustness_cmd)
from .kpca.cli import analyze_cmd, claims_cmd  # noqa: E402, I001
app.command("analyze")(analyze_cmd)
app.command("claims")(claims_cmd)
from .pap_trace import pap_trace_cmd  # noqa: E402, I001
app.command("pap-trace")(pap_trace_cmd)
from .ablations import ablate_cmd  # noqa: E402, I001
app.command("ablate")(ablate_cmd)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
