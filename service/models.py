"""Every table, imported in one place for Alembic's autogenerate and for tests."""

from service.actions.models import Action, ActionEvent
from service.db import Base
from service.incidents.models import Incident
from service.jobs.models import AgentStream, Comm, Host, Job, JobHistory, Rank, RankHistory
from service.plans.models import JobWorkload, PlanVersion

__all__ = [
    "Action",
    "ActionEvent",
    "JobWorkload",
    "PlanVersion",
    "AgentStream",
    "Base",
    "Comm",
    "Host",
    "Incident",
    "Job",
    "JobHistory",
    "Rank",
    "RankHistory",
]
