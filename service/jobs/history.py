"""Downsampled history in the database: the job's step time per bucket, and every rank's
means per bucket as columns.

Per rank, a bucket of ``history_every_steps`` steps is one entry of a column, not a row: one
row per (job, bucket) holds every rank's means, little-endian arrays compressed with zlib
(:func:`encode`). A row per rank per bucket cost, at 102,400 ranks, 0.71 s of Python to build
and 1.04 s to insert (SQLite) per bucket, inside the detection pass, and 81 bytes per rank per
bucket on disk; as columns 0.074 s, 0.010 s and 17 bytes (``bench/history_write.py``). The
newest ``keep`` buckets of per-rank history are kept per job (:func:`prune`); the job's
own rows (one per bucket) are kept whole.
"""

from __future__ import annotations

import logging
import struct
import warnings
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from failslow.service.jobs.models import JobHistory, RankHistoryBucket

log = logging.getLogger(__name__)

FIELDS = ("step_time_s", "compute_s", "comm_s", "lateness_s", "score")  # per-rank means
MAGIC = b"FRH1"  # then uint32 ranks; per column (rank, steps: int32; FIELDS: float32) its
_HEAD = struct.Struct("<4sI")  # length (uint32) and its bytes, zlib-compressed one by one: a
_LEN = struct.Struct("<I")  # reader decompresses only the columns it asks for
_DTYPES = {"rank": "<i4", "steps": "<i4", **dict.fromkeys(FIELDS, "<f4")}
_DECIMALS = 6  # read back: float32 holds ~7 significant digits; JSON shows no float32 noise


class HistoryFormatError(ValueError):
    """A stored bucket is not in a format this version reads."""


@dataclass(frozen=True, slots=True)
class RankColumns:
    """Every rank's means over one bucket: ``rank`` and ``steps`` (frames it was seen in), and
    per name of :data:`FIELDS` a float array (NaN: no value; read back: those asked for)."""

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
    out = [_HEAD.pack(MAGIC, n)]
    for p in parts:
        z = zlib.compress(p.tobytes(), 1)
        out += [_LEN.pack(len(z)), z]
    return b"".join(out)


def decode(blob: bytes, fields: tuple[str, ...] = FIELDS) -> RankColumns:
    """A bucket's ranks, steps and the ``fields`` asked for (the others are not decompressed:
    a 100K-rank bucket is ~2.8 MB of columns)."""
    if len(blob) < _HEAD.size:
        raise HistoryFormatError("a rank history bucket shorter than its header")
    magic, n = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise HistoryFormatError(f"unknown rank history format {magic!r}")
    wanted = {"rank", "steps", *fields}
    got: dict[str, np.ndarray] = {}
    at = _HEAD.size
    for name, dtype in _DTYPES.items():
        if at + _LEN.size > len(blob):
            raise HistoryFormatError(f"a rank history bucket cut short before {name}")
        (size,) = _LEN.unpack_from(blob, at)
        at += _LEN.size
        if name in wanted:
            try:
                raw = zlib.decompress(blob[at : at + size])
            except zlib.error as exc:
                raise HistoryFormatError(f"a rank history bucket's {name}: {exc}") from None
            if len(raw) != 4 * n:
                raise HistoryFormatError(f"{len(raw)} bytes of {name} for {n} ranks")
            got[name] = np.frombuffer(raw, dtype)
        at += size
    if at != len(blob):
        raise HistoryFormatError(f"a rank history bucket of {len(blob)} bytes, {at} read")
    values = {f: got[f] for f in FIELDS if f in got}
    return RankColumns(got["rank"], got["steps"], values)


def bucket_row(job: str, bucket: int, end_ns: int, cols: RankColumns) -> dict[str, Any]:
    """The ``rank_history_buckets`` row of one bucket."""
    return {"job_id": job, "bucket": bucket, "end_ns": end_ns, "ranks": len(cols),
            "data": encode(cols)}  # fmt: skip


def add_history(
    session: Session, *, job_rows: list[dict[str, Any]], rank_rows: list[dict[str, Any]]
) -> None:
    """Insert history rows (one bucket each; buckets are written once)."""
    if job_rows:
        session.execute(insert(JobHistory), job_rows)
    if rank_rows:
        session.execute(insert(RankHistoryBucket), rank_rows)


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


def rank_history(
    session: Session, *, job: str, since: int = 0, fields: tuple[str, ...] = FIELDS
) -> dict[int, RankColumns]:
    """The job's per-rank buckets from bucket ``since`` on, by bucket (with ``fields``); a
    bucket this version cannot read is left out and logged."""
    rows = session.execute(
        select(RankHistoryBucket.bucket, RankHistoryBucket.data).where(
            RankHistoryBucket.job_id == job, RankHistoryBucket.bucket >= since
        )
    ).all()
    out = {}
    for bucket, data in rows:
        try:
            out[int(bucket)] = decode(data, fields)
        except HistoryFormatError as exc:
            log.warning("job %s: rank history bucket %s left out: %s", job, bucket, exc)
    return out


def version(session: Session, *, job: str) -> tuple[int, int, int, int] | None:
    """What changes whenever the job's history does (a bucket written, or its newest bucket
    written again by a flush): its newest bucket, that bucket's steps and end, and how many
    buckets it has. None: no history yet."""
    t = JobHistory
    newest = session.execute(
        select(t.bucket, t.steps, t.end_ns)
        .where(t.job_id == job)
        .order_by(t.bucket.desc())
        .limit(1)
    ).first()
    if newest is None:
        return None
    count = session.scalar(select(func.count()).select_from(t).where(t.job_id == job)) or 0
    return int(newest.bucket), int(newest.steps), int(newest.end_ns), int(count)


def history(
    session: Session, *, job: str, buckets: int, max_ranks: int | None = None
) -> dict[str, Any]:
    """The newest ``buckets`` history buckets: the job's step time per bucket, and per rank its
    speed score (1 = typical) — what the status page draws as a chart and a heatmap. A rank's
    score is None in a bucket it was not seen in, or whose per-rank history was pruned.

    ``max_ranks``: at most this many ranks, those with the lowest score in any of the buckets
    (the slowest; ties by rank), in rank order; ``ranks_total`` says how many had history. A
    100K-rank job's whole heatmap for 120 buckets is 12M numbers, ~110 MB of JSON."""
    rows = session.scalars(
        select(JobHistory)
        .where(JobHistory.job_id == job)
        .order_by(JobHistory.bucket.desc())
        .limit(buckets)
    ).all()[::-1]
    index = {r.bucket: i for i, r in enumerate(rows)}
    since = rows[0].bucket if rows else 0
    got = {b: c for b, c in rank_history(session, job=job, since=since, fields=("score",))
           .items() if b in index}  # fmt: skip
    cols = list(got.values())
    same = bool(cols) and all(np.array_equal(c.rank, cols[0].rank) for c in cols)
    if same:  # the usual case: every bucket has the same ranks in the same order
        ranks = np.unique(cols[0].rank)
        where = np.searchsorted(ranks, cols[0].rank)
    else:
        ranks = np.unique(np.concatenate([c.rank for c in cols])) if cols else np.zeros(0)
    score = np.full((ranks.size, len(rows)), np.nan, np.float32)
    for bucket, c in got.items():
        score[where if same else np.searchsorted(ranks, c.rank), index[bucket]] = c.values["score"]
    total = int(ranks.size)
    if max_ranks is not None and total > max_ranks:
        with warnings.catch_warnings():  # a rank seen in none of the buckets: all NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            worst = np.nan_to_num(np.nanmin(score, axis=1), nan=np.inf)
        keep = np.sort(np.lexsort((ranks, worst))[:max_ranks])  # lowest first, ties by rank
        ranks, score = ranks[keep], score[keep]
    rounded = np.round(score.astype(np.float64), _DECIMALS)
    table = np.where(np.isnan(rounded), None, rounded).tolist()
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
        "ranks_total": total,
    }
