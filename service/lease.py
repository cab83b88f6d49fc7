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
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from sqlalchemy import Float, String, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from failslow.service.db import Base, session_scope

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

    def acquire(self, *, wait_s: float | None = None) -> None:
        """Take the lease, waiting up to ``wait_s`` (default: one TTL); raises LeaseHeld."""
        deadline = time.monotonic() + (self.ttl_s + 1 if wait_s is None else wait_s)
        while True:
            with session_scope(self.sessions) as s:
                other = self._take(s, time.time())
            if other is None:
                log.info("database lease taken by %s (ttl %.0f s)", self.holder, self.ttl_s)
                return
            if time.monotonic() >= deadline:
                with session_scope(self.sessions) as s:
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
        with session_scope(self.sessions) as s:
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
        with session_scope(self.sessions) as s:
            s.execute(
                delete(ServiceLease).where(
                    ServiceLease.name == NAME, ServiceLease.holder == self.holder
                )
            )
