"""What an executed action won back, measured from the job's own step times afterwards.

Measured once ``min_steps`` steps have completed after the execution: the median of the newest of
them (skipping two settling steps) against the fault-free baseline and the step time during the
fault, both taken when the action was decided and executed. ``cost_s`` is the event time the job
did not spend stepping at its new speed (a restart's pause, a plan's pick-up delay); it becomes
the learned cost of that kind of action.
"""

from __future__ import annotations

import statistics
from typing import Any

from failslow.detectors.vocab import IncidentKind
from failslow.service.actions.models import Action
from failslow.service.stream.reading import DetectionReader


def measure(
    action: Action,
    *,
    watermark_ns: int,
    frames: int,
    detection: DetectionReader,
    min_steps: int,
    timeout_s: float,
) -> dict[str, Any] | None:
    """The outcome of ``action``, or None while it is too early to tell."""
    res = action.result or {}
    event_ns = int(res.get("event_ns") or 0)
    if not event_ns:
        return None
    elapsed = (watermark_ns - event_ns) / 1e9
    steps = frames - int(res.get("frames") or 0)
    if steps < min_steps:
        if elapsed >= timeout_s:
            return {
                "recovered": 0.0,
                "steps": steps,
                "measured_over_s": round(elapsed, 3),
                "note": "the job made no progress after the action",
            }
        return None
    exec_step = res.get("exec_step")
    recent = detection.frame_times(
        action.job_id, since_step=int(exec_step) + 3 if exec_step is not None else None, last=8
    )
    if not recent:
        return None
    after = statistics.median(recent)
    before = action.params.get("baseline_step_time_s")
    during = res.get("step_time_during_s") or action.params.get("job_step_time_s")
    outcome: dict[str, Any] = {
        "step_time_before_s": before,
        "step_time_during_s": during,
        "step_time_after_s": round(after, 6),
        "measured_over_s": round(elapsed, 3),
        "steps": steps,
        "cost_s": round(max(0.0, elapsed - steps * after), 3),
    }
    if action.params.get("restore"):
        pass  # undoing a rebalance: step times only, no recovery to score
    elif action.params.get("incident_kind") == IncidentKind.HANG:
        outcome["recovered"] = 1.0  # a hung job makes no progress: recovery is stepping again
    elif before and during and during > before * 1.01:
        outcome["recovered"] = round((during - after) / (during - before), 3)
    return outcome
