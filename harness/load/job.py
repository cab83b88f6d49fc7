"""A large synthetic job for load tests, generated per host as v2 columns at almost no cost.

Layout (as bench/detection_scale.py): TP=8 ranks per host (one tensor-parallel group), PP=4
stages, DP=N/32. Per step every tensor-parallel group runs 16 all-reduces, every pipeline pair 8
send/recv, every data-parallel group one all-reduce, and every rank reports its step: about 30
records per rank. A host's records of one step are a fixed template (times relative to the step,
sequence numbers per step) shifted to the step: one add per column, no object per record.

With a slow GPU (``slow``, from ``fault_step``), that rank arrives ``late_ns`` late at each of
its tensor-parallel all-reduces and 16 x ``late_ns`` late at its data-parallel one; its peers
wait for it (their calls end when it arrives), as in a real synchronous job.
"""

from __future__ import annotations

import functools
from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Any

import numpy as np

from failslow.detectors.vocab import Op
from failslow.wire import topology, v2

TP, PP, GPUS = 8, 4, 8
TP_CALLS, PP_CALLS = 16, 8
MS = 1_000_000


@dataclass(frozen=True, slots=True)
class JobLayout:
    ranks: int
    step_ns: int
    slow: int | None = None  # the slow GPU's rank
    fault_step: int | None = None
    late_ns: int = 10 * MS

    @property
    def dp(self) -> int:
        return self.ranks // (TP * PP)

    @property
    def hosts(self) -> int:
        return self.ranks // GPUS

    def rank(self, p: int, d: int, t: int) -> int:
        return t + TP * (d + self.dp * p)

    def where(self, rank: int) -> tuple[int, int, int]:
        """``(stage, data-parallel index, tensor-parallel index)`` of a rank."""
        t = rank % TP
        p, d = divmod(rank // TP, self.dp)
        return p, d, t


def host_name(h: int) -> str:
    return f"node-{h:06d}"


@functools.cache
def dp_members(job: JobLayout, p: int, t: int) -> list[int]:
    """The members of data-parallel group (stage p, tensor index t): shared by its hosts."""
    return [job.rank(p, x, t) for x in range(job.dp)]


class HostTemplate:
    """One host's registration and its records of one step, healthy and with the fault."""

    def __init__(self, job: JobLayout, host: int) -> None:
        if job.ranks % (TP * PP) or job.ranks < TP * PP * 2:
            raise ValueError(f"ranks must be a multiple of {TP * PP} and at least {TP * PP * 2}")
        self.job, self.host = job, host
        p, d = divmod(host, job.dp)
        self.stage, self.dp_index = p, d
        own = [job.rank(p, d, t) for t in range(TP)]
        comms: list[dict[str, Any]] = [{"comm": f"tp-{p}-{d}", "kind": "tp", "ranks": own}]
        for t in range(TP):
            comms.append({"comm": f"dp-{p}-{t}", "kind": "dp", "ranks": dp_members(job, p, t)})
        pairs: list[tuple[int, int, bool]] = []  # (comm code, my rank, sending)
        for t in range(TP):
            if p + 1 < PP:
                pairs.append((len(comms), own[t], True))
                comms.append({"comm": f"pp-{p}-{d}-{t}", "kind": "pp",
                              "ranks": [own[t], job.rank(p + 1, d, t)]})  # fmt: skip
            if p > 0:
                pairs.append((len(comms), own[t], False))
                comms.append({"comm": f"pp-{p - 1}-{d}-{t}", "kind": "pp",
                              "ranks": [job.rank(p - 1, d, t), own[t]]})  # fmt: skip
        self.ranks = own
        # what an agent registers: the canonical form (long progressions written as ranges)
        self.registration = topology.canonical(
            [{"rank": r, "gpu": i, "world_size": job.ranks} for i, r in enumerate(own)], comms
        )
        self.healthy = self._template(pairs, faulty=False)
        affected = job.slow is not None and job.fault_step is not None
        self.faulty = self._template(pairs, faulty=True) if affected else self.healthy
        self.records = int(self.healthy[0]["rank"].size + self.healthy[1]["rank"].size)

    def _template(
        self, pairs: list[tuple[int, int, bool]], *, faulty: bool
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(collective columns, step columns, per-step increments of seq)`` for step 0."""
        job, S = self.job, self.job.step_ns
        slow = job.slow if faulty else None
        rows: list[tuple[int, int, int, Op, int, int, int, int]] = []
        seq_step: list[int] = []
        # tensor parallel: 16 all-reduces, all members on this host
        for k in range(TP_CALLS):
            base = int((k + 1) * S * 0.8 / (TP_CALLS + 1))
            arrive = [base + 20_000 * i for i in range(TP)]
            if slow in self.ranks:
                arrive[self.ranks.index(slow)] += job.late_ns
            end = max(arrive) + 100_000
            for i, r in enumerate(self.ranks):
                rows.append((r, 0, k, Op.ALLREDUCE, 16 << 20, arrive[i], end, v2.NO_PEER))
                seq_step.append(TP_CALLS)
        # data parallel: one all-reduce per step near its end; a late member delays everyone
        dp_late = 16 * job.late_ns if slow is not None else 0
        for t, r in enumerate(self.ranks):
            arrive = int(S * 0.85) + 10_000 * (self.dp_index % 7)
            group_has_slow = slow is not None and job.where(slow)[0::2] == (self.stage, t)
            end = int(S * 0.85) + 70_000 + (dp_late if group_has_slow else 0) + 200_000
            if r == slow:
                arrive += dp_late
            rows.append((r, 1 + t, 0, Op.ALLREDUCE, 256 << 20, arrive, end, v2.NO_PEER))
            seq_step.append(1)
        # pipeline: 8 send/recv per pair; a receiver waits for its sender
        for code, r, sending in pairs:
            peer = self.registration["comms"][code]["ranks"][1 if sending else 0]  # a pair: a list
            for k in range(PP_CALLS):
                sent = int(S * (0.1 + 0.7 * k / PP_CALLS))
                end = sent + 300_000
                start = sent if sending else sent - 150_000
                op = Op.SEND if sending else Op.RECV
                rows.append((r, code, k, op, 8 << 20, start, end, peer))
                seq_step.append(PP_CALLS)
        a = np.array([(*r[:3], 0, *r[4:]) for r in rows], dtype=np.int64).reshape(-1, 8)
        ops = np.array([v2.OP_CODE[r[3]] for r in rows], dtype=np.uint8)
        cols = {
            "rank": a[:, 0].astype(np.int32),
            "comm": a[:, 1].astype(np.uint32),
            "seq": a[:, 2],
            "op": ops,
            "bytes": a[:, 4],
            "start_ns": a[:, 5],
            "end_ns": a[:, 6],
            "peer": a[:, 7].astype(np.int32),
        }
        steps = {
            "rank": np.array(self.ranks, np.int32),
            "step": np.zeros(TP, np.int64),
            "start_ns": np.zeros(TP, np.int64),
            "end_ns": np.full(TP, S - 1, np.int64),
        }
        return cols, steps, {"seq": np.array(seq_step, np.int64)}

    def body(self, step: int, t0_ns: int, header: dict[str, Any]) -> bytes:
        """This host's records of ``step`` (which began at ``t0_ns + step * step_ns``)."""
        job = self.job
        faulty = job.fault_step is not None and step >= job.fault_step
        cols, steps, inc = self.faulty if faulty else self.healthy
        shift = t0_ns + step * job.step_ns
        c = dict(cols)
        c["seq"] = cols["seq"] + step * inc["seq"]
        c["start_ns"] = cols["start_ns"] + shift
        c["end_ns"] = cols["end_ns"] + shift
        s = dict(steps)
        s["step"] = steps["step"] + step
        s["start_ns"] = steps["start_ns"] + shift
        s["end_ns"] = steps["end_ns"] + shift
        return v2.encode(header, c, s)


def ranks_argument(text: str) -> int:
    """``--ranks`` of `failslow bench e2e`: a job this generator can lay out."""
    n = int(text)
    if n % (TP * PP) or n < 2 * TP * PP:
        nearest = max(2 * TP * PP, round(n / (TP * PP)) * TP * PP)
        raise ArgumentTypeError(
            f"{n} ranks: a multiple of {TP * PP} (TP{TP} x PP{PP}) and at least {2 * TP * PP} "
            f"is needed (e.g. {nearest})"
        )
    return n
