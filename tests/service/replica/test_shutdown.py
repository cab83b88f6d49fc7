"""A clean shutdown with a bus hands its partitions over and drains the connection, each within
``bus.shutdown_timeout_s``: an unresponsive NATS server must not hold the process forever."""

from __future__ import annotations

import asyncio
import logging

import pytest

from failslow.service.app import hand_over


class _Step:
    """An ``ownership`` or ``bus`` whose ``close`` hangs, fails or returns at once."""

    def __init__(self, how: str) -> None:
        self.how, self.called, self.cancelled = how, False, False

    async def close(self) -> None:
        self.called = True
        if self.how == "fail":
            raise RuntimeError("nats: connection closed")
        if self.how == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise


@pytest.mark.parametrize("first", ["hang", "fail", "ok"])
def test_hand_over_is_bounded_and_always_drains(
    first: str, caplog: pytest.LogCaptureFixture
) -> None:
    ownership, bus = _Step(first), _Step("hang")

    async def main() -> None:  # the outer bound fails the test if hand_over does not keep its own
        await asyncio.wait_for(hand_over(ownership, bus, 0.2), 5)

    with caplog.at_level(logging.ERROR, logger="failslow.service.app"):
        asyncio.run(main())
    assert ownership.called and bus.called  # the drain is tried whatever the hand-over did
    assert bus.cancelled and ownership.cancelled == (first == "hang")
    said = caplog.text
    assert "drain of the bus connection took over 0.2 s" in said
    assert ("hand-over of the partitions took over" in said) == (first == "hang")
    assert ("hand-over of the partitions failed" in said) == (first == "fail")


def test_an_ownership_loop_cancelled_during_a_hand_over_ends() -> None:
    """Cancelled while it waits for a partition worker to stop (a hand-over at shutdown), the
    ownership's ``_stop`` lets its own cancellation through once the worker has ended: before,
    it swallowed it and the ownership loop went on for good."""
    from failslow.service.replica.ownership import Ownership

    async def slow_worker() -> None:
        try:
            await asyncio.Event().wait()
        finally:  # like unsubscribing from NATS: takes a while after its cancellation
            await asyncio.sleep(0.2)

    async def main() -> tuple[bool, bool]:
        own = Ownership.__new__(Ownership)
        own.held, own.renewed, own.workers = {3: 7}, {3: 0.0}, {}
        worker = asyncio.create_task(slow_worker())
        own.tasks = {3: worker}
        await asyncio.sleep(0)  # the worker waits
        stopping = asyncio.create_task(own._stop(3, handover=False))
        await asyncio.sleep(0.05)  # _stop waits for the worker's cancellation to finish
        stopping.cancel()  # the app shuts down now
        await asyncio.wait([stopping], timeout=5)
        await asyncio.wait([worker], timeout=5)
        return stopping.cancelled(), worker.cancelled()

    stopping_cancelled, worker_cancelled = asyncio.run(main())
    assert stopping_cancelled  # the caller's cancellation was not swallowed
    assert worker_cancelled  # and the worker was stopped as asked
