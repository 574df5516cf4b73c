"""What the two image tasks share: models wrapped in ``NormalizedModel`` (they take images in [0, 1]),
the training / validation / test splits of an image dataset, evaluation batches under autocast, the fixed
test images a suite draws (:func:`fixed_subset`) and the common-corruption suite (:class:`Corruptions`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from ..checks import check_count, check_int
from ..data.sampling import seeded_indices
from .base import Splits, Task, seeded_sample, validation_split

__all__ = ["ImageTask", "Corruptions", "fixed_subset", "structure_items"]


#: ``build(split, augment, subset) -> Dataset``: one split of an image dataset of a run
Builder = Callable[[str, bool, "int | None"], Dataset]


def _check_subset(subset: int | None, available: int, name: str, what: str) -> None:
    """A subset larger than what it samples would silently be all of it, recorded as asked."""
    if subset is not None and subset > available:
        raise ValueError(f"{name} {subset} is more than {what} ({available}); give at most {available}, or "
                         "none for all")


class ImageTask(Task):
    """The part of an image task that does not depend on what is predicted (see the subclasses)."""

    unit = "images"
    throughput_key = "images_per_s"

    def builder(self, cfg: Any) -> Builder:
        """How this task builds one split of ``cfg``'s dataset."""
        raise NotImplementedError

    def build_model(self, cfg: Any, info: Mapping[str, Any] | None = None) -> nn.Module:
        """``create_model(cfg.model, ...)`` with the dataset's classes, channels and size, wrapped in
        :class:`~kpca_attention.models.NormalizedModel` with the dataset's statistics."""
        from ..models import NormalizedModel, create_model

        data = self.data_info(cfg)
        net = create_model(cfg.model, num_classes=data.num_classes, in_chans=data.in_chans,
                           img_size=cfg.img_size or data.img_size, drop_path_rate=cfg.drop_path,
                           **cfg.model_kwargs)
        return NormalizedModel(net, data.mean, data.std)

    def datasets(self, cfg: Any, *, with_eval: bool = True) -> Splits:
        """The training split (augmented when ``cfg.augment``) and the held-out one: with ``cfg.val_size``
        the validation split carved from the training data (:func:`~.base.validation_split`, not
        augmented; ``eval_subset`` of it when given), else - the legacy setting - ``eval_subset`` test
        images. ``train_subset`` samples the training split (seed 0)."""
        build = self.builder(cfg)
        data = self.data_info(cfg)
        info = {"num_classes": data.num_classes, "in_chans": data.in_chans}
        if cfg.val_size is None:
            held = build("val", False, cfg.eval_subset) if with_eval else None
            return Splits(build("train", cfg.augment, cfg.train_subset), held, info)
        full = build("train", cfg.augment, None)
        train_idx, val_idx = validation_split(len(full), cfg.val_size, cfg.val_seed)  # type: ignore[arg-type]
        _check_subset(cfg.train_subset, len(train_idx), "train_subset",
                      f"the training images of {cfg.dataset} less the {cfg.val_size} of its validation split")
        _check_subset(cfg.eval_subset, len(val_idx), "eval_subset", "the images of the validation split")
        train = Subset(full, seeded_sample(train_idx, cfg.train_subset))
        held = None
        if with_eval:
            held = Subset(build("train", False, None), seeded_sample(val_idx, cfg.eval_subset))
        return Splits(train, held, info)

    def validation_set(self, cfg: Any, subset: int | None = None) -> Dataset:
        """The validation split of ``cfg`` (``subset`` of it, seeded), as the training loop measures it."""
        if cfg.val_size is None:
            raise ValueError(f"{cfg.model}: this run has no validation split (val_size is None: held-out "
                             "numbers were measured on the test split)")
        full = self.builder(cfg)("train", False, None)
        _, val_idx = validation_split(len(full), cfg.val_size, cfg.val_seed)  # type: ignore[arg-type]
        return Subset(full, seeded_sample(val_idx, subset))

    def held_out_note(self, cfg: Any) -> str | None:
        if cfg.val_size is not None:
            return None
        return (f"no validation split (val_size is None): the held-out numbers during training are measured "
                f"on the test split of {cfg.dataset}, so choices made on them are made on test data; "
                "--set val_size=N holds N training images out as a validation split")

    def split_name(self, cfg: Any, split: str) -> str:
        """``val`` of a run without a validation split is the dataset's one held-out set: ``test``."""
        return "test" if split == "val" and cfg.val_size is None else split

    def split_set(self, cfg: Any, split: str, subset: int | None) -> Dataset:
        """``split`` of ``cfg``'s dataset for ``kpca-attention evaluate``: ``val`` of a run with a
        validation split is that split; otherwise the dataset's own split (``subset``: seeded sample).

        Raises:
            ValueError: ``subset`` is more than the split holds (a split smaller than asked for is the
                user's mistake, not a smaller evaluation to pass off as the one asked for)."""
        if split == "val" and cfg.val_size is not None:
            data = self.validation_set(cfg, subset)
        else:
            data = self.builder(cfg)(split, False, subset)
        if subset is not None and len(data) < subset:  # a sample is all of a split smaller than it
            check_count(subset, "subset", len(data), f"the images of the {split} split of {cfg.dataset}")
        return data

    def test_set(self, cfg: Any) -> Dataset:
        """The test split of the dataset a run was trained on (``cfg``: its TrainConfig)."""
        return self.builder(cfg)("test", False, None)

    @staticmethod
    def loader(data: Dataset, batch_size: int, cfg: Any) -> DataLoader:
        return DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=cfg.num_workers)


@dataclass(frozen=True)
class Corruptions:
    """Common corruptions: ``names`` x ``severities`` on ``n`` fixed test images (``None``: all of them),
    corrupted on the fly (image classifiers: or read from the released ImageNet-C tree,
    :attr:`ImageSuites.imagenet_c`)."""

    names: tuple[str, ...]
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)
    n: int | None = 500

    def __post_init__(self) -> None:
        from ..robustness.corruptions import check_corruption

        if not self.names or not self.severities:
            raise ValueError("corruptions need at least one name and one severity")
        for c in self.names:
            for s in self.severities:
                check_corruption(c, s)
        if self.n is not None:
            check_int(self.n, "corruption images", min=1)


def fixed_subset(dataset: Dataset, n: int | None, seed: int) -> Dataset:
    """``n`` examples drawn once with ``seed`` (class-mixed, unlike the first n), in index order
    (``None``: all of them)."""
    if n is None:
        return Subset(dataset, list(range(len(dataset))))  # type: ignore[arg-type]
    if n > len(dataset):  # type: ignore[arg-type]
        raise ValueError(f"asked for {n} examples of a dataset of {len(dataset)}")  # type: ignore[arg-type]
    return Subset(dataset, seeded_indices(len(dataset), n, seed))  # type: ignore[arg-type]


def structure_items(items: Mapping[str, Any]) -> dict[str, Any]:
    """The flat ``{item name: result}`` of a :class:`ResultStore` in the shape
    :func:`~.classification.suites.evaluate_image_suites` returns (``clean``, ``corruptions``, ``attacks``,
    ...); other items (``run``, ``trace``) are passed through under their own names. Both image tasks'
    suites name their items this way (:meth:`~.base.StudySections.structure` of their report sections)."""
    out: dict[str, Any] = {}
    for name, r in items.items():
        parts = name.split("/")
        if name == "corruptions/clean":
            out["clean_corrupt_subset"] = r
        elif name == "attacks/clean":
            out["clean_attack_subset"] = r
        elif name == "autoattack/clean":
            out["clean_autoattack_subset"] = r
        elif parts[0] == "ood" and len(parts) == 2:
            out.setdefault("ood", {})[parts[1]] = r
        elif parts[0] in ("corruptions", "attacks", "autoattack") and len(parts) == 3:
            out.setdefault(parts[0], {}).setdefault(parts[1], {})[parts[2]] = r
        elif parts[0] == "autoattack" and len(parts) == 4:
            continue  # a chunk of an AutoAttack item (``.../images-0-250``): kept to resume, joined above
        else:
            out[name] = r
    return out
