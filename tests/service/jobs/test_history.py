"""Per-rank history as columns: the codec, the accumulator's bucket, retention, the read."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from sqlalchemy import select

from failslow.service.db import make_engine, make_sessionmaker, upgrade
from failslow.service.detection.history import HistoryAccumulator
from failslow.service.detection.persist import write_history
from failslow.service.jobs.history import (
    FIELDS,
    HistoryFormatError,
    RankColumns,
    decode,
    encode,
    history,
    rank_history,
)
from failslow.service.jobs.models import Job, RankHistoryBucket


def _cols(n: int, seed: int = 0) -> RankColumns:
    rng = np.random.default_rng(seed)
    values = {f: rng.uniform(0.1, 2.0, n) for f in FIELDS}
    values["compute_s"][::3] = np.nan
    return RankColumns(rng.permutation(n), rng.integers(1, 11, n), values)


def test_columns_round_trip_as_float32_with_missing_values() -> None:
    cols = _cols(1000)
    back = decode(encode(cols))
    assert back.rank.tolist() == cols.rank.tolist()
    assert back.steps.tolist() == cols.steps.tolist()
    for f in FIELDS:
        assert np.array_equal(np.isnan(back.values[f]), np.isnan(cols.values[f]))
        np.testing.assert_allclose(back.values[f], cols.values[f], rtol=1e-7)
    assert (
        len(decode(encode(RankColumns(np.zeros(0), np.zeros(0), {f: np.zeros(0) for f in FIELDS}))))
        == 0
    )


def test_only_the_columns_asked_for_are_read() -> None:
    cols = _cols(100)
    back = decode(encode(cols), ("score",))
    assert list(back.values) == ["score"] and back.rank.tolist() == cols.rank.tolist()
    np.testing.assert_allclose(back.values["score"], cols.values["score"], rtol=1e-7)


def test_a_bucket_in_another_format_or_cut_short_is_refused() -> None:
    blob = encode(_cols(10))
    with pytest.raises(HistoryFormatError, match="unknown"):
        decode(b"XXXX" + blob[4:])
    with pytest.raises(HistoryFormatError, match="header"):
        decode(blob[:5])
    with pytest.raises(HistoryFormatError, match="of rank for 11 ranks"):
        decode(blob[:4] + (11).to_bytes(4, "little") + blob[8:])
    with pytest.raises(HistoryFormatError, match="cut short|score"):
        decode(blob[:-3])
    with pytest.raises(HistoryFormatError, match="read"):
        decode(blob + b"x")
    with pytest.raises(ValueError, match="one entry per rank"):
        encode(RankColumns(np.arange(3), np.arange(2), {f: np.zeros(3) for f in FIELDS}))


def _frame(index: int, n: int, late: float) -> tuple[SimpleNamespace, SimpleNamespace]:
    step = np.full(n, 1.0)
    step[n - 1] = np.nan  # the last slot never reports in these frames
    frame = SimpleNamespace(index=index, end_ns=1000 + index, step_time=step, comm_time=step / 4)
    lateness = np.full(n, late)
    lateness[n - 1] = np.nan
    scores = SimpleNamespace(compute_ratio=np.full(n, 2.0), compute=step / 2, late=lateness,
                             frame_time=1.0)  # fmt: skip
    return frame, scores


def test_the_accumulator_emits_one_bucket_of_means_for_the_ranks_seen() -> None:
    acc = HistoryAccumulator(job="j", every=10)
    slot_rank = [7, 3, 5, 9]  # slot -> rank
    out = []
    for i in range(12):  # bucket 0: frames 0-9, lateness 0..9 ms; bucket 10 opens at frame 10
        frame, scores = _frame(i, 4, late=i / 1000)
        out.append(acc.add(frame, scores, slot_rank, 1.0))  # type: ignore[arg-type]
    job_rows, rank_rows = out[10]
    assert [r["bucket"] for r in job_rows] == [0] and job_rows[0]["steps"] == 10
    (row,) = rank_rows
    assert (row["job_id"], row["bucket"], row["end_ns"], row["ranks"]) == ("j", 0, 1009, 3)
    cols = decode(row["data"])
    assert cols.rank.tolist() == [7, 3, 5] and cols.steps.tolist() == [10, 10, 10]
    assert cols.values["lateness_s"] == pytest.approx([0.0045] * 3, rel=1e-6)
    assert cols.values["score"] == pytest.approx([0.5] * 3)
    assert all(r == ([], []) for k, r in enumerate(out) if k != 10)


@pytest.fixture()
def sessions(db_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(db_url)
    upgrade(engine)
    factory = make_sessionmaker(engine)
    with factory.begin() as s:
        s.add(Job(id="j", first_seen_ns=0, last_seen_ns=0, watermark_ns=0))
    yield factory
    engine.dispose()


def _write(sessions, bucket: int, cols: RankColumns, keep: int | None) -> None:  # type: ignore[no-untyped-def]
    from failslow.service.jobs.history import bucket_row

    job_row = {"job_id": "j", "bucket": bucket, "steps": 10, "end_ns": bucket, "step_time_s": 1.0,
               "step_time_max_s": 1.0, "slowdown": 1.0}  # fmt: skip
    with sessions.begin() as s:
        write_history(s, [job_row], [bucket_row("j", bucket, bucket, cols)], keep=keep)


@pytest.mark.both_databases
def test_only_the_newest_buckets_of_rank_history_are_kept(sessions) -> None:  # type: ignore[no-untyped-def]
    for b in range(0, 60, 10):
        _write(sessions, b, _cols(4, seed=b), keep=4)
    with sessions() as s:
        kept = s.scalars(select(RankHistoryBucket.bucket).order_by(RankHistoryBucket.bucket)).all()
        assert kept == [20, 30, 40, 50]
        answer = history(s, job="j", buckets=6)  # the job's own rows are all kept
    assert [b["bucket"] for b in answer["buckets"]] == [0, 10, 20, 30, 40, 50]
    assert all(r["score"][:2] == [None, None] for r in answer["ranks"])  # pruned: no score
    assert all(isinstance(v, float) for r in answer["ranks"] for v in r["score"][2:])
    _write(sessions, 50, _cols(4, seed=99), keep=4)  # the same bucket again (a flush): replaced
    with sessions() as s:
        again = rank_history(s, job="j")
    assert sorted(again) == [20, 30, 40, 50]
    assert np.array_equal(again[50].rank, _cols(4, seed=99).rank)


@pytest.mark.both_databases
def test_a_bucket_that_cannot_be_read_is_left_out(sessions) -> None:  # type: ignore[no-untyped-def]
    _write(sessions, 0, _cols(4), keep=None)
    _write(sessions, 10, _cols(4, seed=1), keep=None)
    with sessions.begin() as s:
        row = s.get(RankHistoryBucket, ("j", 0))
        row.data = b"FRH9" + row.data[4:]
    with sessions() as s:
        assert sorted(rank_history(s, job="j")) == [10]
        answer = history(s, job="j", buckets=5)
    assert [b["bucket"] for b in answer["buckets"]] == [0, 10]
    assert all(r["score"][0] is None and r["score"][1] is not None for r in answer["ranks"])


@pytest.mark.both_databases
def test_the_read_puts_each_rank_in_its_bucket(sessions) -> None:  # type: ignore[no-untyped-def]
    a = RankColumns(np.array([5, 1]), np.array([10, 10]),
                    {f: np.array([0.5, 1.0]) for f in FIELDS})  # fmt: skip
    b = RankColumns(np.array([1, 9]), np.array([10, 3]),
                    {f: np.array([0.25, np.nan]) for f in FIELDS})  # fmt: skip
    _write(sessions, 0, a, keep=None)
    _write(sessions, 10, b, keep=None)
    with sessions() as s:
        answer = history(s, job="j", buckets=10)
    by_rank = {r["rank"]: r["score"] for r in answer["ranks"]}
    assert by_rank == {1: [1.0, 0.25], 5: [0.5, None], 9: [None, None]}
    assert math.isnan(decode(encode(b)).values["score"][1])
