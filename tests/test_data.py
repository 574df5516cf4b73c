"""Datasets: images in [0, 1] with the right statistics, clear errors, text corpora and vocabularies."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
import torch
from PIL import Image

from kpca_attention.data import build_image_dataset, dataset_info
from kpca_attention.data import images as images_mod
from kpca_attention.data import text as text_mod
from kpca_attention.data.text import TextCorpus, Vocab, load_corpus, tokenize_words

# ----------------------------------------------------------------------------- images


def test_digits_split_and_range():
    tr = build_image_dataset("digits", "train")
    te = build_image_dataset("digits", "test")
    assert len(tr) + len(te) == 1797 and len(tr) == int(0.8 * 1797)
    assert len(build_image_dataset("digits", "val")) == len(te)
    x, y = tr[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and isinstance(y, int)
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    native = build_image_dataset("digits", "train", img_size=8)
    assert native[0][0].shape == (1, 8, 8)
    # the split is a fixed partition: no training image appears in the test set
    test_native = build_image_dataset("digits", "test", img_size=8)
    seen = set(map(bytes, native.images.flatten(1).numpy()))
    overlap = sum(bytes(row) in seen for row in test_native.images.flatten(1).numpy())
    assert overlap < 10  # digits has a few exact duplicate images, nothing more
    info = dataset_info("digits")
    pix = torch.cat([native.images, test_native.images]).float().div(255)
    assert info.mean[0] == pytest.approx(float(pix.mean()), abs=1e-3)
    assert info.std[0] == pytest.approx(float(pix.std()), abs=1e-3)


def test_subset_is_seeded_and_augmentation_keeps_range():
    a = build_image_dataset("digits", "train", subset=50)
    b = build_image_dataset("digits", "train", subset=50)
    c = build_image_dataset("digits", "train", subset=50, subset_seed=1)
    first = build_image_dataset("digits", "train", subset=50, subset_seed=None)
    assert len(a) == 50 and a.indices == b.indices and a.indices != c.indices
    assert first.indices == list(range(50))
    aug = build_image_dataset("digits", "train", train_transform=True, subset=8)
    torch.manual_seed(0)
    xs = torch.stack([aug[i][0] for i in range(8)])
    assert xs.shape == (8, 1, 28, 28) and xs.min() >= 0 and xs.max() <= 1
    with pytest.raises(ValueError, match="subset"):
        build_image_dataset("digits", "train", subset=0)


def test_fashion_mnist_from_debian_package():
    tr = build_image_dataset("fashion-mnist", "train")
    te = build_image_dataset("fashion-mnist", "test")
    assert len(tr) == 60000 and len(te) == 10000
    x, y = te[0]
    assert x.shape == (1, 28, 28) and 0 <= y < 10
    info = dataset_info("fashion-mnist")
    assert info.num_classes == 10 and info.in_chans == 1 and info.class_names[9] == "Ankle boot"
    pix = tr.images[::10].float().div(255)  # every 10th image: statistics match the documented ones
    assert float(pix.mean()) == pytest.approx(info.mean[0], abs=3e-3)
    assert float(pix.std()) == pytest.approx(info.std[0], abs=3e-3)
    assert torch.bincount(te.labels, minlength=10).tolist() == [1000] * 10
    assert build_image_dataset("fashion-mnist", "test", img_size=32)[0][0].shape == (1, 32, 32)


def test_missing_and_unknown_datasets(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"apt-get install dataset-fashion-mnist") as e:
        build_image_dataset("fashion-mnist", "train", root=tmp_path)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(ValueError, match="valid: fashion-mnist, digits"):
        build_image_dataset("mnist", "train")
    with pytest.raises(ValueError, match="split"):
        build_image_dataset("digits", "validation")
    with pytest.raises(ValueError, match="root= is required"):
        build_image_dataset("imagenet", "val")
    with pytest.raises(FileNotFoundError, match="ImageFolder"):
        build_image_dataset("imagefolder", "train", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        build_image_dataset("cifar10", "train", root=tmp_path)


def test_idx_reader(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 8, 3]) + np.array([2, 3, 4], dtype=">i4").tobytes()
    path = tmp_path / "x-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(header + arr.tobytes())
    np.testing.assert_array_equal(images_mod._read_idx(path), arr)
    bad = tmp_path / "bad-idx3-ubyte"
    bad.write_bytes(header + arr.tobytes()[:-3])
    with pytest.raises(ValueError, match="truncated"):
        images_mod._read_idx(bad)


def _tree(root, split, classes, n=2, size=20):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / split / c).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / split / c / f"{i}.png")


def test_imagefolder_and_cifar_folders(tmp_path):
    _tree(tmp_path, "train", ["cat", "dog"])
    _tree(tmp_path, "val", ["cat", "dog"])
    ev = build_image_dataset("imagefolder", "val", root=tmp_path, img_size=32)
    x, y = ev[0]
    assert x.shape == (3, 32, 32) and 0 <= float(x.min()) and float(x.max()) <= 1 and y == 0
    torch.manual_seed(0)
    tr = build_image_dataset("imagefolder", "train", root=tmp_path, img_size=32, train_transform=True)
    assert tr[1][0].shape == (3, 32, 32)
    info = dataset_info("imagefolder", root=tmp_path)
    assert info.num_classes == 2 and info.class_names == ("cat", "dog")
    cifar = tmp_path / "cifar"
    _tree(cifar, "train", ["airplane", "ship"], size=32)
    _tree(cifar, "test", ["airplane", "ship"], size=32)
    ds = build_image_dataset("cifar10", "test", root=cifar)
    assert len(ds) == 4 and ds[0][0].shape == (3, 32, 32)


# ----------------------------------------------------------------------------- text


def test_bible_corpus_split():
    c = load_corpus("bible-kjv")
    lines = {s: c.split(s).splitlines() for s in ("train", "valid", "test")}
    n = sum(len(v) for v in lines.values())
    assert n == 31102  # every verse of the KJV, once
    for s in ("valid", "test"):
        assert 0.04 < len(lines[s]) / n < 0.06
    assert lines["train"][0].startswith("In the beginning God created the heaven and the earth .")
    assert not any(re.match(r"^\d?[A-Za-z]+\d+:\d+", ln) for v in lines.values() for ln in v[:200])
    # the split is by whole chapters: Genesis 19 (chapter index 18) is in valid
    assert lines["valid"][0].startswith("And there came two angels to Sodom at even")
    assert load_corpus("bible") is c  # cached


def test_bible_missing_command(monkeypatch, tmp_path):
    monkeypatch.setattr(text_mod.shutil, "which", lambda name: None)
    text_mod._load_bible.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="apt-get install bible-kjv"):
            load_corpus("bible-kjv")
    finally:
        text_mod._load_bible.cache_clear()
    saved = tmp_path / "kjv.txt"
    saved.write_text("Ge1:1 In the beginning God created the heaven and the earth.\n"
                     "Ge2:1 Thus the heavens and the earth were finished, and all the host of them.\n")
    c = load_corpus("bible-kjv", root=saved)
    assert c.train.startswith("In the beginning") and "finished , and" in c.train
    with pytest.raises(ValueError, match="valid: bible-kjv"):
        load_corpus("shakespeare")


def test_a_corpus_of_your_own_is_one_entry(monkeypatch):
    from kpca_attention.data import text

    monkeypatch.setitem(text.CORPORA, "tiny", lambda root: TextCorpus("a b\n", "b a\n", "a a\n", name="tiny"))
    assert load_corpus("TINY").valid == "b a\n"
    with pytest.raises(ValueError, match="corpus 'tinier'; valid: bible-kjv, wikitext-103, wikitext-2, tiny"):
        load_corpus("tinier")


def test_wikitext_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="wiki.train.tokens"):
        load_corpus("wikitext-103", root=tmp_path)
    for s in ("train", "valid", "test"):
        (tmp_path / f"wiki.{s}.tokens").write_text(f" = Title = \n\n The {s} text @-@ here <unk> . \n")
    c = load_corpus("wikitext-103", root=tmp_path)
    v = Vocab.build(c.train)
    ids = v.encode(c.valid)
    assert ids[v.tokenize(c.valid).index("valid")] == v.unk_id  # unseen word
    assert "@-@" in v.stoi and v.stoi["<unk>"] == 0
    assert (ids == v.eos_id).sum() == 3  # one <eos> per line, empty lines included


def test_vocab_word_and_char(tmp_path):
    text = "the cat sat\nthe dog sat on the mat\n"
    v = Vocab.build(text, min_freq=2)
    assert v.itos == ["<unk>", "<eos>", "the", "sat"]
    ids = v.encode(text)
    assert ids.dtype == torch.long and ids.tolist() == [2, 0, 3, 1, 2, 0, 3, 0, 2, 0, 1]
    assert v.decode(v.encode("the sat\n")) == "the sat\n"
    assert len(Vocab.build(text, max_size=5)) == 5
    full = Vocab.build(text)
    assert full.decode(full.encode(text)) == text
    path = tmp_path / "vocab.json"
    full.save(path)
    assert Vocab.load(path).itos == full.itos
    ch = Vocab.build(text, level="char")
    assert ch.eos is None and ch.decode(ch.encode(text)) == text and "\n" in ch.stoi
    assert ch.encode("z").tolist() == [ch.unk_id]
    with pytest.raises(ValueError, match="level"):
        Vocab.build(text, level="bpe")
    with pytest.raises(ValueError, match="out of range"):
        full.decode([99])
    # a word vocabulary without an end-of-line token (a user's JSON may omit it): no token stands for
    # the line ends, none of its own tokens is mistaken for one, and decode says nothing about lines
    no_eos = Vocab(["<unk>", "<eos>", "the", "sat"], eos=None)
    assert no_eos.encode("the sat\nthe <eos>").tolist() == [2, 3, 2, 1]
    assert no_eos.decode(no_eos.encode("the sat\nthe <eos>")) == "the sat the <eos>"
    (tmp_path / "noeos.json").write_text('{"level": "word", "itos": ["<unk>", "the"]}')
    assert Vocab.load(tmp_path / "noeos.json").encode("the the\nthe").tolist() == [1, 1, 1]
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not a vocabulary"):
        Vocab.load(tmp_path / "bad.json")


def test_tokenize_words_and_corpus_split_names():
    assert tokenize_words("earth, and void; Pharaoh's fathers' (sic)") == [
        "earth", ",", "and", "void", ";", "Pharaoh's", "fathers'", "(", "sic", ")"]
    c = TextCorpus("a", "b", "c")
    with pytest.raises(ValueError, match="valid, test"):
        c.split("dev")


def test_items_without_randomness_skip_the_per_item_seeding() -> None:
    # Fashion-MNIST without augmentation draws no random numbers: the training loader returns its items
    # unseeded (0.6 ms per item saved) and the batches are the very ones the seeded path gives; with
    # augmentation (or a dataset that does not say) every item is still seeded.
    from torch.utils.data import Subset

    from kpca_attention.data.images import TensorImageDataset
    from kpca_attention.train.data import SeededAugmentation, draws_random, seeded_rngs

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 1, 8, 8), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (40,), generator=g)
    plain = TensorImageDataset(images, labels, [str(i) for i in range(10)])
    flipped = TensorImageDataset(images, labels, [str(i) for i in range(10)],
                                 transform=lambda x: x.flip(-1) if torch.rand(()) < 0.5 else x)
    assert not draws_random(plain) and not draws_random(Subset(plain, range(10)))
    assert draws_random(flipped) and draws_random(Subset(flipped, range(10)))
    assert draws_random(torch.utils.data.TensorDataset(images))  # says nothing: seeded
    fast = SeededAugmentation(plain)
    assert not fast.seeded and SeededAugmentation(flipped).seeded
    for i, seed in ((0, 5), (7, 123), (39, 2**40)):
        with seeded_rngs(seed):
            x_ref, y_ref = plain[i]
        x, y = fast[(i, seed)]
        assert torch.equal(x, x_ref) and y == y_ref
    state = torch.get_rng_state()
    aug = SeededAugmentation(flipped)
    a, b = aug[(3, 11)][0], aug[(3, 11)][0]
    assert torch.equal(a, b) and torch.equal(torch.get_rng_state(), state)  # seeded, global RNG untouched


@pytest.mark.parametrize("size,native,hflip", [(28, 28, 0.5), (28, 8, 0.0), (32, 32, 0.5), (28, 28, 0.2),
                                               (28, 28, 1.0)])
def test_crop_flip_draws_what_torchvision_draws(size, native, hflip) -> None:
    # The small images' training transform in one batched step: image i with seed s equals torchvision's
    # Resize / RandomCrop(padding) / RandomHorizontalFlip under torch.manual_seed(s), to the bit (so the
    # batches of every run trained before the batched path are the same), and the one-image call draws
    # from the global generator exactly as torchvision does.
    from torchvision.transforms import v2

    from kpca_attention.data.images import CropFlip
    from kpca_attention.train.data import seeded_rngs

    g = torch.Generator().manual_seed(size + native)
    images = torch.rand(40, 1, native, native, generator=g)
    seeds = [int(torch.randint(0, 2**62, (), generator=g)) for _ in range(40)]
    steps = [v2.Resize((size, size), antialias=True)] if size != native else []
    steps += [v2.RandomCrop(size, padding=max(1, size // 8))]
    steps += [v2.RandomHorizontalFlip(hflip)] if hflip else []
    reference = v2.Compose(steps)
    expected, alone = [], []
    transform = CropFlip(size, native, train=True, hflip=hflip)
    for x, s in zip(images, seeds, strict=True):
        with seeded_rngs(s):
            expected.append(reference(x))
        with seeded_rngs(s):
            alone.append(transform(x))
    expected = torch.stack(expected)
    batch = transform.batch(images, seeds)
    assert batch.shape == (40, 1, size, size) and torch.equal(batch, expected)
    assert torch.equal(torch.stack(alone), expected)
    assert not torch.equal(batch, transform.batch(images, [s + 1 for s in seeds]))  # the seeds decide
    unflipped = CropFlip(size, native, train=True, hflip=0.0).batch(images, seeds)  # same crops, no flips
    flipped = sum(not torch.equal(b, u) for b, u in zip(batch, unflipped, strict=True))
    expected_flips = {0.0: flipped == 0, 0.2: 2 <= flipped <= 16, 0.5: 5 < flipped < 35, 1.0: flipped == 40}
    assert expected_flips[hflip], flipped
    evaluation = CropFlip(size, native, train=False, hflip=hflip)
    assert not evaluation.random and transform.random
    with pytest.raises(ValueError, match="40 images but 3 seeds"):
        transform.batch(images, seeds[:3])


def test_in_memory_batches_are_the_per_item_batches() -> None:
    # A TensorImageDataset (behind the validation split's Subsets) makes a whole batch in one step from
    # indices and seeds: the same values as its items one by one under the per-item seeding, and the
    # dataset stays usable with plain indexing; a transform without a batch method keeps the per-item path.
    from torch.utils.data import Subset

    from kpca_attention.data.images import CropFlip, TensorImageDataset
    from kpca_attention.train.data import SeededAugmentation, seeded_rngs, seeded_source

    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (30, 1, 28, 28), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (30,), generator=g)
    ds = TensorImageDataset(images, labels, [str(i) for i in range(10)], CropFlip(28, 28, True, 0.5))
    nested = Subset(Subset(ds, list(range(5, 30))), [3, 0, 7, 24, 11])
    source, index_map = seeded_source(nested)
    assert source is ds and index_map.tolist() == [8, 5, 12, 29, 16]
    seeds = [5, 6, 7, 8, 2**50]
    x, y = ds.seeded_batch(index_map, seeds)
    aug = SeededAugmentation(nested)
    for k, s in enumerate(seeds):
        with seeded_rngs(s):
            xk, yk = ds[int(index_map[k])]
        assert torch.equal(x[k], xk) and int(y[k]) == yk
        xa, ya = aug[(k, s)]
        assert torch.equal(xa, xk) and ya == yk
    lam = TensorImageDataset(images, labels, [str(i) for i in range(10)], transform=lambda t: t.flip(-1))
    assert seeded_source(Subset(lam, [0])) is None and SeededAugmentation(lam).source is None
    with pytest.raises(TypeError, match="no batch"):
        lam.seeded_batch(torch.tensor([0]), [0])
    plain = TensorImageDataset(images, labels, [str(i) for i in range(10)])
    assert not plain.random_items and plain.seeded_items
    assert torch.equal(plain.seeded_batch(torch.tensor([4]), [9])[0][0], plain[4][0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_in_memory_batches_match_the_cpu_ones() -> None:
    # DeviceBatches on a GPU: the images copied there once, gathered, cropped and flipped there - the same
    # values as on the CPU (the draws are made on the host from the same seeds)
    from kpca_attention.data.images import CropFlip, TensorImageDataset

    g = torch.Generator().manual_seed(2)
    images = torch.randint(0, 256, (64, 1, 8, 8), dtype=torch.uint8, generator=g)
    ds = TensorImageDataset(images, torch.arange(64) % 10, [str(i) for i in range(10)],
                            CropFlip(28, 8, True, 0.5))
    idx, seeds = torch.tensor([3, 1, 60, 7]), [11, 12, 13, 2**61]
    x_cpu, y_cpu = ds.seeded_batch(idx, seeds)
    x_gpu, y_gpu = ds.seeded_batch(idx, seeds, "cuda")
    assert x_gpu.is_cuda and y_gpu.is_cuda
    torch.testing.assert_close(x_gpu.cpu(), x_cpu, rtol=0, atol=1e-6)  # the resize may round differently
    assert torch.equal(y_gpu.cpu(), y_cpu)


def test_every_subset_is_the_one_seeded_draw() -> None:
    """A dataset's subset=, a study's fixed test images and a validation sample hold the same indices
    for the same (total, n, seed) - one draw, data/sampling.py - and that draw stays what the committed
    per-example files were made with (the first 8 of 10,000 with seed 0)."""
    from kpca_attention.data.sampling import seeded_indices
    from kpca_attention.tasks import seeded_sample
    from kpca_attention.tasks.classification.suites import fixed_subset

    assert seeded_indices(10000, 8, 0) == [429, 1729, 1917, 2890, 4919, 6044, 7532, 9399]
    full = build_image_dataset("digits", "test")
    sub = build_image_dataset("digits", "test", subset=50)
    want = seeded_indices(len(full), 50, 0)
    assert sub.indices == want and fixed_subset(full, 50, 0).indices == want
    assert seeded_sample(list(range(len(full))), 50, 0) == want
    assert seeded_sample([5, 6, 7], 10, 0) == [5, 6, 7]  # n not smaller: all of them
    with pytest.raises(ValueError, match="cannot draw"):
        seeded_indices(3, 4, 0)


@pytest.mark.parametrize("hflip", [0.0, 0.5, 1.0])
def test_the_configs_flip_probability_reaches_the_small_images_transform(hflip) -> None:
    """A review found TrainConfig.hflip recorded but never applied to Fashion-MNIST, CIFAR or the digits:
    `--set hflip=0.0` still mirrored half the images. The task's builder now passes it on."""
    from dataclasses import replace

    from kpca_attention import tasks
    from kpca_attention.train.config import get_preset

    cfg = replace(get_preset("digits-cpu"), hflip=hflip)
    train = tasks.get("vision").builder(cfg)("train", True, 64)
    transform = train.dataset.transform if hasattr(train, "dataset") else train.transform
    assert transform.hflip == hflip
    x = torch.rand(16, 1, 8, 8)
    flips = sum(not torch.equal(a, b) for a, b in zip(transform.batch(x, list(range(16))),
                                                       _without_flip(transform).batch(x, list(range(16))),
                                                       strict=True))
    assert {0.0: flips == 0, 0.5: 0 < flips < 16, 1.0: flips == 16}[hflip], flips


def _without_flip(transform):
    from kpca_attention.data.images import CropFlip

    return CropFlip(transform.size, transform.native, transform.train, 0.0)


def test_deit_transform_options_are_refused_where_they_would_be_ignored() -> None:
    from dataclasses import replace

    from kpca_attention import tasks
    from kpca_attention.train.config import get_preset

    cfg = replace(get_preset("digits-cpu"), auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25)
    build = tasks.get("vision").builder(cfg)
    says = r"reprob=0.25: DeiT's transform options apply to imagenet and imagefolder only; digits'"
    with pytest.raises(ValueError, match=r"auto_augment='rand-m9-mstd0.5-inc1', " + says):
        build("train", True, 64)
    assert len(build("test", False, None)) > 0  # evaluation builds no training transform: not refused
