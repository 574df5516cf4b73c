"""The robustness suites of an image classifier as data, evaluated item by item with per-example
results into a :class:`~kpca_attention.robustness.store.ResultStore`.

:class:`ImageSuites` says what to measure; :func:`evaluate_image_suites` measures it for one model:

* ``clean`` - top-1/top-5 on the first ``clean`` test images (all when ``None``);
* ``corruptions`` - each (corruption, severity) on ``n`` fixed test images
  (:func:`fixed_subset` with ``data_seed``), corrupted once per image with ``imagecorruptions`` and
  cached on disk (:func:`~kpca_attention.robustness.corruptions.corrupted_views`), plus the clean
  accuracy of the same images (so robustness can be read as a drop from clean);
* ``attacks`` - each method at each eps on ``n`` fixed test images (``data_seed + 1``), through
  :func:`~kpca_attention.robustness.attacks.attack_logits`, plus clean on those images; under the
  attack's ``protocol``: ``pixel`` (eps in pixel units) or ``lab`` (the papers' protocol, eps in
  normalised units, no clamp; such an attack is named ``<name>-lab``);
* ``ood`` - ImageNet-A / -R (top-1 on the 200-class mask, per example) and ImageNet-O (AUPR against
  ImageNet val) from local folders (:class:`OODSets`); a set without its folder is skipped with one line;
* ``autoattack`` - AutoAttack (``standard`` or ``rand``, Linf or L2) at each eps on the first ``n``
  images of the test-image list committed with the package
  (:mod:`~kpca_attention.robustness.image_ids`), plus clean on those images.

The attack protocol is part of every attack item's key (pixel items made before the protocol existed
carry none: they are pixel by construction and are read as such), so pixel and lab results are never
mixed or reused for each other.

Every model evaluated with the same suites sees the same images, so per-example results pair up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from ...checks import check_int
from ...robustness.store import ResultStore, example_hits, example_result, join_hits
from ..images import Corruptions, fixed_subset

__all__ = ["Corruptions", "Attack", "attack_title", "OODSets", "same_images", "AutoAttackSuite",
           "ImageSuites", "fixed_subset", "evaluate_image_suites", "eps_label", "eps_text",
           "evaluate_autoattack", "evaluate_ood", "attack_key"]  # Corruptions, fixed_subset: from ..images


@dataclass(frozen=True)
class Attack:
    """One attack method at the budgets ``eps`` (pixel units) on ``n`` fixed test images;
    ``options`` go to :func:`~kpca_attention.robustness.attacks.attack`; ``seeds``: only the runs of
    these training seeds are attacked (``None``: all) - for expensive attacks on one seed; ``label``
    names it in results (default: :attr:`name`); ``protocol``: ``"pixel"`` or ``"lab"``
    (:mod:`~kpca_attention.robustness.protocol`; lab budgets are in normalised units)."""

    method: str
    eps: tuple[float, ...]
    n: int = 200
    options: Mapping[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] | None = None
    label: str | None = None
    protocol: str = "pixel"

    def __post_init__(self) -> None:
        from ...robustness.attacks import METHODS, check_attack_options
        from ...robustness.protocol import check_protocol

        if self.method not in METHODS:
            raise ValueError(f"unknown attack {self.method!r}; valid: {', '.join(METHODS)}")
        check_protocol(self.protocol, self.method)
        if "seed" in self.options:
            raise ValueError(f"{self.method}: the attack seed is fixed (0) so that every model sees the same "
                             "attack; remove 'seed' from the options")
        if not self.eps or any(not (e > 0) for e in self.eps):
            raise ValueError(f"{self.method}: eps must be a non-empty list of budgets > 0, got {self.eps}")
        for e in self.eps:
            check_attack_options(self.method, e, dict(self.options), self.protocol)
        check_int(self.n, f"{self.method} images", min=1)

    @property
    def name(self) -> str:
        """The attack's label in results: ``label``, else ``pgd``, or ``pgd-steps50`` with options;
        ``-lab`` appended under the lab protocol (``pgd-lab``)."""
        return attack_name(asdict(self))


def attack_name(a: Mapping[str, Any]) -> str:
    """The name of an attack in results from its fields (an :class:`Attack` as ``settings.json`` records
    it): ``label``, else the method with its options; ``-lab`` appended under the lab protocol."""
    opts = a.get("options") or {}
    base = a.get("label") or (a["method"] + "".join(f"-{k}{v}" for k, v in sorted(opts.items())))
    return base + ("-lab" if a.get("protocol", "pixel") == "lab" else "")


_ATTACK_TITLES = {"square": "Square", "autoattack": "AutoAttack"}


def attack_title(a: str, norms: Mapping[str, str] | None = None) -> tuple[str, str]:
    """How reports write an attack's name (:func:`attack_name`): ``(title with its norm unless Linf,
    " (lab)" or "")``, e.g. ``("PGD", "")``, ``("CW L2", "")``, ``("FGSM", " (lab)")``; ``norms``: attack
    name -> "Linf" | "L2" | "L1"."""
    base, lab = (a[:-4], " (lab)") if a.endswith("-lab") else (a, "")  # lab protocol: normalised units
    norm = (norms or {}).get(a, "Linf")
    return _ATTACK_TITLES.get(base, base.upper()) + (f" {norm}" if norm != "Linf" else ""), lab


@dataclass(frozen=True)
class AutoAttackSuite:
    """AutoAttack (``pyautoattack``) as RobustBench runs it: ``version`` ``standard`` (APGD-CE, APGD-T,
    FAB-T, Square) or ``rand`` (APGD-CE, APGD-DLR with EOT, for randomised defences), threat model
    ``norm`` (Linf, L2) at each budget ``eps`` (pixel units), on the first ``n`` indices of the
    dataset's committed test-image list; ``seeds``: the training seeds whose runs are attacked
    (``None``: all); ``adaptive``: through what layers compute without gradient
    (:mod:`kpca_attention.attention.adaptive`)."""

    eps: tuple[float, ...] = (4 / 255, 8 / 255)
    norm: str = "Linf"
    version: str = "standard"
    n: int = 1000
    seeds: tuple[int, ...] | None = (0,)
    adaptive: bool = False

    def __post_init__(self) -> None:
        from ...checks import check_choice, check_int

        check_choice(self.version, "autoattack version", ("standard", "rand"))
        check_choice(self.norm, "autoattack norm", ("Linf", "L2"))
        if not self.eps or any(not (e > 0) for e in self.eps):
            raise ValueError(f"autoattack: eps must be a non-empty list of budgets > 0, got {self.eps}")
        check_int(self.n, "autoattack images", min=1)

    @property
    def name(self) -> str:
        """``standard-Linf``: how its items are named (``autoattack/standard-Linf/4``)."""
        return f"{self.version}-{self.norm}"


@dataclass(frozen=True)
class OODSets:
    """Out-of-distribution sets of ImageNet models, each from a local folder (``<wnid>/*``; None: skipped):
    ImageNet-A and -R (top-1 over their 200 classes, the 1000-way logits masked), ImageNet-O (AUPR of
    minus the maximum softmax probability, ``imagenet_val`` the in-distribution images)."""

    imagenet_a: str | None = None
    imagenet_r: str | None = None
    imagenet_o: str | None = None
    imagenet_val: str | None = None

    def sets(self) -> dict[str, str | None]:
        return {"imagenet-a": self.imagenet_a, "imagenet-r": self.imagenet_r, "imagenet-o": self.imagenet_o}


#: images attacked at once by default: a randomised attack seeds each batch once, so its random starts (and
#: results) depend on the batch size - an item attacked in batches of another size names it in its key
ATTACK_BATCH_SIZE = 100


@dataclass(frozen=True)
class ImageSuites:
    """What to measure on an image classifier (see the module docstring)."""

    clean: int | None = None
    corruptions: Corruptions | None = None
    attacks: tuple[Attack, ...] = ()
    data_seed: int = 0
    batch_size: int = 500
    attack_batch_size: int = ATTACK_BATCH_SIZE
    autoattack: AutoAttackSuite | None = None
    ood: OODSets | None = None
    split: str = "test"
    #: the released ImageNet-C tree ``<root>/<corruption>/<severity>/<wnid>/`` (the same images as the
    #: test split, file by file) instead of corrupting on the fly
    imagenet_c: str | None = None

    def __post_init__(self) -> None:
        from ...checks import check_choice, check_int

        check_choice(self.split, "split", ("train", "val", "test"))
        if self.clean is not None:
            check_int(self.clean, "clean images", min=1)
        check_int(self.batch_size, "batch size", min=1)
        check_int(self.attack_batch_size, "attack batch size", min=1)
        if self.split != "test":
            for what, on in (("autoattack (the committed test-image list)", self.autoattack),
                             ("imagenet_c (the released test images)", self.imagenet_c)):
                if on is not None:
                    raise ValueError(f"{what} runs on the test split only, not split={self.split!r}: "
                                     "leave split at test or drop it")
        names = [a.name for a in self.attacks]
        if len(set(names)) != len(names):
            raise ValueError(f"two attacks share a name {names}: give them different options")

    #: how ``settings.json`` names these suites: image suites record no ``kind`` (``kpca_attention.tasks``)
    kind = None

    def to_dict(self) -> dict[str, Any]:
        """The suites as ``settings.json`` records them (what a study folder is checked against)."""
        d = asdict(self)
        # fields at their defaults that older folders did not record are left out, so that a study
        # written before them reads back equal
        for a in d["attacks"]:
            if a.get("protocol") == "pixel":
                del a["protocol"]
        for k, default in (("autoattack", None), ("ood", None), ("split", "test"), ("imagenet_c", None)):
            if d[k] == default:
                del d[k]
        return d


def eps_label(eps: float) -> str:
    """A budget as it names results: Linf budgets as multiples of 1/255 (``4/255`` -> ``"4"``)."""
    return f"{255 * eps:.4g}"


def eps_text(norm: str, label: str) -> str:
    """A budget as reports write it, from its :func:`eps_label`: Linf in units of 1/255 (``"4"`` ->
    ``"4/255"``), L2 / L1 as the number itself (``"127.5"`` -> ``"0.5"``)."""
    return f"{label}/255" if norm == "Linf" else f"{float(label) / 255:.3g}"


def _clean(model: nn.Module, data: Dataset, batch_size: int) -> dict[str, Any]:
    from ...robustness.common import collect_logits

    logits, labels = collect_logits(model, data, batch_size=batch_size, progress=False)
    return example_result(logits, labels)


def evaluate_image_suites(
    model: nn.Module | Callable[[], nn.Module],
    test_set: Dataset,
    suites: ImageSuites,
    store: ResultStore,
    base_key: Mapping[str, Any],
    *,
    cache_dir: str | Path | None = None,
    seed: int | None = None,
    log: Callable[[str], None] = print,
    progress: bool = True,
    dataset: str | None = None,
    img_size: int | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` (images in [0, 1]) on every item of ``suites``, reusing the items of
    ``store`` whose key (``base_key`` + the item's parameters) matches.

    Args:
        model: the model, or a function returning it (called only if some item must be computed).
        seed: the training seed of this model (decides which :attr:`Attack.seeds` attacks run).
        dataset: the name of ``test_set``'s dataset (AutoAttack reads its committed test-image list).
        img_size: the model's input size (ImageNet-C and the OOD folders are resized to it).
    Returns:
        ``{"clean": r, "corruptions": {name: {severity: r}}, "clean_corrupt_subset": r,
        "attacks": {attack name: {eps label: r}}, "clean_attack_subset": r, "timing": {...}}`` where
        each ``r`` is ``{"top1", "top5", "n", "correct"}`` (+ perturbation norms for attacks).
    """
    from tqdm.auto import tqdm

    from ...robustness.attacks import attack_logits, attack_norm
    from ...robustness.corruptions import corrupted_views, images_version_key

    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    bs = suites.batch_size
    loaded: list[nn.Module] = [model] if isinstance(model, nn.Module) else []

    def net() -> nn.Module:
        if not loaded:
            loaded.append(model())  # type: ignore[operator]
        return loaded[0]

    def item(name: str, params: Mapping[str, Any], compute: Callable[[], Any], same_draw: bool = True) -> Any:
        key = {**base_key, **params}
        # fields keys gained later -> whether an item stored without it was computed with this key's value:
        # a pixel item before keys named the protocol; an attack on fewer images than the draw before keys
        # named the draw, if the draw is unchanged since. Such an item is read as it is stored, never
        # rewritten: another study's file may refer to it by its hash (Study.reuse)
        legacy_ok = {"protocol": params.get("protocol") == "pixel", "draw": same_draw}
        later = [f for f, ok in legacy_ok.items() if f in params and ok]
        for drop in [[f] for f in later] + ([later] if len(later) > 1 else []):
            legacy = store.get(name, {k: v for k, v in key.items() if k not in drop})
            if legacy is not None:
                return legacy
        return store.get_or_compute(name, key, compute)[0]

    n_clean = suites.clean
    clean_set = test_set if n_clean is None else Subset(test_set, range(n_clean))
    out["clean"] = item("clean", {"n": n_clean}, lambda: _clean(net(), clean_set, bs))
    t_clean = time.perf_counter()

    c = suites.corruptions
    if c is not None:
        base = fixed_subset(test_set, c.n, suites.data_seed)
        params = {"n": c.n, "data_seed": suites.data_seed}
        if suites.imagenet_c:  # released images, not corrupted here
            params["imagenet_c"] = suites.imagenet_c
        out["clean_corrupt_subset"] = item("corruptions/clean", params, lambda: _clean(net(), base, bs))
        if not suites.imagenet_c:  # the views: corrupt()'s images
            params.update(images_version_key())
        if suites.imagenet_c:
            views = _imagenet_c_views(suites.imagenet_c, c, base, img_size)
        else:
            views = corrupted_views(base, c.names, c.severities, seed=suites.data_seed, cache_dir=cache_dir)
        corr: dict[str, dict[str, Any]] = {}
        for (name, sev), view in tqdm(views.items(), desc="corruptions", disable=None if progress else True,
                                      leave=False):
            def compute(view=view) -> dict[str, Any]:
                if cache_dir is not None and hasattr(view, "build_cache"):
                    view.build_cache(progress=False)
                return _clean(net(), view, bs)

            corr.setdefault(name, {})[str(sev)] = item(
                f"corruptions/{name}/{sev}", {**params, "corruption": name, "severity": sev}, compute)
        out["corruptions"] = corr
        log(f"  corruptions: {len(views)} views of {c.n} images")
    t_corr = time.perf_counter()

    attacks = [a for a in suites.attacks if a.seeds is None or seed is None or seed in a.seeds]
    if attacks:
        n_att = max(a.n for a in attacks)
        att_base = fixed_subset(test_set, n_att, suites.data_seed + 1)
        xs, ys = zip(*(att_base[i] for i in range(n_att)), strict=True)
        x_all, y_all = torch.stack(xs), torch.as_tensor(ys)
        params = {"n": n_att, "data_seed": suites.data_seed + 1}
        # an attack on fewer images takes the first a.n of this draw, which depend on n_att: its key names
        # the draw; items stored before it did are this draw's only if the last evaluation drew the same
        same_draw = store.get("attacks/clean", {**base_key, **params}) is not None
        out["clean_attack_subset"] = item("attacks/clean", params, lambda: _clean(net(), att_base, bs))
        res: dict[str, dict[str, Any]] = {}
        for a in attacks:
            for eps in a.eps:
                def compute(a: Attack = a, eps: float = eps) -> dict[str, Any]:
                    lg, lb, nm = attack_logits(net(), (x_all[: a.n], y_all[: a.n]), a.method, eps,
                                               batch_size=suites.attack_batch_size, progress=progress,
                                               protocol=a.protocol, seed=0, **dict(a.options))
                    return {**example_result(lg, lb), "norm": attack_norm(a.method, a.options),
                            "protocol": a.protocol, "mean_norm": nm.mean().item(),
                            "max_norm": nm.max().item()}

                t_a = time.perf_counter()
                key = attack_key(a, eps, suites.data_seed + 1, n_att, suites.attack_batch_size)
                res.setdefault(a.name, {})[eps_label(eps)] = item(
                    f"attacks/{a.name}/{eps_label(eps)}", key, compute, same_draw)
                r = res[a.name][eps_label(eps)]
                log(f"  {a.name} eps {eps_text(attack_norm(a.method, a.options), eps_label(eps))} "
                    f"({a.protocol}): top-1 {100 * r['top1']:.1f}% "
                    f"({time.perf_counter() - t_a:.0f} s)")
        out["attacks"] = res
    aa = suites.autoattack
    if aa is not None and (aa.seeds is None or seed is None or seed in aa.seeds):
        out.update(evaluate_autoattack(net, test_set, aa, store, base_key, dataset=dataset,
                                       batch_size=suites.attack_batch_size, log=log))
    if suites.ood is not None:
        out["ood"] = evaluate_ood(net, suites.ood, store, base_key, img_size=img_size, batch_size=bs, log=log,
                                  progress=progress)
    out["timing"] = {"clean_s": t_clean - t0, "corruptions_s": t_corr - t_clean,
                     "attacks_s": time.perf_counter() - t_corr}
    return out


def same_images(folder: Dataset, base: Dataset) -> Dataset:
    """The ImageNet-C images of the clean evaluation images: ImageNet-C mirrors the val tree file by
    file, so a seeded subset of val maps to the same indices of each corruption folder."""
    full = base.dataset if isinstance(base, Subset) else base
    if len(folder) != len(full):  # type: ignore[arg-type]
        raise ValueError(f"the ImageNet-C folder has {len(folder)} images but the clean set "  # type: ignore[arg-type]
                         f"{len(full)}: they must be the same images")  # type: ignore[arg-type]
    return Subset(folder, base.indices) if isinstance(base, Subset) else folder


def _imagenet_c_views(root: str, c: Corruptions, base: Dataset,
                      img_size: int | None) -> dict[tuple[str, int], Dataset]:
    from torchvision import transforms

    from ...robustness.corruptions import imagenet_c_folder

    size = img_size or 224  # the released images are 224 x 224 centre crops
    tf = transforms.Compose([*([] if size == 224 else [transforms.Resize(size)]), transforms.ToTensor()])
    return {(n, s): same_images(imagenet_c_folder(root, n, s, tf), base)
            for n in c.names for s in c.severities}


def evaluate_ood(
    model: Callable[[], nn.Module],
    sets: OODSets,
    store: ResultStore,
    base_key: Mapping[str, Any],
    *,
    img_size: int | None,
    batch_size: int,
    log: Callable[[str], None] = print,
    progress: bool = True,
) -> dict[str, Any]:
    """Items ``ood/imagenet-a``, ``ood/imagenet-r`` (per-example correctness on the 200-class mask) and
    ``ood/imagenet-o`` (AUPR) of the folders given; the others are listed in ``skipped`` (one line each)."""
    from ...robustness import metrics as M

    out: dict[str, Any] = {}
    skipped: list[str] = []
    for name, root in sets.sets().items():
        if root is None or not Path(root).is_dir():
            why = f"no --{name} path given" if root is None else f"{root} not found"
            skipped.append(f"{name}: skipped ({why})")
            continue
        if name == "imagenet-o" and (sets.imagenet_val is None or not Path(sets.imagenet_val).is_dir()):
            skipped.append("imagenet-o: skipped (needs --imagenet-val, the in-distribution ImageNet val "
                           "folder)")
            continue
        key = {**base_key, "root": str(root), "val": sets.imagenet_val, "img_size": img_size}

        def compute(name: str = name, root: str = root) -> dict[str, Any]:
            if name == "imagenet-o":
                return M.imagenet_o_aupr(model(), root, sets.imagenet_val, img_size, batch_size, progress)
            return M.masked_accuracy(model(), root, name[-1], img_size, batch_size, progress)

        out[name] = store.get_or_compute(f"ood/{name}", key, compute)[0]
    for msg in skipped:
        log(f"  {msg}")
    out["skipped"] = skipped
    return out


def attack_key(a: Attack, eps: float, data_seed: int, draw: int | None = None,
               batch: int = ATTACK_BATCH_SIZE) -> dict[str, Any]:
    """The parameters of one attack item (added to the model's key): images, method, budget, options and
    the protocol. An attack on fewer images than the suite's draw (``draw``: the most any of its attacks
    uses) runs on the draw's first ``a.n``, which depend on the draw's size: the key names it then; and the
    batch size when it is not :data:`ATTACK_BATCH_SIZE` (random starts are drawn per batch)."""
    more = {"draw": draw} if draw is not None and draw != a.n else {}
    return {"n": a.n, "data_seed": data_seed, "method": a.method, "eps": eps, "options": dict(a.options),
            "protocol": a.protocol, **more, **batch_key(batch)}


def batch_key(batch: int) -> dict[str, int]:
    """What an attack item attacked in batches of ``batch`` images names in its key: the batch size when it
    is not :data:`ATTACK_BATCH_SIZE` (each batch is one seeded attack run, so random starts depend on it),
    nothing at the default (the key every item stored before had)."""
    return {"batch": batch} if batch != ATTACK_BATCH_SIZE else {}


def evaluate_autoattack(
    model: nn.Module | Callable[[], nn.Module],
    test_set: Dataset,
    suite: AutoAttackSuite,
    store: ResultStore,
    base_key: Mapping[str, Any],
    *,
    dataset: str | None,
    batch_size: int = 100,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """AutoAttack (``suite``) on the first ``suite.n`` images of ``dataset``'s committed test-image list
    (``test_set`` is that dataset's test split), items ``autoattack/clean`` and
    ``autoattack/<version>-<norm>/<eps label>`` of ``store``, per example.

    Returns ``{"clean_autoattack_subset": r, "autoattack": {suite.name: {eps label: r}}}``; each robust
    ``r`` also holds the perturbation norms (pixel units), the protocol (``pixel``) and ``robust_after``:
    images still correct after each of AutoAttack's attacks, as it reports them (``clean`` first), summed
    over the chunks (absent where a chunk was stored before it was recorded)."""
    from ...robustness.attacks import attack_logits
    from ...robustness.autoattack_log import robust_after_each_attack
    from ...robustness.image_ids import ids_key, load_image_ids

    if dataset is None:
        raise ValueError("autoattack needs the dataset's name to find its committed test-image list")
    ids = load_image_ids(dataset, suite.n)
    net = model if not isinstance(model, nn.Module) else (lambda: model)
    subset = Subset(test_set, ids)
    xs, ys = zip(*(subset[i] for i in range(len(ids))), strict=True)
    x_all, y_all = torch.stack(xs), torch.as_tensor(ys)
    params = {"n": suite.n, **ids_key(dataset)}

    def get(name: str, extra: Mapping[str, Any], compute: Callable[[], Any]) -> Any:
        return store.get_or_compute(name, {**base_key, **params, **extra}, compute)[0]

    out: dict[str, Any] = {"clean_autoattack_subset": get(
        "autoattack/clean", {}, lambda: _clean(net(), subset, batch_size))}
    res: dict[str, Any] = {}
    how = {"adaptive": True} if suite.adaptive else {}  # in the key only when set: older items stay valid
    for eps in suite.eps:
        item = f"autoattack/{suite.name}/{eps_label(eps)}"
        budget = eps_text(suite.norm, eps_label(eps))  # as people write it: 4/255 (Linf), 0.5 (L2)
        extra = {"version": suite.version, "norm": suite.norm, "eps": eps, "protocol": "pixel",
                 "attack_seed": 0, **how, **batch_key(batch_size)}

        def compute(eps: float = eps, item: str = item, extra: dict[str, Any] = extra,
                    budget: str = budget) -> dict[str, Any]:
            # chunks of batch_size images, each one AutoAttack run seeded alike (its attacks are per
            # example), each stored when done: an evaluation stopped part-way (an hour on one CPU core)
            # resumes at its first missing chunk, with the numbers an uninterrupted one gives
            chunks = []
            for start in range(0, len(y_all), batch_size):
                stop = min(start + batch_size, len(y_all))

                def chunk(start: int = start, stop: int = stop) -> dict[str, Any]:
                    with robust_after_each_attack() as after:  # AutoAttack's own per-attack breakdown
                        lg, lb, nm = attack_logits(net(), (x_all[start:stop], y_all[start:stop]),
                                                   "autoattack", eps, batch_size=batch_size, progress=False,
                                                   seed=0, version=suite.version, norm=suite.norm, **how)
                    return {**example_hits(lg, lb), "norms": nm.tolist(), "robust_after": after.counts}

                chunks.append(get(f"{item}/images-{start}-{stop}", {**extra, "images": [start, stop]}, chunk))
                log(f"  AutoAttack {suite.name} eps {budget}: images {start}-{stop} of "
                    f"{len(y_all)} done")
            nm = torch.tensor([v for c in chunks for v in c["norms"]], dtype=torch.float32)
            joined = {**join_hits(chunks), "norm": suite.norm, "protocol": "pixel",
                      "mean_norm": nm.mean().item(), "max_norm": nm.max().item()}
            if all(c.get("robust_after") for c in chunks):  # chunks stored before it was recorded lack it
                joined["robust_after"] = {name: sum(c["robust_after"][name] for c in chunks)
                                          for name in chunks[0]["robust_after"]}
            return joined

        t_a = time.perf_counter()
        r = res[eps_label(eps)] = get(item, extra, compute)
        log(f"  AutoAttack {suite.name} eps {budget} on {suite.n} images: top-1 "
            f"{100 * r['top1']:.1f}% ({time.perf_counter() - t_a:.0f} s)")
    out["autoattack"] = {suite.name: res}
    return out
