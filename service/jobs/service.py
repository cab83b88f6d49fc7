"""Persistence of job topology and ingest counters (keyword-only functions; history:
:mod:`.history`).

Counters are written as increments so that two service processes sharing a database add up
instead of overwriting each other. Callers own the transaction.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, String, Table, bindparam, delete, insert, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from failslow.detectors.vocab import CommKind
from failslow.service.jobs.models import (
    AgentStream,
    Comm,
    Host,
    HostRegistration,
    Job,
    Rank,
)
from failslow.service.stream import columnar
from failslow.service.stream.records import CommAnnouncement, RankAnnouncement
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import HostDelta, JobState


def _upsert(
    session: Session,
    table: Table,
    key: dict[str, Any],
    *,
    insert_values: dict[str, Any],
    update_values: dict[str, Any],
) -> None:
    """UPDATE, else INSERT; a concurrent INSERT by another process falls back to UPDATE."""
    where = [table.c[k] == v for k, v in key.items()]
    if (
        update_values
        and session.execute(update(table).where(*where).values(**update_values)).rowcount
    ):
        return
    if (
        not update_values
        and session.execute(select(table.c[next(iter(key))]).where(*where)).first()
    ):
        return
    try:
        with session.begin_nested():
            session.execute(insert(table).values(**key, **insert_values))
    except IntegrityError:
        if update_values:
            session.execute(update(table).where(*where).values(**update_values))


@dataclass(slots=True)
class Uncommitted:
    """What a job accumulated since its last commit, taken out of it (under its lock) to be
    written; put back with :func:`restore` when the write fails (counters are additive)."""

    job: str
    world_size: int | None
    first_seen_ns: int
    watermark_ns: int
    deltas: dict[str, HostDelta] = field(default_factory=dict)
    streams: dict[tuple[str, str], int] = field(default_factory=dict)  # -> newest batch_seq
    ranks: dict[int, tuple[str, int | None]] = field(default_factory=dict)  # -> (host, gpu)
    comms: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # -> (kind, ranks)
    # v2 registrations: host -> (digests kept now, oldest first; new ones -> canonical JSON)
    registrations: dict[str, tuple[list[str], dict[str, bytes]]] = field(default_factory=dict)


def take_uncommitted(state: JobState) -> Uncommitted:
    """Swap out the job's pending counters and dirty marks (call under the job lock)."""
    topo = state.topology
    u = Uncommitted(
        job=state.job,
        world_size=topo.world_size,
        first_seen_ns=state.first_seen_ns or state.watermark_ns,
        watermark_ns=state.watermark_ns,
        deltas=state.deltas,
        streams={k: state.streams[k] for k in state.dirty_streams},
        ranks={
            r: (topo.ranks[r].host, topo.ranks[r].gpu)  # type: ignore[misc]
            for r in topo.dirty_ranks
            if topo.ranks[r].host is not None
        },
        comms={n: (topo.comms[n].kind, list(topo.comms[n].ranks)) for n in topo.dirty_comms},
        registrations={h: (_kept(state, h), new) for h, new in state.new_registrations.items()},
    )
    state.new_registrations = {}
    state.deltas = {}
    state.dirty_streams = set()
    topo.dirty_ranks = set()
    topo.dirty_comms = set()
    return u


def _kept(state: JobState, host: str) -> list[str]:
    """The digests of ``host`` to keep stored: those in memory and those stored and not yet
    used since a restart, the newest few."""
    both = [*state.stored_registrations.get(host, ()), *state.registrations.get(host, ())]
    return list(dict.fromkeys(both))[-columnar.REGISTRATIONS_KEPT :]


def restore(state: JobState, u: Uncommitted) -> None:
    """Put back what a failed commit took (call under the job lock)."""
    for host, d in u.deltas.items():
        cur = state.deltas.get(host)
        if cur is None:
            state.deltas[host] = d
            continue
        cur.envelopes += d.envelopes
        cur.accepted += d.accepted
        cur.duplicates += d.duplicates
        cur.rejected += d.rejected
        cur.first_seen_ns = min(x for x in (cur.first_seen_ns, d.first_seen_ns) if x is not None)
        cur.last_seen_ns = max(cur.last_seen_ns, d.last_seen_ns)
    state.dirty_streams |= set(u.streams)
    for host, (_, new) in u.registrations.items():
        state.new_registrations[host] = new | state.new_registrations.get(host, {})
    state.topology.dirty_ranks |= set(u.ranks)
    state.topology.dirty_comms |= set(u.comms)


_NATIVE_UPSERT = {"sqlite": sqlite_insert, "postgresql": pg_insert}


@functools.cache
def _plain(table: Table) -> bool:
    """Whether every column is an integer or a string: values the driver takes as they are."""
    return all(isinstance(col.type, Integer | String) for col in table.c)


@functools.cache
def _native_upsert_sql(
    table: str, names: tuple[str, ...], key: tuple[str, ...], set_: tuple[str, ...],
    add: tuple[str, ...], paramstyle: str,
) -> str:  # fmt: skip
    """``INSERT ... ON CONFLICT (key) DO UPDATE`` (SQLite and PostgreSQL) with positional
    parameters in the driver's style; the names are our own columns, never input."""
    mark = "?" if paramstyle == "qmark" else "%s"
    sets = [f"{k} = excluded.{k}" for k in set_]
    sets += [f"{k} = {table}.{k} + excluded.{k}" for k in add]
    action = f"DO UPDATE SET {', '.join(sets)}" if sets else "DO NOTHING"
    return (f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join([mark] * len(names))}) "
            f"ON CONFLICT ({', '.join(key)}) {action}")  # fmt: skip


def _bulk_upsert(
    session: Session,
    table: Table,
    key: tuple[str, ...],
    rows: list[dict[str, Any]],
    *,
    set_: tuple[str, ...] = (),
    add: tuple[str, ...] = (),
) -> None:
    """Write many rows of one job at once: rows that exist get the ``set_`` columns replaced and
    the ``add`` columns incremented; the others are inserted whole. On SQLite and PostgreSQL one
    ``INSERT ... ON CONFLICT DO UPDATE`` executemany (the database resolves concurrent writers);
    elsewhere a SELECT of the existing keys, an UPDATE and an INSERT executemany, where a
    concurrent insert by another process falls back to row-by-row :func:`_upsert`. ``key[0]`` is
    the job, the same in every row; keys are distinct."""
    if not rows:
        return
    c = table.c
    dialect = session.get_bind().dialect
    if dialect.name in _NATIVE_UPSERT and _plain(table):
        # the counters of every host, every commit: one statement through the driver's own
        # executemany (SQLAlchemy's per-row parameter processing cost ~20 us a row)
        names = list(rows[0])
        sql = _native_upsert_sql(table.name, tuple(names), key, set_, add, dialect.paramstyle)
        values = [tuple(r[n] for n in names) for r in rows]
        conn = session.connection()
        for lo in range(0, len(values), 2000):
            conn.exec_driver_sql(sql, values[lo : lo + 2000])
        return
    if dialect.name in _NATIVE_UPSERT:
        ins = _NATIVE_UPSERT[dialect.name](table)
        updates = {k: ins.excluded[k] for k in set_} | {k: c[k] + ins.excluded[k] for k in add}
        stmt = (
            ins.on_conflict_do_update(index_elements=list(key), set_=updates)
            if updates
            else ins.on_conflict_do_nothing(index_elements=list(key))
        )
        for lo in range(0, len(rows), 2000):
            session.execute(stmt, rows[lo : lo + 2000])
        return
    job, rest = rows[0][key[0]], key[1:]
    existing: set[tuple[Any, ...]] = set()
    for lo in range(0, len(rows), 500):
        chunk = rows[lo : lo + 500]
        col = c[rest[0]] if len(rest) == 1 else tuple_(*(c[k] for k in rest))
        keys = [r[rest[0]] for r in chunk] if len(rest) == 1 else [
            tuple(r[k] for k in rest) for r in chunk]  # fmt: skip
        found = select(*(c[k] for k in rest)).where(c[key[0]] == job, col.in_(keys))
        existing |= {tuple(f) for f in session.execute(found)}
    old = [r for r in rows if tuple(r[k] for k in rest) in existing]
    new = [r for r in rows if tuple(r[k] for k in rest) not in existing]
    if old and (set_ or add):
        stmt = (
            update(table)
            .where(*(c[k] == bindparam(f"k_{k}") for k in key))
            .values({**{k: bindparam(f"v_{k}") for k in set_},
                     **{k: c[k] + bindparam(f"v_{k}") for k in add}})
        )  # fmt: skip
        session.execute(
            stmt, [{**{f"k_{k}": r[k] for k in key},
                    **{f"v_{k}": r[k] for k in (*set_, *add)}} for r in old]  # fmt: skip
        )
    if new:
        try:
            with session.begin_nested():
                session.execute(insert(table), new)
        except IntegrityError:
            for r in new:
                values = {k: v for k, v in r.items() if k not in key}
                upd = {k: r[k] for k in set_} | {k: c[k] + r[k] for k in add}
                _upsert(session, table, {k: r[k] for k in key},
                        insert_values=values, update_values=upd)  # fmt: skip


def commit_ingest(session: Session, *, u: Uncommitted) -> None:
    """Write what one job accumulated (job, hosts, streams, topology): a few statements whatever
    the number of hosts."""
    jobs: Table = Job.__table__  # type: ignore[assignment]
    _upsert(
        session,
        jobs,
        {"id": u.job},
        insert_values={
            "world_size": u.world_size,
            "first_seen_ns": u.first_seen_ns,
            "last_seen_ns": u.watermark_ns,
            "watermark_ns": u.watermark_ns,
        },
        update_values={
            "world_size": u.world_size,
            "last_seen_ns": u.watermark_ns,
            "watermark_ns": u.watermark_ns,
        },
    )
    key = ("job_id", "host")
    _bulk_upsert(
        session,
        Host.__table__,  # type: ignore[arg-type]
        key,
        [
            {"job_id": u.job, "host": host, "first_seen_ns": d.first_seen_ns or d.last_seen_ns,
             "last_seen_ns": d.last_seen_ns, "envelopes": d.envelopes,
             "records_accepted": d.accepted, "records_duplicate": d.duplicates,
             "records_rejected": d.rejected}
            for host, d in u.deltas.items()
        ],  # fmt: skip
        set_=("last_seen_ns",),
        add=("envelopes", "records_accepted", "records_duplicate", "records_rejected"),
    )
    _bulk_upsert(
        session,
        AgentStream.__table__,  # type: ignore[arg-type]
        ("job_id", "host", "agent"),
        [
            {"job_id": u.job, "host": host, "agent": agent, "last_batch_seq": seq,
             "updated_ns": u.watermark_ns}
            for (host, agent), seq in u.streams.items()
        ],  # fmt: skip
        set_=("last_batch_seq", "updated_ns"),
    )
    _bulk_upsert(
        session,
        Rank.__table__,  # type: ignore[arg-type]
        ("job_id", "rank"),
        [{"job_id": u.job, "rank": r, "host": host, "gpu": gpu}
         for r, (host, gpu) in u.ranks.items()],  # fmt: skip
        set_=("host", "gpu"),
    )
    _bulk_upsert(
        session,
        Comm.__table__,  # type: ignore[arg-type]
        ("job_id", "comm"),
        [{"job_id": u.job, "comm": name, "kind": kind, "ranks": members}
         for name, (kind, members) in u.comms.items()],  # fmt: skip
    )
    _store_registrations(session, u)


def _store_registrations(session: Session, u: Uncommitted) -> None:
    """Insert new v2 registrations; drop those the service no longer keeps for their host."""
    if not u.registrations:
        return
    t = HostRegistration.__table__.c  # type: ignore[attr-defined]
    now = time.time_ns()
    rows = []
    for host, (kept, new) in u.registrations.items():
        session.execute(
            delete(HostRegistration).where(
                t.job_id == u.job, t.host == host, t.digest.not_in(kept) | t.digest.in_(new)
            )
        )
        rows += [
            {"job_id": u.job, "host": host, "digest": d, "registered": now + kept.index(d),
             "body": body}
            for d, body in new.items() if d in kept
        ]  # fmt: skip
    if rows:
        session.execute(insert(HostRegistration), rows)


def load_job(session: Session, *, job: str, settings: StateSettings) -> JobState | None:
    """Rebuild a job's topology and stream positions from the database (after a restart)."""
    row = session.get(Job, job)
    if row is None:
        return None
    state = JobState(job, settings)
    state.persisted = True
    state.first_seen_ns = row.first_seen_ns
    state.watermark_ns = row.watermark_ns
    topo = state.topology
    topo.world_size = row.world_size
    for h in session.scalars(select(Host).where(Host.job_id == job)):
        topo.touch_host(h.host, h.last_seen_ns, state.last_wall)
    for r in session.scalars(select(Rank).where(Rank.job_id == job)):
        if r.host not in topo.hosts:
            topo.touch_host(r.host, row.last_seen_ns, state.last_wall)
        topo.announce_rank(r.host, RankAnnouncement(r.rank, r.gpu, None))
    for c in session.scalars(select(Comm).where(Comm.job_id == job)):
        topo.announce_comm(CommAnnouncement(c.comm, CommKind(c.kind), tuple(c.ranks)))
    for s in session.scalars(select(AgentStream).where(AgentStream.job_id == job)):
        state.streams[(s.host, s.agent)] = s.last_batch_seq
    load_registrations(session, state)
    topo.dirty_ranks.clear()
    topo.dirty_comms.clear()
    return state


def load_registrations(session: Session, state: JobState) -> None:
    """What the hosts had registered, oldest first: each is registered again when an envelope
    first names it (``columnar.apply_v2``), so the hosts need not, and a large job's load does
    not pay for all its hosts at once (~2 ms each at 100K ranks)."""
    q = (
        select(HostRegistration.host, HostRegistration.digest, HostRegistration.body)
        .where(HostRegistration.job_id == state.job)
        .order_by(HostRegistration.host, HostRegistration.registered)
    )
    for host, digest, body in session.execute(q):
        state.stored_registrations.setdefault(host, {})[digest] = bytes(body)


def list_jobs(session: Session) -> list[Job]:
    return list(session.scalars(select(Job).order_by(Job.id)))


def get_job(session: Session, *, job: str) -> Job | None:
    return session.get(Job, job)


def host_counters(session: Session, *, job: str) -> list[Host]:
    return list(session.scalars(select(Host).where(Host.job_id == job).order_by(Host.host)))


def save_job_progress(
    session: Session,
    *,
    job: str,
    last_step: int | None,
    step_time_s: float | None,
    baseline_step_time_s: float | None,
) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job)
        .values(
            last_step=last_step, step_time_s=step_time_s, baseline_step_time_s=baseline_step_time_s
        )
    )
