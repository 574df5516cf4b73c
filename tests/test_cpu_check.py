"""benchmarks/cpu_check.py: every CPU speed target in one command. The verdict of a part is read from its
script's PASS / FAIL lines; every part's arguments are accepted by its script (run at toy sizes here, so a
typo does not wait for the next Intel Xeon to show); a busy machine and an unknown part are refused."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_check.py"
_spec = importlib.util.spec_from_file_location("cpu_check", SCRIPT)
cpu_check = importlib.util.module_from_spec(_spec)
sys.modules["cpu_check"] = cpu_check  # its dataclasses look their module up there
_spec.loader.exec_module(cpu_check)


def test_verdicts_from_the_scripts_lines():
    out = ("CPU: x\n  forward   41.0  160.1   3.90x   4.5x  PASS   4.1x\n"
           "| KDE | <= 1.3x | 1.40x (1 / 1 ms) | FAIL |\n\nSOME FAIL; load average at the end: 0.1\n"
           "passes: 4 (PASSING is no verdict)\n")
    lines = cpu_check.verdict_lines(out)
    assert lines == ["forward   41.0  160.1   3.90x   4.5x  PASS   4.1x",
                     "| KDE | <= 1.3x | 1.40x (1 / 1 ms) | FAIL |"]
    assert cpu_check.part_status(0, lines) == "FAIL"
    assert cpu_check.part_status(0, lines[:1]) == "PASS"
    assert cpu_check.part_status(0, []) == "no target"
    assert cpu_check.part_status(1, lines[:1]) == "error"


def test_record_path_names_the_cpu_the_day_and_the_commit():
    import datetime

    day = datetime.date(2026, 12, 1)
    p = cpu_check.record_path("Intel(R) Xeon(R) Processor @ 2.80GHz", day, "58ce76b+dirty")
    assert p.name == "2026-12-01-intel-r-xeon-r-processor-2-80ghz-58ce76b-dirty-cpu_check.json"
    assert p.parent.name == "records"
    # a check after a change, the same day on the same CPU, keeps the first one's record
    assert cpu_check.record_path("Intel(R) Xeon(R) Processor @ 2.80GHz", day, "9f29319") != p


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_refusals_exit_2_with_one_line():
    res = _cli("--parts", "pap,nope")
    assert res.returncode == 2 and "unknown part(s) nope" in res.stderr
    assert "valid: pap, pap-avx2" in res.stderr
    res = _cli("--max-load", "-1")  # any machine is busier than that
    assert res.returncode == 2 and "the machine is busy" in res.stderr and "--busy-ok" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_every_part_runs_its_script_at_toy_sizes(tmp_path):
    out = tmp_path / "record.json"
    res = _cli("--quick", "--json", str(out))
    rec = json.loads(out.read_text())
    assert rec["quick"] is True and rec["machine"]["cpu"] and set(rec["parts"]) == set(cpu_check.PARTS)
    for name, part in rec["parts"].items():
        if part["status"] == "skipped":  # the AVX2 rerun on a CPU where torch does not use AVX512
            assert name == "pap-avx2" and "not AVX512" in part["reason"]
            continue
        assert part["status"] != "error", (name, part["output"][-2000:])
        assert part["returncode"] == 0 and part["seconds"] > 0
        assert part["command"].startswith(f"benchmarks/{cpu_check.PARTS[name].script} ")  # no local path
    # the targets' parts print verdicts (toy sizes: PASS or FAIL, either), the diagnostic none
    assert rec["parts"]["pap"]["verdict_lines"] and rec["parts"]["models"]["verdict_lines"]
    assert len(rec["parts"]["family"]["verdict_lines"]) >= 7
    assert rec["parts"]["threads"]["status"] == "no target"
    assert res.returncode == (1 if any(p["status"] == "FAIL" for p in rec["parts"].values()) else 0)
    assert "record: " + str(out) in res.stdout
