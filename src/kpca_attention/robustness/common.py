"""Small pieces shared by the robustness suites: exact model-mode restoration, batched logits over
a dataset, top-k accuracy, PGD's default step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

#: the paper's PGD step, a fraction of eps (both protocols: attacks.py in pixels, protocol.py normalised)
PGD_ALPHA = 0.15


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode and restore each one's own flag afterwards.

    ``model.train(was_training)`` is not enough: it would also switch submodules that the caller had
    deliberately left in eval mode (frozen BatchNorm, say), so the flags are saved one by one.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags:
            m.training = flag


def model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def collect_logits(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = 128,
    num_workers: int = 0,
    progress: bool = True,
    desc: str = "eval",
) -> tuple[Tensor, Tensor]:
    """Logits ``(N, K)`` (float32, CPU) and labels ``(N,)`` of ``model`` over ``dataset``.

    ``dataset[i]`` is ``(image (C, H, W) in [0, 1], label)``; the model takes [0, 1] images
    (normalisation inside). Runs in eval mode; the model's modes are restored afterwards.
    """
    device = model_device(model)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    logits, labels = [], []
    with eval_mode(model):
        for x, y in tqdm(loader, desc=desc, disable=None if progress else True, leave=False):
            logits.append(model(x.to(device)).float().cpu())
            labels.append(torch.as_tensor(y))
    if not logits:
        raise ValueError(f"{desc}: the dataset is empty")
    return torch.cat(logits), torch.cat(labels).long()


def topk_hits(logits: Tensor, labels: Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[int, Tensor]:
    """``{k: per-example bool hits}`` of logits ``(N, K)``; k larger than the number of classes is clipped."""
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    return {k: (top[:, : min(k, logits.shape[1])] == labels.view(-1, 1)).any(dim=1) for k in ks}


def accuracy_of_hits(hits: dict[int, Tensor]) -> dict[str, float]:
    """``{"top1": ..., "top5": ...}`` as fractions of :func:`topk_hits`."""
    return {f"top{k}": hit.float().mean().item() for k, hit in hits.items()}


def topk_accuracy(logits: Tensor, labels: Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """``{"top1": ..., "top5": ...}`` as fractions; k larger than the number of classes is clipped."""
    return accuracy_of_hits(topk_hits(logits, labels, ks))
