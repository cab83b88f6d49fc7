"""Run PyTorch's distributed test suite plain and with failslow in its ranks; compare outcomes.

    python -m tests.compat.run_suite [--select NAME ...] [--json OUT] [--jobs N]

Each arm runs ``tests/compat/pytorch_suite.py`` under pytest with ``BACKEND=gloo``,
``WORLD_SIZE=2``: the plain arm as it is, the failslow arm with the environment of
``failslow run`` (``FAILSLOW_TORCH=1``, failslow's bootstrap first on ``PYTHONPATH``, records to a
spool folder), so that every rank the suite spawns installs the instrumentation when it imports
torch. A test is *broken by failslow* when it passes plain and does not pass with failslow; the
answer lists those, the tests whose outcome is the same in both arms by outcome, and how many
records failslow wrote (none would mean the arm measured nothing). ``--jobs N`` splits the tests
over N pytest processes per arm (each test spawns its own two ranks on free ports).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = "tests/compat/pytorch_suite.py"
INI = "tests/compat/pytest.ini"  # PyTorch's suite under its own rules, not failslow's


def collect(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", INI, SUITE, "--collect-only", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    names = [line.split("::")[-1] for line in out.stdout.splitlines() if "::" in line]
    if not names:
        raise SystemExit(f"no tests collected:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return names


def outcomes(junit: Path) -> dict[str, str]:
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        result[name] = state
    return result


def run_arm(
    names: list[str], env: dict[str, str], work: Path, tag: str, jobs: int
) -> dict[str, str]:
    chunks = [names[i::jobs] for i in range(jobs)]
    procs = []
    for i, chunk in enumerate(chunks):
        if not chunk:
            continue
        junit = work / f"{tag}-{i}.xml"
        listing = work / f"{tag}-{i}.txt"
        listing.write_text("\n".join(f"{SUITE}::TestDistBackendWithSpawn::{n}" for n in chunk))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            INI,
            "-q",
            f"--junitxml={junit}",
            *[f"{SUITE}::TestDistBackendWithSpawn::{n}" for n in chunk],
        ]
        log = open(work / f"{tag}-{i}.log", "w")  # noqa: SIM115
        procs.append(
            (
                subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
                junit,
                log,
            )
        )
    result: dict[str, str] = {}
    for proc, junit, log in procs:
        proc.wait()
        log.close()
        if junit.exists():
            result.update(outcomes(junit))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--select", nargs="*", help="only these tests (exact names)")
    ap.add_argument("--match", nargs="*", help="only tests whose names contain one of these")
    ap.add_argument("--json", help="write the comparison here")
    ap.add_argument("--jobs", type=int, default=2, help="pytest processes per arm")
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args(argv)

    from failslow.agents.launch import run_environment

    work = Path(tempfile.mkdtemp(prefix="failslow-compat-"))
    base = dict(os.environ)
    base.update(BACKEND="gloo", WORLD_SIZE=str(args.world_size), TEMP_DIR=str(work / "tmp"))
    base.pop("FAILSLOW_TORCH", None)
    (work / "tmp").mkdir()
    names = collect(base)
    if args.select:
        unknown = sorted(set(args.select) - set(names))
        if unknown:
            raise SystemExit(f"not in this PyTorch's suite: {', '.join(unknown)}")
        names = [n for n in names if n in args.select]
    if args.match:
        names = [n for n in names if any(m in n for m in args.match)]
    spool = work / "spool"
    spool.mkdir()
    instrumented = run_environment(base, "compat", None, str(spool))
    started = time.monotonic()
    arms = {}
    for tag, env in (("plain", base), ("failslow", instrumented)):
        t0 = time.monotonic()
        arms[tag] = run_arm(names, env, work, tag, args.jobs)
        print(f"{tag}: {len(arms[tag])} tests in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    plain, with_fs = arms["plain"], arms["failslow"]
    broken = sorted(n for n, s in plain.items() if s == "passed" and with_fs.get(n) != "passed")
    fixed = sorted(n for n, s in with_fs.items() if s == "passed" and plain.get(n) != "passed")
    records = 0
    from failslow.agents import wire

    for f in spool.glob("*.jsonl"):
        _, items = wire.decode_payload(f.read_bytes())
        records += sum(1 for m in items if m[0] == "c")
    summary = {
        "torch": _torch_version(),
        "backend": "gloo",
        "world_size": args.world_size,
        "tests": len(names),
        "plain": _count(plain),
        "failslow": _count(with_fs),
        "broken_by_failslow": broken,
        "passed_only_with_failslow": fixed,
        "records_written_by_failslow": records,
        "seconds": round(time.monotonic() - started),
        "logs": str(work),
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 1 if broken or records == 0 else 0


def _count(outcome: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for state in outcome.values():
        out[state] = out.get(state, 0) + 1
    return out


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


if __name__ == "__main__":
    sys.exit(main())
