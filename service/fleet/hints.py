"""Drain hints: a part judged unfit becomes a ``drain`` action on its host, under the actions'
approval rules and actuators (Slurm ``scontrol update nodename=... state=drain``, Kubernetes
cordon + taint; ``log`` by default, manual approval by default: docs/fleet.md).

A hint is proposed when a part moves to ``suspect`` or ``failed`` by evidence, and when an
operator drains it; an ``undrain`` when an operator returns it and nothing else on its host is
still unfit. Its idempotency key is the part and the moment of its move, so a part that stays
unfit is hinted once, and again only after it was returned and failed anew. Every unfit part's
hint is offered again at the ledger's full judgements (the same key: no duplicate), so one
skipped while its job was muted comes once the job is unmuted. Actions belong to a job (the one
whose evidence decided it: its newest reading or incident), as every action.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from failslow.detectors.fleet import PartState
from failslow.service.actions.decisions import ActionSpec
from failslow.service.actions.vocab import ActionKind
from failslow.service.fleet.models import ARCHIVE, FleetMark, FleetPart, FleetReading
from failslow.service.jobs.models import Job

UNFIT = (PartState.SUSPECT, PartState.FAILED)
# (job, spec, event ns) -> (action id, state); None: not proposed (the job is muted)
Propose = Callable[[str, ActionSpec, int], tuple[str, str] | None]


def last_job(s: Session, part_id: str) -> str | None:
    """The newest job that said something of the part, of the two newest sayings (a reading, a
    mark), that is still known (a qualification's mark names its run, not a job)."""
    r = s.scalars(select(FleetReading).where(FleetReading.part_id == part_id,
                                             FleetReading.job_id != ARCHIVE)
                  .order_by(FleetReading.last_ns.desc()).limit(1)).first()  # fmt: skip
    m = s.scalars(select(FleetMark).where(FleetMark.part_id == part_id)
                  .order_by(FleetMark.at_ns.desc()).limit(1)).first()  # fmt: skip
    seen = ([(r.last_ns, r.job_id)] if r else []) + ([(m.at_ns, m.job_id)] if m else [])
    return next((job for _, job in sorted(seen, reverse=True) if s.get(Job, job) is not None),
                None)  # fmt: skip


def drain_spec(part: FleetPart, why: str) -> ActionSpec:
    reason = f"fleet: {part.kind} {part.part_id} is {part.state}: {why}"[:480]
    return ActionSpec(
        kind=ActionKind.DRAIN, target=f"host:{part.host}", reason=reason,
        params={"host": part.host, "part": part.part_id, "part_kind": part.kind,
                "state": part.state},
        key=f"fleet:{part.part_id}:{part.state_since_ns}",
    )  # fmt: skip


def undrain_spec(part: FleetPart, why: str) -> ActionSpec:
    """The host of a part returned from repair back in service (where failslow drained it)."""
    reason = f"fleet: {part.kind} {part.part_id} returned: {why}"[:480]
    return ActionSpec(
        kind=ActionKind.UNDRAIN, target=f"host:{part.host}", reason=reason,
        params={"host": part.host, "part": part.part_id, "part_kind": part.kind},
        key=f"fleet-return:{part.part_id}:{part.state_since_ns}",
    )  # fmt: skip


def unfit_on(s: Session, host: str) -> list[str]:
    """Parts on ``host`` that are still unfit (its host stays drained for them)."""
    q = select(FleetPart.part_id).where(FleetPart.host == host,
                                        FleetPart.state.in_([str(u) for u in UNFIT]))  # fmt: skip
    return list(s.scalars(q))


def hints_for(s: Session, before: dict[str, str]) -> list[tuple[str, ActionSpec, int]]:
    """The drain hints for parts that became unfit since ``before`` (part id -> state)."""
    out = []
    moved = s.scalars(select(FleetPart).where(FleetPart.state.in_([str(u) for u in UNFIT])))
    for part in moved:
        if before.get(part.part_id) == part.state:
            continue
        job = last_job(s, part.part_id)
        if job is not None:
            out.append((job, drain_spec(part, part.state_reason), part.state_since_ns))
    return out


__all__ = ["Propose", "drain_spec", "hints_for", "last_job", "undrain_spec", "unfit_on"]
