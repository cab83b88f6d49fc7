"""Downsampled history in the database: the job's step time per bucket, and every rank's
means per bucket as columns.

Per rank, a bucket of ``history_every_steps`` steps is one entry of a column, not a row: one
row per (job, bucket) holds every rank's means, little-endian arrays compressed with zlib
(:func:`encode`). A row per rank per bucket cost, at 102,400 ranks, 0.71 s of Python to build
and 1.04 s to insert (SQLite) per bucket, inside the detection pass, and 81 bytes per rank per
bucket on disk; as columns 0.074 s, 0.010 s and 17 bytes (``bench/history_write.py``). The
newest ``keep`` buckets of per-rank history are kept per job (:func:`add_history`); the job's
own rows (one per bucket) are kept whole.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from failslow.service.jobs.models import JobHistory, RankHistoryBucket

FIELDS = ("step_time_s", "compute_s", "comm_s", "lateness_s", "score")  # per-rank means
MAGIC = b"FRH1"  # format 1: uint32 count, then zlib of int32 rank, int32 steps, float32 FIELDS
_HEAD = struct.Struct("<4sI")
_DECIMALS = 6  # read back: float32 holds ~7 significant digits; JSON shows no float32 noise


class HistoryFormatError(ValueError):
    """A stored bucket is not in a format this version reads."""


@dataclass(frozen=True, slots=True)
class RankColumns:
    """Every rank's means over one bucket: ``rank`` and ``steps`` (frames it was seen in), and
    per name of :data:`FIELDS` a float array (NaN: no value)."""

    rank: np.ndarray
    steps: np.ndarray
    values: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.rank.size)


def encode(cols: RankColumns) -> bytes:
    n = len(cols)
    parts = [cols.rank.astype("<i4"), cols.steps.astype("<i4")]
    parts += [cols.values[f].astype("<f4") for f in FIELDS]
    if any(p.shape != (n,) for p in parts):
        raise ValueError("every column of a rank history bucket has one entry per rank")
    return _HEAD.pack(MAGIC, n) + zlib.compress(b"".join(p.tobytes() for p in parts), 1)


def decode(blob: bytes) -> RankColumns:
    if len(blob) < _HEAD.size:
        raise HistoryFormatError("a rank history bucket shorter than its header")
    magic, n = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise HistoryFormatError(f"unknown rank history format {magic!r}")
    raw = zlib.decompress(blob[_HEAD.size :])
    if len(raw) != 4 * n * (2 + len(FIELDS)):
        raise HistoryFormatError(f"a rank history bucket of {len(raw)} bytes for {n} ranks")
    cols = np.frombuffer(raw, "<i4", count=2 * n).reshape(2, n)
    floats = np.frombuffer(raw, "<f4", offset=8 * n).reshape(len(FIELDS), n)
    return RankColumns(cols[0], cols[1], dict(zip(FIELDS, floats, strict=True)))


def bucket_row(job: str, bucket: int, end_ns: int, cols: RankColumns) -> dict[str, Any]:
    """The ``rank_history_buckets`` row of one bucket."""
    return {"job_id": job, "bucket": bucket, "end_ns": end_ns, "ranks": len(cols),
            "data": encode(cols)}  # fmt: skip


def add_history(
    session: Session,
    *,
    job_rows: list[dict[str, Any]],
    rank_rows: list[dict[str, Any]],
    keep: int | None = None,
) -> None:
    """Insert history rows (one bucket each; buckets are written once); then delete the job's
    per-rank buckets older than its newest ``keep`` (None: keep all)."""
    if job_rows:
        session.execute(insert(JobHistory), job_rows)
    if rank_rows:
        session.execute(insert(RankHistoryBucket), rank_rows)
        if keep is not None:
            for job in {r["job_id"] for r in rank_rows}:
                prune(session, job=job, keep=keep)


def prune(session: Session, *, job: str, keep: int) -> None:
    """Delete ``job``'s per-rank buckets but its newest ``keep``."""
    t = RankHistoryBucket
    oldest_kept = (
        select(t.bucket)
        .where(t.job_id == job)
        .order_by(t.bucket.desc())
        .limit(1)
        .offset(keep - 1)
        .scalar_subquery()
    )  # NULL while the job has fewer: nothing is deleted
    session.execute(delete(t).where(t.job_id == job, t.bucket < oldest_kept))


def rank_history(session: Session, *, job: str, since: int = 0) -> dict[int, RankColumns]:
    """The job's per-rank buckets from bucket ``since`` on, by bucket."""
    rows = session.execute(
        select(RankHistoryBucket.bucket, RankHistoryBucket.data).where(
            RankHistoryBucket.job_id == job, RankHistoryBucket.bucket >= since
        )
    ).all()
    return {int(bucket): decode(data) for bucket, data in rows}


def history(session: Session, *, job: str, buckets: int) -> dict[str, Any]:
    """The newest ``buckets`` history buckets: the job's step time per bucket, and per rank its
    speed score (1 = typical) — what the status page draws as a chart and a heatmap. A rank's
    score is None in a bucket it was not seen in, or whose per-rank history was pruned."""
    rows = session.scalars(
        select(JobHistory)
        .where(JobHistory.job_id == job)
        .order_by(JobHistory.bucket.desc())
        .limit(buckets)
    ).all()[::-1]
    index = {r.bucket: i for i, r in enumerate(rows)}
    got = {b: c for b, c in rank_history(session, job=job, since=rows[0].bucket if rows else 0)
           .items() if b in index}  # fmt: skip
    ranks = np.unique(np.concatenate([c.rank for c in got.values()])) if got else np.zeros(0)
    score = np.full((ranks.size, len(rows)), np.nan)
    for bucket, c in got.items():
        score[np.searchsorted(ranks, c.rank), index[bucket]] = c.values["score"]
    score = np.round(score, _DECIMALS)
    table = np.where(np.isnan(score), None, score).tolist()
    return {
        "job": job,
        "buckets": [
            {
                "bucket": r.bucket,
                "end_ns": r.end_ns,
                "steps": r.steps,
                "step_time_s": r.step_time_s,
                "step_time_max_s": r.step_time_max_s,
            }
            for r in rows
        ],
        "ranks": [{"rank": r, "score": s} for r, s in zip(ranks.tolist(), table, strict=True)],
    }
