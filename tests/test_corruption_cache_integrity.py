"""The on-disk cache of corrupted images is checked against the SHA-256 recorded when it was written: a file
changed since (zeroed with the same shape and dtype, one byte flipped) or without a recorded hash (a cache
written before hashes were) is rebuilt, with one warning, never read as the images. Before, only dtype,
shape and length were checked, and a model added to a ``robustness`` folder was scored on black images."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from run_fixtures import untrained_run
from typer.testing import CliRunner

from kpca_attention.cli import app
from kpca_attention.robustness import corruptions as C
from kpca_attention.robustness.store import ResultStore

pytestmark = pytest.mark.usefixtures("single_thread_module")


class _Base(torch.utils.data.Dataset):
    def __init__(self, n: int = 4):
        rng = np.random.default_rng(0)
        self.images = [torch.from_numpy(rng.integers(0, 256, (1, 28, 28))).float() / 255 for _ in range(n)]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], i % 3


def _built(tmp_path):
    """A built cache, the images it holds computed without it, and the bytes of its two files."""
    base = _Base()
    want = [C.CorruptedDataset(base, "gaussian_noise", 3, seed=1)[i] for i in range(len(base))]
    ds = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    ds.build_cache(progress=False)
    assert ds.cache_problem() is None
    assert C.hash_path(ds.cache_path).is_file() and C.hash_path(ds.labels_path).is_file()
    return base, want, ds.cache_path.read_bytes(), ds.labels_path.read_bytes()


def _check_rebuilt(base, want, images, labels, tmp_path, problem):
    """A new view of the damaged cache names ``problem``, computes its items without it (warning once), and
    build_cache rewrites the files as they were (warning); the items are then those of a fresh cache."""
    ds = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    assert problem in (ds.cache_problem() or "")
    with pytest.warns(UserWarning, match="incomplete"):
        assert all(torch.equal(ds[i][0], want[i][0]) and ds[i][1] == want[i][1] for i in range(len(base)))
    with pytest.warns(UserWarning, match=r"was not usable \(.*\): rebuilding it"):
        ds.build_cache(progress=False)
    assert ds.cache_path.read_bytes() == images and ds.labels_path.read_bytes() == labels
    fresh = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    assert fresh.cache_problem() is None
    for i in range(len(base)):
        x, y = fresh[i]
        assert torch.equal(x, want[i][0]) and y == want[i][1]


def test_zeroed_images_with_the_same_shape_are_rebuilt(tmp_path):
    base, want, images, labels = _built(tmp_path)
    path = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path).cache_path
    old = np.load(path)
    np.save(path, np.zeros_like(old))  # same dtype and shape: passed every check before
    _check_rebuilt(base, want, images, labels, tmp_path, "damaged images file")


@pytest.mark.parametrize("which", ["cache_path", "labels_path"])
def test_a_flipped_byte_is_rebuilt(tmp_path, which):
    base, want, images, labels = _built(tmp_path)
    path = getattr(C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path), which)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x10  # the last image's last pixel / the last label's high byte
    path.write_bytes(bytes(raw))
    what = "images" if which == "cache_path" else "labels"
    _check_rebuilt(base, want, images, labels, tmp_path, f"damaged {what} file")


def test_a_cache_without_recorded_hashes_is_not_trusted(tmp_path):
    base, want, images, labels = _built(tmp_path)
    ds = C.CorruptedDataset(base, "gaussian_noise", 3, seed=1, cache_dir=tmp_path)
    np.save(ds.cache_path, np.zeros_like(np.load(ds.cache_path)))
    for p in (ds.cache_path, ds.labels_path):  # as a cache written before hashes were recorded
        C.hash_path(p).unlink()
    _check_rebuilt(base, want, images, labels, tmp_path, "images file without a recorded SHA-256")


def test_robustness_scores_an_added_model_on_the_images_not_on_a_zeroed_cache(tmp_path):
    """The reproduction: two models, the cache zeroed, a third model added: it is scored as on a fresh
    cache, and the cache holds the corrupted images again."""
    runs = [untrained_run(tmp_path / "runs" / f"m{i}", "symvit_mini_patch4_28", i) for i in range(3)]

    def robustness(out, *models):
        res = CliRunner().invoke(app, ["robustness", *map(str, models), "--out", str(out), "--n", "16",
                                       "--corruptions", "fog", "--severities", "1", "--no-progress",
                                       "--device", "cpu"])
        assert res.exit_code == 0, (res.output[-3000:], res.exception)

    robustness(tmp_path / "rb1", *runs[:2])
    [cache] = [p for p in (tmp_path / "rb1" / "cache").glob("*.npy") if not p.name.endswith(".labels.npy")]
    images = cache.read_bytes()
    np.save(cache, np.zeros_like(np.load(cache)))
    with pytest.warns(UserWarning, match="damaged images file.*rebuilding it"):
        robustness(tmp_path / "rb1", *runs)
    assert cache.read_bytes() == images
    robustness(tmp_path / "fresh", runs[2])

    def fog(out):
        return ResultStore(out / "results" / "m2.json").items()["corruptions/fog/1"]

    got, fresh = fog(tmp_path / "rb1"), fog(tmp_path / "fresh")
    assert got["n"] == 16 and got == fresh  # per-example correctness and accuracies
