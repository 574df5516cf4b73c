"""The attack protocols: ``pixel`` (eps in pixel units, clamp) and ``lab`` (the papers': the attack on the
normalised tensor, eps in normalised units, no clamp), and that their results never mix."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from kpca_attention.models.normalize import NormalizedModel
from kpca_attention.robustness.attacks import attack, attack_logits
from kpca_attention.robustness.store import ResultStore
from kpca_attention.tasks.classification.report import _metric_title
from kpca_attention.tasks.classification.suites import (
    Attack,
    ImageSuites,
    attack_title,
    evaluate_image_suites,
)

torch.set_num_threads(1)
MEAN, STD = (0.2, 0.5, 0.7), (0.25, 0.4, 0.1)


def _model(seed: int = 0) -> NormalizedModel:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 6 * 6, 32), nn.Tanh(), nn.Linear(32, 5))
    return NormalizedModel(net, MEAN, STD).eval()


def _images(n: int = 12, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 6, 6, generator=g)
    x[:, :, 0, 0] = 0.0  # pixels on the box boundary: the lab attack may leave it, pixel may not
    x[:, :, 0, 1] = 1.0
    return x, torch.randint(0, 5, (n,), generator=g)


def _channel_linf(d: torch.Tensor) -> torch.Tensor:
    return d.abs().amax(dim=(0, 2, 3))


def test_lab_fgsm_budget_is_eps_times_std_and_not_clamped():
    model, (x, y) = _model(), _images()
    eps = 4 / 255
    lab = attack(model, x, y, "fgsm", eps, protocol="lab")
    pix = attack(model, x, y, "fgsm", eps)
    # FGSM moves every coordinate by exactly eps (normalised) = eps * std_c (pixels)
    assert torch.allclose(_channel_linf(lab - x), eps * torch.tensor(STD), rtol=1e-4, atol=1e-7)
    per_pixel = (lab - x).abs() / torch.tensor(STD).view(1, 3, 1, 1)
    assert torch.allclose(per_pixel, torch.full_like(per_pixel, eps), rtol=1e-3)
    assert lab.min() < 0 or lab.max() > 1  # no clamp to [0, 1]
    # pixel: eps in pixel units, clamped
    assert torch.allclose(_channel_linf(pix - x), torch.full((3,), eps), rtol=1e-4)
    assert pix.min() >= 0 and pix.max() <= 1


def test_lab_fgsm_is_the_cleverhans_step_on_the_predicted_class():
    model, (x, y) = _model(), _images()
    eps = 0.05
    z = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    z.requires_grad_(True)
    pred = model.model(z).argmax(1).detach()
    assert (pred != y).any()  # the test means something: some true labels differ from the prediction
    (g,) = torch.autograd.grad(F.cross_entropy(model.model(z), pred), z)
    std, mean = torch.tensor(STD).view(1, 3, 1, 1), torch.tensor(MEAN).view(1, 3, 1, 1)
    want = (z + eps * g.sign()).detach() * std + mean
    got = attack(model, x, y, "fgsm", eps, protocol="lab")
    assert torch.allclose(got, want, atol=1e-6)


def test_lab_pgd_stays_in_the_normalised_ball_and_differs_from_pixel():
    model, (x, y) = _model(), _images()
    eps = 8 / 255
    lab = attack(model, x, y, "pgd", eps, protocol="lab")
    d = _channel_linf(lab - x)
    assert (d <= eps * torch.tensor(STD) * (1 + 1e-4)).all()
    assert (d >= 0.9 * eps * torch.tensor(STD)).all()  # 20 steps of 0.15 eps reach the ball's surface
    again = attack(model, x, y, "pgd", eps, protocol="lab")
    assert torch.equal(lab, again)  # seeded random start
    pix = attack(model, x, y, "pgd", eps)
    assert not torch.allclose(lab, pix)


def test_lab_refusals_are_one_line():
    x, y = _images(2)
    with pytest.raises(ValueError, match="NormalizedModel"):
        attack(_model().model, x, y, "fgsm", 0.01, protocol="lab")
    with pytest.raises(ValueError, match="lab protocol has fgsm, pgd"):
        attack(_model(), x, y, "cw", 0.5, protocol="lab")
    with pytest.raises(ValueError, match="unknown attack protocol"):
        attack(_model(), x, y, "fgsm", 0.01, protocol="normalised")
    with pytest.raises(ValueError, match="lab protocol has"):
        Attack("square", (0.01,), protocol="lab")


def test_attack_logits_norms_are_in_pixel_units():
    model, (x, y) = _model(), _images()
    _, _, nm = attack_logits(model, (x, y), "fgsm", 0.1, progress=False, protocol="lab")
    assert torch.allclose(nm, torch.full_like(nm, 0.1 * max(STD)), rtol=1e-4)


def _suites(*attacks: Attack) -> ImageSuites:
    return ImageSuites(clean=8, attacks=attacks, batch_size=8, attack_batch_size=8)


def test_results_differ_in_keys_and_names_and_never_mix(tmp_path):
    model, (x, y) = _model(), _images(10)
    data = TensorDataset(x, y)
    store = ResultStore(tmp_path / "m.json")
    eps = 4 / 255
    pix, lab = Attack("fgsm", (eps,), n=6), Attack("fgsm", (eps,), n=6, protocol="lab")
    assert (pix.name, lab.name) == ("fgsm", "fgsm-lab")
    out = evaluate_image_suites(model, data, _suites(pix, lab), store, {"w": 1}, log=lambda m: None,
                                progress=False)
    raw = store._items
    assert raw["attacks/fgsm/4"]["key"]["protocol"] == "pixel"
    assert raw["attacks/fgsm-lab/4"]["key"]["protocol"] == "lab"
    assert out["attacks"]["fgsm-lab"]["4"]["protocol"] == "lab"
    assert out["attacks"]["fgsm"]["4"]["max_norm"] == pytest.approx(eps, rel=1e-4)
    assert out["attacks"]["fgsm-lab"]["4"]["max_norm"] == pytest.approx(eps * max(STD), rel=1e-4)
    # a lab item is never taken for a pixel one (nor the reverse): same name, other protocol -> recomputed
    store.put("attacks/fgsm/4", {**raw["attacks/fgsm-lab/4"]["key"]}, {"fake": True, "top1": 0.5})
    again = evaluate_image_suites(model, data, _suites(pix), store, {"w": 1}, log=lambda m: None,
                                  progress=False)
    assert "fake" not in again["attacks"]["fgsm"]["4"]
    assert store._items["attacks/fgsm/4"]["key"]["protocol"] == "pixel"


def test_pixel_items_stored_before_the_protocol_existed_are_read_as_pixel(tmp_path):
    model, (x, y) = _model(), _images(10)
    data = TensorDataset(x, y)
    store = ResultStore(tmp_path / "m.json")
    pix = Attack("fgsm", (2 / 255,), n=6)
    evaluate_image_suites(model, data, _suites(pix), store, {"w": 1}, log=lambda m: None, progress=False)
    key = dict(store._items["attacks/fgsm/2"]["key"])
    del key["protocol"]  # as an older version wrote it
    store.put("attacks/fgsm/2", key, {"legacy": True, "top1": 0.5})
    out = evaluate_image_suites(model, data, _suites(pix), store, {"w": 1}, log=lambda m: None,
                                progress=False)
    assert out["attacks"]["fgsm"]["2"] == {"legacy": True, "top1": 0.5}
    # read as it is stored, never rewritten: another study's file may refer to it by its hash
    assert "protocol" not in ResultStore(store.path)._items["attacks/fgsm/2"]["key"]
    # ... but never as a lab item
    lab = Attack("fgsm", (2 / 255,), n=6, protocol="lab")
    store.put("attacks/fgsm-lab/2", key, {"legacy": True, "top1": 0.5})
    out = evaluate_image_suites(model, data, _suites(lab), store, {"w": 1}, log=lambda m: None,
                                progress=False)
    assert "legacy" not in out["attacks"]["fgsm-lab"]["2"]


def test_settings_and_report_name_the_protocol():
    s = _suites(Attack("pgd", (4 / 255,)), Attack("pgd", (4 / 255,), protocol="lab"))
    d = s.to_dict()
    assert "protocol" not in d["attacks"][0]  # pixel, as settings written before the option read
    assert d["attacks"][1]["protocol"] == "lab"
    assert "autoattack" not in d
    assert _metric_title("pgd-lab@4") == "PGD 4/255 (lab)"
    assert _metric_title("pgd@4") == "PGD 4/255"
    # attacks as their papers name them (the report had "apgd-ce 4/255" beside "SQUARE 4/255")
    assert [_metric_title(k) for k in ("apgd-ce@4", "square@4")] == ["APGD-CE 4/255", "Square 4/255"]
    # L2 budgets are stored in units of 1/255 like every key, and read as they are in titles and plot panels
    assert _metric_title("cw@127.5", {"cw": "L2"}) == "CW L2 0.5"
    assert attack_title("cw", {"cw": "L2"}) == ("CW L2", "")
    assert attack_title("pgd-lab") == ("PGD", " (lab)")


def test_an_attack_on_fewer_images_than_the_draw_is_keyed_by_the_draw(tmp_path):
    """The first 4 images of a draw of 6 are not the first 4 of a draw of 8: an item of the smaller attack
    is never reused after the draw changes; items stored before keys named the draw are reused only while
    the draw is the one they were computed on."""
    model, (x, y) = _model(), _images(10)
    data = TensorDataset(x, y)
    store = ResultStore(tmp_path / "m.json")
    small = Attack("fgsm", (2 / 255,), n=4)

    def run(n_big: int) -> dict:
        suites = ImageSuites(clean=8, attacks=(small, Attack("pgd", (2 / 255,), n=n_big)), batch_size=8)
        return evaluate_image_suites(model, data, suites, store, {"w": 1}, log=lambda m: None, progress=False)

    run(6)
    assert store._items["attacks/fgsm/2"]["key"]["draw"] == 6
    assert "draw" not in store._items["attacks/pgd/2"]["key"]  # an attack on the whole draw: key as before
    key = dict(store._items["attacks/fgsm/2"]["key"])
    del key["draw"], key["protocol"]  # as the committed studies' files hold it (default batch size)
    store.put("attacks/fgsm/2", key, {"legacy": True, "top1": 0.5})
    stored = dict(ResultStore(store.path)._items["attacks/fgsm/2"])
    assert run(6)["attacks"]["fgsm"]["2"] == {"legacy": True, "top1": 0.5}  # same draw: read
    assert ResultStore(store.path)._items["attacks/fgsm/2"] == stored  # as it was: its hash unchanged
    out = run(8)  # another draw: the legacy item is not this draw's first 4 images
    assert "legacy" not in out["attacks"]["fgsm"]["2"]
    assert store._items["attacks/fgsm/2"]["key"]["draw"] == 8
    again = run(6)  # and the draw-8 item is not taken for the draw-6 one either
    assert store._items["attacks/fgsm/2"]["key"]["draw"] == 6
    assert again["attacks"]["fgsm"]["2"]["top1"] == pytest.approx(
        evaluate_image_suites(model, data, _suites(small, Attack("pgd", (2 / 255,), n=6)),
                              ResultStore(tmp_path / "fresh.json"), {"w": 1}, log=lambda m: None,
                              progress=False)["attacks"]["fgsm"]["2"]["top1"])


def test_an_attack_in_batches_of_another_size_is_another_item(tmp_path):
    """A randomised attack seeds each batch once: PGD's random starts, and so its results, depend on the
    batch size. Batches of the default size keep the key they always had."""
    from kpca_attention.tasks.classification.suites import ATTACK_BATCH_SIZE, attack_key

    model, (x, y) = _model(), _images(10)
    data = TensorDataset(x, y)
    pgd = Attack("pgd", (8 / 255,), n=8, options={"steps": 2})

    def run(batch: int) -> dict:
        store = ResultStore(tmp_path / f"b{batch}.json")
        suites = ImageSuites(clean=8, attacks=(pgd,), batch_size=8, attack_batch_size=batch)
        evaluate_image_suites(model, data, suites, store, {"w": 1}, log=lambda m: None, progress=False)
        return store._items["attacks/pgd-steps2/8"]

    small, whole = run(3), run(8)
    assert small["key"]["batch"] == 3 and whole["key"]["batch"] == 8
    assert small["result"]["correct"] != whole["result"]["correct"] or small["result"]["mean_norm"] != \
        whole["result"]["mean_norm"]  # other random starts after the first batch
    assert "batch" not in attack_key(pgd, 8 / 255, 1, 8, ATTACK_BATCH_SIZE)
