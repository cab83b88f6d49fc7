"""Runtime control and audit on the wire."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

MAX_S = 10 * 366 * 86400.0  # ten years: longer mutes and windows are mistakes
Reason = Field(min_length=1, max_length=2000, description="Why (recorded in the audit trail).")


class AuditVerb(StrEnum):
    """What an operator did."""

    MUTE = "mute"
    UNMUTE = "unmute"
    PAUSE = "pause"
    RESUME = "resume"
    MAINTENANCE = "maintenance"
    END_MAINTENANCE = "end_maintenance"
    SET = "set"
    UNSET = "unset"
    RESOLVE = "resolve"
    APPROVE = "approve"
    REJECT = "reject"
    DRAIN = "drain"  # a fleet part taken out of service
    RETURN = "return"  # a fleet part back from repair (on probation)


class Because(BaseModel):
    reason: str = Reason


class MuteIn(BaseModel):
    reason: str = Reason
    for_s: float | None = Field(
        default=None, gt=0, le=MAX_S, description="Mute for this long; absent: until unmuted."
    )


class WindowIn(BaseModel):
    reason: str = Reason
    start: datetime | None = Field(default=None, description="RFC 3339; absent: now.")
    end: datetime | None = Field(default=None, description="RFC 3339; or give for_s.")
    for_s: float | None = Field(default=None, gt=0, le=MAX_S, description="Length, from start.")


class SetIn(BaseModel):
    value: float = Field(allow_inf_nan=False)
    reason: str = Reason


class WindowOut(BaseModel):
    id: str
    start_ns: int
    end_ns: int
    start: str
    end: str
    reason: str
    by: str
    active: bool


class ControlOut(BaseModel):
    job: str
    muted: bool = Field(description="Detected, but neither acted on nor notified.")
    muted_until: str | None = Field(description="RFC 3339; null with muted: until unmuted.")
    mute_reason: str | None
    paused: bool = Field(description="Detection paused (by hand or by a maintenance window).")
    pause_reason: str | None
    in_maintenance: bool
    windows: list[WindowOut]
    overrides: dict[str, float]
    updated: str | None
    updated_by: str | None


class AuditOut(BaseModel):
    id: str
    at_ns: int
    at: str
    actor: str
    verb: AuditVerb
    job: str | None
    target: str | None
    reason: str
    detail: dict[str, Any]


class ConfigValue(BaseModel):
    key: str = Field(description="section.name, as FAILSLOW_<SECTION>__<NAME>.")
    value: Any
    source: str = Field(
        description="default, environment (the FAILSLOW_* variable named in env), argument "
        "(a command-line flag), fleet (set at run time for all jobs) or job (for this job)."
    )
    env: str
    tunable: bool = Field(description="Settable at run time (`failslow config set`).")
