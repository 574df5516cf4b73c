"""What causal language modelling adds to the study report (:class:`LanguageSections`, for
:class:`~kpca_attention.tasks.language.suites.LMSuites`): perplexity tables in the shape of the paper's
Table 3, paired statistics over seeds and over tokens, the word-swap effect, the PAP trace and mu / tau
along the sequence, from the per-run results alone (no checkpoint needed).

Paired statistics against the baseline (same seed: same initialisation seed and batches):

* over seeds - the perplexity difference per seed, its mean, 95% t interval and paired t-test
  (:func:`~kpca_attention.report.stats.seed_test`);
* over tokens - the mean per-token NLL difference (nats) with a percentile bootstrap interval that
  resamples contiguous blocks of ``context`` tokens (neighbouring tokens share context, so single
  tokens are not independent; :func:`~kpca_attention.report.stats.bootstrap_diff_ci` on block means,
  seeds kept with their block), and a Wilcoxon signed-rank test (``scipy.stats.wilcoxon``) on the
  per-token differences averaged over seeds (it treats tokens as independent: read its p as optimistic).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...plotting import new_figure, panel_grid, row_starts, save_figure, series_style
from ...stats import bootstrap_diff_ci, seed_test
from ...tables import fmt_num, fmt_p, fmt_pm, markdown_table
from ..base import StudySections, bar_plot
from .suites import decode_nll

__all__ = ["LanguageSections", "lm_metrics", "token_nlls", "paired_tokens", "PAPER_TABLE3"]

#: the paper's Table 3 (WikiText-103, 16 layers, context 256): perplexity, clean and word swap
PAPER_TABLE3: dict[str, dict[str, float]] = {
    "Symlm": {"valid": 38.37, "test": 36.36, "valid_swap": 42.90, "test_swap": 44.32},
    "RPC-Symlm": {"valid": 37.38, "test": 35.26, "valid_swap": 41.83, "test_swap": 43.16},
}

#: spill-over of a swap: NLL changes up to this many tokens after a swapped token are plotted
SPILL = 32


def _metric_keys(splits: list[str]) -> list[str]:
    return [f"ppl/{s}" for s in splits] + [f"wordswap/{s}" for s in splits]


def _title(k: str) -> str:
    what, split = k.split("/")
    return f"{split} ppl" + (" (word swap)" if what == "wordswap" else "")


def _kept(nll: np.ndarray, swapped: list[int]) -> np.ndarray:
    """Mask of the per-token NLL entries whose target is not a swapped token (entry t - 1 predicts t)."""
    keep = np.ones(nll.shape[0], dtype=bool)
    idx = np.asarray([p - 1 for p in swapped if p >= 1], dtype=int)
    keep[idx] = False
    return keep


def lm_metrics(items: Mapping[str, Any]) -> dict[str, float]:
    """Perplexities of one run (``ppl/<split>``, ``wordswap/<split>``), the word-swap increase, the
    word-swap perplexity without the swapped tokens' own predictions (``ctx/<split>``: the effect of a
    corrupted context on the other tokens; ``clean_ctx/<split>``: the clean text on the same tokens),
    and training throughput."""
    m: dict[str, float] = {}
    for k, r in items.items():
        if k.startswith(("ppl/", "wordswap/")):
            m[k] = float(r["ppl"])
    for k in [k for k in m if k.startswith("wordswap/")]:
        split = k.split("/")[1]
        if f"ppl/{split}" not in items:
            continue
        att, clean = items[k], items[f"ppl/{split}"]
        m[f"swap_increase/{split}"] = m[k] - m[f"ppl/{split}"]
        a, c = decode_nll(att), decode_nll(clean)
        keep = _kept(a, att.get("swapped", []))
        m[f"ctx/{split}"] = math.exp(float(a[keep].mean()))
        m[f"clean_ctx/{split}"] = math.exp(float(c[keep].mean()))
    run = items["run"]
    m["tokens_per_s"] = float(run.get("tokens_per_s", float("nan")))
    m["train_min"] = float(run.get("train_time_s", float("nan"))) / 60  # nan: an existing model, not trained
    return m


def token_nlls(items: Mapping[str, Any], key: str) -> np.ndarray:
    """The per-token NLL vector ``(tokens - 1,)`` of one item."""
    return decode_nll(items[key])


def paired_tokens(a: np.ndarray, b: np.ndarray, block: int,
                  rng: np.random.Generator | int = 0) -> dict[str, Any]:
    """Per-token NLL of ``a`` against ``b`` (``(seeds, tokens)``, paired): mean difference (nats),
    block-bootstrap 95% interval and Wilcoxon signed-rank p (see the module docstring)."""
    from scipy.stats import wilcoxon

    a, b = np.atleast_2d(a), np.atleast_2d(b)
    if a.shape != b.shape:
        raise ValueError(f"paired token NLLs must have the same shape, got {a.shape} and {b.shape}")
    n_blocks = max(a.shape[1] // block, 1)
    used = n_blocks * block if a.shape[1] >= block else a.shape[1]
    blocks_a = a[:, :used].reshape(a.shape[0], n_blocks, -1).mean(-1)
    blocks_b = b[:, :used].reshape(b.shape[0], n_blocks, -1).mean(-1)
    lo, hi = bootstrap_diff_ci(blocks_a, blocks_b, rng)
    d = (a - b).mean(0)
    p = float(wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
    return {"mean": float(d.mean()), "boot_ci": [lo, hi], "wilcoxon_p": p, "tokens": int(d.size),
            "blocks": n_blocks, "block": block}


def _spill(items: Mapping[str, Any], split: str) -> np.ndarray | None:
    """Mean NLL increase (attacked - clean) at distance 0..SPILL after a swapped token (distance 0:
    predicting the swapped token itself)."""
    key = f"wordswap/{split}"
    if key not in items or f"ppl/{split}" not in items:
        return None
    d = token_nlls(items, key) - token_nlls(items, f"ppl/{split}")
    pos = [p for p in items[key].get("swapped", []) if p >= 1]
    if not pos:
        return None
    out = np.full(SPILL + 1, np.nan)
    for k in range(SPILL + 1):
        idx = [p - 1 + k for p in pos if p - 1 + k < d.size]
        if idx:
            out[k] = float(d[idx].mean())
    return out


# ----------------------------------------------------------------------------- formatting

def _token_cell(pt: Mapping[str, Any]) -> str:
    lo, hi = pt["boot_ci"]
    return f"{pt['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}] W p {fmt_p(pt['wilcoxon_p'])}"


# ----------------------------------------------------------------------------- the sections

class LanguageSections(StudySections):
    """Causal language modelling's part of the study report (see the module docstring)."""

    table_title = "## Perplexity (mean ± std over seeds; lower is better)"
    throughput_title = "train tokens/s"
    trace_heading = "## PAP trace of the RPC layers on valid windows"
    trace_note = ("Is the sparse component S of Principal Attention Pursuit ever non-zero in a causal model? "
                  "s_density: fraction of non-zero entries of S (mean over windows, heads and positions); "
                  "tau / max|K| above 1: the first step shrinks nothing.")
    trace_statements = True
    summary_means = False
    verdict_scale, verdict_unit, higher_is_better = 1.0, "perplexity", False
    value_unit = "perplexity"
    curve = ("eval_ppl", "valid perplexity during training\n(non-overlapping windows)", 1, True)
    footer = ("Per-run results with per-token NLL (float16; tasks/language/suites.py's decode_nll reads "
              "them): `results/<variant>-s<seed>.json`; paired statistics: `summary.json`.")

    def __init__(self, settings: Mapping[str, Any], throughput_key: str) -> None:
        super().__init__(settings, throughput_key)
        self.suites = self.settings["suites"]
        self.splits = list(self.suites["splits"])
        self.context = int(self.settings["recipe"].get("context", 256))
        self.swap_splits: list[str] = []

    def prepare(self) -> None:
        """The metrics, and the context the perplexities were computed with, read from their items: a
        study of existing models (``kpca-attention robustness``) has no recipe, and its report said the
        fallback 256 - also the token bootstrap's block length - for models of context 128."""
        super().prepare()
        seen = {int(r[k]["context"]) for s in self.slugs for r in self.res[s].values() for k in r
                if k.startswith("ppl/") and isinstance(r[k], Mapping) and "context" in r[k]}
        if len(seen) == 1:
            self.context = seen.pop()

    def keep(self, r: dict[str, Any]) -> dict[str, Any] | None:
        """Runs with a training summary and a perplexity item."""
        return r if "run" in r and any(k.startswith("ppl/") for k in r) else None

    def metrics(self, r: Mapping[str, Any]) -> dict[str, Any]:
        return lm_metrics(r)

    def keys(self) -> list[str]:
        return [k for k in _metric_keys(self.splits)
                if any(k in r for per in self.res.values() for r in per.values())]

    def title(self, key: str) -> str:
        return _title(key)

    def cell(self, values: Any) -> str:
        return fmt_pm(values, scale=1, digits=2)

    def summary_extra(self) -> dict[str, Any]:
        return {"paired_tokens": {}}

    def evaluation(self) -> str:
        suites, context, tokens = self.suites, self.context, self.suites["tokens"]
        return (
            f"Evaluation: the first {'all' if tokens is None else tokens} tokens of each of "
            f"{', '.join(self.splits)} with the paper's sliding window (context {context}, stride 1: each "
            f"token predicted once, from up to {context} preceding tokens); word swap: "
            f"{100 * suites['swap_rate']:g}% of the non-stopwords of each whole split replaced by "
            f"`{suites['replacement']}` (seed {suites['swap_seed']}), the same tokens scored"
            + (f"; PAP trace and mu / tau along the sequence on {self.settings['trace']} windows of the "
               "valid split" if self.settings.get("trace") else "") + "."
        )

    def table_notes(self, columns: Mapping[str, str]) -> list[str]:
        return ["The paper (Table 3, WikiText-103, 16 layers, context 256): valid / test perplexity "
                + "; ".join(f"{m} {p['valid']} / {p['test']}, word swap {p['valid_swap']} / {p['test_swap']}"
                            for m, p in PAPER_TABLE3.items())
                + ". Training throughput: the training loop's own tokens/s (one thread per run; it follows "
                "the machine's load).", ""]

    # --- paired differences over seeds and tokens ---------------------------------------------------
    def paired_note(self) -> str:
        return ("Over seeds: perplexity difference (variant - baseline, same seed), mean with its 95% t "
                "interval and paired t-test p (>= 2 seeds). Over tokens: mean per-token NLL difference "
                f"in nats, [block-bootstrap 95% interval, blocks of {self.context} tokens, seeds pooled], "
                "Wilcoxon signed-rank p on the per-token differences (averaged over seeds; optimistic, "
                "tokens are not independent). Negative: lower perplexity than the baseline.")

    def seed_noise(self, b0: int, b1: int, rng: np.random.Generator,
                   summary: dict[str, Any]) -> dict[str, str]:
        res, met, base = self.res, self.met, self.base
        cells = {}
        for k in self.keys_:
            if k in res[base][b0] and k in res[base][b1]:
                pt = paired_tokens(token_nlls(res[base][b1], k), token_nlls(res[base][b0], k), self.context,
                                   rng)
                d = met[base][b1][k] - met[base][b0][k]
                cells[k] = f"{d:+.2f}; {_token_cell(pt)}"
        return cells

    def paired(self, s: str, rng: np.random.Generator, summary: dict[str, Any]) -> dict[str, str] | None:
        res, met, base = self.res, self.met, self.base
        cells: dict[str, str] = {}
        summary["paired"][s], summary["paired_tokens"][s] = {}, {}
        for k in self.keys_:
            common = [sd for sd in sorted(res[s])
                      if sd in res[base] and k in res[s][sd] and k in res[base][sd]]
            if not common:
                continue
            st = seed_test([met[s][sd][k] - met[base][sd][k] for sd in common])
            pt = paired_tokens(np.stack([token_nlls(res[s][sd], k) for sd in common]),
                               np.stack([token_nlls(res[base][sd], k) for sd in common]), self.context, rng)
            summary["paired"][s][k] = {"seeds": common, **st}
            summary["paired_tokens"][s][k] = pt
            cell = f"{st['mean']:+.2f}"
            if st["ci"] is not None:
                cell += f" ({st['ci'][0]:+.2f}, {st['ci'][1]:+.2f}) t p {fmt_p(st['p'])}"
            cells[k] = cell + f"; {_token_cell(pt)}"
        return cells

    # --- sections and plots -------------------------------------------------------------------------
    def sections_before_trace(self, out: Path, summary: dict[str, Any]) -> list[str]:
        """The word-swap effect: all tokens, and the tokens around the swapped ones."""
        met, res, slugs, label = self.met, self.res, self.slugs, self.label
        self.swap_splits = swap_splits = [s for s in self.splits if any(
            f"swap_increase/{s}" in m for per in met.values() for m in per.values())]
        if not swap_splits:
            return []
        lines = ["## The word-swap effect", "",
                 f"`{self.suites['replacement']}` is not in the training vocabulary, so a swapped word is "
                 "read and predicted as `<unk>`, which the training text never contains: predicting it "
                 "costs the model a large, arbitrary NLL. The paper's number scores every token; 'other "
                 "tokens' leaves out the swapped tokens' own predictions and measures only what a corrupted "
                 "context does to the prediction of the words around it (clean text on the same tokens "
                 "in brackets). Increase: word-swap minus clean perplexity (mean ± std over seeds).", ""]
        wrows = []
        for s in slugs:
            seeds = sorted(met[s])
            w: dict[str, Any] = {"variant": label[s]}
            for sp in swap_splits:
                def pm(key: str, s: str = s, seeds: list[int] = seeds) -> str:
                    return fmt_pm([met[s][sd].get(key) for sd in seeds], scale=1, digits=2)

                w[f"inc/{sp}"] = pm(f"swap_increase/{sp}")
                w[f"ctx/{sp}"] = pm(f"ctx/{sp}") + " (" + pm(f"clean_ctx/{sp}") + ")"
            wrows.append(w)
        wcols = {"variant": "variant"}
        for sp in swap_splits:
            wcols.update({f"inc/{sp}": f"{sp}: increase (all tokens)",
                          f"ctx/{sp}": f"{sp}: word-swap ppl of other tokens (clean)"})
        n_sw = {sp: next((len(r[f"wordswap/{sp}"].get("swapped", [])) for per in res.values()
                          for r in per.values() if f"wordswap/{sp}" in r), 0) for sp in swap_splits}
        return lines + [markdown_table(wrows, wcols), "",
                        "Swapped tokens in the scored slice: "
                        + ", ".join(f"{sp} {n}" for sp, n in n_sw.items()) + ".", ""]

    def sections_after_trace(self, out: Path, summary: dict[str, Any]) -> list[str]:
        """Mu and tau along the sequence (the first PAP step, per position)."""
        slugs, label = self.slugs, self.label
        pos_runs = {(s, sd): r["pap_positions"] for s in slugs for sd, r in sorted(self.res[s].items())
                    if r.get("pap_positions")}
        if not pos_runs:
            return []
        first = next(iter(pos_runs.values()))
        n_pos = first["positions"]
        marks = [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if p <= n_pos]
        prows = []
        summary["positions"] = {}
        for s in slugs:
            runs = [pr for (ss, _), pr in pos_runs.items() if ss == s]
            if not runs:
                continue
            for name in runs[0]["layers"]:
                mean = {q: np.mean([pr["layers"][name][q] for pr in runs], axis=0)
                        for q in ("mu", "tau", "k_abs_max", "tau_over_kmax", "s1_density")}
                summary["positions"].setdefault(s, {})[name] = {q: v.tolist() for q, v in mean.items()}
                for p in marks:
                    prows.append({"variant": label[s], "layer": name, "position": str(p),
                                  **{q: fmt_num(float(mean[q][p - 1])) for q in mean}})
        return ["## Mu and tau along the sequence (first PAP step)", "",
                "Under the causal mask PAP's step size is a prefix quantity: mu_i = i * mu_dim / "
                "(4 * sum_{j <= i} ||k_j||_1), recomputed here from each RPC layer's keys with `pap_mu` as "
                "PAP computes it; tau_i = lambda * mu_i. s1_density: fraction of the entries of key row i "
                "shrunk at the first step (|K_id| > tau_i). Means over windows, heads and seeds at some "
                "positions (1-based). PAP's own trace averages over positions, so the later steps' sparse "
                "density is not available per position.", "",
                markdown_table(prows, {"variant": "variant", "layer": "layer", "position": "position",
                                       "mu": "mu", "tau": "tau", "k_abs_max": "max_d abs K_id",
                                       "tau_over_kmax": "tau / max abs K_i", "s1_density": "s1_density"}),
                ""]

    def plots(self, out: Path, summary: dict[str, Any]) -> tuple[list[Path], list[Path]]:
        return _plots(out, self.slugs, self.label, self.res, self.met, self.keys_, self.swap_splits,
                      summary.get("positions", {}))


def _plots(out: Path, slugs: list[str], label: dict[str, str], res: dict[str, dict[int, dict[str, Any]]],
           met: dict[str, dict[int, dict[str, float]]], keys: list[str], swap_splits: list[str],
           positions: dict[str, dict[str, dict[str, list[float]]]]) -> tuple[list[Path], list[Path]]:
    """``([perplexity bars], [word-swap spill-over, mu / tau along the sequence])``: the plots before and
    after the training curves."""
    fig, axes = panel_grid(len(keys), panel=(3.0, 4.2))
    for ax, k in zip(axes, keys, strict=True):
        bar_plot(ax, {s: [met[s][sd][k] for sd in sorted(met[s]) if k in met[s][sd]] for s in slugs},
                 slugs, label, rotation=45)
        ax.set_title(_title(k), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in row_starts(axes):
        ax.set_ylabel("perplexity; bars: mean, dots: seeds")
    before = [save_figure(fig, out / "perplexity.png")]
    paths: list[Path] = []

    if swap_splits:
        fig, axes = panel_grid(len(swap_splits), panel=(5.0, 4.0))
        for ax, sp in zip(axes, swap_splits, strict=True):
            for i, s in enumerate(slugs):
                curves = [c for c in (_spill(r, sp) for r in res[s].values()) if c is not None]
                if curves:
                    ax.plot(np.arange(SPILL + 1), np.nanmean(curves, axis=0), ms=3, **series_style(i),
                            label=label[s])
            ax.set_yscale("symlog", linthresh=0.01)
            ax.set_xlabel("tokens after the swapped word (0: predicting it)")
            ax.set_title(sp)
            ax.grid(alpha=0.3)
        for ax in row_starts(axes):
            ax.set_ylabel("mean NLL increase (nats), word swap - clean")
        axes[0].legend(fontsize=7)
        paths.append(save_figure(fig, out / "wordswap_spill.png"))

    if positions:
        fig, axes = new_figure(1, 3, figsize=(14, 4), squeeze=False)
        for i, (s, per_layer) in enumerate(positions.items()):
            for name, q in per_layer.items():
                x = np.arange(1, len(q["mu"]) + 1)
                tag = f"{label.get(s, s)} {name}"
                axes[0][0].plot(x, q["mu"], color=f"C{i}", label=f"mu, {tag}")
                axes[0][0].plot(x, q["tau"], "--", color=f"C{i}", label=f"tau, {tag}")
                axes[0][1].plot(x, q["tau_over_kmax"], color=f"C{i}", label=tag)
                axes[0][2].plot(x, q["s1_density"], color=f"C{i}", label=tag)
        axes[0][1].axhline(1.0, color="r", ls="--", lw=1)
        for ax, title in zip(axes[0], ("prefix mu and tau = lambda mu", "tau_i / max_d |K_id|",
                                       "fraction of row i shrunk at step 1"), strict=True):
            ax.set_xscale("log")
            ax.set_xlabel("position i (1-based)")
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=6)
        axes[0][0].set_yscale("log")
        paths.append(save_figure(fig, out / "pap_positions.png"))
    return before, paths
