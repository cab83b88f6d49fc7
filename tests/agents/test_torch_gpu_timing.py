"""failslow.agents.torch's GPU timing path (CUDA events), on a real one-rank gloo group with
stand-in events.

There is no GPU on the development machines, so ``torch.cuda.Event`` is replaced by ``_Event``
below: it reads a fake GPU clock when recorded and has "happened" once the test moves the GPU's
progress past it — what CUDA events do, without a device. Everything around the events (which
calls are event-timed, sync/async/DDP completion, polling, in-flight reports, broken events) is the
production code. On a GPU machine the same paths run with real events (``gpu_timing=None``).
``poll_s=None``: the tests poll themselves, no background thread races them."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch not installed (optional extra failslow[torch])"
)
dist = pytest.importorskip("torch.distributed")


class _Gpu:
    def __init__(self) -> None:
        self.now_ns = 1_000  # the fake device clock
        self.done_ns = 0  # every event recorded at or before this has happened


class _Event:
    def __init__(self, gpu: _Gpu) -> None:
        self.gpu = gpu
        self.at: int | None = None

    def record(self) -> None:
        self.at = self.gpu.now_ns
        self.gpu.now_ns += 250_000  # 0.25 ms of device time between consecutive events

    def query(self) -> bool:
        assert self.at is not None
        return self.at <= self.gpu.done_ns

    def elapsed_time(self, end: _Event) -> float:  # ms, like torch.cuda.Event
        assert self.at is not None and end.at is not None
        return (end.at - self.at) / 1e6


class _Recorder:
    def __init__(self) -> None:
        from failslow.agents.sdk import SdkStats

        self.records: list[dict[str, Any]] = []
        self.stats = SdkStats()
        self.nudged = 0

    def hand_over_soon(self) -> None:
        self.nudged += 1

    def start(self) -> None: ...

    def record_step(self, **kw: Any) -> None: ...

    def register_rank(self, *a: Any, **k: Any) -> None: ...

    def register_comm(self, *a: Any, **k: Any) -> None: ...

    def record_collective(self, **kw: Any) -> None:
        self.records.append(kw)


@pytest.fixture
def group(tmp_path: Any) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _inst(gpu: _Gpu, **kw: Any) -> Any:
    from failslow.agents.torch import Instrumentation

    host = iter(range(10_000_000_000, 10**12, 1_000_000_000))  # host clock: +1 s per reading
    return Instrumentation(
        _Recorder(),
        clock=lambda: next(host),
        gpu_timing=True,
        event_factory=lambda: _Event(gpu),
        inflight_after_s=None,
        poll_s=None,  # the test polls; no background thread racing it
        **kw,
    )


def test_sync_and_async_calls_are_timed_by_their_events(group: None) -> None:
    gpu = _Gpu()
    inst = _inst(gpu).install()
    try:
        t = torch.ones(8)
        dist.all_reduce(t)  # events at 1,000 and 251,000: 0.25 ms apart
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        assert inst.recorded == 0  # nothing until the GPU has passed the end events
        assert inst.poll_events() == 0
        gpu.done_ns = gpu.now_ns
        assert inst.poll_events() == 2
    finally:
        inst.uninstall()
    recs = inst.recorder.records
    assert [(r["op"], r["seq"], r["nbytes"]) for r in recs] == [
        ("allreduce", 0, 32),
        ("allreduce", 1, 32),
    ]
    for r in recs:  # duration from the events, not from the host clock (+1 s per reading)
        assert r["end_ns"] - r["start_ns"] == 250_000
    assert recs[0]["start_ns"] < recs[1]["start_ns"]
    assert inst.errors == 0 and inst.event_errors == 0


def test_events_happen_in_any_order_and_unfinished_ones_wait(group: None) -> None:
    gpu = _Gpu()
    inst = _inst(gpu).install()
    try:
        dist.all_reduce(torch.ones(2))
        first_end = gpu.now_ns - 250_000
        dist.broadcast(torch.ones(2), src=0)
        gpu.done_ns = first_end  # only the first collective has finished on the device
        assert inst.poll_events() == 1
        assert [r["op"] for r in inst.recorder.records] == ["allreduce"]
        gpu.done_ns = gpu.now_ns
        assert inst.poll_events() == 1
        assert [r["op"] for r in inst.recorder.records] == ["allreduce", "broadcast"]
    finally:
        inst.uninstall()


@pytest.mark.parametrize("way", ["group", "hook"])
def test_ddp_buckets_are_event_timed_and_training_unchanged(group: None, way: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(inst: Any | None) -> list[float]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        pg = inst.process_group() if inst is not None and way == "group" else None
        ddp = DDP(model, bucket_cap_mb=0.0001, process_group=pg)
        if inst is not None and way == "hook":
            ddp.register_comm_hook(None, inst.ddp_hook())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            loss = ddp(x).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    plain = train(None)
    gpu = _Gpu()
    inst = _inst(gpu).install()
    try:
        timed = train(inst)
        gpu.done_ns = gpu.now_ns
        inst.poll_events()
    finally:
        inst.uninstall()
    assert timed == plain
    dp = [r for r in inst.recorder.records if r["comm"] == "dp" and r["op"] == "allreduce"]
    # device time between the bucket's two events (other buckets' events may fall between
    # them), never the host clock's +1 s per reading
    durations = [r["end_ns"] - r["start_ns"] for r in dp]
    assert len(dp) >= 3 and all(0 < d < 10_000_000 and d % 250_000 == 0 for d in durations)


def test_a_call_the_gpu_never_finishes_is_reported_in_flight(group: None) -> None:
    gpu = _Gpu()
    inst = _inst(gpu).install()
    inst.inflight_after_s = 0.5  # host clock moves 1 s per reading
    try:
        dist.all_reduce(torch.ones(4))
        assert inst.poll_events() == 0
        assert inst.report_inflight() == 1
        assert [r["end_ns"] for r in inst.recorder.records] == [None]
        # blocked: each scan hands over at once (agents/urgency.py), not at the next interval
        assert inst.recorder.nudged == 1
        assert inst.report_inflight() == 0 and inst.recorder.nudged == 2
        gpu.done_ns = gpu.now_ns
        assert inst.poll_events() == 1  # the completed record follows
        assert inst.recorder.records[-1]["end_ns"] is not None
        assert inst.report_inflight() == 0
        assert inst.recorder.nudged == 2  # nothing blocked any more
    finally:
        inst.uninstall()


def test_broken_events_are_counted_and_never_raise(group: None) -> None:
    class Broken(_Event):
        def elapsed_time(self, end: _Event) -> float:
            raise RuntimeError("event not recorded")

    from failslow.agents.torch import Instrumentation

    gpu = _Gpu()
    inst = Instrumentation(
        _Recorder(),
        gpu_timing=True,
        event_factory=lambda: Broken(gpu),
        inflight_after_s=None,
        poll_s=None,
    ).install()
    try:
        t = torch.ones(3)
        dist.all_reduce(t)
        gpu.done_ns = gpu.now_ns
        assert inst.poll_events() == 0
    finally:
        inst.uninstall()
    assert inst.event_errors == 1 and inst.recorder.records == []
    assert torch.equal(t, torch.ones(3))  # the training's result is untouched


def test_cpu_tensors_use_the_wall_clock_by_default(group: None) -> None:
    from failslow.agents.torch import Instrumentation

    made = []
    inst = Instrumentation(
        _Recorder(), event_factory=lambda: made.append(1), inflight_after_s=None
    ).install()  # gpu_timing=None: events only for CUDA tensors (and only with CUDA)
    try:
        dist.all_reduce(torch.ones(2))
    finally:
        inst.uninstall()
    assert made == [] and len(inst.recorder.records) == 1


def test_failures_pass_through_and_leave_nothing_in_flight(group: None) -> None:
    gpu = _Gpu()
    inst = _inst(gpu).install()
    inst.gpu_timing = False  # wall clock: the records complete at once
    inst.inflight_after_s = 0.5  # host clock moves 1 s per reading
    try:
        with pytest.raises(RuntimeError) as failed:  # raised by gloo, below our kernel
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            gather(torch.empty(3), torch.ones(2))
        assert "world_size" in str(failed.value) or "size" in str(failed.value)
        assert inst._inflight == {} and inst.report_inflight() == 0
        t = torch.ones(3)
        dist.all_reduce(t)
        assert [(r["comm"], r["seq"], r["op"], r["nbytes"]) for r in inst.recorder.records] == [
            ("world", 1, "allreduce", 12)
        ]  # the failed call had taken sequence number 0, on every rank alike
        assert inst.stats()["errors"] == 0
    finally:
        inst.uninstall()


def test_watchdog_sleeps_until_the_oldest_call_in_flight_is_due() -> None:
    from failslow.agents.torch import Instrumentation

    now = [100 * 10**9]
    inst = Instrumentation(
        _Recorder(), clock=lambda: now[0], gpu_timing=False, inflight_after_s=1.0, poll_s=0.25
    )
    assert inst._next_wake() == pytest.approx(1.0)  # nothing in flight: one period
    inst._begin("dp", 0, "allreduce", 4, now[0] - 700_000_000, None)  # in flight for 0.7 s
    inst._begin("dp", 1, "allreduce", 4, now[0] - 100_000_000, None)
    assert inst._next_wake() == pytest.approx(0.3)  # the older one is due in 0.3 s
    now[0] += 2 * 10**9
    assert inst._next_wake() == pytest.approx(0.02)  # overdue: at once (a short floor)
    assert inst.report_inflight() == 2
    assert inst._next_wake() == pytest.approx(1.0)  # reported ones no longer count
    inst.gpu_timing = None  # events may need polling: at least every poll_s
    assert inst._next_wake() == pytest.approx(0.25)


def test_the_watermark_waits_for_unresolved_gpu_calls_and_the_in_flight_scan(
    group: None,
) -> None:
    """What a hand-over vouches for (docs/ingest-v1.md, "Completeness"): nothing before the first
    in-flight scan; never past a GPU-timed call not yet resolved (its end, found later, is at
    least its start), nor past the last scan; the announced delay is ``inflight_after_s``."""
    from failslow.agents.torch.timing import VOUCH_MARGIN_NS

    gpu = _Gpu()
    inst = _inst(gpu).install()  # host clock: +1 s per reading
    inst.inflight_after_s = 0.5
    try:
        assert inst.recorder.watermark == inst.watermark  # the recorder asks it
        assert inst.watermark() is None  # no scan yet
        dist.all_reduce(torch.ones(4))  # GPU-timed, unresolved
        start = inst._events[0][2][4]
        inst.report_inflight()  # (reports it: in flight for more than 0.5 s of host clock)
        complete, after = inst.watermark()  # type: ignore[misc]
        assert after == 500_000_000 and complete == start - VOUCH_MARGIN_NS
        gpu.done_ns = gpu.now_ns
        assert inst.poll_events() == 1
        scan = inst._last_scan_ns
        complete, _ = inst.watermark()  # type: ignore[misc]
        assert complete == scan - VOUCH_MARGIN_NS > start  # the scan bounds it now
    finally:
        inst.uninstall()
    assert getattr(inst.recorder, "watermark", None) is None
