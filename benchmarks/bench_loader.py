"""The training loader of in-memory image datasets: the per-image path against the batched one.

Fashion-MNIST's training transform (padded random crop, horizontal flip) made per image - each image's
draws under ``seeded_rngs`` (python's, numpy's and torch's generators saved, seeded and restored) and
torchvision's ``RandomCrop`` / ``RandomHorizontalFlip``, collated by a ``DataLoader`` (the path every
augmented run took before ``DeviceBatches``) - against ``DeviceBatches`` (the batch gathered and cropped /
flipped in one step by ``CropFlip``). Both from the same sampler positions and seeds, interleaved, one
thread; every batch pair is checked equal, so the script fails if the two paths ever differ.

    .venv/bin/python benchmarks/bench_loader.py                 # 12 batches of 128
    .venv/bin/python benchmarks/bench_loader.py --device cuda   # the batched path on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.transforms import v2

from kpca_attention.data.images import TensorImageDataset, build_image_dataset
from kpca_attention.machine import cpu_model
from kpca_attention.train.data import DeviceBatches, SeededAugmentation, SeededSampler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--device", default="cpu", help="where the batched path makes its batches")
    args = ap.parse_args()
    torch.set_num_threads(1)
    batched = build_image_dataset("fashion-mnist", "train", train_transform=True)  # CropFlip, in memory
    per_image = TensorImageDataset(batched.images, batched.labels, batched.classes,
                                   v2.Compose([v2.RandomCrop(28, padding=3), v2.RandomHorizontalFlip()]))

    def sampler() -> SeededSampler:
        s = SeededSampler(DistributedSampler(batched, num_replicas=1, rank=0, shuffle=True, seed=0,
                                             drop_last=True), seed=0)
        s.set_epoch(0)
        return s

    old = iter(DataLoader(SeededAugmentation(per_image), batch_size=args.batch_size, sampler=sampler(),
                          drop_last=True))
    new = iter(DeviceBatches(SeededAugmentation(batched), sampler(), args.batch_size,
                             torch.device(args.device)))
    t_old, t_new = [], []
    for _ in range(args.batches):
        t = time.perf_counter()
        x_old, y_old = next(old)
        t_old.append(time.perf_counter() - t)
        t = time.perf_counter()
        x_new, y_new = next(new)
        if x_new.is_cuda:
            torch.cuda.synchronize()
        t_new.append(time.perf_counter() - t)
        if not (torch.equal(x_old, x_new.cpu()) and torch.equal(y_old, y_new.cpu())):
            raise SystemExit("bench_loader: the batched path made another batch than the per-image one: FAIL")
    a, b = statistics.median(t_old) * 1e3, statistics.median(t_new) * 1e3
    print(f"torch {torch.__version__}, {cpu_model()}, 1 thread; {args.batches} batches of {args.batch_size}, "
          f"interleaved, every pair equal")
    print(f"per-image path (seeded items, torchvision transforms, DataLoader): {a:.1f} ms a batch")
    print(f"batched path (DeviceBatches on {args.device}): {b:.1f} ms a batch ({a / b:.0f}x faster)")


if __name__ == "__main__":
    main()
