"""Hugging Face folders are loaded in one place (:mod:`kpca_attention.train.hf`): offline, never with the
folder's own code (``trust_remote_code=False`` whatever stdin says), with a tokenizer that must be there.
Every ``from_pretrained`` of the package goes through it (checked on the source)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kpca_attention.train.resolve import minilm_path, resolve_model

SRC = Path(__file__).resolve().parents[1] / "src" / "kpca_attention"
LOADER = SRC / "train" / "hf.py"


def _custom_code_folder(folder: Path, marker: Path) -> Path:
    """A folder whose config asks for its own Python (``auto_map``), which writes ``marker`` when imported."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
                     "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]},
    }))
    payload = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    cfg = ("from transformers import PretrainedConfig\n"
           "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    for name in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py"):
        (folder / name).write_text(payload + (cfg if name.startswith("configuration") else ""))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}))
    return folder


@pytest.mark.parametrize("command", ["analyze", "pap-trace"])
def test_a_folder_with_custom_code_is_refused_even_with_yes_on_stdin(tmp_path, command) -> None:
    marker = tmp_path / "MARKER"
    folder = _custom_code_folder(tmp_path / "evil", marker)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["OMP_NUM_THREADS"] = "1"
    extra = ["--json", str(tmp_path / "a.json")] if command == "analyze" else []
    res = subprocess.run([sys.executable, "-m", "kpca_attention.cli", command, str(folder),
                          "--out", str(tmp_path / "out"), *extra],
                         input="y\ny\ny\n", capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    assert not marker.exists(), "the folder's Python ran"
    assert res.returncode == 2, res.stdout + res.stderr
    assert "custom code" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_the_loader_refuses_custom_code_in_the_api(tmp_path) -> None:
    marker = tmp_path / "MARKER"
    folder = _custom_code_folder(tmp_path / "evil", marker)
    with pytest.raises(ValueError, match="custom code"):
        resolve_model(str(folder))
    assert not marker.exists()


def _gpt2_folder(folder: Path, tokenizer: bool) -> Path:
    from transformers import AutoTokenizer, GPT2Config, GPT2Model

    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    torch.manual_seed(0)
    GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=len(tok), n_positions=32,
                         bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder


def test_a_causal_folder_without_tokenizer_files_is_one_clear_error(tmp_path) -> None:
    folder = _gpt2_folder(tmp_path / "gpt2-no-tok", tokenizer=False)
    with pytest.raises(ValueError, match="no tokenizer") as e:
        resolve_model(str(folder))
    assert str(folder) in str(e.value)
    from typer.testing import CliRunner

    from kpca_attention.cli import app

    res = CliRunner().invoke(app, ["analyze", str(folder), "--out", str(tmp_path / "o"),
                                   "--json", str(tmp_path / "a.json")])
    assert res.exit_code == 2 and "no tokenizer" in res.output and "reshape" not in res.output, res.output


def test_a_folder_with_its_tokenizer_still_loads(tmp_path) -> None:
    loaded = resolve_model(str(_gpt2_folder(tmp_path / "gpt2", tokenizer=True)))
    assert loaded.info["causal"] is True and loaded.tokenizer is not None


def test_a_hub_name_is_looked_up_offline_only(monkeypatch) -> None:
    """A hub name that is not in the local cache fails at once, with no connection attempted."""
    import socket

    calls: list[str] = []

    def refuse(*a, **k):
        calls.append(repr(a))
        raise OSError("network used")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ValueError, match="offline"):
        resolve_model("nobody-owns-this/not-a-model-kpca")
    assert calls == []


def _from_pretrained_calls(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "from_pretrained"]


def test_every_from_pretrained_is_in_the_one_loader() -> None:
    """Hugging Face folders are opened in one module: no other module of the package calls
    ``from_pretrained`` or names ``trust_remote_code``."""
    assert LOADER.exists()
    others = {}
    for f in SRC.rglob("*.py"):
        if f == LOADER:
            continue
        tree = ast.parse(f.read_text())
        lines = _from_pretrained_calls(tree)
        if lines or "trust_remote_code" in f.read_text():
            others[str(f.relative_to(SRC))] = lines
    assert others == {}
    text = LOADER.read_text()
    assert _from_pretrained_calls(ast.parse(text))
    assert "trust_remote_code=True" not in text
