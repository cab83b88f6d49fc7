"""Writing one bucket of per-rank history (``history_every_steps`` frames), as the detection pass
does: building it and inserting it into SQLite, and the bytes it adds to the database. Per-rank
columns in one row (``service/jobs/history.py``, what the service writes) against a row per
rank (what it wrote before revision 0007, rebuilt here as it was). Then reading 120 buckets back
as ``GET /v1/jobs/{job}/history`` does, for all ranks and for the slowest 1,024.

    python bench/history_write.py --ranks 1024 10240 102400
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa  # noqa: E402

from failslow.service.db import make_engine, make_sessionmaker, upgrade  # noqa: E402
from failslow.service.detection.history import HistoryAccumulator  # noqa: E402
from failslow.service.detection.persist import write_history  # noqa: E402
from failslow.service.jobs.history import (  # noqa: E402
    FIELDS,
    RankColumns,
    add_history,
    bucket_row,
    history,
)
from failslow.service.jobs.models import Job  # noqa: E402

ROWS = sa.Table(  # the per-rank rows of revisions 0001-0006
    "rank_history_rows",
    sa.MetaData(),
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("rank", sa.Integer(), primary_key=True),
    sa.Column("bucket", sa.Integer(), primary_key=True),
    sa.Column("steps", sa.Integer(), nullable=False),
    sa.Column("end_ns", sa.BigInteger(), nullable=False),
    *(sa.Column(f, sa.Float(), nullable=True) for f in FIELDS),
)


def _accumulated(n: int, every: int, seed: int) -> HistoryAccumulator:
    rng = np.random.default_rng(seed)
    acc = HistoryAccumulator(job="j", every=every)
    slot_rank = list(range(n))
    for i in range(every):
        step = rng.uniform(1.0, 1.1, n)
        frame = SimpleNamespace(index=i, end_ns=i, step_time=step, comm_time=step / 5)
        scores = SimpleNamespace(compute_ratio=rng.uniform(0.9, 1.1, n), compute=step / 2,
                                 late=rng.uniform(0, 0.01, n), frame_time=1.0)  # fmt: skip
        acc.add(frame, scores, slot_rank, 1.0)  # type: ignore[arg-type]
    return acc


def _rows_as_before(acc: HistoryAccumulator, slot_rank: list[int]) -> list[dict[str, Any]]:
    """``HistoryAccumulator.rows`` before 0007: a dict per rank, in a Python loop."""
    present = acc.counts["lateness_s"]
    means = {k: np.where(acc.counts[k] > 0, s / np.maximum(acc.counts[k], 1), np.nan)
             for k, s in acc.sums.items()}  # fmt: skip
    out = []
    for slot in range(len(slot_rank)):
        if present[slot] == 0:
            continue
        row: dict[str, Any] = {"job_id": "j", "rank": slot_rank[slot], "bucket": 0,
                               "steps": int(present[slot]), "end_ns": acc.end_ns}  # fmt: skip
        for name, m in means.items():
            v = float(m[slot])
            row[name] = v if np.isfinite(v) else None
        out.append(row)
    return out


def _size(engine: sa.Engine, folder: str) -> int:
    """The database file's size with everything written to it (not waiting in the WAL)."""
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return Path(f"{folder}/h.db").stat().st_size


def measure(n: int, every: int, buckets: int) -> dict[str, Any]:
    buckets = max(buckets, -(-2_000_000 // (20 * n)))  # enough to grow the file by ~2 MB
    with tempfile.TemporaryDirectory() as d:
        engine = make_engine(f"sqlite:///{d}/h.db")
        upgrade(engine)
        ROWS.create(engine)
        sessions = make_sessionmaker(engine)
        with sessions.begin() as s:
            s.add(Job(id="j", first_seen_ns=0, last_seen_ns=0, watermark_ns=0))
        out: dict[str, Any] = {"ranks": n, "buckets": buckets}
        for name in ("columns", "rows"):
            build = write = 0.0
            size0 = _size(engine, d)
            for b in range(buckets):
                acc = _accumulated(n, every, seed=b)
                t = time.process_time()
                if name == "columns":
                    job_rows, rank_rows = acc.rows(list(range(n)), 1.0)
                    job_rows[0]["bucket"] = rank_rows[0]["bucket"] = b * every
                else:
                    rows = _rows_as_before(acc, list(range(n)))
                    for r in rows:
                        r["bucket"] = b * every
                t1 = time.process_time()
                with sessions.begin() as s:
                    if name == "columns":
                        write_history(s, job_rows, rank_rows, keep=None)
                    else:
                        s.execute(ROWS.insert(), rows)
                t2 = time.process_time()
                build, write = build + t1 - t, write + t2 - t1
            grown = _size(engine, d) - size0
            out[name] = {
                "build_s": round(build / buckets, 4),
                "insert_s": round(write / buckets, 4),
                "bytes_per_rank_bucket": round(grown / buckets / n, 1),
            }
            print(f"{n} ranks, {name}: {out[name]}", file=sys.stderr, flush=True)
        engine.dispose()
    return out


def measure_read(n: int, buckets: int, max_ranks: int) -> dict[str, Any]:
    """``GET /v1/jobs/{job}/history``'s work: ``buckets`` buckets of ``n`` ranks read back, all
    ranks and the ``max_ranks`` slowest; seconds of CPU and bytes of JSON."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        engine = make_engine(f"sqlite:///{d}/h.db")
        upgrade(engine)
        sessions = make_sessionmaker(engine)
        with sessions.begin() as s:
            s.add(Job(id="j", first_seen_ns=0, last_seen_ns=0, watermark_ns=0))
        for b in range(buckets):
            cols = RankColumns(np.arange(n), np.full(n, 10),
                               {f: rng.uniform(0.9, 1.1, n) for f in FIELDS})  # fmt: skip
            job_row = {"job_id": "j", "bucket": b, "steps": 10, "end_ns": b, "step_time_s": 1.0,
                       "step_time_max_s": 1.0, "slowdown": 1.0}  # fmt: skip
            with sessions.begin() as s:
                add_history(s, job_rows=[job_row], rank_rows=[bucket_row("j", b, b, cols)])
        out: dict[str, Any] = {"ranks": n, "buckets": buckets}
        for name, cut in (("all_ranks", None), (f"slowest_{max_ranks}", max_ranks)):
            with sessions() as s:
                t = time.process_time()
                body = orjson.dumps(history(s, job="j", buckets=buckets, max_ranks=cut))
                out[name] = {"cpu_s": round(time.process_time() - t, 3), "json_mb": len(body) / 1e6}
        print(f"read {n} ranks x {buckets} buckets: {out}", file=sys.stderr, flush=True)
        engine.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 10240, 102400])
    ap.add_argument("--every", type=int, default=10, help="frames per bucket")
    ap.add_argument("--buckets", type=int, default=3, help="buckets written (mean per bucket)")
    ap.add_argument("--read-buckets", type=int, default=120, help="as the status page asks")
    ap.add_argument("--max-ranks", type=int, default=1024, help="the endpoint's default")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = {
        "every": args.every,
        "write": [measure(n, args.every, args.buckets) for n in args.ranks],
        "read": [measure_read(n, args.read_buckets, args.max_ranks) for n in args.ranks],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
