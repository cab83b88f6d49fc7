"""Every table, imported in one place for Alembic's autogenerate and for tests."""

from service.db import Base
from service.incidents.models import Incident
from service.jobs.models import AgentStream, Comm, Host, Job, JobHistory, Rank, RankHistory

__all__ = [
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
