"""The run directory's owner: one writer at a time (a second gets one clear error; a killed writer's
lock is taken over), orphaned temporary checkpoints removed, ``--overwrite`` leaving exactly the new
run, a failed checkpoint write (full disk) reported in one line with the last good checkpoint kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kpca_attention.train import CheckpointError, get_preset, load_model, train
from kpca_attention.train.rundir import TRAJECTORY_FREE, RunDir, RunDirBusy

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(out, **kw):
    opts = dict(output_dir=str(out), epochs=1, train_subset=32, eval_subset=16, batch_size=16, progress=False,
                model_kwargs={"depth": 1, "embed_dim": 32})
    opts.update(kw)
    return get_preset("digits-cpu", **opts)


def test_a_second_writer_is_refused_and_a_dead_ones_lock_taken_over(tmp_path) -> None:
    rd = RunDir(tmp_path / "run")
    with rd.lock():
        with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
            with RunDir(tmp_path / "run").lock():
                pass
        # another process is refused too (fcntl locks are per open file description)
        code = textwrap.dedent(f"""
            from kpca_attention.train.rundir import RunDir, RunDirBusy
            try:
                with RunDir({str(tmp_path / 'run')!r}).lock():
                    print("got it")
            except RunDirBusy as e:
                print("busy:", e)
        """)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert "busy:" in r.stdout and "another process" in r.stdout
    # a writer killed while holding the lock: the kernel drops it, the next writer takes over
    code = textwrap.dedent(f"""
        import os, signal
        from kpca_attention.train.rundir import RunDir
        with RunDir({str(tmp_path / 'run')!r}).lock():
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", code], timeout=120)
    assert (tmp_path / "run" / ".lock").exists()
    with RunDir(tmp_path / "run").lock():
        pass


def test_train_refuses_a_busy_run_directory(tmp_path) -> None:
    with RunDir(tmp_path / "run").lock():
        with pytest.raises(RunDirBusy):
            train(tiny(tmp_path / "run"))
    assert not RunDir(tmp_path / "run").has_checkpoint()


def test_orphaned_temporary_checkpoints_are_removed(tmp_path) -> None:
    out = tmp_path / "run"
    train(tiny(out, epochs=2, max_steps=2))
    orphan = out / "checkpoints" / ".e0001-s00000002.tmp-999999"
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"partial")
    train(tiny(out, epochs=2), resume=True)
    assert not orphan.exists()
    assert [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")] == []


def test_overwrite_leaves_exactly_the_new_run(tmp_path) -> None:
    out = tmp_path / "run"
    train(tiny(out, epochs=2))
    old = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert len(old) == 2
    train(tiny(out, epochs=1, seed=1), overwrite=True)
    new = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert new == ["e0001-s00000002"]
    rows = (out / "epochs.csv").read_text().strip().splitlines()
    assert len(rows) == 2  # header + the new run's one epoch
    assert load_model(out)[1].seed == 1
    with pytest.raises(ValueError, match="exclude each other"):
        train(tiny(out), resume=True, overwrite=True)


def test_a_failed_checkpoint_write_is_one_clear_line(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    train(tiny(out, epochs=2, max_steps=2))
    before = RunDir(out).checkpoint()

    def full_disk(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc] . unexpected pos 50112 vs 50004")

    import shutil

    from kpca_attention.train import checkpoint as C

    monkeypatch.setattr(C.torch, "save", full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(2 << 20, 2 << 20, 1024))
    with pytest.raises(CheckpointError, match="no space left on device") as e:
        train(tiny(out, epochs=2), resume=True)
    assert "\n" not in str(e.value) and "previous checkpoint is kept" in str(e.value)
    monkeypatch.undo()
    assert RunDir(out).checkpoint() == before  # the last good checkpoint is still the latest
    assert [p for p in (out / "checkpoints").iterdir() if ".tmp" in p.name] == []
    model, cfg = load_model(out)
    assert isinstance(model, torch.nn.Module)
    train(tiny(out, epochs=2), resume=True)  # and the run resumes once there is space again


def test_which_fields_change_the_trajectory(tmp_path) -> None:
    out = tmp_path / "run"
    cfg = tiny(out)
    train(cfg)
    rd = RunDir(out)
    assert rd.finished() and rd.changed_fields(cfg) == {}
    cfg2 = tiny(out, eval_subset=8, progress=True, log_every_steps=3)
    assert rd.changed_fields(cfg2) == {}  # evaluation and logging do not change the weights
    assert set(rd.changed_fields(tiny(out, lr=1e-3))) == {"lr"}
    assert "epochs" not in TRAJECTORY_FREE and "eval_subset" in TRAJECTORY_FREE
