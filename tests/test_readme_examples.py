"""The Python examples of README.md run as written (in order, in one namespace, as a reader would paste them),
so the front page cannot drift from the library's names and signatures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytestmark = pytest.mark.usefixtures("single_thread")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_has_python_examples() -> None:
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 2 and any("TwicingAttention" in b for b in blocks)  # the library and the family


def test_the_readme_python_examples_run(capsys) -> None:
    namespace: dict = {"__name__": "readme"}
    for block in python_blocks(README.read_text()):
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - our own README
    import timm
    import torch

    # what the examples say they make
    assert isinstance(namespace["model"], timm.models.VisionTransformer)
    printed = capsys.readouterr().out
    assert "twicing" in printed  # mechanisms() printed, and its comment lists what it prints
    from kpca_attention.attention import mechanisms

    comment = next(line for line in README.read_text().splitlines() if line.startswith("print(mechanisms())"))
    assert comment.split("#", 1)[1].strip() == ", ".join(mechanisms())
    assert namespace["rkde"].blocks[0].attn.official_norm is True
    assert namespace["ell"].blocks[0].attn.differentiable is True
    with torch.no_grad():
        logits = namespace["vit2"](torch.rand(1, 3, 224, 224))
    assert logits.shape == (1, 1000)
    assert type(namespace["vit2"].blocks[0].attn).__name__.startswith("TwicingAttention")
