"""A second task that takes tokens is asked, not mistaken for the language model: the commands above the
tasks read its declared settings (``config_fields``), its default KPCA inputs (``sample_tokens``) and its
suites, never ``takes_tokens`` as "this is the project's LM"."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from typer.testing import CliRunner

from kpca_attention import tasks
from kpca_attention.cli import app
from kpca_attention.kpca.run import resolve_inputs
from kpca_attention.tasks.language import CausalLanguageModelling
from kpca_attention.train import get_preset
from kpca_attention.train.checkpoint import save_checkpoint
from kpca_attention.train.resolve import LoadedModel


@dataclass(frozen=True)
class TaggingSuites:
    kind = "tagging"
    clean: int = 10

    def to_dict(self) -> dict:
        return {"kind": self.kind, "clean": self.clean}


class Tagging(CausalLanguageModelling):
    """A token task of its own (the LM's data and models, other suites and inputs)."""

    name = "tagging"
    title = "token tagging"
    causal = False
    suites_type = TaggingSuites
    config_fields = frozenset({"context", "vocab", "smoothing"})

    def sample_tokens(self, cfg, n, vocab):
        return torch.arange(n * 4).view(n, 4) % 7, f"{n} tagging windows"


@pytest.fixture
def tagging(monkeypatch):
    task = Tagging()
    monkeypatch.setitem(tasks.TASKS, task.name, task)
    return task


def test_settings_are_refused_by_what_each_task_declares(tagging) -> None:
    cfg = get_preset("bible-cpu", task="tagging", smoothing=0.1)
    assert tasks.unused_settings(cfg) == []  # tagging reads smoothing
    lm = get_preset("bible-cpu", smoothing=0.1)
    assert tasks.unused_settings(lm) == ["smoothing=0.1"]  # the LM does not (images and tagging do)
    assert tasks.unused_settings(get_preset("digits-cpu", vocab="char")) == ["vocab='char'"]


def test_the_kpca_inputs_of_a_token_model_come_from_its_task(tagging) -> None:
    cfg = get_preset("bible-cpu", task="tagging")
    loaded = LoadedModel(name="t", model=torch.nn.Identity(), task=tagging, config=cfg)
    assert loaded.takes_text and loaded.project_tokens
    inputs = resolve_inputs(loaded, max_samples=3)
    assert inputs.description == "3 tagging windows" and inputs.tokens.shape == (3, 4)
    # the base task has no default inputs to give: one line naming the option
    with pytest.raises(ValueError, match="task 'vision' names no default token inputs.*--texts"):
        tasks.get("vision").sample_tokens(cfg, 3, None)


def test_robustness_refuses_a_token_task_with_other_suites(tagging, tmp_path) -> None:
    run = tmp_path / "tag"
    cfg = get_preset("bible-cpu", task="tagging", output_dir=str(run))
    from kpca_attention.models import create_model

    cfg.model_kwargs = {"preset": "small", "n_layer": 1, "d_model": 16, "n_head": 2, "d_ff": 16}
    model = create_model("symlm", vocab_size=20, context=cfg.context, **cfg.model_kwargs)
    save_checkpoint(run, model=model, config=cfg,
                    state={"progress": {"epoch": 0, "step_in_epoch": 0, "global_step": 0}}, finished=True)
    res = CliRunner().invoke(app, ["robustness", str(run), "--suite", "wordswap", "-o", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert "not a token tagging model (task='tagging'); its suites run in a study of your own" in res.output


def test_register_refuses_a_task_missing_a_required_attribute(monkeypatch) -> None:
    class NoUnit(Tagging):
        name = "no-unit"

    monkeypatch.delattr(CausalLanguageModelling, "unit")  # inherited from the LM otherwise
    with pytest.raises(ValueError, match="NoUnit does not set unit"):
        tasks.register(NoUnit())
    assert "no-unit" not in tasks.TASKS
