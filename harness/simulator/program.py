"""A rank's program for one step: compute segments, tensor-parallel (and MoE) collectives,
pipeline send/recv in GPipe order, the tied embedding's and the data-parallel all-reduces, the
optimizer; under a published plan (micro-batch shares, re-created communicators)."""

from __future__ import annotations

from typing import Any

from failslow.harness.simulator.layout import Layout
from failslow.harness.simulator.model import PlanState, Workload


def step_program(
    layout: Layout, work: Workload, plan: PlanState, rank: int
) -> list[tuple[Any, ...]]:
    lay, w = layout, work
    t, d, stage = lay.coords(rank)
    names = dict(plan.comm_names)
    tp_comm = lay.tp_comm(rank)
    tp_comm = names.get(tp_comm, tp_comm) if tp_comm else None
    mbs = plan.shares[d] if plan.shares is not None else w.microbatches
    ops: list[tuple[Any, ...]] = []
    ep_comm = lay.ep_comm(rank)

    def chunk(seconds: float) -> None:
        for _ in range(w.tp_per_chunk):
            ops.append(("compute", seconds))
            if tp_comm:
                ops.append(("coll", tp_comm, "allreduce", w.tp_bytes))
        if ep_comm:  # MoE: tokens to and from the experts
            ops.append(("coll", ep_comm, "alltoall", w.tp_bytes))

    def p2p(op: str, other: int) -> None:  # with the same (tp, dp) rank of stage ``other``
        comm = lay.pp_comm(rank, min(stage, other))
        ops.append(("p2p", comm, op, w.pp_bytes, lay.rank(t, d, other)))

    for _ in range(mbs):  # forward: activations in from the stage before, out to the next
        if stage > 0:
            p2p("recv", stage - 1)
        chunk(w.fwd_s)
        if stage < lay.pp - 1:
            p2p("send", stage + 1)
    for _ in range(mbs):  # backward: gradients in from the next stage, out to the one before
        if stage < lay.pp - 1:
            p2p("recv", stage + 1)
        chunk(w.bwd_s)
        if stage > 0:
            p2p("send", stage - 1)
    emb_comm = lay.embedding_comm(rank)
    if emb_comm:  # the tied embedding's gradients, between the first and last stage
        ops.append(("coll", emb_comm, "allreduce", w.pp_bytes))
    dp_comm = lay.dp_comm(rank)
    dp_comm = names.get(dp_comm, dp_comm) if dp_comm else None
    if dp_comm:
        for _ in range(w.dp_buckets):
            ops.append(("coll", dp_comm, "allreduce", w.dp_bytes // w.dp_buckets))
    ops.append(("compute", w.optimizer_s))
    return ops
