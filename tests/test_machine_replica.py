"""benchmarks/machine_replica.py: the numbers behind results/language/machine_replica.md (how far two kinds of
machine end for one seed) come from the result files, side by side, and a pair that is not a replica is
refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from kpca_attention.robustness.store import ResultStore
from kpca_attention.tasks.language.suites import encode_nll

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "machine_replica.py"


def _run(folder: Path, seed: int, cpu: str, ppl: float, nll: np.ndarray, epochs=(4.0, 3.5)) -> None:
    store = ResultStore(folder / "results" / f"symlm-s{seed}.json")
    store.put("run", {}, {"machine": {"cpu": cpu}, "train_time_s": 600.0,
                          "epochs": [{"epoch": float(i), "train_loss": x, "eval_loss": x - 0.5,
                                      "eval_ppl": float(np.exp(x - 0.5))} for i, x in enumerate(epochs)]})
    store.put("ppl/test", {"stride": 1}, {"ppl": ppl, "nll_mean": float(np.log(ppl)), **encode_nll(nll)})


def _replica(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path)


def test_the_replica_table_puts_each_number_of_both_runs_side_by_side(tmp_path) -> None:
    nll = np.array([1.0, 2.0, 3.0, 4.0])
    first, second = tmp_path / "first", tmp_path / "second"
    _run(first, 0, "Intel(R) Xeon(R) Processor @ 2.80GHz", 55.0, nll)
    _run(first, 1, "Intel(R) Xeon(R) Processor", 55.4, nll)  # the study's spread: SD over seeds 0 and 1
    _run(second, 0, "AMD EPYC", 55.0011, nll + np.array([0, 0, 0, 0.25]), epochs=(4.0, 3.5000007))
    res = _replica(tmp_path, [str(first), str(second), "--out", str(tmp_path / "r.md")])
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "r.md").read_text()
    assert "## symlm-s0" in text and "symlm-s1" not in text  # only the seed both folders have
    assert "Trained on Intel(R) Xeon(R) Processor (10 min) and on AMD EPYC (10 min)." in text
    rows = {r.split(" | ")[0].lstrip("| "): r.split(" | ")[1:]
            for r in text.splitlines() if r.startswith("| ")}
    assert rows["epoch 0 train_loss"][2] == "0"
    assert rows["epoch 1 train_loss"][:4] == ["3.5", "3.5000007", "7e-07", "2.0e-07"]
    sd = float(np.std([55.0, 55.4], ddof=1))
    assert rows["ppl/test ppl"] == ["55", "55.0011", "0.0011", "2.0e-05", f"{sd:.3g} |"]
    per_token = rows["ppl/test per-token NLL (4 tokens, float16)"]
    assert per_token[2:4] == ["max 0.25, mean 0.062", "75.0% identical"]
    assert "Largest relative difference of a recorded number: 2.0e-05." in text


def test_runs_that_are_not_replicas_are_refused(tmp_path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _run(first, 0, "Intel(R) Xeon(R) Processor", 55.0, np.ones(3))
    _run(second, 0, "AMD EPYC", 55.0, np.ones(3), epochs=(4.0, 3.5, 3.2))
    res = _replica(tmp_path, [str(first), str(second)])
    assert res.returncode != 0 and "2 and 3 epochs" in res.stderr
    _run(second, 0, "AMD EPYC", 55.0, np.ones(3))
    (first / "results" / "symlm-s0.json").rename(first / "results" / "symlm-s7.json")
    res = _replica(tmp_path, [str(first), str(second)])
    assert res.returncode != 0 and "no finished run" in res.stderr
