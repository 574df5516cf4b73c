"""Whole-model KPCA analysis: every layer, head and input sequence, batched.

:class:`Analyzer` takes the q, k, v captured from one forward pass (:class:`~.capture.QKVCapture`)
and a token mask, crops every sequence to its real tokens, groups sequences of equal length, and
runs the diagnostics on ``(sequences x heads)`` stacks at once - no Python loop over heads (the
Hungarian matching is one SciPy call per (sequence, head)). :meth:`Analyzer.result` returns a
JSON-ready dict: ``summary`` (model-level means), ``layers``, ``heads`` (per layer/head means),
``gamma`` and ``spectrum`` per layer, ``eigen_stats``, ``pap`` (RPC layers) and columnar ``records``
(one entry per (sequence, layer, head)).

Per (sequence, head): predicted values ``V_hat`` (Theorem 1) from the keys (``floor_columns``: how many of
its columns are zero because their eigenvalue is at ``Kc``'s rounding floor), :func:`~.alignment.alignment`
of the learned V with V_hat, :func:`~.diagnostics.projection_loss` (paper scaling) and
:func:`~.diagnostics.projection_loss_official`, the top-d eigenvalues of ``Kc``. On the first
``detail_samples`` sequences also the gamma test and eigenvalues of standardised keys.

Chance levels (:mod:`.chance`): on the first ``null_samples`` sequences every alignment measure also
gets its two null baselines (``<measure>_null_perm``: V with its tokens permuted; ``<measure>_null_gauss``:
i.i.d. Gaussian V), ``null_draws`` seeded draws each; ``summary["chance"]`` tests measure against null
over (layer, head) units. On the first ``control_samples`` sequences, the positive control (V_hat plus
noise at known SNRs, with and without a random rotation) gives each measure's response curve. The gamma
test is tested the same way against the values with their tokens permuted (``summary["gamma_chance"]``) and
against the critique's random-orthogonal control (``summary["gamma_vs_control"]``), and
``summary["j_proj_share_h"]`` says how much of J_proj's variation over units is ``||h||^2``'s.

Scaled Attention layers (``A (I - S) V``): the paper's author holds that there the eigenvectors are
recovered by the effective values ``(I - S) V``, so alignment, gamma test and J_proj are computed for
``V_eff = V - S V`` (``S V = alpha softmax(K K^T / sqrt D) V`` or ``S @ V``), and the raw-V alignment is
kept under ``raw_v_*``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .alignment import alignment
from .capture import AttentionSite
from .chance import (
    DEFAULT_SNRS,
    NULL_KINDS,
    alignment_chance,
    chance_test,
    null_alignment,
    positive_control,
    share_of_change,
    unit_means,
)
from .diagnostics import gamma_test, projection_loss, projection_loss_official, top_eigenvalues
from .gram import CENTERINGS, METHODS, ORDERS, SCALES, kpca_eigen, predicted_values, signal_columns

__all__ = ["AnalysisConfig", "Analyzer", "SUMMARY_KEYS", "ALIGNMENT_KEYS", "CHANCE_MEASURES", "scaled_sv",
           "pack_records", "unpack_records"]

ALIGNMENT_KEYS = (
    "direct_cosine",
    "optimal_cosine",
    "signfix_cosine",
    "negative_pct",
    "pearson",
    "linear_cka",
    "kernel_cka",
    "relative_frobenius",
)
PROJECTION_KEYS = ("j_proj", "phi_norm_sq", "h_norm_sq")
SUMMARY_KEYS = (
    "linear_cka",
    "kernel_cka",
    "optimal_cosine",
    "direct_cosine",
    "j_proj",
    "phi_norm_sq",
    "h_norm_sq",
)
#: the alignment measures whose chance levels are measured and tested (the others come along in the JSON)
CHANCE_MEASURES = (
    "linear_cka",
    "kernel_cka",
    "optimal_cosine",
    "direct_cosine",
    "signfix_cosine",
    "relative_frobenius",
)
GAMMA_VARIANTS = ("values", "values_permuted", "eigenvectors", "random")
GAMMA_STATS = ("mean_abs", "std_abs", "mean_rel", "std_rel")


@dataclass
class AnalysisConfig:
    """Options of the analysis (defaults follow the critique, see :func:`~.gram.predicted_values`).

    Attributes:
        d_v: predicted value columns (None: the head width).
        order, scale, centering, method: see :func:`~.gram.predicted_values` / :func:`~.gram.kpca_eigen`.
        bandwidth, threshold: kernel CKA (``"kornblith"`` or ``"critique"``).
        row_eps: added to row norms in cosines (critique: 1e-8; 0 = exact).
        cka_eps: added to the linear-CKA denominator (critique: 1e-10; 0 = exact).
        optimal: run the Hungarian matching.
        detail_samples: sequences (first ones seen) that also get the gamma test and standardised
            eigenvalues (the critique's gamma script used 3 images, its eigenvalue script 25).
            Relative gamma differences use 1024 sampled token pairs per head.
        null_samples, null_draws: sequences (first ones seen) whose alignment measures also get the
            permutation and Gaussian nulls, and draws per null (averaged).
        control_samples: sequences that also get the positive control at ``control_snrs``.
        gamma_noise, seed: the random-orthogonal control of the gamma test; ``seed`` also seeds the
            null and control draws (one generator, advanced in the order sequences arrive).
        chunk_elems: float64 elements per batched N x N stack (bounds memory: 2^25 = 256 MiB).
    """

    d_v: int | None = None
    order: str = "abs"
    scale: str = "unit"
    centering: str = "GHA"
    method: str = "auto"
    bandwidth: str = "kornblith"
    threshold: float = 1.0
    row_eps: float = 0.0
    cka_eps: float = 0.0
    optimal: bool = True
    detail_samples: int = 10
    null_samples: int = 20
    null_draws: int = 10
    control_samples: int = 2
    control_snrs: tuple[float, ...] = DEFAULT_SNRS
    gamma_noise: float = 0.1
    seed: int = 0
    chunk_elems: int = 2**25

    def to_json(self) -> dict[str, Any]:
        """The settings as an analysis stores them, JSON-exact: tuples as lists, the infinite SNR as
        ``"inf"`` (JSON has no inf: it would come back as null)."""
        return {k: ["inf" if isinstance(x, float) and math.isinf(x) else x for x in v]
                if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def __post_init__(self) -> None:
        for name, valid in (
            ("order", ORDERS),
            ("scale", SCALES),
            ("centering", CENTERINGS),
            ("method", METHODS),
        ):
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(valid)}")
        for name in ("detail_samples", "null_samples", "control_samples"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.null_draws < 1:
            raise ValueError(f"null_draws must be >= 1, got {self.null_draws}")
        if self.row_eps < 0 or self.cka_eps < 0:
            raise ValueError(f"row_eps and cka_eps must be >= 0, got {self.row_eps} and {self.cka_eps}")
        self.control_snrs = tuple(float(x) for x in self.control_snrs)
        if any(not (x >= 0) for x in self.control_snrs):
            raise ValueError(f"control_snrs must be >= 0 (inf allowed), got {self.control_snrs}")


def scaled_sv(site: AttentionSite, k: Tensor, v: Tensor) -> Tensor | None:
    """``S V`` of a Scaled Attention layer for ``k, v`` of shape ``(B, H, N, D)``; None for other layers."""
    from ..attention import ScaledAttention

    m = site.module
    if not isinstance(m, ScaledAttention):
        return None
    if m.mode == "matrix":
        s = m.scale_s.detach().to(torch.float64)
        if s.shape[-1] != v.shape[-2]:
            raise ValueError(
                f"{site.name}: Scaled Attention S is {tuple(s.shape)} but the sequence has "
                f"{v.shape[-2]} analysed tokens (special-token exclusion does not apply here)"
            )
        return s @ v
    alpha = float(m.alpha.detach())
    a_sym = torch.softmax(k @ k.mT / math.sqrt(k.shape[-1]), dim=-1)
    return alpha * (a_sym @ v)


#: how an analysis file stores its per-record columns (:func:`pack_records`)
RECORDS_ENCODING = "little-endian float64 / int64 columns, xz, base85 (kpca_attention.kpca.unpack_records)"


def pack_records(records: dict[str, Any]) -> dict[str, Any]:
    """The per-record columns of an analysis (one value per (input, layer, head)) as an analysis file
    stores them: each column's exact float64 (int64 for integers) bytes, packed by
    :func:`~kpca_attention.io.pack_bytes` - 40 % of the same numbers written as JSON text, and exact."""
    from ..io import pack_bytes

    cols: dict[str, Any] = {}
    n = None
    for key, val in records.items():
        a = np.asarray(val)
        a = a.astype("<i8") if a.dtype.kind in "iub" else a.astype("<f8")
        n = len(a) if n is None else n
        if a.ndim != 1 or len(a) != n:
            raise ValueError(f"records column {key!r}: expected {n} values in one dimension, got {a.shape}")
        cols[key] = {"dtype": "int64" if a.dtype.kind == "i" else "float64", "data": pack_bytes(a.tobytes())}
    return {"encoding": RECORDS_ENCODING, "n": n or 0, "columns": cols}


def unpack_records(stored: dict[str, Any]) -> dict[str, np.ndarray]:
    """The columns of an analysis file's ``records``, as numpy arrays: :func:`pack_records`'s form, or the
    plain JSON lists that files written before it hold."""
    from ..io import unpack_bytes

    if "columns" not in stored:
        return {key: np.asarray(val) for key, val in stored.items()}
    out = {}
    for key, col in stored["columns"].items():
        a = np.frombuffer(unpack_bytes(col["data"], max_size=8 * int(stored["n"])),
                          dtype="<i8" if col["dtype"] == "int64" else "<f8")
        if len(a) != stored["n"]:
            raise ValueError(f"records column {key!r} holds {len(a)} values, the file says {stored['n']}")
        out[key] = a
    return out


def _pad(row: np.ndarray, width: int) -> np.ndarray:
    """Pad the last axis with NaN to ``width`` (sequences shorter than d_v have fewer eigenpairs)."""
    missing = width - row.shape[-1]
    return (
        row
        if missing <= 0
        else np.pad(row, [(0, 0)] * (row.ndim - 1) + [(0, missing)], constant_values=np.nan)
    )


class Analyzer:
    """Accumulates per-(sequence, layer, head) diagnostics over batches; see the module docstring."""

    def __init__(self, sites: Sequence[AttentionSite], config: AnalysisConfig | None = None) -> None:
        self.sites = list(sites)
        self.cfg = config or AnalysisConfig()
        self.num_sequences = 0
        self.input_of: dict[int, int] = {}  # sequence id -> the input it was cut from (bootstrap clusters)
        self.records: dict[str, list] = defaultdict(list)
        # gamma[layer][variant][stat] -> list of (d,) arrays, one per detailed (sequence, head)
        self.gamma: list[dict[str, dict[str, list[np.ndarray]]]] = [
            defaultdict(lambda: defaultdict(list)) for _ in self.sites
        ]
        self.gamma_lambda: list[list[np.ndarray]] = [[] for _ in self.sites]
        self.spectrum: list[list[np.ndarray]] = [[] for _ in self.sites]
        # eigenvalue stats need, per sequence, all (layer, head) top-d |eigenvalues|
        self.eig_raw: dict[int, list[np.ndarray]] = defaultdict(list)
        self.eig_std: dict[int, list[np.ndarray]] = defaultdict(list)
        self.pap: list[list[list[float]]] = [[] for _ in self.sites]
        self.official: dict[str, list[float]] = defaultdict(list)
        self.seconds = 0.0
        self._workers: int | None = None
        self._gen = torch.Generator().manual_seed(self.cfg.seed)  # null and control draws
        # gamma test per detailed (sequence, layer, head): mean over axes of the relative differences
        self.gamma_records: dict[str, list] = defaultdict(list)
        # positive control: [variant][measure] -> list of (len(snrs),) arrays, one per (sequence, layer, head)
        self.control: dict[str, dict[str, list[np.ndarray]]] = {
            "plain": defaultdict(list),
            "rotated": defaultdict(list),
        }

    # ------------------------------------------------------------------------------ accumulation
    @torch.no_grad()
    def add(self, captured: Sequence[dict[str, Any]], mask: Tensor | None = None,
            inputs: Sequence[int] | None = None) -> None:
        """One forward pass: ``captured[i]`` holds ``q, k, v`` ``(B, H, N, D)`` of ``sites[i]``;
        ``mask`` ``(B, N)`` bool marks the tokens to analyse (None: all); ``inputs`` ``(B,)`` the input
        each sequence was cut from (a causal model's nested prefixes of one text share it: the bootstrap
        over inputs resamples them together); None: each sequence is its own input.

        The float64 work on small ``(heads, N, N)`` stacks runs with one intra-op thread: OpenMP
        threads on such small ops gain little and, on a busy machine, cost 5x in CPU time
        (measured: 234 vs 49 CPU-s for MiniLM over 100 texts, 2 vs 1 threads, load ~8 on 2 cores).
        The dense eigensolver - the largest single cost - is split over the caller's thread count.
        """
        outer = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            b = captured[0]["k"].shape[0] if captured else 0
            if inputs is not None and len(inputs) != b:
                raise ValueError(f"inputs must name the input of each of the {b} sequences, "
                                 f"got {len(inputs)}")
            for i in range(b):
                self.input_of[self.num_sequences + i] = (int(inputs[i]) if inputs is not None
                                                         else self.num_sequences + i)
            self._add(captured, mask, outer)
        finally:
            torch.set_num_threads(outer)

    def _add(self, captured: Sequence[dict[str, Any]], mask: Tensor | None, workers: int) -> None:
        self._workers = workers
        t0 = time.perf_counter()
        if len(captured) != len(self.sites):
            raise ValueError(f"got q/k/v of {len(captured)} layers, expected {len(self.sites)}")
        b, _, n, _ = captured[0]["k"].shape
        mask = torch.ones(b, n, dtype=torch.bool) if mask is None else mask.bool().cpu()
        if mask.shape != (b, n):
            raise ValueError(f"mask must be (B, N) = {(b, n)}, got {tuple(mask.shape)}")
        lengths = mask.sum(1)
        if int(lengths.min()) < 2:
            raise ValueError("every sequence needs at least 2 analysed tokens")
        first = self.num_sequences
        for li, (site, rec) in enumerate(zip(self.sites, captured, strict=False)):
            q, k, v = (rec[key].to("cpu", torch.float64) for key in ("q", "k", "v"))
            trace = rec.get("pap_trace")
            if trace is not None:
                self.pap[li].append([float(x) for x in trace.get("s_density", [])])
            for length in sorted(set(lengths.tolist())):
                seqs = torch.nonzero(lengths == length).flatten()
                # real tokens first, original order kept (stable sort), then crop
                order = torch.argsort((~mask[seqs]).to(torch.int8), dim=1, stable=True)[:, :length]
                idx = order[:, None, :, None]
                pick = [x[seqs].gather(2, idx.expand(-1, x.shape[1], -1, x.shape[-1])) for x in (q, k, v)]
                self._group(li, site, *pick, [first + int(s) for s in seqs])
        self.num_sequences += b
        self.seconds += time.perf_counter() - t0

    def _group(
        self, li: int, site: AttentionSite, q: Tensor, k: Tensor, v: Tensor, seq_ids: list[int]
    ) -> None:
        """Sequences of one length: ``(S, H, L, D)`` each."""
        cfg = self.cfg
        s_n, h_n, length, d = k.shape
        sv = scaled_sv(site, k, v)
        v_eff = v if sv is None else v - sv
        d_v = cfg.d_v or v.shape[-1]
        flat = [x.reshape(s_n * h_n, length, x.shape[-1]) for x in (q, k, v, v_eff)]
        chunk = max(1, cfg.chunk_elems // (length * length * 4))
        out: dict[str, list[Tensor]] = defaultdict(list)
        for lo in range(0, s_n * h_n, chunk):
            qc, kc, vc, vec = (x[lo : lo + chunk] for x in flat)
            eig = kpca_eigen(
                kc, min(d_v, length), order=cfg.order, method=cfg.method, seed=cfg.seed, workers=self._workers
            )
            v_hat = predicted_values(
                kc, d_v, order=cfg.order, scale=cfg.scale, centering=cfg.centering, eigen=eig
            )
            # columns of V_hat zeroed because their eigenvalue is at Kc's rounding floor (large keys); with
            # N <= d_v tokens the last pair is Kc's own null direction (Kc 1 = 0), not counted
            out["floor_columns"].append((~signal_columns(eig))[..., : length - 1].sum(-1).to(torch.float64))
            akw = dict(
                optimal=cfg.optimal, threshold=cfg.threshold, bandwidth=cfg.bandwidth,
                row_eps=cfg.row_eps, cka_eps=cfg.cka_eps,
            )
            # Scaled Attention is judged on its (I - S) V values; the raw V is kept alongside.
            for prefix, values in (("", vec), ("raw_v_", vc if sv is not None else None)):
                if values is None:
                    continue
                al = alignment(values, v_hat, **akw)  # type: ignore[arg-type]
                for key, val in al.items():
                    out[prefix + key].append(val)
            seq_of = torch.tensor([seq_ids[i // h_n] for i in range(lo, lo + kc.shape[0])])
            self._nulls(out, vec, v_hat, seq_of < cfg.null_samples, akw)
            ctrl = seq_of < cfg.control_samples
            if ctrl.any():
                for variant in self.control:
                    resp = positive_control(
                        v_hat[ctrl], cfg.control_snrs, rotate=variant == "rotated", generator=self._gen, **akw
                    )
                    for key, val in resp.items():
                        self.control[variant][key].extend(val.T.numpy())  # (units, snrs)
            pl = projection_loss(qc, kc, vec)
            for key in PROJECTION_KEYS:
                out[key].append(pl[key + "_seq"])
            off = projection_loss_official(qc, kc, vec)
            for key in PROJECTION_KEYS:
                out["official_" + key].append(off[key + "_seq"])
            out["eig"].append(eig.eigenvalues.abs())
        res = {key: torch.cat(vals).reshape(s_n, h_n, *vals[0].shape[1:]) for key, vals in out.items()}
        eig_abs = res.pop("eig").numpy()  # (S, H, k)
        done = len(self.records["sequence"])
        for key in res:  # a column seen for the first time (e.g. raw_v_* of a later Scaled layer)
            if key not in self.records:
                self.records[key] = [float("nan")] * done
        for si, seq in enumerate(seq_ids):
            for hi in range(h_n):
                self.records["sequence"].append(seq)
                self.records["layer"].append(li)
                self.records["head"].append(hi)
                self.records["tokens"].append(length)
                for key, val in res.items():
                    self.records[key].append(float(val[si, hi]))
            self.eig_raw[seq].append(eig_abs[si])
            self.spectrum[li].append(_pad(eig_abs[si].mean(0), d_v))
        for col in self.records.values():  # columns this group lacks stay aligned (NaN)
            if len(col) < len(self.records["sequence"]):
                col.extend([float("nan")] * (len(self.records["sequence"]) - len(col)))
        detail = [i for i, s in enumerate(seq_ids) if s < cfg.detail_samples]
        if detail:
            sel = torch.tensor(detail)
            kd, vd = k[sel].reshape(-1, length, d), v_eff[sel].reshape(-1, length, v.shape[-1])
            # Kc has rank <= N - 1 (Kc 1 = 0): axes beyond it have eigenvalue 0 and no defined gamma
            d_g = min(d_v, length - 1)
            g = gamma_test(kd, vd, d=d_g, order=cfg.order, noise=cfg.gamma_noise, seed=cfg.seed)
            for i in detail:
                for hi in range(h_n):
                    self.gamma_records["sequence"].append(seq_ids[i])
                    self.gamma_records["layer"].append(li)
                    self.gamma_records["head"].append(hi)
            for variant in GAMMA_VARIANTS:
                self.gamma_records[variant + "_rel"].extend(g[variant]["mean_rel"].nanmean(-1).tolist())
            for variant in GAMMA_VARIANTS:
                for stat in GAMMA_STATS:
                    for row in g[variant][stat].numpy():
                        self.gamma[li][variant][stat].append(_pad(row, d_v))
            self.gamma_lambda[li].extend(_pad(row, d_v) for row in g["reference"]["lambda"].numpy())
            std_eig = top_eigenvalues(kd, min(d, length), standardized=True).reshape(len(detail), h_n, -1)
            for j, i in enumerate(detail):
                self.eig_std[seq_ids[i]].append(std_eig[j].numpy())

    def _nulls(
        self, out: dict[str, list[Tensor]], v: Tensor, v_hat: Tensor, sel: Tensor, akw: dict[str, Any]
    ) -> None:
        """Append ``<measure>_null_<kind>`` for one chunk: the nulls where ``sel`` (units ``(C,)``), NaN
        elsewhere; the measured optimal cosine (already in ``out``) is its own permutation null."""
        if self.cfg.null_samples == 0:
            return
        measures = [key for key in out if key in ALIGNMENT_KEYS]
        nulls: dict[str, Tensor] = {}
        if sel.any():
            measured_opt = out["optimal_cosine"][-1][sel] if "optimal_cosine" in out else None
            nulls = null_alignment(
                v[sel], v_hat[sel], draws=self.cfg.null_draws, generator=self._gen,
                measured_optimal_cosine=measured_opt, **akw,
            )
        for key in measures:  # every chunk gets every column (NaN where no null was drawn)
            for kind in NULL_KINDS:
                full = torch.full(sel.shape, float("nan"), dtype=torch.float64)
                if f"{key}_null_{kind}" in nulls:
                    full[sel] = nulls[f"{key}_null_{kind}"]
                out[f"{key}_null_{kind}"].append(full)

    # ------------------------------------------------------------------------------ results
    def result(self) -> dict[str, Any]:
        """JSON-ready results (see the module docstring)."""
        with warnings.catch_warnings():  # NaN-only ranks (sequences shorter than d_v) are expected
            warnings.simplefilter("ignore", RuntimeWarning)
            return self._result()

    def _result(self) -> dict[str, Any]:
        if not self.records:
            raise RuntimeError("nothing analysed yet: call add() with captured q/k/v first")
        rec = {key: np.asarray(val) for key, val in self.records.items()}
        metrics = [key for key in rec if key not in ("sequence", "layer", "head", "tokens")]

        def mean(x: np.ndarray) -> float | None:
            x = x[np.isfinite(x)]
            return float(x.mean()) if x.size else None

        summary: dict[str, Any] = {key: mean(rec[key]) for key in metrics}
        h, phi = summary.get("h_norm_sq"), summary.get("phi_norm_sq")
        summary["log10_h_over_phi"] = math.log10(h / phi) if h and phi and h > 0 and phi > 0 else None
        # what the official code logs: log(mean error) per layer, averaged over layers (NaN if a mean <= 0)
        if "official_j_proj" in rec:
            per_layer = [rec["official_j_proj"][rec["layer"] == li].mean() for li in range(len(self.sites))]
            logs = [math.log(x) if x > 0 else float("nan") for x in per_layer]
            summary["official_log_j_proj"] = float(np.mean(logs)) if all(np.isfinite(logs)) else None
        summary["num_sequences"] = self.num_sequences
        summary["num_heads_analysed"] = int(rec["layer"].size)
        summary["mean_tokens"] = float(rec["tokens"].mean())
        # (input, head) units where a measure is undefined (e.g. kernel CKA's median bandwidth 0 on duplicate
        # tokens): left out of every mean, so counted here rather than dropped in silence
        undefined = {key: int((~np.isfinite(rec[key].astype(float))).sum())
                     for key in dict.fromkeys((*SUMMARY_KEYS, *CHANCE_MEASURES)) if key in rec}
        summary["undefined_units"] = {key: n for key, n in undefined.items() if n}

        layers, heads = [], []
        for li, site in enumerate(self.sites):
            sel = rec["layer"] == li
            entry = {
                "layer": li,
                "name": site.name,
                "type": site.layer_type,
                "num_heads": site.num_heads,
                "head_dim": site.head_dim,
                **{key: mean(rec[key][sel]) for key in metrics},
            }
            if self.pap[li]:
                dens = np.array(self.pap[li])  # (batches, iterations)
                entry["pap_s_density"] = [float(x) for x in dens.mean(0)]
            if self.cfg.null_samples:  # per layer: units are its heads
                entry["chance"] = alignment_chance({k: v[sel] for k, v in rec.items()}, CHANCE_MEASURES)
            layers.append(entry)
            for hi in range(site.num_heads):
                hs = sel & (rec["head"] == hi)
                heads.append(
                    {
                        "layer": li,
                        "head": hi,
                        "n": int(hs.sum()),
                        **{key: mean(rec[key][hs]) for key in metrics},
                        **{
                            key + "_std": float(np.nanstd(rec[key][hs])) for key in SUMMARY_KEYS if key in rec
                        },
                    }
                )

        if self.cfg.null_samples:
            summary["chance"] = alignment_chance(rec, CHANCE_MEASURES)
            summary["null_units"] = int(np.isfinite(rec["linear_cka_null_perm"]).sum())
        for prefix in ("", "official_"):  # how much of J_proj's variation over units is ||h||^2's
            if prefix + "j_proj" in rec:
                summary[prefix + "j_proj_share_h"] = share_of_change(
                    rec[prefix + "j_proj"], rec[prefix + "h_norm_sq"],
                    clusters=[self.input_of.get(int(q), int(q)) for q in rec["sequence"]], seed=self.cfg.seed,
                )
        if self.gamma_records:
            g_units = unit_means(self.gamma_records, [v + "_rel" for v in GAMMA_VARIANTS])
            # the null: V's tokens permuted (it keeps the g-weighting); the critique's random control beside
            summary["gamma_chance"] = {
                **chance_test(g_units["values_rel"], g_units["values_permuted_rel"], higher_is_better=False),
                "null_label": "values with their tokens permuted",
            }
            summary["gamma_vs_control"] = chance_test(
                g_units["values_rel"], g_units["random_rel"], higher_is_better=False
            )
        control: dict[str, Any] = {}
        if any(self.control[v] for v in self.control):
            control = {
                "snr": ["inf" if math.isinf(x) else x for x in self.cfg.control_snrs],
                "units": len(next(iter(self.control["plain"].values()))),
                **{
                    variant: {key: np.nanmean(np.stack(rows), 0).tolist() for key, rows in curves.items()}
                    for variant, curves in self.control.items()
                },
            }

        gamma: dict[str, Any] = {}
        for li in range(len(self.sites)):
            if not self.gamma[li]:
                continue
            entry = {
                variant: {stat: np.nanmean(np.stack(rows), 0).tolist() for stat, rows in stats.items()}
                for variant, stats in self.gamma[li].items()
            }
            entry["lambda"] = np.nanmean(np.stack(self.gamma_lambda[li]), 0).tolist()
            gamma[str(li)] = entry
        if gamma:
            summary["gamma"] = {
                variant: {
                    stat: float(np.nanmean([np.nanmean(g[variant][stat]) for g in gamma.values()]))
                    for stat in GAMMA_STATS
                }
                for variant in GAMMA_VARIANTS
            }
            summary["gamma"]["lambda_mean"] = float(
                np.nanmean([np.nanmean(g["lambda"]) for g in gamma.values()])
            )

        from .diagnostics import eigen_stats

        eig: dict[str, Any] = {}
        for label, store in (("raw", self.eig_raw), ("standardized", self.eig_std)):
            seqs = [np.stack(v) for v in store.values() if len(v) == len(self.sites)]
            widths = {a.shape[-1] for a in seqs}
            if seqs and len(widths) == 1:
                arr = torch.from_numpy(np.stack([a.reshape(-1, a.shape[-1]) for a in seqs]))
                eig[label] = eigen_stats(arr)
            elif seqs:  # different widths (short sequences): keep the common top ranks
                w = min(widths)
                arr = torch.from_numpy(np.stack([a.reshape(-1, a.shape[-1])[:, :w] for a in seqs]))
                eig[label] = eigen_stats(arr)
        spectrum = {str(li): np.nanmean(np.stack(s), 0).tolist() for li, s in enumerate(self.spectrum) if s}
        pap = {
            site.name: layers[li]["pap_s_density"]
            for li, site in enumerate(self.sites)
            if "pap_s_density" in layers[li]
        }
        if pap:
            summary["pap_s_density_max"] = float(max(max(v) for v in pap.values()))
        return {
            "config": self.cfg.to_json(),
            "summary": summary,
            "layers": layers,
            "heads": heads,
            "gamma": gamma,
            "spectrum": spectrum,
            "eigen_stats": eig,
            "pap": pap,
            "positive_control": control,
            "records": {key: val.tolist() for key, val in rec.items()},
            "timing": {"analysis_s": self.seconds},
        }
