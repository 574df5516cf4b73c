"""timm names: offline by default (pretrained weights come from a local file, ``NAME@FILE``, or the local
Hugging Face cache; never the network), an empty or broken weights part is one clear error, never a
randomly initialised model."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.train.resolve import resolve_model

NAME = "vit_tiny_patch16_224"


@pytest.fixture
def no_network(monkeypatch):
    """Every DNS lookup or connection is recorded and refused."""
    calls: list[str] = []

    def refuse(*a, **k):
        calls.append(repr(a)[:80])
        raise OSError("network used")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-kpca-cache")  # nothing cached: the lookup must fail
    return calls


def test_pretrained_timm_name_fails_at_once_without_the_network(no_network) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="@") as e:
        resolve_model(NAME)  # pretrained=True is the default
    assert time.perf_counter() - t0 < 10
    assert no_network == []
    msg = str(e.value)
    assert "\n" not in msg and f"{NAME}@" in msg and "--no-pretrained" in msg


def test_hub_offline_is_set_by_the_package_while_it_loads(no_network, monkeypatch) -> None:
    """Offline while a model is built; the caller's settings come back after it, failed or not (a review
    found load_model left the whole notebook process offline)."""
    import os

    import huggingface_hub.constants as c
    import timm

    from kpca_attention.train import load_model

    seen = []
    real = timm.create_model

    def spy(*a, **k):
        seen.append((c.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")))
        return real(*a, **k)

    monkeypatch.setattr(timm, "create_model", spy)
    c.HF_HUB_OFFLINE = False
    try:
        resolve_model(NAME, pretrained=False)
        assert seen == [(True, "1")]
        assert c.HF_HUB_OFFLINE is False and "HF_HUB_OFFLINE" not in os.environ
        with pytest.raises(ValueError):
            resolve_model(NAME)
        with pytest.raises(FileNotFoundError):
            load_model("nothere")
        assert c.HF_HUB_OFFLINE is False and "HF_HUB_OFFLINE" not in os.environ
    finally:
        c.HF_HUB_OFFLINE = False


def test_cli_evaluate_timm_name_is_one_line(no_network, tmp_path) -> None:
    res = CliRunner().invoke(app, ["analyze", NAME, "--json", str(tmp_path / "a.json"),
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and f"{NAME}@" in res.output and no_network == [], res.output


@pytest.mark.parametrize("spec", [f"{NAME}@", f"{NAME}@ "])
def test_an_empty_weights_part_is_refused(spec, tmp_path) -> None:
    with pytest.raises(ValueError, match="empty weights file"):
        resolve_model(spec, pretrained=False)
    res = CliRunner().invoke(app, ["evaluate", spec, "--dataset", "cifar10", "--data-root", str(tmp_path)])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "empty weights file" in lines[0], res.output


@pytest.mark.parametrize(("suffix", "content"), [(".pth", b""), (".safetensors", b""),
                                                 (".pth", b"hello, I am text\n"),
                                                 (".safetensors", b"hello, I am text\n")])
def test_a_file_that_is_not_weights_is_one_line(tmp_path, suffix, content) -> None:
    f = tmp_path / f"w{suffix}"
    f.write_bytes(content)
    with pytest.raises(ValueError, match="not a weights file") as e:
        resolve_model(f"{NAME}@{f}", pretrained=False)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_real_weights_load_and_pap_trace_takes_an_absolute_path(tmp_path) -> None:
    import safetensors.torch
    import timm

    torch.manual_seed(0)
    net = timm.create_model("rpc_vit_mini_patch4_32")
    f = tmp_path / "w.safetensors"
    safetensors.torch.save_model(net, str(f))
    loaded = resolve_model(f"rpc_vit_mini_patch4_32@{f}", pretrained=False)
    assert loaded.info["weights"] == str(f)
    res = CliRunner().invoke(app, ["pap-trace", f"rpc_vit_mini_patch4_32@{f}", "--out", str(tmp_path / "p")])
    assert "no such checkpoint" not in res.output and "takes 3x32x32 images" in res.output, res.output


def test_a_pickled_pth_given_as_timm_weights_never_runs(tmp_path) -> None:
    """NAME@FILE.pth goes through timm's loader with weights_only asked for explicitly (timm>=1.0.16 is
    allowed, and what its default was in every release is not checked): a pickle that runs code is refused."""
    import pickle
    from pathlib import Path

    marker = tmp_path / "MARKER"

    class Evil:
        def __reduce__(self):
            return (Path.write_text, (marker, "ran"))

    f = tmp_path / "w.pth"
    torch.save({"state_dict": {"x": Evil()}}, f, pickle_module=pickle)
    # one whole line naming what the pickle holds (torch's long note was cut at 200 characters mid-word);
    # torch lists the globals in no fixed order
    with pytest.raises(ValueError, match=r"w.pth holds pickled objects, not only weights \([^)]*pathlib"
                                         r"[^)]*\): refused, never unpickled"):
        resolve_model(f"vit_tiny_patch16_224@{f}", pretrained=False)
    assert not marker.exists(), "the pickle ran"
