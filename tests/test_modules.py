"""The core module helpers: eval_mode restores each submodule's flag; weights_sha256 fingerprints weights of
any dtype and changes with any one of them."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from kpca_attention.modules import eval_mode, weights_sha256


def test_eval_mode_restores_each_submodules_own_flag():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    net.train()
    net[1].eval()
    with eval_mode(net) as m:
        assert not any(x.training for x in m.modules())
    assert net.training and net[0].training and not net[1].training


def test_weights_sha256_is_the_state_dicts_bytes_in_name_order():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    h = hashlib.sha256()  # the rule written out: name, then the raw bytes, entries sorted by name
    for k, v in sorted(net.state_dict().items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    assert weights_sha256(net) == h.hexdigest()
    before = weights_sha256(net)
    with torch.no_grad():
        net[0].weight[1, 2] += 1e-7  # one weight, by about an ulp of 1
    assert weights_sha256(net) != before
    half = nn.Linear(3, 4).to(torch.bfloat16)  # numpy has no bfloat16: hashed as raw bytes
    assert len(weights_sha256(half)) == 64 and weights_sha256(half) != weights_sha256(half.float())
