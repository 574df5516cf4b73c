"""What the models and datasets are: RPC's ablation defaults, the family SymViT's symmetry, preset sizes,
normalisation constants, held-out splits that never read training data, the Segmenter decoder, scene labels,
perplexity in eval mode. Each test fails on a mutant no earlier test caught (the fifth mutation review,
2026-11-30, /work/notes/review/mutation5.md); expected values are the published constants and hand-built
references, not the code under test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kpca_attention  # noqa: F401  (registers the models)
from kpca_attention.attention import RPCAttention
from kpca_attention.models import NormalizedModel, create_lm, create_model, perplexity

META = dict(device="meta")


# ----------------------------------------------------------------------------- vit.py

def test_rpc_models_default_to_the_full_pap_and_pass_the_ablation_flags_through():
    """V05-V07: the registered RPC models run PAP with S and the dual update unless asked otherwise."""
    for name in ("rpc_symvit_mini_patch4_28", "rpc_vit_mini_patch4_28", "rpc_symasym_vit_mini_patch4_28"):
        a = create_model(name).blocks[0].attn
        assert isinstance(a, RPCAttention) and (a.sparse, a.dual) == (True, True), name
    a = create_model("rpc_symvit_mini_patch4_28", rpc_sparse=False).blocks[0].attn
    assert (a.sparse, a.dual) == (False, True)
    a = create_model("rpc_symvit_mini_patch4_28", rpc_dual=False).blocks[0].attn
    assert (a.sparse, a.dual) == (True, False)


def test_small_image_models_carry_their_datasets_statistics():
    """V08/V09/V15: the mini models' pretrained cfg (used when a checkpoint is not a NormalizedModel and by
    kpca's image loader) has the dataset's published statistics and no centre crop."""
    from kpca_attention.data.images import dataset_info

    fm = create_model("symvit_mini_patch4_28", **META).pretrained_cfg
    assert tuple(fm["mean"]) == pytest.approx(dataset_info("fashion-mnist").mean)
    assert tuple(fm["std"]) == pytest.approx(dataset_info("fashion-mnist").std)
    cf = create_model("symvit_mini_patch4_32", **META).pretrained_cfg
    # CIFAR-10 training-set per-channel statistics (the 0.2023/0.1994/0.2010 "std" is a known mistake)
    assert tuple(cf["mean"]) == pytest.approx((0.4914, 0.4822, 0.4465), abs=1e-4)
    assert tuple(cf["std"]) == pytest.approx((0.2470, 0.2435, 0.2616), abs=1e-4)
    assert fm["crop_pct"] == 1.0 and cf["crop_pct"] == 1.0


def test_documented_widths_and_heads():
    """V10-V12: mini = 64 wide, 4 heads of width 16, MLP 128; DeiT-tiny = 3 heads of 64."""
    for name in ("symvit_mini_patch4_28", "vit_mini_patch4_32"):
        m = create_model(name, **META)
        assert len(m.blocks) == 4 and m.embed_dim == 64
        assert m.blocks[0].attn.num_heads == 4 and m.blocks[0].attn.head_dim == 16
        assert m.blocks[0].mlp.fc1.out_features == 128
    t = create_model("symvit_tiny_patch16_224", **META)
    assert t.blocks[0].attn.num_heads == 3 and t.blocks[0].attn.head_dim == 64
    assert t.blocks[0].mlp.fc1.out_features == 768


def test_features_only_defaults_to_the_last_three_blocks():
    """V13: timm's ViT convention, out_indices=3 -> blocks 1, 2, 3 of the 4-block mini model."""
    import timm

    m = timm.create_model("symvit_mini_patch4_28", features_only=True).eval()
    x = torch.rand(1, 1, 28, 28)
    with torch.no_grad():
        out = m(x)
        _, inter = m.model.forward_intermediates(x, indices=[1, 2, 3])
    assert len(out) == 3
    for a, b in zip(out, inter, strict=True):
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- normalize.py

def test_normalized_model_computes_x_minus_mean_over_std():
    """N01/N02/N04: the wrapped model sees (x - mean) / std, per channel."""
    seen = {}

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen["x"] = x
            return x

    net = NormalizedModel(Probe(), (0.2, 0.5), (0.4, 0.25))
    x = torch.rand(2, 2, 3, 3)
    net(x)
    want = torch.stack([(x[:, 0] - 0.2) / 0.4, (x[:, 1] - 0.5) / 0.25], dim=1)
    torch.testing.assert_close(seen["x"], want)


def test_imagenet_constants():
    """N03: torchvision's ImageNet statistics, RGB order."""
    from kpca_attention.models.normalize import IMAGENET_MEAN, IMAGENET_STD

    assert IMAGENET_MEAN == pytest.approx((0.485, 0.456, 0.406))
    assert IMAGENET_STD == pytest.approx((0.229, 0.224, 0.225))


# ----------------------------------------------------------------------------- lm.py

def test_small_lm_preset_keeps_the_papers_head_width():
    """L03: the small preset scales depth and width but keeps head width 16 (as the paper's LM)."""
    c = create_lm("rpc_symlm", 100, preset="small").cfg
    assert (c.n_layer, c.d_model, c.n_head, c.d_ff) == (4, 64, 4, 256)
    assert c.d_model // c.n_head == 16


def test_perplexity_runs_with_dropout_off():
    """L05: a model left in train mode is scored in eval mode (no dropout noise in a reported number)."""
    torch.manual_seed(0)
    m = create_lm("lm", 13, n_layer=2, n_head=2, d_model=16, d_ff=32, context=8, dropout=0.5)
    ids = torch.randint(0, 13, (30,), generator=torch.Generator().manual_seed(1))
    want = perplexity(m.eval(), ids, context=8, progress=False)
    m.train()
    got = [perplexity(m, ids, context=8, progress=False) for _ in range(2)]
    assert got == [pytest.approx(want, rel=1e-6)] * 2 and m.training


def test_lm_layers_have_biases_and_position_embeddings_are_initialised():
    """L07/L08: timm's ViT block (qkv with bias) and N(0, 0.02) position embeddings."""
    torch.manual_seed(0)
    m = create_lm("symlm", 100, preset="small")
    assert m.blocks[0].attn.kv.bias is not None
    assert 0.015 < float(m.pos_emb.detach().std()) < 0.025


# ----------------------------------------------------------------------------- segmenter.py

MINI = dict(num_classes=5, in_chans=1, img_size=16)


def test_decoder_sees_the_patch_tokens_only():
    """S01: the class token is dropped, every patch token kept, in order."""
    torch.manual_seed(0)
    m = create_model("segmenter_symvit_mini_patch4_32", **MINI).eval()
    got = {}
    def hook(mod, args, out):
        got["tokens"] = args[0]

    m.decoder.register_forward_hook(hook)
    x = torch.randn(1, 1, 16, 16)
    with torch.no_grad():
        m(x)
        feats = m.encoder.forward_features(x)
    assert got["tokens"].shape == (1, 16, 64)
    torch.testing.assert_close(got["tokens"], feats[:, 1:])


def test_mask_transformer_by_hand():
    """S03/S06: masks = LayerNorm_K(<normalize(P W_p), normalize(C W_c)>), normalised over the features."""
    torch.manual_seed(0)
    dec = create_model("segmenter_symvit_mini_patch4_32", **MINI).decoder.eval()
    tokens = torch.randn(2, 16, 64)
    with torch.no_grad():
        x = torch.cat((dec.proj_dec(tokens), dec.cls_emb.expand(2, -1, -1)), 1)
        for blk in dec.blocks:
            x = blk(x)
        x = dec.decoder_norm(x)
        p, c = x[:, :16] @ dec.proj_patch, x[:, 16:] @ dec.proj_classes
        p = p / p.norm(dim=-1, keepdim=True)
        c = c / c.norm(dim=-1, keepdim=True)
        want = F.layer_norm(p @ c.transpose(1, 2), (5,), dec.mask_norm.weight, dec.mask_norm.bias)
        got = dec(tokens, (4, 4))
    torch.testing.assert_close(got, want.transpose(1, 2).reshape(2, 5, 4, 4))


def test_segmenter_defaults():
    """S02/S04: decoder dropout 0.1 (official), 150 classes (ADE20K) unless given."""
    m = create_model("segmenter_symvit_mini_patch4_32", in_chans=1, img_size=16)
    assert m.num_classes == 150 and m.decoder.cls_emb.shape[1] == 150
    assert m.decoder.blocks[0].attn.attn_drop.p == 0.1 and m.decoder.blocks[0].mlp.drop1.p == 0.1


def test_padding_goes_bottom_right_and_is_cropped_away():
    """S05: an image of 13 x 10 px is the top-left corner of its zero-padded 16 x 12 version."""
    torch.manual_seed(0)
    m = create_model("segmenter_symvit_mini_patch4_32", **MINI).eval()
    x = torch.randn(1, 1, 13, 10)
    with torch.no_grad():
        got = m.forward_window(x)
        want = m.forward_window(F.pad(x, (0, 2, 0, 3)))[..., :13, :10]
    torch.testing.assert_close(got, want)


# ----------------------------------------------------------------------------- data/images.py

def test_cifar_statistics_and_classes():
    """I02/I03/I09: the published CIFAR-10/100 training-set statistics; CIFAR-100 has 100 classes."""
    from kpca_attention.data.images import dataset_info

    c10, c100 = dataset_info("cifar10"), dataset_info("cifar100")
    assert c10.mean == pytest.approx((0.4914, 0.4822, 0.4465), abs=1e-4)
    assert c10.std == pytest.approx((0.2470, 0.2435, 0.2616), abs=1e-4)
    assert c100.mean == pytest.approx((0.5071, 0.4865, 0.4409), abs=1e-4)
    assert c100.std == pytest.approx((0.2673, 0.2564, 0.2762), abs=1e-4)
    assert (c10.num_classes, c100.num_classes) == (10, 100)


def test_cifar_val_and_test_read_the_test_batches(tmp_path, monkeypatch):
    """I04: torchvision's CIFAR is read with train=True for 'train' only."""
    from torchvision import datasets

    from kpca_attention.data.images import build_image_dataset

    calls = []

    class Fake(torch.utils.data.Dataset):
        def __init__(self, root, train, transform=None, download=False):
            calls.append(train)

        def __len__(self):
            return 1

    monkeypatch.setattr(datasets, "CIFAR10", Fake)
    (tmp_path / "cifar-10-batches-py").mkdir()
    for split in ("train", "val", "test"):
        build_image_dataset("cifar10", split, root=tmp_path)
    assert calls == [True, False, False]


def test_folder_val_falls_back_to_test_never_to_train(tmp_path):
    """I05: a tree with train/ and test/ only: 'val' reads test/."""
    from PIL import Image

    from kpca_attention.data.images import build_image_dataset

    for split, n in (("train", 3), ("test", 1)):
        for cls in ("a", "b"):
            d = tmp_path / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(d / f"{i}.png")
    assert len(build_image_dataset("imagefolder", "val", root=tmp_path, img_size=8)) == 2


def test_default_flip_probability():
    """I06: 0.5 for Fashion-MNIST (and every other dataset), 0 for the digits."""
    from kpca_attention.data.images import build_image_dataset

    assert build_image_dataset("fashion-mnist", "test", train_transform=True).transform.hflip == 0.5
    assert build_image_dataset("digits", "train", train_transform=True).transform.hflip == 0.0


def test_deit_eval_transform_resizes_to_size_over_0875_and_centre_crops():
    """I08: DeiT's evaluation: resize the short side to 256, centre-crop 224."""
    from PIL import Image

    from kpca_attention.data.images import deit_transform

    tf = deit_transform(224)
    img = Image.fromarray(np.zeros((300, 400, 3), np.uint8))
    assert tuple(tf(img).shape) == (3, 224, 224)
    text = repr(tf)
    assert "256" in text and "CenterCrop" in text


# ----------------------------------------------------------------------------- data/text.py

def test_bible_chapters_are_counted_across_books(tmp_path):
    """T06: a book change starts a new chapter even when the chapter number stays 1 (Obadiah -> Jonah)."""
    from kpca_attention.data.text import load_corpus

    books = [f"B{chr(ord('a') + i)}" for i in range(20)]
    path = tmp_path / "kjv.txt"
    path.write_text("".join(f"{b}1:1 verse{i} .\n" for i, b in enumerate(books)))
    c = load_corpus("bible-kjv", root=path)
    assert c.valid.split() == ["verse18", "."] and c.test.split() == ["verse19", "."]


# ----------------------------------------------------------------------------- data/segmentation.py

def test_single_item_scenes_are_labelled_with_class_plus_one():
    """G01/G07: one item per scene: its pixels carry its class + 1 (T-shirts, class 0, are not background)."""
    from kpca_attention.data.segmentation import FashionMNISTScenes, SceneSpec

    ds = FashionMNISTScenes("val", SceneSpec(canvas=32, items=(1, 1)))
    idx = [int(i) for i in torch.nonzero(ds.item_labels == 0)[:3, 0]] + [0, 1, 2]
    for i in idx:
        img, lab = ds.scene(i)
        assert set(lab.unique().tolist()) == {0, int(ds.item_labels[i]) + 1}, i
        cut = round(0.25 * 255)
        assert torch.equal(lab > 0, img[0] > cut)


def test_held_out_scenes_come_from_the_test_images():
    """G02: 'test' scenes, like 'val', are built from Fashion-MNIST's 10k test images (never the train
    ones)."""
    from kpca_attention.data.segmentation import FashionMNISTScenes, SceneSpec

    spec = SceneSpec(canvas=32)
    val, test = FashionMNISTScenes("val", spec), FashionMNISTScenes("test", spec)
    assert len(test) == 10000
    assert torch.equal(test.scene(7)[1], val.scene(7)[1])


def test_evaluation_scenes_are_never_flipped():
    """G03: without train_transform the scenes are not augmented, whatever hflip says."""
    from kpca_attention.data.segmentation import build_segmentation_dataset

    ds = build_segmentation_dataset("fashion-mnist-scenes", "val", img_size=32, hflip=1.0)
    img, lab = ds.scene(3)
    x, y = ds[3]
    assert torch.equal(y, lab) and ds.hflip == 0.0


def test_ade20k_info():
    """G04: 150 classes (label 0 'other' is ignored, not a class)."""
    from kpca_attention.data.segmentation import segmentation_info

    assert segmentation_info("ade20k").num_classes == 150


def test_ade20k_crop_avoids_crops_one_class_dominates(tmp_path):
    """G05: mmseg's cat_max_ratio: redraw (up to 10 times) while one class covers >= 75 % of the crop."""
    from PIL import Image

    from kpca_attention.data.segmentation import ADE20KSegmentation
    from kpca_attention.train.data import seeded_rngs

    (tmp_path / "images" / "training").mkdir(parents=True)
    (tmp_path / "annotations" / "training").mkdir(parents=True)
    raw = np.ones((32, 128), np.uint8)
    raw[:, 64:] = 2  # two classes, one border: balanced crops straddle it
    Image.fromarray(np.stack([raw * 100] * 3, -1)).save(tmp_path / "images" / "training" / "a.jpg")
    Image.fromarray(raw).save(tmp_path / "annotations" / "training" / "a.png")
    ds = ADE20KSegmentation(tmp_path, "train", train_transform=True, crop_size=32, ratio_range=(1.0, 1.0),
                            hflip=0.0, photometric=False)
    balanced = 0
    for seed in range(40):
        with seeded_rngs(seed):
            _, y = ds[0]
        counts = torch.bincount(y[y != 255].flatten())
        counts = counts[counts > 0]
        balanced += int(len(counts) > 1 and counts.max() / counts.sum() < 0.75)
    assert balanced >= 24  # ~80 % expected; without the redraws ~15 %


# ----------------------------------------------------------------------------- family.py

def test_family_symvits_drop_w_q_in_every_block_whatever_attn_layers():
    """F01: a family SymViT is symmetric in the blocks outside attn_layers too (W_Q = W_K everywhere): it has
    one W_Q (64 x 64 + bias) per block fewer than the asymmetric model, for attn_layers 'first' or 'all'."""
    from kpca_attention.models.family import FAMILY_MECHANISMS

    def n(m):
        return sum(p.numel() for p in m.parameters())

    for mech, sym in FAMILY_MECHANISMS.items():
        if not sym:
            continue
        for layers in ("first", "all"):
            a = create_model(f"{mech}_vit_mini_patch4_28", attn_layers=layers, **META)
            s = create_model(f"{mech}_symvit_mini_patch4_28", attn_layers=layers, **META)
            assert n(a) - n(s) == 4 * (64 * 64 + 64), (mech, layers)
