"""One service per database: a lease row that the running service holds and renews.

Two failslow services writing one database without coordination count retried batches twice and
split collectives between them (issue 15). Until a bus coordinates replicas, a second service on
the same database therefore refuses to start, with the holder's name in the error.

The lease is one row (``service_lease``, name ``"ingest"``): holder ``host:pid:nonce`` and an
expiry in wall-clock seconds, renewed every third of its TTL. A service takes it when it is free,
expired, or held by a process of the same host that no longer exists (a ``kill -9`` followed by
a restart does not wait). Otherwise it waits up to one TTL (a holder on another host that died
lets it expire) and then gives up with :class:`LeaseHeld`. Every change is one conditional
UPDATE (or the first INSERT), atomic in SQLite and PostgreSQL alike. A service that finds its
lease taken (it stalled past the TTL and another took over) stops writing: ingest and /readyz
answer 503 from then on.

Timing alone does not fence: a service stopped (SIGSTOP, a VM paused) past the TTL wakes up
with a transaction in hand, and before its renewal notices anything it has committed a batch
the other service never sees (issue 31, case 6: 200 answered after SIGCONT, 4 envelopes for 3
batches). So every transaction that writes through the service's sessions first updates the
lease row where the holder is still this service (:meth:`Lease.guard`): the holder, with its
nonce, is the fencing token. The row stays locked until the transaction ends, so a takeover
waits for it or it fails with :class:`LeaseLost` (rolled back, 503; the agent re-sends to the
new holder).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from sqlalchemy import Float, String, delete, event, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, ORMExecuteState, Session, mapped_column, sessionmaker

from failslow.service.db import Base, session_scope
from failslow.service.errors import Unavailable

log = logging.getLogger(__name__)
NAME = "ingest"


class ServiceLease(Base):
    __tablename__ = "service_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(300))
    expires_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float] = mapped_column(Float)


class LeaseHeld(RuntimeError):
    """Another live service holds the database."""


class LeaseLost(Unavailable):
    """A write was fenced off: another service holds the lease now (503: send it there)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"Retry-After": "5"})


_FENCED = "failslow_lease_fenced"  # session.info: this transaction checked the lease
_OWN = "failslow_lease_own"  # session.info: the lease's own statements (taking, renewing)


def _gone(holder: str) -> bool:
    """Whether ``holder`` was a process of this host that no longer exists."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


@dataclass
class Lease:
    sessions: sessionmaker[Session]
    ttl_s: float
    holder: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )
    lost: str | None = None  # why this service stopped writing

    def _take(self, s: Session, now: float) -> str | None:
        """One attempt; the current other holder when it failed."""
        row = s.get(ServiceLease, NAME)
        if row is None:
            try:
                with s.begin_nested():
                    s.execute(insert(ServiceLease).values(
                        name=NAME, holder=self.holder, expires_at=now + self.ttl_s,
                        acquired_at=now))  # fmt: skip
                return None
            except IntegrityError:
                row = s.get(ServiceLease, NAME)
                if row is None:
                    return "unknown"
        other = row.holder
        free = [ServiceLease.holder == self.holder, ServiceLease.expires_at < now]
        if _gone(other):
            free.append(ServiceLease.holder == other)
        done = s.execute(
            update(ServiceLease)
            .where(ServiceLease.name == NAME, or_(*free))
            .values(holder=self.holder, expires_at=now + self.ttl_s, acquired_at=now)
        ).rowcount
        return None if done else other

    def guard(self) -> None:
        """Fence every writing transaction of ``sessions`` (see the module's doc)."""
        event.listen(self.sessions, "do_orm_execute", self._on_execute)
        event.listen(self.sessions, "before_flush", self._on_flush)
        for name in ("after_commit", "after_rollback", "after_soft_rollback"):
            event.listen(self.sessions, name, _unfence)

    def _on_execute(self, state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            self.fence(state.session)

    def _on_flush(self, session: Session, _context: object, _instances: object) -> None:
        if session.new or session.dirty or session.deleted:
            self.fence(session)

    def fence(self, session: Session) -> None:
        """Once per transaction, before its first write: lock the lease row where this service
        still holds it; raises :class:`LeaseLost` (and sets ``lost``) where it does not."""
        info = session.info
        if info.get(_FENCED) or info.get(_OWN):
            return
        info[_FENCED] = True
        done = session.execute(
            update(ServiceLease)
            .where(ServiceLease.name == NAME, ServiceLease.holder == self.holder)
            .values(holder=self.holder)
        ).rowcount
        if not done:
            self.lost = self.lost or "this service lost its database lease to another service"
            log.error("%s: a write was fenced off (ingest and /readyz answer 503)", self.lost)
            raise LeaseLost(self.lost)

    def _session(self) -> Session:
        s = self.sessions()
        s.info[_OWN] = True
        return s

    def acquire(self, *, wait_s: float | None = None) -> None:
        """Take the lease, waiting up to ``wait_s`` (default: one TTL); raises LeaseHeld."""
        deadline = time.monotonic() + (self.ttl_s + 1 if wait_s is None else wait_s)
        while True:
            with session_scope(self._session) as s:
                other = self._take(s, time.time())
            if other is None:
                log.info("database lease taken by %s (ttl %.0f s)", self.holder, self.ttl_s)
                return
            if time.monotonic() >= deadline:
                with session_scope(self._session) as s:
                    row = s.get(ServiceLease, NAME)
                    left = row.expires_at - time.time() if row else 0.0
                raise LeaseHeld(
                    f"another failslow service ({other}) is using this database (its lease runs "
                    f"{max(left, 0):.0f} s more and is being renewed). Run one service per "
                    "database, or enable the bus for replicas; to reuse the database after that "
                    f"service is gone for good, wait {self.ttl_s:.0f} s."
                )
            time.sleep(min(1.0, self.ttl_s / 3))

    def renew(self) -> bool:
        """Extend the lease; False (and ``lost`` set) when another holder has it now."""
        if self.lost is not None:
            return False
        now = time.time()
        with session_scope(self._session) as s:
            done = s.execute(
                update(ServiceLease)
                .where(ServiceLease.name == NAME, ServiceLease.holder == self.holder)
                .values(expires_at=now + self.ttl_s)
            ).rowcount
            if not done:
                other = s.scalar(select(ServiceLease.holder).where(ServiceLease.name == NAME))
                self.lost = f"this service lost its database lease to {other or 'nobody'}"
                log.error("%s: it stops writing (ingest and /readyz answer 503)", self.lost)
        return self.lost is None

    def release(self) -> None:
        with session_scope(self._session) as s:
            s.execute(
                delete(ServiceLease).where(
                    ServiceLease.name == NAME, ServiceLease.holder == self.holder
                )
            )


def _unfence(session: Session, *_: object) -> None:
    session.info.pop(_FENCED, None)

