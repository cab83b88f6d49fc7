"""Which replica owns which partition: claims in a NATS key-value bucket with a TTL.

Every third of ``owner_ttl_s`` a replica announces itself (bucket ``failslow-replicas``), renews
the claims it holds (a compare-and-set on the revision it last wrote, bucket
``failslow-owners``), hands over one partition when it holds more than its share
(ceil(partitions / live replicas)) and claims free ones while it holds fewer. A claim that is not
renewed expires with the bucket's TTL: when a replica dies, the others take its partitions over
within about ``owner_ttl_s`` plus one renewal. A replica that cannot renew for a whole TTL stops
applying (its claim may be someone else's by then); the claim's revision is also the epoch that
fences its database writes (``store.claim``/``store.commit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError

from failslow.service.replica.context import Owned
from failslow.service.replica.worker import PartitionWorker

log = logging.getLogger(__name__)


def _key(partition: int) -> str:
    return f"p{partition}"


async def _ended(task: asyncio.Task[None]) -> None:
    """Wait until a cancelled worker's task has ended, whatever it ended with. A cancellation of
    the caller itself goes on up: ``suppress(CancelledError)`` around ``await task`` swallowed
    it, and an app shut down during a hand-over kept its ownership loop running for good (a
    test's app once hung in its shutdown for over ten minutes)."""
    await asyncio.wait([task])  # raises only the caller's own cancellation
    if not task.cancelled() and task.exception() is not None:
        log.warning("partition task %s ended with %r", task.get_name(), task.exception())


class Ownership:
    def __init__(self, owned: Owned) -> None:
        self.o = owned
        self.held: dict[int, int] = {}  # partition -> revision of our claim (the epoch)
        self.renewed: dict[int, float] = {}  # partition -> when last renewed (monotonic)
        self.workers: dict[int, PartitionWorker] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}

    @property
    def ttl(self) -> float:
        return self.o.bus_settings.owner_ttl_s

    def owns(self, job: str) -> bool:
        w = self.workers.get(self.o.bus.partition(job))
        return w is not None and w.ready

    def describe(self) -> dict[str, object]:
        return {
            "replica": self.o.bus.replica,
            "partitions": self.o.bus_settings.partitions,
            "owned": {
                str(p): {"epoch": w.epoch, "ready": w.ready, "position": w.position,
                         "applied_through": w.through, "jobs": sorted(w.jobs())}  # fmt: skip
                for p, w in sorted(self.workers.items())
            },
        }

    async def run(self) -> None:
        while True:
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - NATS away: the TTL bounds what happens
                log.exception("ownership round failed")
            await self._self_fence()
            await asyncio.sleep(self.ttl / 3)

    async def beat(self) -> None:
        bus = self.o.bus
        assert bus.owners is not None and bus.replicas is not None
        await bus.replicas.put(bus.replica.replace(":", "_"), b"1")
        try:
            live = max(1, len(await bus.replicas.keys()))
        except NoKeysError:
            live = 1
        target = math.ceil(self.o.bus_settings.partitions / live)
        for p, rev in list(self.held.items()):
            try:
                self.held[p] = await bus.owners.update(_key(p), bus.replica.encode(), last=rev)
                self.renewed[p] = time.monotonic()
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                log.warning("partition %d: claim lost to another replica", p)
                await self._stop(p, handover=False)
        if len(self.held) > target:  # hand one over per round, cleanly
            p = max(self.held)
            await self._stop(p, handover=True)
        for p in range(self.o.bus_settings.partitions):
            if len(self.held) >= target:
                break
            if p in self.held:
                continue
            try:
                rev = await bus.owners.create(_key(p), bus.replica.encode())
            except KeyWrongLastSequenceError:
                continue  # held by another replica
            self.held[p] = rev
            self.renewed[p] = time.monotonic()
            self._start(p, rev)
        self.o.metrics.bus_partitions.set(len(self.held))

    def _start(self, p: int, epoch: int) -> None:
        w = PartitionWorker(self.o, p, epoch)
        self.workers[p] = w
        self.tasks[p] = asyncio.create_task(self._guard(w), name=f"failslow-partition-{p}")
        log.info("partition %d: owned from epoch %d", p, epoch)

    async def _guard(self, w: PartitionWorker) -> None:
        try:
            await w.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - fenced, or the database away: give it up
            log.exception("partition %d: stopped; giving it up", w.partition)
            with contextlib.suppress(Exception):
                await self._release(w.partition)
            self._drop(w)
            self.held.pop(w.partition, None)
            self.renewed.pop(w.partition, None)
            self.tasks.pop(w.partition, None)

    async def _self_fence(self) -> None:
        now = time.monotonic()
        for p in [p for p, t in self.renewed.items() if now - t > self.ttl]:
            log.error("partition %d: not renewed for %.1f s; stopping", p, now - self.renewed[p])
            await self._stop(p, handover=False)

    async def _stop(self, p: int, *, handover: bool) -> None:
        """Stop applying ``p``. ``handover``: commit everything with snapshots first, then
        delete the claim so that the next owner starts at once and replays nothing."""
        w, task = self.workers.get(p), self.tasks.pop(p, None)
        if task is not None:
            if handover and w is not None:
                async with w.lock:  # between two batches
                    task.cancel()
            else:
                task.cancel()
            await _ended(task)
        if handover and w is not None and w.resumed:
            try:
                await w.commit(all_due=True)
                await self._release(p)
            except Exception:  # noqa: BLE001 - the next owner replays from the stream
                log.exception("partition %d: hand-over commit failed", p)
        elif handover:
            await self._release(p)
        if w is not None:
            self._drop(w)
        self.held.pop(p, None)
        self.renewed.pop(p, None)

    async def _release(self, p: int) -> None:
        bus, rev = self.o.bus, self.held.get(p)
        if rev is None or bus.owners is None:
            return
        with contextlib.suppress(NatsError, KeyWrongLastSequenceError, KeyNotFoundError):
            await bus.owners.delete(_key(p), last=rev)

    def _drop(self, w: PartitionWorker) -> None:
        for job in w.jobs():
            self.o.jobs.drop(job)
        self.workers.pop(w.partition, None)

    async def close(self) -> None:
        """Hand every partition over (a clean shutdown)."""
        for p in list(self.held):
            await self._stop(p, handover=True)
        bus = self.o.bus
        if bus.replicas is not None:
            with contextlib.suppress(Exception):
                await bus.replicas.delete(bus.replica.replace(":", "_"))
