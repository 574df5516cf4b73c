"""Segmenter models: registration, shapes at any image size, sliding windows, decoders, RPC options."""

from __future__ import annotations

import pytest
import timm
import torch

from kpca_attention.attention import RPCAttention, SymmetricAttention
from kpca_attention.models import SEGMENTATION_MODELS, NormalizedModel, Segmenter, create_model
from kpca_attention.models.segmenter import LinearDecoder, MaskTransformerDecoder

pytestmark = pytest.mark.usefixtures("single_thread")

MINI = dict(num_classes=5, in_chans=1, img_size=16)


def test_names_cover_the_encoder_families_and_build_through_timm():
    assert "segmenter_rpc_symvit_tiny_patch16_512" in SEGMENTATION_MODELS
    assert "segmenter_symvit_mini_patch4_32" in SEGMENTATION_MODELS
    assert "segmenter_vit_mini_patch4_32" in SEGMENTATION_MODELS  # asymmetric (timm attention)
    for name in SEGMENTATION_MODELS:
        assert timm.is_model(name)
    m = timm.create_model("segmenter_symvit_mini_patch4_32", **MINI)
    assert isinstance(m, Segmenter) and isinstance(m.decoder, MaskTransformerDecoder)
    with pytest.raises(ValueError, match="pretrained"):
        create_model("segmenter_symvit_mini_patch4_32", pretrained=True, **MINI)
    with pytest.raises(ValueError, match="decoder"):
        create_model("segmenter_symvit_mini_patch4_32", decoder="fpn", **MINI)
    # a feature backbone is its encoder: said in one line, not an AttributeError from inside the build
    with pytest.raises(ValueError, match=r"not a feature backbone.*'symvit_mini_patch4_32', features_only"):
        timm.create_model("segmenter_symvit_mini_patch4_32", features_only=True, **MINI)
    enc = timm.create_model("symvit_mini_patch4_32", features_only=True, in_chans=1, out_indices=(-1,))
    assert enc(torch.rand(1, 1, 32, 32))[0].shape[1] == enc.feature_info.channels()[-1]


@pytest.mark.parametrize("decoder", ["mask_transformer", "linear"])
def test_logits_have_the_image_size_for_any_input(decoder):
    torch.manual_seed(0)
    m = create_model("segmenter_symvit_mini_patch4_32", decoder=decoder, **MINI).eval()
    for h, w in [(16, 16), (13, 10), (16, 40), (37, 23)]:
        out = m(torch.randn(2, 1, h, w))
        assert out.shape == (2, 5, h, w)
        assert torch.isfinite(out).all()
    dec_cls = LinearDecoder if decoder == "linear" else MaskTransformerDecoder
    assert isinstance(m.decoder, dec_cls)


def test_mask_transformer_follows_the_official_layout():
    m = create_model("segmenter_symvit_mini_patch4_32", **MINI)
    dec = m.decoder
    assert len(dec.blocks) == 2 and dec.cls_emb.shape == (1, 5, 64)
    assert dec.blocks[0].attn.num_heads == 1  # width 64 // 64
    assert dec.blocks[0].mlp.fc1.out_features == 256  # MLP ratio 4
    # masks are LayerNorm-ed over classes: zero mean over the class axis before upsampling
    tokens = torch.randn(2, 16, 64)
    masks = dec(tokens, (4, 4))
    assert masks.shape == (2, 5, 4, 4)
    torch.testing.assert_close(masks.mean(dim=1), torch.zeros(2, 4, 4), atol=1e-5, rtol=0)


def test_sliding_window_equals_averaged_window_logits():
    torch.manual_seed(0)
    m = create_model("segmenter_symvit_mini_patch4_32", window_stride=8, **MINI).eval()
    x = torch.randn(1, 1, 16, 28)
    with torch.no_grad():
        out = m(x)
        # windows at left 0, 8, 12 (the last flush with the border)
        ref = torch.zeros(1, 5, 16, 28)
        cnt = torch.zeros(1, 1, 16, 28)
        for left in (0, 8, 12):
            ref[..., left:left + 16] += m.forward_window(x[..., left:left + 16])
            cnt[..., left:left + 16] += 1
    torch.testing.assert_close(out, ref / cnt)
    with pytest.raises(ValueError, match="window_stride"):
        create_model("segmenter_symvit_mini_patch4_32", window_stride=17, **MINI)


def test_rpc_options_reach_the_encoder_and_weights_match_symvit_under_one_seed():
    torch.manual_seed(3)
    rpc = create_model("segmenter_rpc_symvit_mini_patch4_32", rpc_iters=2, rpc_lambda=3.0, rpc_layers=[0, 2],
                       **MINI)
    torch.manual_seed(3)
    sym = create_model("segmenter_symvit_mini_patch4_32", **MINI)
    kinds = [type(b.attn) for b in rpc.encoder.blocks]
    assert kinds == [RPCAttention, SymmetricAttention, RPCAttention, SymmetricAttention]
    assert rpc.encoder.blocks[0].attn.n_iter == 2
    assert rpc.encoder.rpc_blocks == [0, 2]
    sd_r, sd_s = rpc.state_dict(), sym.state_dict()
    for k in sd_s:
        torch.testing.assert_close(sd_r[k], sd_s[k], msg=k)
    with pytest.raises(TypeError, match="rpc_"):
        create_model("segmenter_rpc_symvit_mini_patch4_32", rpc_iterations=2, **MINI)


def test_trains_on_images_in_unit_range_through_normalized_model():
    torch.manual_seed(0)
    net = create_model("segmenter_rpc_symvit_mini_patch4_32", decoder_dropout=0.0, **MINI)
    model = NormalizedModel(net, (0.5,), (0.25,))
    x = torch.rand(4, 1, 16, 16)
    # one class per 4 x 4 patch (what patch-level logits upsampled bilinearly can fit), some pixels ignored
    y = torch.randint(0, 5, (4, 1, 4, 4)).float()
    y = torch.nn.functional.interpolate(y, scale_factor=4, mode="nearest")[:, 0].long()
    y[:, :2] = 255
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(x), y, ignore_index=255)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    # every parameter gets a gradient (DDP without find_unused_parameters)
    assert all(p.grad is not None for p in model.parameters())


def test_encoder_initialised_from_a_trained_classifier(tmp_path):
    from safetensors.torch import save_file

    from kpca_attention.models.segmenter import load_encoder_weights

    torch.manual_seed(0)
    net = create_model("rpc_symvit_mini_patch4_32", num_classes=10, in_chans=1)
    clf = NormalizedModel(net, (0.5,), (0.25,))
    seg = create_model("segmenter_rpc_symvit_mini_patch4_32", num_classes=5, in_chans=1, img_size=32)
    decoder_before = {k: v.clone() for k, v in seg.decoder.state_dict().items()}
    loaded = load_encoder_weights(seg, clf.state_dict())
    assert "blocks.0.attn.qkv.weight" in loaded or "blocks.0.attn.kv.weight" in loaded
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(seg.encoder.forward_features(x), clf.model.forward_features(x))
    for k, v in seg.decoder.state_dict().items():
        assert torch.equal(v, decoder_before[k])
    # another window: position embeddings resampled to the 4 x 4 grid; from a safetensors file
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in clf.state_dict().items()}, str(path))
    small = create_model("segmenter_rpc_symvit_mini_patch4_32", num_classes=5, in_chans=1, img_size=16)
    load_encoder_weights(small, path)
    assert small.encoder.pos_embed.shape == (1, 17, 64)
    torch.testing.assert_close(small.encoder.blocks[1].mlp.fc1.weight, clf.model.blocks[1].mlp.fc1.weight)
    wide = create_model("segmenter_symvit_mini_patch4_32", num_classes=5, in_chans=3, img_size=16)
    with pytest.raises(ValueError, match="patch_embed.proj.weight"):
        load_encoder_weights(wide, clf.state_dict())
