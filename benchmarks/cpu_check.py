"""Every CPU speed target of the package on this machine, in one command, into one record.

    make cpu-check    # or: .venv/bin/python benchmarks/cpu_check.py [--parts pap,models] [--json out.json]

A speed claim holds only where it holds on every kind of machine (an AMD EPYC and an Intel Xeon so far:
docs/benchmarks.md keeps one table per kind). This runs the scripts that carry the targets, each in its
own process, in order, and writes what they printed - with the CPU model, torch's vector instructions,
the commit and the load average before and after each part - to
``benchmarks/records/<date>-<cpu>-<commit>-cpu_check.json`` (``--json`` elsewhere):

1. ``pap``       - ``bench_pap.py``: PAP / one SDPA call, forward <= 4.5x, forward+backward <= 5.0x, random
   and trained keys, 1 and 2 threads (issue 28);
2. ``pap-avx2``  - the same with ``ATEN_CPU_CAPABILITY=avx2`` (torch's AVX2 kernels on an AVX512 CPU: the
   other path a host of the same model may take); skipped where torch does not use AVX512;
3. ``family``    - ``bench_family.py``: each robust-attention mechanism / one SDPA call (issue 25);
4. ``models``    - ``bench_models.py``: RPC-SymViT-tiny / SymViT-tiny throughput, training >= 0.95,
   inference >= 0.9, 1 and 2 threads;
5. ``threads``   - ``bench_threads.py``: how PAP, SDPA, a GEMM and a copy scale from 1 thread to 2 (a
   diagnostic: no target).

Timings mean nothing on a busy machine, so it refuses to start (exit 2) while the 1-minute load average
is above ``--max-load`` (another run holds a core); ``--busy-ok`` runs anyway and the record says so.
Each part's verdict is read from the PASS / FAIL lines its script prints; the exit status is 1 when a
part failed or crashed. ``--quick`` runs every part at toy sizes (seconds: a check of this script, not
of speed - its record says so and goes to a temporary file unless ``--json`` is given).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kpca_attention.io import write_json_atomic
from kpca_attention.machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "records"


@dataclass(frozen=True)
class Part:
    """One benchmark script: its arguments for a real measurement and for ``--quick``, extra environment,
    and whether it needs torch to be using AVX512 (the AVX2 rerun)."""

    script: str
    args: tuple[str, ...]
    quick: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    needs_avx512: bool = False


_PAP_QUICK = ("--threads", "1", "--batch", "2", "--tokens", "17", "--repeats", "1", "--naive-repeats", "1",
              "--train-steps", "0", "--growth-iters", "2")
#: the parts, in the order they run
PARTS: dict[str, Part] = {
    "pap": Part("bench_pap.py", ("--threads", "1,2"), _PAP_QUICK),
    "pap-avx2": Part("bench_pap.py", ("--threads", "1,2"), _PAP_QUICK, {"ATEN_CPU_CAPABILITY": "avx2"},
                     needs_avx512=True),
    "family": Part("bench_family.py", ("--threads", "1,2"),
                   ("--threads", "1", "--batch", "2", "--tokens", "17", "--repeats", "1")),
    "models": Part("bench_models.py", ("--threads", "1,2", "--repeats", "9"),
                   ("--threads", "1", "--batch", "1", "--img-size", "32", "--repeats", "1", "--warmup", "0")),
    "threads": Part("bench_threads.py", (), ("--threads", "1", "--repeats", "1", "--mbytes", "1",
                                             "--batch", "2")),
}

_VERDICT = re.compile(r"\b(PASS|FAIL)\b")
_SUMMARY = re.compile(r"^\s*(ALL PASS|SOME FAIL)\b")


def verdict_lines(output: str) -> list[str]:
    """The lines of a script's output that carry a PASS or FAIL (its own closing summary left out)."""
    return [ln.strip() for ln in output.splitlines() if _VERDICT.search(ln) and not _SUMMARY.match(ln)]


def part_status(returncode: int, lines: list[str]) -> str:
    """``error`` (the script failed), ``FAIL`` (a target missed), ``PASS`` (every target met) or ``no
    target`` (a diagnostic)."""
    if returncode != 0:
        return "error"
    if any(_VERDICT.search(ln).group(1) == "FAIL" for ln in lines):  # type: ignore[union-attr]
        return "FAIL"
    return "PASS" if lines else "no target"


def run_part(name: str, part: Part, quick: bool) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / part.script), *(part.quick if quick else part.args)]
    env = {**os.environ, **part.env}
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    output = res.stdout + (f"\n[stderr]\n{res.stderr}" if res.returncode != 0 and res.stderr else "")
    lines = verdict_lines(res.stdout)
    status = part_status(res.returncode, lines)
    print(f"[{name}] {status} in {seconds:.0f} s" + "".join(f"\n  {ln}" for ln in lines)
          + (f"\n  exit status {res.returncode}: {res.stderr.strip().splitlines()[-1:]}" if status == "error"
             else ""), flush=True)
    shown = " ".join([f"benchmarks/{part.script}", *cmd[2:]])  # the record names no path of this disk
    return {"command": shown, "env": part.env, "returncode": res.returncode,
            "seconds": round(seconds, 1), "load_before": load_before, "load_after": os.getloadavg()[0],
            "status": status, "verdict_lines": lines, "output": output}


def commit() -> str:
    """HEAD's hash, ``+dirty`` when tracked files differ from it (``unknown`` outside a git checkout)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def record_path(cpu: str, today: datetime.date, code: str) -> Path:
    """``records/<date>-<cpu>-<commit>-cpu_check.json``: a second check on one day (after a change) keeps the
    first's record."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{cpu}-{code}".lower()).strip("-") or "cpu"
    return RECORDS / f"{today.isoformat()}-{slug}-cpu_check.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    ap.add_argument("--json", type=Path, default=None, help="where the record goes (default: "
                    "benchmarks/records/<date>-<cpu>-<commit>-cpu_check.json)")
    ap.add_argument("--max-load", type=float, default=0.5,
                    help="refuse to start above this 1-minute load average (default 0.5)")
    ap.add_argument("--busy-ok", action="store_true", help="run on a busy machine (the record says so)")
    ap.add_argument("--quick", action="store_true", help="toy sizes: checks this script, measures nothing")
    args = ap.parse_args(argv)
    names = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in names if p not in PARTS]
    if unknown or not names:
        print(f"error: unknown part(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(PARTS)}",
              file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    if load > args.max_load and not (args.busy_ok or args.quick):
        print(f"error: the machine is busy (1-minute load average {load:.2f} > {args.max_load}): other "
              "processes would be timed with these; wait for a quiet window or pass --busy-ok",
              file=sys.stderr)
        return 2
    info, code = machine_info(gpu=False), commit()
    print(f"CPU: {info['cpu']} ({info['logical_cpus']} logical CPUs, torch {info['torch']} using "
          f"{info['cpu_capability']}); commit {code}; load average {load:.2f}", flush=True)
    record: dict = {"script": "benchmarks/cpu_check.py", "date": datetime.date.today().isoformat(),
                    "commit": code, "machine": info, "load_average_start": load,
                    "busy_ok": args.busy_ok, "quick": args.quick, "parts": {}}
    for name in names:
        part = PARTS[name]
        if part.needs_avx512 and info["cpu_capability"] != "AVX512":
            reason = f"torch uses {info['cpu_capability']} here, not AVX512: nothing else to compare"
            print(f"[{name}] skipped: {reason}", flush=True)
            record["parts"][name] = {"status": "skipped", "reason": reason}
            continue
        record["parts"][name] = run_part(name, part, args.quick)
    path = args.json
    if path is None:
        path = (Path(tempfile.gettempdir()) / "cpu_check-quick.json" if args.quick
                else record_path(info["cpu"], datetime.date.today(), code))
    write_json_atomic(path, record)
    statuses = {n: p["status"] for n, p in record["parts"].items()}
    print(f"record: {path}\n" + json.dumps(statuses))
    return 1 if any(s in ("FAIL", "error") for s in statuses.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
