"""Every ``kpca-attention`` command shown in README.md and docs/*.md parses with the real command line
(options exist, values convert), so the docs cannot drift from the CLI; the cheap ones also run at
smoke scale here and in the commands' own tests (demo --quick, train, evaluate, robustness,
pap-trace, report)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from kpca_attention.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "CONTRIBUTING.md"]


def _commands() -> list[tuple[str, int, list[str]]]:
    """``(file, line, argv after the program name)`` of every command in a code block or inline code."""
    found = []
    for doc in DOCS:
        if not doc.exists():
            continue
        lines = doc.read_text().splitlines()
        in_block = False
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.strip().startswith("```"):
                in_block = not in_block
                i += 1
                continue
            candidates = []
            if in_block:
                text = line
                while text.rstrip().endswith("\\") and i + 1 < len(lines):  # continued lines
                    i += 1
                    text = text.rstrip()[:-1] + " " + lines[i].strip()
                candidates.append(text.split("  #")[0].split(" # ")[0])
            else:
                candidates += re.findall(r"`((?:kpca-attention|torchrun)[^`]*)`", line)
            for c in candidates:
                m = re.search(r"(?:^|\s)(kpca-attention|-m kpca_attention\.cli)\s+(.*)$", c.strip())
                # placeholders (RUN, ..., <x>, a|b, [opt]) are not commands
                if m and not re.search(r"[A-Z]{3,}|\.\.\.|<|\||\[", m.group(2)):
                    found.append((doc.name, i + 1, shlex.split(m.group(2))))
            i += 1
    return found


COMMANDS = _commands()


def test_the_docs_show_commands() -> None:
    names = {argv[0] for _, _, argv in COMMANDS if argv}
    assert {"train", "evaluate", "robustness", "study", "ablate", "analyze", "claims", "pap-trace"} <= names


@pytest.mark.parametrize(("doc", "line", "argv"), COMMANDS, ids=[f"{d}:{n}" for d, n, _ in COMMANDS])
def test_documented_command_parses(doc: str, line: int, argv: list[str]) -> None:
    group = typer.main.get_command(app)
    assert argv, f"{doc}:{line}: empty command"
    name, rest = argv[0], argv[1:]
    ctx = group.make_context("kpca-attention", [name])
    cmd = group.get_command(ctx, name)
    assert cmd is not None, f"{doc}:{line}: unknown command {name!r}"
    if not rest:  # a bare command name in prose refers to the command; its arguments may be required
        return
    cmd.make_context(name, list(rest), parent=ctx)  # raises on unknown options or bad values
