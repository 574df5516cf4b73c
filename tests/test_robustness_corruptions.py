"""Corruptions through imagecorruptions: validation, determinism, small/gray images, dataset views,
disk cache, ImageNet-C folder tree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from kpca_attention.robustness import corruptions as C


def _gray(h: int = 28, w: int = 28, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # a smooth-ish image: a bright square on a dark background plus texture
    img = np.full((h, w, 1), 30, np.uint8)
    img[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4] = 200
    return np.clip(img.astype(int) + rng.integers(0, 20, img.shape), 0, 255).astype(np.uint8)


def test_names_and_severities_are_validated():
    assert len(C.COMMON_CORRUPTIONS) == 15 and len(C.ALL_CORRUPTIONS) == 19
    with pytest.raises(ValueError, match="valid names: gaussian_noise, shot_noise"):
        C.corrupt(_gray(), "gaussian_nosie", 1)
    for bad in (0, 6, 2.5, True, "3"):
        with pytest.raises(ValueError, match="severity must be an integer in 1..5"):
            C.corrupt(_gray(), "fog", bad)
    with pytest.raises(TypeError, match="uint8"):
        C.corrupt(_gray().astype(np.float32), "fog", 1)
    with pytest.raises(ValueError, match="subset"):
        C.corruption_names("weather")


def test_every_corruption_runs_on_28px_gray_and_keeps_shape():
    img = _gray()
    for name in C.ALL_CORRUPTIONS:
        out = C.corrupt(img, name, 5, seed=1)
        assert out.shape == img.shape and out.dtype == np.uint8, name
        assert np.abs(out.astype(int) - img).mean() > 1.0, f"{name} did not change the image"


def test_rgb_and_tiny_images():
    rgb = np.repeat(_gray(40, 36), 3, axis=2)
    assert C.corrupt(rgb, "motion_blur", 3, seed=0).shape == (40, 36, 3)
    tiny = _gray(8, 8)[..., 0]  # (H, W) 8 px, like scikit-learn digits
    out = C.corrupt(tiny, "gaussian_noise", 3, seed=0)
    assert out.shape == (8, 8)
    assert not np.array_equal(out, tiny)


def test_seeded_corruption_is_deterministic_and_leaves_global_rng_alone():
    img = _gray()
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    for name in ("gaussian_noise", "impulse_noise", "glass_blur", "snow", "elastic_transform"):
        a, b = C.corrupt(img, name, 3, seed=7), C.corrupt(img, name, 3, seed=7)
        assert np.array_equal(a, b), name
        assert not np.array_equal(a, C.corrupt(img, name, 3, seed=8)), name
    assert np.array_equal(np.random.get_state()[1], before)
    # unseeded calls draw from the global RNG, as imagecorruptions does
    assert not np.array_equal(C.corrupt(img, "gaussian_noise", 3), C.corrupt(img, "gaussian_noise", 3))


def test_gray_round_trip_uses_luma_and_severity_orders_noise():
    img = _gray()
    noise = [np.abs(C.corrupt(img, "gaussian_noise", s, seed=0).astype(int) - img).mean() for s in (1, 3, 5)]
    assert noise[0] < noise[1] < noise[2]


class _Base(torch.utils.data.Dataset):
    def __init__(self, n: int = 6):
        self.images = [torch.from_numpy(_gray(seed=i)).permute(2, 0, 1).float() / 255 for i in range(n)]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], i % 3


def test_corrupted_dataset_is_deterministic_per_seed_and_index():
    base = _Base()
    a = C.CorruptedDataset(base, "shot_noise", 4, seed=0)
    b = C.CorruptedDataset(base, "shot_noise", 4, seed=0)
    x0, y0 = a[2]
    assert x0.shape == (1, 28, 28) and x0.dtype == torch.float32 and 0 <= x0.min() and x0.max() <= 1
    assert y0 == 2
    assert torch.equal(x0, b[2][0])
    assert not torch.equal(x0, C.CorruptedDataset(base, "shot_noise", 4, seed=1)[2][0])
    # the same clean image at two indices gets different noise
    base.images[3] = base.images[2]
    assert not torch.equal(a[2][0], a[3][0])
    with pytest.raises(ValueError, match="valid names"):
        C.CorruptedDataset(base, "rain", 1)


def test_cache_is_written_once_and_read_back(tmp_path, monkeypatch):
    base = _Base(4)
    ds = C.CorruptedDataset(base, "glass_blur", 2, seed=3, cache_dir=tmp_path)
    fresh = [ds[i][0] for i in range(4)]
    path = ds.build_cache(progress=False)
    assert path.exists() and path.with_suffix(".labels.npy").exists()
    assert not list(tmp_path.glob("*.tmp"))

    def boom(*a, **k):
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(C, "corrupt", boom)
    again = C.CorruptedDataset(base, "glass_blur", 2, seed=3, cache_dir=tmp_path)
    assert again.build_cache(progress=False) == path
    for i in range(4):
        x, y = again[i]
        assert torch.equal(x, fresh[i]) and y == i % 3
    # another base data set gets another cache file
    other = _Base(5)
    assert C.CorruptedDataset(other, "glass_blur", 2, seed=3, cache_dir=tmp_path).cache_path != path
    # a subset with the same length and ends but other images in its middle: another file
    from torch.utils.data import Subset

    ten = _Base(10)
    paths = {C.CorruptedDataset(Subset(ten, ids), "glass_blur", 2, seed=3, cache_dir=tmp_path).cache_path
             for ids in ([0, 3, 9], [0, 4, 9], [0, 4, 9])}
    assert len(paths) == 2
    # and other images of corrupt() (a fix, its version bumped) another file, and the results made on
    # them another key (nothing added at version 1: every key stored so far)
    assert C.images_version_key() == {}
    monkeypatch.setattr(C, "IMAGES_VERSION", C.IMAGES_VERSION + 1)
    assert C.CorruptedDataset(base, "glass_blur", 2, seed=3, cache_dir=tmp_path).cache_path != path
    assert C.images_version_key() == {"images_version": 2}


def test_partial_cache_is_repaired(tmp_path, monkeypatch):
    """A cache missing only its labels file used to count as built: build_cache did nothing and every
    later run recomputed the corruptions on the fly, silently. Now reading warns and build_cache
    rewrites the labels from the base data set, without corrupting anything again."""
    base = _Base(4)
    ds = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    path = ds.build_cache(progress=False)
    want = [ds[i] for i in range(4)]
    ds.labels_path.unlink()

    calls = []
    real = C.corrupt
    monkeypatch.setattr(C, "corrupt", lambda *a, **k: calls.append(1) or real(*a, **k))
    partial = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    assert partial.cache_problem() == "no labels file"
    with pytest.warns(UserWarning, match="incomplete \\(no labels file\\).*build_cache\\(\\) repairs it"):
        x, y = partial[2]
    assert torch.equal(x, want[2][0]) and y == want[2][1] and len(calls) == 1  # computed on the fly
    assert partial.build_cache(progress=False) == path
    assert len(calls) == 1 and partial.cache_problem() is None  # labels only: no corruption recomputed
    fresh = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    for i in range(4):
        x, y = fresh[i]
        assert torch.equal(x, want[i][0]) and y == want[i][1]
    assert len(calls) == 1 and not list(tmp_path.glob("*.tmp"))

    # damaged images (truncated file): everything is recomputed, the same images come back
    path.write_bytes(path.read_bytes()[:100])
    again = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    assert "unreadable images file" in again.cache_problem()
    again.build_cache(progress=False)
    assert len(calls) == 1 + 4 and again.cache_problem() is None
    assert all(torch.equal(again[i][0], want[i][0]) for i in range(4))


def test_dataset_options_are_validated():
    base = _Base(2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            C.CorruptedDataset(base, "fog", 1, seed=bad)
    with pytest.raises(ValueError, match="seed must be an integer >= 0 or None; got -2"):
        C.corrupt(_gray(), "fog", 1, seed=-2)
    with pytest.raises(ValueError, match="the string 'fog'"):
        C.corrupted_views(base, "fog")
    with pytest.raises(ValueError, match="non-empty"):
        C.corrupted_views(base, ["fog"], [])


def test_imagenet_c_folder(tmp_path):
    for wnid in ("n01440764", "n01443537"):
        d = tmp_path / "fog" / "3" / wnid
        d.mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(d / "a.JPEG")
    ds = C.imagenet_c_folder(tmp_path, "fog", 3)
    assert len(ds) == 2 and ds.classes == ["n01440764", "n01443537"]
    x, y = ds[1]
    assert x.shape == (3, 8, 8) and y == 1
    with pytest.raises(FileNotFoundError, match="<root>/<corruption>/<severity>"):
        C.imagenet_c_folder(tmp_path, "fog", 4)
    with pytest.raises(ValueError, match="valid names"):
        C.imagenet_c_folder(tmp_path, "haze", 3)
