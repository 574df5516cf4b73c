"""Kill-and-resume: a training process killed (SIGKILL) after a checkpoint and resumed with ``--resume``
ends with the same weights as an uninterrupted run of the same seed (CPU, bitwise)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from kpca_attention.train import get_preset, train
from kpca_attention.train.checkpoint import resolve_checkpoint

ARGS = dict(epochs=3, train_subset=128, eval_subset=32, batch_size=16, progress=False,
            model_kwargs={"depth": 1, "embed_dim": 48}, smoothing=0.1, mixup=0.8, cutmix=1.0, drop_path=0.1)


def cli_args(out) -> list[str]:
    sets = [f"{k}={v!r}" if isinstance(v, dict) else f"{k}={v}" for k, v in ARGS.items()]
    cmd = [sys.executable, "-m", "kpca_attention.cli", "train", "--preset", "digits-cpu", "-o", str(out),
           "--no-progress", "--set", "checkpoint_every_steps=4"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def env() -> dict[str, str]:
    # one thread everywhere: the uninterrupted reference runs with one thread too (same float sums)
    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def test_killed_training_resumes_to_the_uninterrupted_result(tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(cli_args(out), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    latest = out / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 120
    try:
        while not latest.exists():
            if proc.poll() is not None:
                err = proc.stderr.read().decode()[-2000:]
                pytest.fail(f"training exited early ({proc.returncode}): {err}")
            if time.monotonic() > deadline:
                pytest.fail("no checkpoint within 120 s")
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_at = json.loads(latest.read_text())
    assert not killed_at["finished"], "the run finished before it was killed: the test proves nothing"
    state = torch.load(resolve_checkpoint(out) / "state.pt", weights_only=True)
    step_killed = state["progress"]["global_step"]
    assert step_killed < 24

    done = subprocess.run(cli_args(out) + ["--resume"], env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["finished"]

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = train(get_preset("digits-cpu", output_dir=str(tmp_path / "ref"), **ARGS))
    finally:
        torch.set_num_threads(n)
    assert ref.global_step == 24
    w_ref = load_file(str(ref.checkpoint / "model.safetensors"))
    w_res = load_file(str(resolve_checkpoint(out) / "model.safetensors"))
    assert w_ref.keys() == w_res.keys()
    for k in w_ref:
        torch.testing.assert_close(w_res[k], w_ref[k], rtol=0, atol=1e-6, msg=f"{k} differs after resume")


def test_sigterm_stops_a_command_with_the_line_ctrl_c_gives_and_exit_143(tmp_path):
    # batch schedulers and `kill` send SIGTERM: the command exited 143 with no word, where Ctrl-C says what
    # is kept and how to continue (LM user-journey review)
    out = tmp_path / "run"
    proc = subprocess.Popen(cli_args(out), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    latest = out / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 120
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()[-2000:]
    assert err.decode().strip().splitlines()[-1].startswith("interrupted: finished work is kept")
    assert resolve_checkpoint(out).exists()  # the last whole checkpoint stays


def test_sigterm_stops_a_study_s_parallel_runs_without_leaking_their_semaphores(tmp_path):
    """``study --jobs 2`` stopped by SIGTERM terminated its worker processes where they stood, and the
    resource tracker warned "There appear to be 2 leaked semaphore objects" after the interrupted line:
    the workers now unwind as on Ctrl-C (schedule._stop_on_sigterm)."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    # two seeds: four runs for two workers, so runs wait in the pool's queue when the study is stopped (a
    # stopped worker took the next one and trained it while the study waited: no run may start after)
    cmd = [sys.executable, "-m", "kpca_attention.cli", "study", "demo", "-o", str(out), "--runs", str(runs),
           "--jobs", "2", "--seeds", "0,1", "--no-progress", "--no-checks"]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while len(list(runs.glob("*/steps.csv"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # both workers are training
    assert proc.poll() is None, "the study ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 143, text[-2000:]
    assert text.strip().splitlines()[-1].startswith("interrupted: finished work is kept"), text[-2000:]
    assert "leaked" not in text, text[-2000:]
    time.sleep(3)  # a worker that went on would be starting its next run now
    assert len([d for d in runs.iterdir() if d.is_dir() and d.name != "cache"]) == 2, sorted(runs.iterdir())
