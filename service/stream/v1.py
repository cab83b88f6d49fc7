"""Applying a v1 envelope (JSON records, one at a time): announcements, then each collective
checked against the topology and the ledger and staged for the join, then each step record."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from failslow.detectors.vocab import P2P_OPS
from failslow.service.stream.parse import parse_collective, parse_comm, parse_rank, parse_step
from failslow.service.stream.records import Envelope, Outcome, RecordError, RecordKind, Reject
from failslow.wire.v2 import NO_END, OP_CODE

if TYPE_CHECKING:
    from failslow.service.stream.state import ApplyResult, JobState


def apply_v1(state: JobState, env: Envelope) -> ApplyResult:
    result = state.begin(env.host, env.sent_ns, env.agent, env.batch_seq, env.record_count)
    if result.batch_duplicate:
        return result
    topo = state.topology
    for i, raw in enumerate(env.ranks):
        try:
            topo.announce_rank(env.host, parse_rank(raw))
        except RecordError as exc:
            result.reject(f"ranks[{i}]", exc)
    state.scale_limits()  # from the ranks just announced (never their declared world size)
    for i, raw in enumerate(env.comms):
        try:
            topo.announce_comm(parse_comm(raw))
        except RecordError as exc:
            result.reject(f"comms[{i}]", exc)
    columns: tuple[list[int], ...] = ([], [], [], [], [], [], [], [])
    comm_c, seq_c, pos_c, slot_c, op_c, bytes_c, start_c, end_c = columns
    duplicates = 0
    for i, raw in enumerate(env.collectives):
        try:
            rec = parse_collective(raw)
            comm = topo.comms.get(rec.comm)
            if comm is None:
                raise RecordError(
                    Reject.UNKNOWN_COMM, f"unknown comm {rec.comm} (announce it in comms[])"
                )
            slot = topo.check_rank_host(rec.rank, env.host)
            pos = comm.position.get(rec.rank)
            if pos is None:
                raise RecordError(
                    Reject.NOT_MEMBER, f"rank {rec.rank} is not a member of comm {rec.comm}"
                )
            if rec.op in P2P_OPS and (len(comm.ranks) != 2 or rec.peer not in comm.position):
                raise RecordError(
                    Reject.BAD_PEER, f"peer {rec.peer} is not the other member of comm {rec.comm}"
                )
            outcome = state.ledger.check(comm.index, pos, rec)
        except RecordError as exc:
            result.reject(f"collectives[{i}]", exc)
            continue
        if outcome is Outcome.DUPLICATE:
            duplicates += 1
            continue
        comm_c.append(comm.index)
        seq_c.append(rec.seq)
        pos_c.append(pos)
        slot_c.append(slot)
        op_c.append(OP_CODE[rec.op])
        bytes_c.append(rec.nbytes)
        start_c.append(rec.start_ns)
        end_c.append(NO_END if rec.end_ns is None else rec.end_ns)
    result.count(RecordKind.COLLECTIVE, len(comm_c), duplicates)
    oldest = min((e for e in end_c if e != NO_END), default=None)  # (delivery lag)
    if comm_c:
        n = len(comm_c)
        starts, ends = np.array(start_c, np.int64), np.array(end_c, np.int64)
        state.inflight_delay.note(env.sent_ns, starts, ends)
        state.stage(
            {
                "comm": np.array(comm_c, np.int64),
                "seq": np.array(seq_c, np.int64),
                "pos": np.array(pos_c, np.int64),
                "slot": np.array(slot_c, np.int64),
                "op": np.array(op_c, np.uint8),
                "nbytes": np.array(bytes_c, np.int64),
                "start": starts,
                "end": ends,
                "seen": np.full(n, state.watermark_ns, np.int64),
            }
        )
    for i, raw in enumerate(env.steps):
        try:
            step = parse_step(raw)
            slot = topo.check_rank_host(step.rank, env.host)
            outcome = state.add_step(slot, step)
        except RecordError as exc:
            result.reject(f"steps[{i}]", exc)
            continue
        dup = outcome is Outcome.DUPLICATE
        result.count(RecordKind.STEP, 0 if dup else 1, 1 if dup else 0)
        if not dup:
            oldest = step.end_ns if oldest is None else min(oldest, step.end_ns)
    topo.vouch(env.host, env.complete_ns, env.inflight_after_ns)  # (after its records)
    state.delivery_lag.note(env.host, env.sent_ns, oldest)
    return state.finish(result, env.host, env.sent_ns, env.agent, env.batch_seq)
