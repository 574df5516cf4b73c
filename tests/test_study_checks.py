"""The study-wide cost check (training throughput and peak memory side by side) on both kinds of task:
image studies time a random image batch with cross-entropy; language studies time their corpus's first
training windows with the task's next-token loss, in tokens/s."""

from __future__ import annotations

import pytest

from kpca_attention.studies import get_study, quick_demo_study
from kpca_attention.studies.checks import cost_inputs, training_cost
from kpca_attention.studies.language import quick_language_study
from kpca_attention.studies.spec import Variant

pytestmark = pytest.mark.usefixtures("single_thread")


def _tiny_lm_study():
    study = quick_language_study()
    tiny = dict(study.variants[0].kwargs)
    twicing = Variant("twicing", "Twicing", "twicing_lm", tiny, "two smoothings")
    return study.replace(variants=(*study.variants, twicing), recipe={**study.recipe, "batch_size": 4})


def test_language_cost_counts_tokens_and_sees_the_extra_attention_pass() -> None:
    study = _tiny_lm_study()
    b = cost_inputs(study, None)
    assert b.unit == "tokens" and tuple(b.x.shape) == (4, 16) and b.per_step == 4 * 16
    assert bool((b.x[:, 1:] == b.y[:, :-1]).all())  # windows of the corpus: targets are the next tokens
    rows = {r["variant"]: r for r in training_cost(study, {}, repeats=2, steps=1)}
    assert set(rows) == {"Symlm", "RPC-Symlm", "LM (asymmetric)", "Twicing"}
    base = rows["Symlm"]
    assert base["speed vs Symlm"] == 1.0 and base["memory vs Symlm"] == 1.0
    assert all(r["tokens/s"] > 0 and r["peak MiB"] > 0 for r in rows.values())
    # Twicing keeps a second attention call's output for backward in every layer; PAP four passes in one
    assert rows["Twicing"]["peak MiB"] > base["peak MiB"]
    assert rows["RPC-Symlm"]["peak MiB"] > base["peak MiB"]


def test_image_cost_is_unchanged_in_kind() -> None:
    study = quick_demo_study()
    b = cost_inputs(study, 8)
    assert b.unit == "images" and b.x.shape[0] == 8 and b.per_step == 8
    rows = training_cost(study, {}, repeats=1, steps=1, batch_size=8)
    assert all("images/s" in r and r["images/s"] > 0 for r in rows)


def test_zoo_language_measures_its_cost() -> None:
    assert [c.name for c in get_study("zoo-language").checks] == ["cost"]
