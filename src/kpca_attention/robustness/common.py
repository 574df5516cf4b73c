"""Small pieces shared by the robustness suites: batched logits over a dataset, top-k accuracy, PGD's
default step (and, from :mod:`kpca_attention.modules`, exact model-mode restoration)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..modules import eval_mode, model_device

#: the paper's PGD step, a fraction of eps (both protocols: attacks.py in pixels, protocol.py normalised)
PGD_ALPHA = 0.15


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
