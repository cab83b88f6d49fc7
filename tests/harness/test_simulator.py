"""The simulator: layout, determinism, record consistency, timing, faults and labels."""

from __future__ import annotations

from collections import defaultdict

import pytest

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.engine import Simulation
from failslow.harness.simulator.model import Noise, Workload
from failslow.harness.simulator.scenario import parse_fault

SMALL = Layout(tp=2, pp=2, dp=2, gpus_per_host=4)


def test_layout_megatron_order_and_comms() -> None:
    lay = Layout(tp=4, pp=2, dp=8, gpus_per_host=8)
    assert lay.world == 64 and lay.n_hosts == 8
    assert all(
        lay.rank(*lay.coords(r)[:1], lay.coords(r)[1], lay.coords(r)[2]) == r for r in range(64)
    )
    kinds: dict[int, list[str]] = defaultdict(list)
    for c in lay.comms:
        for r in c.ranks:
            kinds[r].append(c.kind)
    assert all(
        k.count("tp") == 1 and k.count("dp") == 1 and k.count("pp") == 1 for k in kinds.values()
    )
    assert all(len({lay.host(r) for r in c.ranks}) == 1 for c in lay.comms if c.kind == "tp")
    with pytest.raises(ValueError):
        Layout(tp=3, pp=1, dp=1, gpus_per_host=8)


def test_same_seed_same_records_other_seed_differs() -> None:
    a = list(Scenario(layout=SMALL, steps=5, seed=1).envelopes())
    b = list(Scenario(layout=SMALL, steps=5, seed=1).envelopes())
    c = list(Scenario(layout=SMALL, steps=5, seed=2).envelopes())
    assert a == b and a != c


def test_every_collective_has_all_members_with_one_op() -> None:
    sc = Scenario(layout=SMALL, steps=4)
    members: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)  # type: ignore[type-arg]
    for env in sc.envelopes():
        for rec in env["collectives"]:
            assert rec["end_ns"] >= rec["start_ns"]
            members[(rec["comm"], rec["seq"])][rec["rank"]] = rec
    for (comm, _), recs in members.items():
        assert set(recs) == set(SMALL.comm(comm).ranks)
        ops = {r["op"] for r in recs.values()}
        assert ops == {"send", "recv"} if comm.startswith("pp") else len(ops) == 1
        if comm.startswith("pp"):
            assert all(
                r["peer"] in SMALL.comm(comm).ranks and r["peer"] != r["rank"]
                for r in recs.values()
            )


def test_noise_free_step_time_matches_the_model() -> None:
    w = Workload()
    sim = Simulation(
        Layout(tp=1, pp=1, dp=1, gpus_per_host=1), steps=3, workload=w, noise=Noise.none()
    )
    sim.run_until(100)
    steps = [rec for _, rec in sim.drain(100) if rec[0] == "s"]
    expected = w.microbatches * w.tp_per_chunk * (w.fwd_s + w.bwd_s) + w.optimizer_s
    assert [round((e - s) / 1e9, 9) for *_, s, e in steps] == [pytest.approx(expected)] * 3


def test_slow_gpu_slows_that_rank_only_and_is_labelled() -> None:
    sc = Scenario(
        layout=SMALL,
        steps=12,
        noise=Noise.none(),
        faults=(Fault("slow_gpu", 6, factor=2.0, ranks=(3,)),),
    )
    sim = sc.simulation()
    envs = list(sc.envelopes(sim))
    labels = sc.labels(sim)
    f = labels["faults"][0]
    assert f["ranks"] == [3] and f["hosts"] == ["node-000"] and f["expected_incident"] == "slow_gpu"
    assert f["onset_ns"] is not None
    step_time = {
        s["step"]: s["end_ns"] - s["start_ns"] for e in envs for s in e["steps"] if s["rank"] == 0
    }
    assert step_time[8] > 1.4 * step_time[3]


def test_hang_leaves_inflight_records_and_heartbeats() -> None:
    sc = Scenario(layout=SMALL, steps=30, faults=(Fault("hang", 10, ranks=(2,)),), hang_tail_s=5)
    envs = list(sc.envelopes())
    inflight = [c for e in envs for c in e["collectives"] if c["end_ns"] is None]
    assert inflight and all(c["rank"] != 2 for c in inflight)
    assert envs[-1]["collectives"] == [] and envs[-1]["steps"] == []  # heartbeats at the end
    assert max(s["step"] for e in envs for s in e["steps"]) < 12


def test_dead_host_stops_sending() -> None:
    sc = Scenario(
        layout=SMALL, steps=30, faults=(Fault("dead_host", 10, hosts=("node-001",)),), hang_tail_s=5
    )
    envs = list(sc.envelopes())
    last = {e["host"]: e["sent_ns"] for e in envs}
    assert last["node-001"] < last["node-000"] - 4 * 10**9


def test_clock_offsets_are_small_and_per_host() -> None:
    sim = Scenario(layout=SMALL, steps=1).simulation()
    assert (
        abs(sim.offset_ns).max() <= 2_000_000 and len(set(sim.offset_ns.tolist())) == SMALL.n_hosts
    )


def test_parse_fault() -> None:
    f = parse_fault("slow_link:host=node-000+node-003,start=5,end=9,factor=3,period=2")
    assert (f.kind, f.hosts, f.start_step, f.end_step, f.factor, f.period) == (
        "slow_link",
        ("node-000", "node-003"),
        5,
        9,
        3.0,
        2,
    )
    assert [f.active(s) for s in range(4, 11)] == [False, True, True, False, False, False, False]
    with pytest.raises(ValueError):
        parse_fault("slow_gpu:gpu=1")
    with pytest.raises(ValueError):
        parse_fault("slow_gpu:start=1")  # needs a rank
