"""Queries and state changes of actions, each with an audit event (the caller owns the transaction).

States: ``proposed -> approved -> executing -> succeeded | failed``, or ``proposed -> rejected``.
The move to ``executing`` is a conditional UPDATE, so of two service processes (or two loop
iterations) exactly one claims an action; an action left ``executing`` by a crash is never run
again (at-most-once), it is marked failed at the next start with the reason.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from failslow.service.actions.decisions import ActionSpec
from failslow.service.actions.models import Action, ActionEvent
from failslow.service.actions.vocab import MEASURED, ActionState, Approval
from failslow.service.db import get_for_update
from failslow.service.errors import Conflict
from failslow.service.ids import new_id
from failslow.service.paging import Page

TRANSITIONS: dict[ActionState, tuple[ActionState, ...]] = {
    ActionState.PROPOSED: (ActionState.APPROVED, ActionState.REJECTED),
    ActionState.APPROVED: (ActionState.EXECUTING,),
    ActionState.EXECUTING: (ActionState.SUCCEEDED, ActionState.FAILED),
    ActionState.SUCCEEDED: (),
    ActionState.FAILED: (),
    ActionState.REJECTED: (),
}


def idempotency_key(job: str, incident: str | None, spec: ActionSpec) -> str:
    return f"{job}/{spec.key or incident or '-'}/{spec.rung}/{spec.kind}/{spec.target}"


def _event(
    session: Session,
    action_id: str,
    *,
    frm: str | None,
    to: str,
    actor: str,
    note: str,
    now_ns: int,
) -> None:
    session.add(
        ActionEvent(
            action_id=action_id, at_ns=now_ns, from_state=frm, to_state=to, actor=actor, note=note
        )
    )


def propose(
    session: Session,
    *,
    job: str,
    incident: str | None,
    spec: ActionSpec,
    mode: str,
    actuator: str,
    dry_run: bool,
    now_ns: int,
    event_ns: int,
) -> tuple[Action, bool]:
    """Persist a decided action (``proposed``; ``approved`` at once in auto mode).

    Returns ``(action, created)``; a second proposal with the same idempotency key returns the
    first one.
    """
    key = idempotency_key(job, incident, spec)
    existing = session.scalars(select(Action).where(Action.idempotency_key == key)).first()
    if existing is not None:
        return existing, False
    row = Action(
        id=new_id("act"),
        job_id=job,
        incident_id=incident,
        kind=spec.kind,
        target=spec.target,
        state=ActionState.PROPOSED,
        mode=mode,
        reason=spec.reason,
        params=dict(spec.params),
        actuator=actuator,
        dry_run=dry_run,
        result=None,
        outcome=None,
        idempotency_key=key,
        created_ns=now_ns,
        updated_ns=now_ns,
        decided_event_ns=event_ns,
        executed_ns=None,
        decided_by="policy",
    )
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        winner = session.scalars(select(Action).where(Action.idempotency_key == key)).first()
        if winner is None:
            raise
        return winner, False
    _event(
        session,
        row.id,
        frm=None,
        to=ActionState.PROPOSED,
        actor="policy",
        note=spec.reason,
        now_ns=now_ns,
    )
    if mode == Approval.AUTO:
        transition(
            session, row, to=ActionState.APPROVED, actor="policy", note="auto mode", now_ns=now_ns
        )
    return row, True


def transition(
    session: Session, action: Action, *, to: str, actor: str, note: str, now_ns: int
) -> None:
    if to not in TRANSITIONS[action.state]:
        raise Conflict(f"action {action.id} is {action.state}; it cannot become {to}")
    frm = action.state
    action.state = to
    action.updated_ns = now_ns
    _event(session, action.id, frm=frm, to=to, actor=actor, note=note, now_ns=now_ns)


def decide_manually(
    session: Session, *, action_id: str, approve: bool, actor: str, note: str, now_ns: int
) -> Action | None:
    """An operator's approval or rejection (409 if the action is no longer proposed)."""
    row = get_for_update(session, Action, action_id)
    if row is None:
        return None
    to = ActionState.APPROVED if approve else ActionState.REJECTED
    if row.state == to:
        return row  # the same decision twice: idempotent
    transition(session, row, to=to, actor=actor, note=note, now_ns=now_ns)
    row.decided_by = actor
    if not approve:
        row.result = {"rejected": note or "rejected by an operator"}
    return row


def claim(session: Session, *, action_id: str, now_ns: int) -> bool:
    """``approved -> executing`` for exactly one claimant (conditional UPDATE)."""
    res = session.execute(
        update(Action)
        .where(Action.id == action_id, Action.state == ActionState.APPROVED)
        .values(state=ActionState.EXECUTING, updated_ns=now_ns, executed_ns=now_ns)
    )
    if res.rowcount != 1:  # type: ignore[attr-defined]
        return False
    _event(
        session,
        action_id,
        frm=ActionState.APPROVED,
        to=ActionState.EXECUTING,
        actor="executor",
        note="claimed for execution",
        now_ns=now_ns,
    )
    return True


def finish(
    session: Session, *, action: Action, ok: bool, result: dict[str, Any], now_ns: int
) -> None:
    action.result = result
    note = "done" if ok else str(result.get("error", "failed"))
    transition(
        session,
        action,
        to=ActionState.SUCCEEDED if ok else ActionState.FAILED,
        actor=f"actuator:{action.actuator}",
        note=note,
        now_ns=now_ns,
    )


def recover_interrupted(session: Session, *, now_ns: int) -> list[str]:
    """Actions left ``executing`` by a crash: failed, never re-run (their effect is unknown)."""
    rows = list(session.scalars(select(Action).where(Action.state == ActionState.EXECUTING)))
    for row in rows:
        row.result = {
            "error": "the service stopped while this action was executing; its effect is "
            "unknown and it is not run again (at-most-once). Check the target, then re-propose."
        }
        transition(
            session,
            row,
            to=ActionState.FAILED,
            actor="service",
            note="interrupted by restart",
            now_ns=now_ns,
        )
    return [r.id for r in rows]


def list_actions(
    session: Session,
    *,
    job: str | None = None,
    state: str | None = None,
    incident: str | None = None,
    page: Page | None = None,
) -> list[Action]:
    """In creation order. With ``page``: created within its time range, after its cursor
    (``<created_ns>.<id>``, :func:`cursor`), ``limit + 1`` at most."""
    q = select(Action)
    if job is not None:
        q = q.where(Action.job_id == job)
    if state is not None:
        q = q.where(Action.state == state)
    if incident is not None:
        q = q.where(Action.incident_id == incident)
    if page is not None:
        if page.since_ns is not None:
            q = q.where(Action.created_ns >= page.since_ns)
        if page.until_ns is not None:
            q = q.where(Action.created_ns <= page.until_ns)
        if page.after is not None:
            ns, _, after_id = page.after.partition(".")
            if not ns.isdigit():
                raise ValueError(f"not a cursor of this list: {page.after!r}")
            q = q.where(
                (Action.created_ns > int(ns))
                | ((Action.created_ns == int(ns)) & (Action.id > after_id))
            )
        q = q.limit(page.limit + 1)
    return list(session.scalars(q.order_by(Action.created_ns, Action.id)))


def cursor(row: Action) -> str:
    return f"{row.created_ns}.{row.id}"


def get_action(session: Session, *, action_id: str) -> Action | None:
    return session.get(Action, action_id)


def events(session: Session, *, action_id: str) -> list[ActionEvent]:
    return list(
        session.scalars(
            select(ActionEvent).where(ActionEvent.action_id == action_id).order_by(ActionEvent.id)
        )
    )


def fixes(session: Session, *, incident: str) -> list[str]:
    """Kinds of the corrective actions (rebalance, re-plan, restart) that succeeded on an
    incident, oldest first: what its resolution says it was cleared after."""
    return list(
        session.scalars(
            select(Action.kind)
            .where(
                Action.incident_id == incident,
                Action.state == ActionState.SUCCEEDED,
                Action.kind.in_(MEASURED),
            )
            .order_by(Action.created_ns)
        ).all()
    )
