"""The leaderboard: every committed image-classification study, one row per model and threat model.

``write_leaderboard("results", "results/leaderboard", "docs/leaderboard.md")`` (``kpca-attention
leaderboard``) reads each study folder ``results/<study>/`` (``settings.json`` and the per-run result
stores ``results/<variant>-s<seed>.json``) and writes one table per threat model - dataset, norm,
budget, protocol and evaluation - with one row per (study, variant), sorted by robust accuracy:

* ``AutoAttack <version>``: the ``autoattack/<version>-<norm>/<eps>`` items (the committed image list);
* ``worst case of <attacks>``: per image, robust only if every attack run at that budget on the
  study's attacked images left it correct (the attacks run on fewer images - one seed's SPSA, say -
  are left out of that row and named in the notes); uniform noise is not an attack and is left out;
* ``corruptions``: mean top-1 over every corruption and severity the study ran;
* the RobustBench-format JSONs of ``kpca-attention benchmark ... -o results/benchmark`` committed under
  ``results/benchmark/`` (AutoAttack on the committed image list), one row each; each JSON's numbers must
  be what its sealed per-image results ``results/benchmark/results/<name>.json`` give (a JSON that differs,
  or has no such file, is refused with one line naming it).

A run whose store lacks items its study's settings ask for (a run in progress) is left out, so the
page changes only when runs finish. Numbers are means over the seeds present; the 95 % interval is a t
interval over seeds when there are two or more, else a Wilson interval over the images of the one run
(the table says which). Clean accuracy is on the same images. Everything is measured (``reported``
is ``""``, RobustBench's way of saying no paper reported the number); attacks under the ``lab`` protocol
get their own tables, never mixed with ``pixel`` ones, and so do attacks run with other settings (each table
and row names them, from :func:`~kpca_attention.robustness.attacks.attack_settings`). Studies of other tasks
(segmentation, language) have no RobustBench threat model and are listed as skipped.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import textwrap
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["leaderboard_rows", "render_markdown", "write_leaderboard"]

#: how the page says where it came from: the repository's committed results, or a user's folder
REPO_SOURCE = ("Generated from every committed study under `results/` by `kpca-attention leaderboard` "
               "(do not edit by hand; `tests/test_leaderboard.py` checks that this page and "
               "`results/leaderboard/` are in sync with `results/`).")

HEADER = """# Leaderboard

{source} One table per threat model, one row per model, sorted by robust accuracy; clean accuracy on
the same images. The AutoAttack tables are on the first images of the dataset's committed test-image
list, the worst-case and corruption tables on each study's seeded draw: two tables at one budget can be on
different images. A `benchmark/` row is named by its JSON (`rpc-seeds-vit-s0`: a model benchmarked under
that name, not necessarily the study's own run of that seed; docs/robustness.md says which). Mean over the
seeds listed; 95 % interval: t over seeds (2+ seeds) or Wilson over images (1 seed). All numbers are
measured here (`reported` is empty: no number a paper reported), attacks in pixel space (images in [0, 1],
eps in pixel units) unless a
table says `lab`; each table names its attacks' settings, and runs whose settings differ are never pooled
in one table. Models are small and trained on CPU budgets: read the rows as comparisons within a study, not
as results next to RobustBench's. The order is not a verdict: rows of different studies are different
trainings{repo_trainings}, a one-seed row's Wilson interval measures test-set noise only, and a mechanism's
non-adaptive attack can flatter it{repo_flatter}. The paired comparisons over seeds, with their verdicts,
are in each study's `report.md`{repo_results}.
"""

#: the sentences of the page that name the repository's own studies (left out for a user's folder)
REPO_NOTES = {"repo_trainings": " (the 3-seed `vision` study chose its recipe on the test split)",
              "repo_flatter": " (Elliptical: docs/results.md)", "repo_results": " and in docs/results.md"}


def _bits(r: Mapping[str, Any]) -> np.ndarray:
    from ..robustness.store import decode_bits

    return decode_bits(r["correct"])


def _n_classes(dataset: str | None) -> int | None:
    """The classes of a known image dataset (None when it is not known or depends on a folder)."""
    from ..data.images import dataset_info

    if dataset is None:
        return None
    try:
        return dataset_info(dataset).num_classes or None
    except ValueError:
        return None


def _threats(settings: Mapping[str, Any], items: Mapping[str, Any],
             n_classes: int | None = None) -> dict[tuple, dict[str, Any]]:
    """``{threat key: {"robust": bits, "clean": bits, "attacks": [...], "left_out": [...]}}`` of one run
    (``n_classes``: the model's, for the target count of AutoAttack's targeted attacks)."""
    from ..robustness.attacks import attack_settings
    from ..tasks.classification.suites import attack_name, eps_text

    attacks = settings["suites"].get("attacks", [])
    methods = {attack_name(a): a["method"] for a in attacks}
    described = {attack_name(a): attack_settings(a["method"], a.get("options"), n_classes=n_classes)
                 for a in attacks}
    out: dict[tuple, dict[str, Any]] = {}
    groups: dict[tuple, list[tuple[str, np.ndarray]]] = {}
    for item, r in items.items():
        parts = item.split("/")
        if len(parts) != 3 or not isinstance(r, dict) or "correct" not in r:
            continue
        if parts[0] == "attacks":
            name, label = parts[1], parts[2]
            if methods.get(name) in (None, "noise"):
                continue
            protocol = r.get("protocol", "pixel")
            groups.setdefault((r.get("norm", "Linf"), label, protocol), []).append((name, _bits(r)))
        elif parts[0] == "autoattack" and "clean_autoattack" not in item:
            version, norm = parts[1].split("-", 1)
            key = (norm, eps_text(norm, parts[2]), "pixel", f"AutoAttack {version}")
            out[key] = {"robust": _bits(r), "clean": _bits(items["autoattack/clean"]), "attacks": [parts[1]],
                        "left_out": [], "settings": _autoattack_settings(version, norm, n_classes)}
    for (norm, label, protocol), runs in groups.items():
        n = max(len(b) for _, b in runs)
        used = sorted(a for a, b in runs if len(b) == n)
        robust = np.logical_and.reduce([b for _, b in runs if len(b) == n])
        key = (norm, eps_text(norm, label), protocol, "worst case of " + ", ".join(used))
        out[key] = {"robust": robust, "clean": _bits(items["attacks/clean"])[:n], "attacks": used,
                    "left_out": sorted(a for a, b in runs if len(b) != n),
                    "settings": "; ".join(f"{a}: {described[a]}" for a in used)}
    views = [_bits(r) for k, r in items.items() if k.startswith("corruptions/") and k.count("/") == 2]
    if views:
        out[("corruptions", None, "pixel", f"mean of {len(views)} corruption views")] = {
            "robust": np.stack(views).mean(0), "clean": _bits(items["corruptions/clean"]), "attacks": [],
            "left_out": [], "settings": ""}
    return out


def _autoattack_settings(version: str, norm: str, n_classes: int | None) -> str:
    from ..robustness.attacks import attack_settings

    return attack_settings("autoattack", {"version": version, "norm": norm}, n_classes=n_classes)


def _split_by_settings(tables: dict[tuple, list[dict[str, Any]]]) -> dict[tuple, list[dict[str, Any]]]:
    """Rows whose attacks ran with other settings (another Square budget, APGD's restarts...) are other
    threat evaluations: a table whose rows differ there becomes one table per setting, each evaluation
    naming its settings (rows are never pooled across settings)."""
    out: dict[tuple, list[dict[str, Any]]] = {}
    for key, rows in tables.items():
        texts = sorted({r["attack_settings"] for r in rows})
        if len(texts) == 1:
            out[key] = rows
            continue
        for text in texts:
            out[(*key[:4], f"{key[4]} [{text}]")] = [r for r in rows if r["attack_settings"] == text]
    return out


def _missing(settings: Mapping[str, Any], items: Mapping[str, Any], seed: int) -> list[str]:
    """The items the study's suites ask of this run that its store does not hold (a run in progress)."""
    from ..tasks.classification.suites import attack_name, eps_label

    suites = settings["suites"]
    want = []
    c = suites.get("corruptions") or {}
    want += [f"corruptions/{n}/{s}" for n in c.get("names", []) for s in c.get("severities", [])]
    for a in suites.get("attacks", []):
        if a.get("seeds") is None or seed in a["seeds"]:
            want += [f"attacks/{attack_name(a)}/{eps_label(e)}" for e in a["eps"]]
    return [w for w in want if w not in items]


def _interval(per_seed: list[float], bits: np.ndarray | None) -> tuple[float, float, str]:
    from scipy.stats import t

    from .benchmark import wilson_interval

    if len(per_seed) >= 2:
        m, sd = float(np.mean(per_seed)), float(np.std(per_seed, ddof=1))
        half = float(t.ppf(0.975, len(per_seed) - 1)) * sd / math.sqrt(len(per_seed))
        return m - half, m + half, f"t, {len(per_seed)} seeds"
    assert bits is not None
    if bits.dtype == bool:
        lo, hi = wilson_interval(int(bits.sum()), len(bits))
        return lo, hi, f"Wilson, {len(bits)} images"
    rng = np.random.default_rng(0)  # a mean over views per image: bootstrap over images
    boot = [bits[rng.integers(0, len(bits), len(bits))].mean() for _ in range(2000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(lo), float(hi), f"bootstrap, {len(bits)} images"


def leaderboard_rows(results: str | os.PathLike, *,
                     sealed_only: bool = False) -> tuple[dict[tuple, list[dict[str, Any]]], list[str]]:
    """``({(dataset, norm, eps, protocol, evaluation): [row, ...]}, notes)`` from every study folder;
    ``sealed_only`` (what ``kpca-attention leaderboard`` publishes): an unsealed result file is refused."""
    from ..io import read_json
    from ..report.study import result_files
    from ..robustness.store import ResultStore
    from ..tasks import for_settings

    tables: dict[tuple, list[dict[str, Any]]] = {}
    notes: list[str] = []
    listed: set[str] = set()  # result files already listed: a study's copy of another's (Study.reuse) is not
    for folder in sorted(p for p in Path(results).iterdir() if (p / "settings.json").is_file()):
        settings = read_json(folder / "settings.json")
        try:
            task = for_settings(settings)
        except ValueError:
            task = None
        if task is None or not task.robustbench:
            name = task.name if task else None
            if not (folder / "report.md").is_file():
                continue  # not published yet (runs in progress): the same page in every checkout
            notes.append(f"`{folder.name}`: task {name}, no RobustBench threat model - not listed")
            continue
        for v in settings.get("variants", []):
            runs: dict[tuple, dict[int, dict[str, Any]]] = {}
            dataset = None
            for path, seed in result_files(folder, v):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                store = ResultStore(path)  # verified: hashes and summaries
                if sealed_only and not store.sealed:  # this version seals what it writes: legacy, or tampered
                    raise ValueError(f"{path} is not sealed, so an edit of its items cannot be detected: the "
                                     "leaderboard publishes sealed results only - check the file and run "
                                     "`kpca-attention results seal` on its folder (a legacy file), or "
                                     "restore it")
                if digest in listed or store.taken_from is not None:
                    continue  # the same run, taken from another study: one row, under the study that ran it
                listed.add(digest)
                raw = store.records()
                items = store.run_items()  # not an item left under another run's key
                keys = [x.get("key", {}) for x in raw.values() if isinstance(x, dict)]
                dataset = dataset or next((k["train"]["dataset"] for k in keys if "train" in k), None) \
                    or next((k["dataset"] for k in keys if k.get("dataset")), None)  # an existing model's
                if _missing(settings, items, seed):
                    continue  # a run in progress: left out until it has every item
                for key, th in _threats(settings, items, _n_classes(dataset)).items():
                    runs.setdefault(key, {})[seed] = th
            for key, per_seed in runs.items():
                seeds = sorted(per_seed)
                rob = [float(per_seed[s]["robust"].mean()) for s in seeds]
                cln = [float(per_seed[s]["clean"].mean()) for s in seeds]
                lo, hi, how = _interval(rob, per_seed[seeds[0]]["robust"] if len(seeds) == 1 else None)
                first = per_seed[seeds[0]]
                tables.setdefault((dataset, *key), []).append({
                    "name": f"{folder.name}/{v['slug']}", "label": v.get("label", v["slug"]),
                    "model": v["model"], "kwargs": v.get("kwargs", {}),
                    "seeds": [] if v.get("source") else seeds,  # an existing model: evaluated once
                    "clean_acc": round(100 * float(np.mean(cln)), 2),
                    "robust_acc": round(100 * float(np.mean(rob)), 2),
                    "robust_acc_interval": [round(100 * lo, 2), round(100 * hi, 2)], "interval": how,
                    "n": int(len(first["robust"])), "attacks": first["attacks"],
                    "attack_settings": first["settings"], "left_out": first["left_out"], "reported": ""})
        # a study with no finished run yet is not mentioned: its folder may exist in one checkout (runs in
        # progress) and not in another, and the page must be the same in both
    _benchmarks(Path(results) / "benchmark", tables)
    tables = _split_by_settings(tables)
    for rows in tables.values():
        rows.sort(key=lambda r: (-r["robust_acc"], r["name"]))
    return tables, notes


def _benchmarks(folder: Path, tables: dict[tuple, list[dict[str, Any]]]) -> None:
    """Rows of the committed ``kpca-attention benchmark`` JSONs (``results/benchmark/<dataset>/...``), each
    checked against its sealed per-image results (:func:`_checked_benchmark`)."""
    from ..io import read_json

    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        r = read_json(path)
        if not isinstance(r, dict) or "clean_acc" not in r or path.parent.name == "results":
            continue
        aa = "autoattack_acc" in r
        field = "autoattack_acc" if aa else "corruptions_acc"
        how = f"AutoAttack {r.get('version', 'standard')}" if aa else "benchmark: mean of 75 corruption views"
        key = (r["dataset"], r["threat_model"], r.get("eps"), r.get("protocol", "pixel"), how)
        m = re.search(r"-s(\d+)$", r["name"])
        _checked_benchmark(path, r, folder, field)
        tables.setdefault(key, []).append({
            "name": f"benchmark/{r['name']}", "label": r["name"], "model": r.get("architecture"),
            "kwargs": {},
            "seeds": [int(m.group(1))] if m else [], "clean_acc": float(r["clean_acc"]),
            "robust_acc": float(r[field]), "robust_acc_interval": r[f"{field}_interval"],
            "interval": f"{'Wilson' if aa else 'bootstrap'}, {r['n']} images", "n": r["n"],
            "attacks": [], "attack_settings": _autoattack_settings(
                r.get("version", "standard"), r["threat_model"], _n_classes(r["dataset"])) if aa else "",
            "left_out": [], "reported": ""})


def _checked_benchmark(path: Path, r: Mapping[str, Any], folder: Path, field: str) -> None:
    """Refuse (one ValueError line naming ``path``) a benchmark JSON ``r`` whose numbers - ``n``, the clean
    accuracy, ``field`` (``autoattack_acc`` / ``corruptions_acc``) and their intervals - are not what its
    sealed per-image results ``<folder>/results/<name>.json`` give, or whose dataset or architecture (where
    the items' keys record one) are not theirs, computed as the rows of the studies
    are (:func:`_threats`, :func:`_interval`: the benchmark's own Wilson interval and bootstrap over images);
    a JSON without that file, or with an unsealed one, is refused too."""
    from ..io import output_path
    from ..robustness.store import ResultStore
    from .benchmark import parse_eps

    store_path = output_path(folder / "results", f"{r.get('name')}.json", what=f"{path}: name")
    if not store_path.is_file():
        raise ValueError(f"{path}: its sealed per-image results {store_path} are missing, so its numbers "
                         "cannot be checked: restore the file (or run `kpca-attention benchmark` again)")
    store = ResultStore(store_path)  # verified: hashes and summaries (ResultIntegrityError names the item)
    if not store.sealed:
        raise ValueError(f"{path}: its per-image results {store_path} are not sealed: run "
                         f"`kpca-attention results seal {store_path.parent}` first")
    keys = [rec["key"] for rec in store.records().values() if isinstance(rec["key"], dict)]
    datasets = {k.get("dataset") for k in keys}
    if r.get("dataset") not in datasets:
        raise ValueError(f"{path}: dataset {r.get('dataset')!r} but its sealed per-image results "
                         f"{store_path} are on {', '.join(sorted(map(str, datasets))) or 'no dataset'}")
    # results stored before 2026-11-30 afternoon have no architecture in their keys: nothing to check it by
    architectures = {k["architecture"] for k in keys if "architecture" in k}
    if architectures and r.get("architecture") not in architectures:
        raise ValueError(f"{path}: architecture {r.get('architecture')!r} but its sealed per-image results "
                         f"{store_path} are of {', '.join(sorted(map(str, architectures)))}: the JSON was "
                         "edited, or is another run's - restore it or run `kpca-attention benchmark` again")
    try:
        threats = _threats({"suites": {}}, store.items(), _n_classes(r.get("dataset")))
    except KeyError as e:
        raise ValueError(f"{path}: its sealed per-image results {store_path} lack the item {e}") from None
    if field == "corruptions_acc":
        found = [th for k, th in threats.items() if k[0] == "corruptions"]
    else:
        try:
            eps = parse_eps(r.get("eps"))[0]
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        how = f"AutoAttack {r.get('version', 'standard')}"
        found = [th for (norm, budget, protocol, evaluation), th in threats.items()
                 if (norm, protocol, evaluation) == (r.get("threat_model"), r.get("protocol", "pixel"), how)
                 and budget is not None and math.isclose(float(Fraction(budget)), eps, rel_tol=1e-6)]
    if not found:
        what = f"{r.get('threat_model')} {r.get('eps') or ''}".rstrip()
        raise ValueError(f"{path}: its sealed per-image results {store_path} hold no {field} items for "
                         f"{what}: the JSON was edited, or the results are another run's")
    th = found[0]
    lo, hi, _ = _interval([float(th["robust"].mean())], th["robust"])
    lo_c, hi_c, _ = _interval([float(th["clean"].mean())], th["clean"])
    true = {"n": len(th["robust"]), "clean_acc": round(100 * float(th["clean"].mean()), 2),
            "clean_acc_interval": [round(100 * lo_c, 2), round(100 * hi_c, 2)],
            field: round(100 * float(th["robust"].mean()), 2),
            f"{field}_interval": [round(100 * lo, 2), round(100 * hi, 2)]}
    for k, want in true.items():
        got = r.get(k)
        try:
            mine, theirs = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
            same = mine.shape == theirs.shape and bool(np.allclose(mine, theirs, rtol=0, atol=1e-9))
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(f"{path}: {k} is {got!r} but its sealed per-image results {store_path} give "
                             f"{want!r}: the JSON was edited, or is another run's - restore it or run "
                             "`kpca-attention benchmark` again")


def _title(key: tuple) -> str:
    dataset, norm, eps, protocol, evaluation = key
    budget = "" if eps is None else f" {eps}"
    lab = " (lab protocol: eps in normalised units)" if protocol == "lab" else ""
    return f"{dataset}, {norm}{budget}{lab} - {evaluation}"


def _order(key: tuple) -> tuple:
    dataset, norm, eps, protocol, evaluation = key
    value = 0.0 if eps is None else float(Fraction(eps))
    return (dataset or "", {"Linf": 0, "L2": 1}.get(norm, 2), protocol != "pixel", value, evaluation)


#: under a table whose only attack is CW: what such an L2 number is and is not
CW_ONLY = ("CW is a minimum-norm attack, run here with its fixed settings and its last iterate kept: "
           "an image counts as robust when the perturbation CW found is larger than the budget, though a "
           "smaller one may exist. The robust accuracy is an upper bound on what a stronger L2 attack (APGD, "
           "AutoAttack L2) leaves, and not comparable with RobustBench's L2 rows.")


def render_markdown(tables: Mapping[tuple, list[dict[str, Any]]], notes: list[str],
                    source: str | None = None) -> str:
    """The page; ``source``: the folder it was generated from (None: the repository's ``results/``)."""
    from ..tables import markdown_table

    where = REPO_SOURCE if source is None else (
        f"Generated from the studies under `{source}` by `kpca-attention leaderboard --results {source}`.")
    notes_ = REPO_NOTES if source is None else dict.fromkeys(REPO_NOTES, "")
    title, body = HEADER.format(source=where, **notes_).split("\n\n", 1)
    parts = [title + "\n\n" + textwrap.fill(" ".join(body.split()), 106, break_on_hyphens=False,
                                                 break_long_words=False) + "\n"]
    for key in sorted(tables, key=_order):
        rows = tables[key]
        robust = "corrupted top-1 (%)" if key[1] == "corruptions" else "robust top-1 (%)"
        parts.append(f"## {_title(key)}\n")
        if rows[0]["attack_settings"]:
            parts.append(f"Attacks: {rows[0]['attack_settings']}.\n")
        if key[4] == "worst case of cw":
            parts.append(CW_ONLY + "\n")
        body = [{"rank": i + 1, "label": r["label"], "name": f"`{r['name']}`",
                 "seeds": ",".join(map(str, r["seeds"])) or "-", "clean": f"{r['clean_acc']:.2f}",
                 "robust": f"{r['robust_acc']:.2f}",
                 "ci": "[{:.2f}, {:.2f}] ({})".format(*r["robust_acc_interval"], r["interval"]),
                 "n": r["n"]} for i, r in enumerate(rows)]
        parts.append(markdown_table(body, {"rank": "#", "label": "model", "name": "study/variant",
                                           "seeds": "seeds", "clean": "clean top-1 (%)", "robust": robust,
                                           "ci": "95% interval", "n": "images"},
                                    formats={"rank": str, "n": str},
                                    align_right=["rank", "clean", "robust", "n"]))
        left = sorted({a for r in rows for a in r["left_out"]})
        if left:
            parts.append(f"\nRun on fewer images and left out of this row: {', '.join(left)}.")
        parts.append("")
    if notes:
        parts += ["## Not listed", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(parts).rstrip() + "\n"


def _slug(key: tuple) -> Path:
    dataset, norm, eps, protocol, evaluation = key
    name = "-".join(x for x in ((eps or "").replace("/", "_"), protocol,
                                re.sub(r"[^A-Za-z0-9]+", "_", evaluation).strip("_")) if x)
    return Path(str(dataset)) / norm / f"{name}.json"


#: the keys of a leaderboard table's JSON, in the order it writes them (also how a stale one is recognised)
TABLE_KEYS = ("dataset", "threat_model", "eps", "protocol", "evaluation", "attack_settings", "rows")


def write_leaderboard(results: str | os.PathLike, out: str | os.PathLike,
                      markdown: str | os.PathLike, *, repo: bool = True,
                      sealed_only: bool = False) -> list[Path]:
    """Write ``markdown`` and one JSON per table under ``out`` (``<dataset>/<threat>/<eps>-...json``);
    JSON files of tables that no longer exist are removed. Returns the paths written. ``repo``: the
    repository's committed ``results/`` (the page says so), else a folder of the user's (named);
    ``sealed_only``: see :func:`leaderboard_rows`."""
    from ..io import output_path, write_json_atomic, write_text_atomic

    tables, notes = leaderboard_rows(results, sealed_only=sealed_only)
    out = Path(out)
    if out.is_symlink():
        raise ValueError(f"{out} is a symbolic link: the leaderboard removes its stale tables under its "
                         "output folder; give the folder itself")
    written = [write_text_atomic(markdown, render_markdown(tables, notes, None if repo else str(results)))]
    keep = set()
    for key, rows in tables.items():
        dataset, norm, eps, protocol, evaluation = key
        path = output_path(out, _slug(key), what="the leaderboard table")  # names come from results/
        keep.add(path)
        values = (dataset, norm, eps, protocol, evaluation, rows[0]["attack_settings"], rows)
        written.append(write_json_atomic(path, dict(zip(TABLE_KEYS, values, strict=True))))
    for old in out.rglob("*.json") if out.is_dir() else []:
        if old not in keep and _is_table(old):  # only tables this command wrote: other JSON stays
            old.unlink()
    return written


def _is_table(path: Path) -> bool:
    """Whether ``path`` holds a leaderboard table (as :func:`write_leaderboard` writes them)."""
    from ..io import read_json

    data = read_json(path)  # None when unreadable
    return isinstance(data, dict) and set(TABLE_KEYS) <= set(data)

