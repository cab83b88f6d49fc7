"""Every table, imported in one place for Alembic's autogenerate and for tests."""

from failslow.service.actions.models import Action, ActionEvent
from failslow.service.control.models import AuditEvent, JobControl
from failslow.service.db import Base
from failslow.service.fleet.models import FleetMark, FleetPart, FleetReading, HostInventory
from failslow.service.incidents.models import Incident
from failslow.service.jobs.models import (
    AgentStream,
    Comm,
    Host,
    Job,
    JobHistory,
    Rank,
    RankHistoryBucket,
)
from failslow.service.lease import ServiceLease
from failslow.service.plans.models import JobWorkload, PlanVersion
from failslow.service.replica.models import BusPartition, JobSnapshot

__all__ = [
    "Action",
    "ActionEvent",
    "AuditEvent",
    "JobControl",
    "JobWorkload",
    "PlanVersion",
    "AgentStream",
    "BusPartition",
    "JobSnapshot",
    "Base",
    "Comm",
    "FleetMark",
    "FleetPart",
    "FleetReading",
    "HostInventory",
    "Host",
    "Incident",
    "Job",
    "JobHistory",
    "Rank",
    "RankHistoryBucket",
    "ServiceLease",
]
