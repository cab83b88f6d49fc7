"""What the replica side works with, handed in by ``create_app``."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from failslow.service.bus.client import Bus
from failslow.service.bus.settings import BusSettings
from failslow.service.detection.engine import DetectionEngine
from failslow.service.metrics import Metrics
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.settings import StateSettings


@dataclass(slots=True)
class Owned:
    bus: Bus
    bus_settings: BusSettings
    sessions: sessionmaker[Session]
    jobs: JobRegistry
    detection: DetectionEngine
    metrics: Metrics
    state_settings: StateSettings

    def failed(self, messages: int) -> None:
        """Messages of an owned partition that failed to apply."""
        self.metrics.bus_failed.inc(messages)

    def expired(self, sequences: int) -> None:
        """Stream sequences needed on resuming that the stream no longer holds."""
        self.metrics.bus_expired.inc(sequences)
