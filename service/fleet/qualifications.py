"""Qualification runs kept in the database (docs/fleet.md), so that every replica serves them: an
operator may start a run on one replica, the agents poll and answer others, and any replica
reads the verdicts. The rules are :mod:`.qualify`'s.

What replicas may do at once, and how it stays right:

* a check is handed to one agent poll only: a conditional ``UPDATE ... WHERE NOT handed``
  (the row count says who won);
* an answer is taken once: ``UPDATE ... WHERE result IS NULL``;
* a run is judged once: ``UPDATE ... SET state = 'done' WHERE state = 'running'`` and, by the
  one that changed the row, in the same transaction, the verdicts and the norm's new entries.
  Each of these begins its transaction with that write (SQLite's one writer then waits for the
  lock instead of failing on a stale read snapshot).

Deadlines are wall-clock nanoseconds (replicas share no monotonic clock). Bounded: the newest
``keep_runs`` runs and ``Norms.keep`` passing measurements per kind and model are kept.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import Select, delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from failslow.service.db import session_scope
from failslow.service.fleet.models import QualHost, QualNorm, QualRun, QualTask
from failslow.service.fleet.qualify import (
    Check,
    NormKey,
    Norms,
    RunState,
    TaskKind,
    Verdict,
    judge,
    measures,
    ring,
)
from failslow.service.ids import new_id

LIVE_TTL_S = 0.5


class Qualifier:
    def __init__(self, sessions: sessionmaker[Session], norms: Norms | None = None,
                 keep_runs: int = 1000) -> None:  # fmt: skip
        self.sessions, self.norms, self.keep_runs = sessions, norms or Norms(), keep_runs
        # the hosts of running runs, read at most every LIVE_TTL_S: every node agent polls
        # every second, and a poll for a host in no run must not cost a database write
        self._live: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._live_lock = threading.Lock()

    def start(self, hosts: list[str], *, timeout_s: float, nbytes: int, iterations: int,
              standing: dict[str, list[str]]) -> str:  # fmt: skip
        """A new run of ``hosts`` (no duplicates); its id."""
        now = time.time_ns()
        run_id = new_id("qual")
        with session_scope(self.sessions) as s:
            s.add(QualRun(id=run_id, created_ns=now, deadline_ns=now + int(timeout_s * 1e9),
                          nbytes=nbytes, iterations=iterations,
                          state=RunState.RUNNING))  # fmt: skip
            s.add_all(QualHost(run_id=run_id, host=h, position=i, seen=False, link_pairs=0,
                               standing=list(standing.get(h, [])), reasons=[], marked=False)
                      for i, h in enumerate(hosts))  # fmt: skip
            s.add_all(QualTask(id=new_id("qt"), run_id=run_id, host=h, kind=kind, peer=peer,
                               handed=False) for kind, h, peer in ring(hosts))  # fmt: skip
            s.flush()
            self._prune(s)
        with self._live_lock:
            self._live = (0.0, frozenset())  # committed: read again at the next poll
        return run_id

    def live_hosts(self) -> frozenset[str]:
        """Hosts in a running run, as read at most ``LIVE_TTL_S`` ago (a run started on any
        replica is seen by the polls here within that)."""
        with self._live_lock:
            at, hosts = self._live
            if time.monotonic() - at < LIVE_TTL_S:
                return hosts
            with self.sessions() as s:
                hosts = frozenset(s.scalars(select(QualHost.host).distinct()
                                            .where(QualHost.run_id.in_(_live(time.time_ns())))))
            self._live = (time.monotonic(), hosts)
            return hosts

    def poll(self, host: str, addr: str | None) -> list[dict[str, Any]]:
        """The checks this host's agent should run now (its echo endpoint noted)."""
        if host not in self.live_hosts():
            return []
        out: list[dict[str, Any]] = []
        with session_scope(self.sessions) as s:
            live = _live(time.time_ns())
            seen = {QualHost.seen: True} | ({QualHost.addr: addr} if addr else {})
            s.execute(update(QualHost).where(QualHost.host == host, QualHost.run_id.in_(live))
                      .values(seen).execution_options(synchronize_session=False))  # fmt: skip
            runs = {r.id: r for r in s.scalars(select(QualRun).where(QualRun.id.in_(live)))}
            if not runs:
                return out
            tasks = list(s.scalars(select(QualTask).where(
                QualTask.run_id.in_(list(runs)), QualTask.host == host,
                QualTask.handed.is_(False))))  # fmt: skip
            peers = {(h.run_id, h.host): h.addr for h in s.scalars(select(QualHost).where(
                QualHost.run_id.in_(list(runs)), QualHost.addr.is_not(None)))}  # fmt: skip
            for t in tasks:
                run = runs[t.run_id]
                if t.kind == TaskKind.COMPUTE:
                    task = {"kind": TaskKind.COMPUTE, "iterations": run.iterations}
                elif (t.run_id, t.peer) in peers:  # the peer's agent is up: its endpoint known
                    task = {"kind": TaskKind.LINK, "peer": t.peer, "bytes": run.nbytes,
                            "peer_addr": peers[(t.run_id, t.peer)]}  # fmt: skip
                else:
                    continue
                won = s.execute(update(QualTask).where(QualTask.id == t.id,
                                                       QualTask.handed.is_(False))
                                .values(handed=True)
                                .execution_options(synchronize_session=False))  # fmt: skip
                if won.rowcount == 1:  # type: ignore[attr-defined]
                    out.append({"run": t.run_id, "id": t.id, **task})
        return out

    def report(self, run_id: str, task_id: str, result: dict[str, Any]) -> bool:
        """An agent's answer; False when there is no such open check (answered, or judged)."""
        with session_scope(self.sessions) as s:
            open_run = select(QualRun.id).where(QualRun.id == run_id,
                                                QualRun.state == RunState.RUNNING)  # fmt: skip
            took = s.execute(update(QualTask).where(
                QualTask.id == task_id, QualTask.run_id.in_(open_run),
                QualTask.result.is_(None)).values(result=result)
                .execution_options(synchronize_session=False))  # fmt: skip
            return bool(took.rowcount == 1)  # type: ignore[attr-defined]

    def view(self, run_id: str) -> dict[str, Any] | None:
        """The run as the REST shows it, judged first when every check answered or its
        deadline passed."""
        with self.sessions() as s:
            run = s.get(QualRun, run_id)
            if run is None:
                return None
            ready = run.state == RunState.RUNNING and (
                time.time_ns() >= run.deadline_ns
                or not s.scalar(select(func.count()).select_from(QualTask).where(
                    QualTask.run_id == run_id, QualTask.result.is_(None))))  # fmt: skip
        if ready:
            self._judge(run_id)
        with self.sessions() as s:
            run = s.get(QualRun, run_id)
            assert run is not None
            hosts = list(s.scalars(select(QualHost).where(QualHost.run_id == run_id)
                                   .order_by(QualHost.position)))  # fmt: skip
            gpus = {t.host: t.result["gpus"] for t in s.scalars(select(QualTask).where(
                QualTask.run_id == run_id, QualTask.kind == TaskKind.COMPUTE))
                if t.result and t.result.get("gpus")}  # fmt: skip
        done = run.state == RunState.DONE
        rows = [{"host": h.host, "verdict": h.verdict if done else Verdict.PENDING,
                 "reasons": list(h.reasons) if done else [],
                 **({"compute_s": h.compute_s, "link_bps": h.link_bps} if done else {}),
                 **({"gpus": gpus[h.host]} if done and h.host in gpus else {})}
                for h in hosts]  # fmt: skip

        def having(v: Verdict) -> list[str]:
            return [r["host"] for r in rows if r["verdict"] == v]

        return {"id": run.id, "state": run.state, "hosts": rows,
                "go": having(Verdict.GO), "no_go": having(Verdict.NO_GO)}  # fmt: skip

    def untaken(self, s: Session) -> list[QualHost]:
        """Judged hosts with a link check or slow GPUs the ledger has not taken yet (in the
        caller's transaction: it sets ``marked``)."""
        return list(s.scalars(select(QualHost).where(
            QualHost.marked.is_(False),
            QualHost.link_bps.is_not(None) | QualHost.slow_gpus.is_not(None),
            QualHost.verdict.is_not(None))))  # fmt: skip

    def claim(self, s: Session, host: QualHost) -> bool:
        """Take ``host``'s checks for the ledger, unless another replica's flush did (a
        conditional update, in the caller's transaction: released if it rolls back)."""
        took = s.execute(update(QualHost).where(
            QualHost.run_id == host.run_id, QualHost.host == host.host,
            QualHost.marked.is_(False)).values(marked=True)
            .execution_options(synchronize_session=False))  # fmt: skip
        return bool(took.rowcount == 1)  # type: ignore[attr-defined]

    # -- inside -------------------------------------------------------------------------------
    def _judge(self, run_id: str) -> None:
        """Judge the run unless another request or replica did: verdicts, and the passing
        hosts' numbers added to the norm (a bad host must not lower it)."""
        with session_scope(self.sessions) as s:
            claimed = s.execute(update(QualRun).where(QualRun.id == run_id,
                                                      QualRun.state == RunState.RUNNING)
                                .values(state=RunState.DONE, done_ns=time.time_ns())
                                .execution_options(synchronize_session=False))  # fmt: skip
            if claimed.rowcount != 1:  # type: ignore[attr-defined]
                return
            hosts = list(s.scalars(select(QualHost).where(QualHost.run_id == run_id)
                                   .order_by(QualHost.position)))  # fmt: skip
            checks = [Check(t.host, TaskKind(t.kind), t.peer, t.result) for t in s.scalars(
                select(QualTask).where(QualTask.run_id == run_id))]  # fmt: skip
            keys = {(TaskKind.LINK, "")} | {(TaskKind.COMPUTE, m.device) for c in checks
                                             if c.kind == TaskKind.COMPUTE and c.result
                                             for m in measures(c.result)}  # fmt: skip
            history = {k: self._history(s, k) for k in keys}
            verdicts = judge([h.host for h in hosts], checks, seen={h.host for h in hosts
                                                                    if h.seen},
                             standing={h.host: list(h.standing) for h in hosts},
                             norms=self.norms, history=history)  # fmt: skip
            now = time.time_ns()
            for h in hosts:
                v = verdicts[h.host]
                h.verdict, h.reasons, h.slow_link = v.verdict, v.reasons, v.slow_link
                h.compute_s, h.link_bps = v.compute_s, v.link_bps
                h.link_norm, h.link_pairs = v.link_norm, v.link_pairs
                h.slow_gpus = [{"index": m.gpu, "uuid": m.uuid} for m in v.slow_gpus] or None
                if v.verdict != Verdict.GO:
                    continue
                entries = [(TaskKind.COMPUTE, m.device, m.seconds) for m in v.compute]
                if v.link_bps is not None:
                    entries.append((TaskKind.LINK, "", v.link_bps))
                for kind, model, value in entries:
                    s.add(QualNorm(kind=kind, model=model, value=value, at_ns=now))
            s.flush()
            for kind, model in keys:
                of = (QualNorm.kind == kind) & (QualNorm.model == model)
                floor = s.scalar(select(QualNorm.id).where(of).order_by(QualNorm.id.desc())
                                 .offset(self.norms.keep).limit(1))  # fmt: skip
                if floor is not None:
                    s.execute(delete(QualNorm).where(of, QualNorm.id <= floor))

    def _history(self, s: Session, key: NormKey) -> list[float]:
        kind, model = key
        return list(s.scalars(select(QualNorm.value).where(QualNorm.kind == kind,
                                                           QualNorm.model == model)
                              .order_by(QualNorm.id.desc()).limit(self.norms.keep)))  # fmt: skip

    def _prune(self, s: Session) -> None:
        """Runs beyond the newest ``keep_runs`` go, with their hosts and checks."""
        cut = s.scalar(select(QualRun.created_ns).order_by(QualRun.created_ns.desc())
                       .offset(self.keep_runs).limit(1))  # fmt: skip
        if cut is None:
            return
        old = select(QualRun.id).where(QualRun.created_ns <= cut)
        for model in (QualTask, QualHost):
            s.execute(delete(model).where(model.run_id.in_(old))
                      .execution_options(synchronize_session=False))  # fmt: skip
        s.execute(delete(QualRun).where(QualRun.created_ns <= cut))


def _live(now_ns: int) -> Select[tuple[str]]:
    """The ids of runs still running and within their deadline."""
    return select(QualRun.id).where(QualRun.state == RunState.RUNNING,
                                    QualRun.deadline_ns > now_ns)  # fmt: skip


__all__ = ["Qualifier"]
