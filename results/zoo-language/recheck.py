"""An independent recomputation of this study's paired perplexity differences, outside the package.

    python results/zoo-language/recheck.py      # from the repository root; numpy and scipy only

Reads the per-run result files (following the LM, Symlm and RPC-Symlm files to the `language` study they
were taken from, and checking the taken items' hashes), checks that each recorded perplexity is exp(mean
NLL) and that the stored per-token losses (float16) average to that mean, then prints each mechanism's
test perplexity minus the LM's per seed with scipy's paired t test and 95 % interval - the numbers in
report.md's tables "against LM (asymmetric)" (raw p; Holm's adjustment is over the whole family there).
"""

import base64
import glob
import json
import lzma
import math
import os

import numpy as np
from scipy import stats

HERE = "results/zoo-language/results"
MECHANISMS = ["twicing", "neutreno", "pid", "elliptical", "kde", "rkde", "rvt", "rpc_symlm", "symlm"]


def per_token_nll(result: dict) -> np.ndarray:
    if "nll_f16" in result:  # the older form: base64 of the float16 values
        return np.frombuffer(base64.b64decode(result["nll_f16"]), dtype="<f2")
    planes = np.frombuffer(lzma.decompress(base64.b85decode(result["nll_f16_xz"])), dtype=np.uint8)
    half = planes.size // 2  # the float16 values' high bytes, then their low bytes
    return ((planes[:half].astype("<u2") << 8) | planes[half:].astype("<u2")).view("<f2")


def perplexity(path: str, item: str) -> float:
    data = json.load(open(path))
    if "reuses" in data:  # taken from another study: that study's file, its item's hash checked
        want = data["reuses"]["sha256"][item]
        src = os.path.join("results", data["reuses"]["study"], "results", data["reuses"]["file"])
        data = json.load(open(src))
        assert data["items"][item]["sha256"] == want, (path, item)
    r = data["items"][item]["result"]
    assert abs(math.exp(r["nll_mean"]) - r["ppl"]) < 1e-9 * r["ppl"], path
    nll = per_token_nll(r).astype(np.float64)
    assert nll.size == r["tokens"] and abs(nll.mean() - r["nll_mean"]) < 2e-3, (path, nll.mean())
    return r["ppl"]


def by_seed(variant: str, item: str) -> dict[int, float]:
    files = glob.glob(f"{HERE}/{variant}-s*.json")
    return {int(p.rsplit("-s", 1)[1][:-5]): perplexity(p, item) for p in files}


for item in ("ppl/test", "wordswap/test"):
    lm = by_seed("lm", item)
    print(f"{item}: LM {np.mean(list(lm.values())):.2f} over seeds {sorted(lm)}")
    for v in MECHANISMS:
        x = by_seed(v, item)
        seeds = sorted(set(x) & set(lm))
        d = [x[s] - lm[s] for s in seeds]
        t = stats.ttest_rel([x[s] for s in seeds], [lm[s] for s in seeds])
        ci = t.confidence_interval(0.95)
        print(f"  {v:11s} {np.mean(d):+.2f} ({ci.low:+.2f}, {ci.high:+.2f}) raw p {t.pvalue:.2g}; per seed "
              + ", ".join(f"{a:+.2f}" for a in d))
