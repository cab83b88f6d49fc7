"""Actions on the wire (spec section 3)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, computed_field

from failslow.service.actions.models import Action, ActionEvent
from failslow.service.actions.vocab import ActionKind, ActionState, Approval
from failslow.service.ids import rfc3339


class ActionOut(BaseModel):
    id: str
    incident: str | None = Field(description="The incident the action answers.")
    job: str
    kind: ActionKind
    target: str = Field(description="`host:<name>`, `job:<id>`, `link:<a>-<b>` or `incident:<id>`.")
    state: ActionState
    reason: str = Field(description="Why the policy decided it (costs, budgets, predictions).")
    created_ns: int
    updated_ns: int
    actuator: str
    result: dict[str, Any] | None = Field(description="What the actuator reported.")
    mode: Approval
    dry_run: bool
    params: dict[str, Any] = Field(description="What the action changes (shares, ring orders...).")
    outcome: dict[str, Any] | None = Field(
        description="Measured afterwards: step time before/during/after, share recovered, cost."
    )
    executed_ns: int | None
    decided_by: str | None


    @computed_field(description="created_ns as RFC 3339 (UTC).")  # type: ignore[prop-decorator]
    @property
    def created(self) -> str | None:
        return rfc3339(self.created_ns)

    @computed_field(description="updated_ns as RFC 3339 (UTC).")  # type: ignore[prop-decorator]
    @property
    def updated(self) -> str | None:
        return rfc3339(self.updated_ns)


class ActionEventOut(BaseModel):
    at_ns: int
    from_state: str | None
    to_state: str
    actor: str
    note: str


class Decision(BaseModel):
    """Body of approve/reject (optional for approve; a reject should say why)."""

    reason: str | None = Field(default=None, max_length=2000)
    actor: str | None = Field(
        default=None,
        max_length=128,
        description="Ignored: the actor recorded is the token's (auth.token_names), never what "
        "the body claims. Kept so that clients that send it are not refused.",
    )


def to_out(row: Action) -> ActionOut:
    return ActionOut(
        id=row.id,
        incident=row.incident_id,
        job=row.job_id,
        kind=ActionKind(row.kind),
        target=row.target,
        state=ActionState(row.state),
        reason=row.reason,
        created_ns=row.created_ns,
        updated_ns=row.updated_ns,
        actuator=row.actuator,
        result=row.result,
        mode=Approval(row.mode),
        dry_run=row.dry_run,
        params=dict(row.params),
        outcome=row.outcome,
        executed_ns=row.executed_ns,
        decided_by=row.decided_by,
    )


def event_out(row: ActionEvent) -> ActionEventOut:
    return ActionEventOut(
        at_ns=row.at_ns,
        from_state=row.from_state,
        to_state=row.to_state,
        actor=row.actor,
        note=row.note,
    )
