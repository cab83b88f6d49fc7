"""Envelopes applied together (v2apply.apply_v2_many) give what applying them one by one gives:
every answer, counter, stream position, pending collective and frame array, on a job's traffic
with re-sends (later and within the same group), an unknown digest, rejected records, a
conflicting step, step work on some envelopes and one host's two steps in one group."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from failslow.harness.load.job import HostTemplate, JobLayout, host_name
from failslow.service.stream import columnar, v2apply
from failslow.service.stream.columnar import UnknownTopology
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import ApplyResult, JobState
from failslow.wire import topology, v2

T0 = 1_780_000_000_000_000_000
Envelope = tuple[dict[str, Any], bytes, v2.Layout]


def _job() -> tuple[JobLayout, list[HostTemplate]]:
    job = JobLayout(64, 1_000_000_000, slow=21, fault_step=1, late_ns=20_000_000)
    return job, [HostTemplate(job, h) for h in range(job.hosts)]


def _state(hosts: list[HostTemplate], jit: bool) -> JobState:
    state = JobState("j", StateSettings())
    state.frames.jit = jit
    for h, t in enumerate(hosts):
        state.topology.touch_host(host_name(h), T0, 0.0)
        columnar.register_topology(state, host_name(h), t.registration["ranks"],
                                   t.registration["comms"])  # fmt: skip
    return state


def _envelope(body: bytes) -> Envelope:
    header, layout = v2.decode_header(body)
    return header, body, layout


def _traffic(job: JobLayout, hosts: list[HostTemplate], rng: np.random.Generator) -> list[Envelope]:
    digests = [topology.digest(t.registration["ranks"], t.registration["comms"]) for t in hosts]
    out: list[Envelope] = []
    for step in range(4):
        order = rng.permutation(len(hosts))  # hosts arrive in any order
        for h in order.tolist():
            header = {"job": "j", "host": host_name(h), "sent_ns": T0 + (step + 1) * job.step_ns,
                      "agent": f"a{h}", "batch_seq": step, "topology": digests[h]}  # fmt: skip
            body = hosts[h].body(step, T0, header)
            _, cols = v2.decode(body)
            c = {k: v.copy() for k, v in cols.collectives.items()}
            s = {k: v.copy() for k, v in cols.steps.items()}
            if (h + step) % 3 == 0:  # a record of another host's rank, one with a bad op
                c["rank"][0] = hosts[(h + 1) % len(hosts)].ranks[0]
                c["op"][1] = 250
            if h % 2:  # step work on some envelopes
                s["work"] = np.full(s["rank"].size, 1000.0 + step)
            if step == 2 and h == 3:  # a conflicting re-send of an earlier step's record
                s["step"][0] = 1
            out.append(_envelope(v2.encode(header, c, s)))
            if rng.random() < 0.15:  # a re-send right away (same batch)
                out.append(out[-1])
        out.append(out[rng.integers(len(out))])  # a late re-send
    bad = {"job": "j", "host": host_name(0), "sent_ns": T0, "agent": "a0", "batch_seq": 99,
           "topology": "0" * 64}  # fmt: skip
    out.insert(len(out) // 2, _envelope(v2.encode(bad, {}, {})))
    return out


def _answer(r: ApplyResult | UnknownTopology) -> Any:
    if isinstance(r, UnknownTopology):
        return ("unknown", r.host, r.digest)
    return (r.accepted, r.duplicates, r.rejected, r.reasons, r.kinds, r.batch_duplicate)


def _frames(state: JobState) -> list[tuple[int, dict[str, Any]]]:
    return [(k, {f.name: getattr(acc, f.name) for f in dataclasses.fields(acc)})
            for k, acc in sorted(state.frames.frames.items())]  # fmt: skip


def _same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("jit", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_grouped_equals_one_by_one(seed: int, jit: bool) -> None:
    rng = np.random.default_rng(seed)
    job, hosts = _job()
    traffic = _traffic(job, hosts, rng)
    one, grouped = _state(hosts, jit), _state(hosts, jit)
    answers_one = [v2apply.apply_v2_many(one, [e])[0] for e in traffic]
    answers_grouped: list[ApplyResult | UnknownTopology] = []
    i = 0
    while i < len(traffic):
        n = int(rng.integers(1, 40))
        answers_grouped += v2apply.apply_v2_many(grouped, traffic[i : i + n])
        i += n
    _same([_answer(a) for a in answers_one], [_answer(a) for a in answers_grouped])
    assert any(a[1] for a in map(_answer, answers_one) if a[0] != "unknown")  # re-sends seen
    assert any(isinstance(a, UnknownTopology) for a in answers_one)
    rejected = [r for a in answers_one if not isinstance(a, UnknownTopology) for r in a.rejected]
    assert {r["index"].split("[")[0] for r in rejected} == {"collectives", "steps"}
    assert one.deltas == grouped.deltas and one.streams == grouped.streams
    assert one.dirty_streams == grouped.dirty_streams
    assert one.watermark_ns == grouped.watermark_ns
    lags = [(s.delivery_lag._lag, s.delivery_lag._count, s.delivery_lag._reorder)
            for s in (one, grouped)]  # fmt: skip
    assert lags[0] == lags[1] and lags[0][1][0] > 0 and lags[0][0][0] > 0  # (delivery lag)
    _same(_frames(one), _frames(grouped))
    for state in (one, grouped):
        state.drain_ready()
    _same(one.joiner.pending, grouped.joiner.pending)
    assert one.joiner.duplicates == grouped.joiner.duplicates
    assert one.joiner.conflicts == grouped.joiner.conflicts
    closed = [s.frames.advance(s.watermark_ns + 10 * job.step_ns, s.topology.n_slots, flush=True)
              for s in (one, grouped)]  # fmt: skip
    assert len(closed[0]) == len(closed[1]) >= 3
    for a, b in zip(*closed, strict=True):
        _same({f.name: getattr(a, f.name) for f in dataclasses.fields(a)},
              {f.name: getattr(b, f.name) for f in dataclasses.fields(b)})  # fmt: skip


def test_a_resend_in_the_same_group_is_a_duplicate() -> None:
    job, hosts = _job()
    state = _state(hosts, jit=True)
    digest = topology.digest(hosts[0].registration["ranks"], hosts[0].registration["comms"])
    header = {"job": "j", "host": host_name(0), "sent_ns": T0 + job.step_ns, "agent": "a",
              "batch_seq": 0, "topology": digest}  # fmt: skip
    e = _envelope(hosts[0].body(0, T0, header))
    first, again = v2apply.apply_v2_many(state, [e, e])
    assert isinstance(first, ApplyResult) and isinstance(again, ApplyResult)
    assert first.accepted == hosts[0].records and not first.batch_duplicate
    assert again.batch_duplicate and again.duplicates == hosts[0].records
    assert state.deltas[host_name(0)].accepted == hosts[0].records
