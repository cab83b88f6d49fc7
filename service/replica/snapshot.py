"""A job's state, serialised: the event-time core's :class:`JobState` (topology, collectives
being joined, open frames, stream positions, watermark) and the detection runtime (detector
windows, baselines, open conditions and their incident ids), taken together under both locks so
that they agree with each other and with the stream position they are tagged with.

Pickle (zlib-compressed), because the state is a graph of numpy arrays and plain objects and
this is the one format that needs no second description of it. Snapshots are read only from the
service's own database, which the service trusts as it trusts its code; a snapshot written by
another version of failslow is not read (the job is rebuilt from the database and what the
stream still holds instead).
"""

from __future__ import annotations

import pickle
import threading
import time
import zlib
from typing import Any

from failslow.service import __version__
from failslow.service.detection.engine import JobRuntime
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.state import JobState

FORMAT = 8  # 2: JobState.clock (stream/clock.py); 3: Topology.budget (stream/topology.py);
# 4: frames keep time per comm kind and work per rank, the peer detector the job's usual work;
# 5: the job history keeps its step noise (detectors/history.py); 6: the join and frames in
# JobState.assembly, and a sharded job's shards (stream/shards); 7: the job history keeps each
# rank's first frames (detectors/chronic.py), the reporter whether a plan is in force; 8: the
# fleet tally keeps hosts' passive link readings (detectors/fleet_links.py)
_RUNTIME_SKIP = ("lock", "shape", "shape_version")  # rebuilt on the next pass


class Incompatible(ValueError):
    """The snapshot was written by another version (or is damaged)."""


def dumps(state: JobState, rt: JobRuntime | None) -> bytes:
    """Call with ``rt.lock`` (if any) and ``state.lock`` held. Uncommitted counters are not
    part of a snapshot: take them first (they go to the database in the same transaction)."""
    s = {k: v for k, v in state.__dict__.items() if k != "lock"}
    r = None
    if rt is not None:
        r = {k: getattr(rt, k) for k in JobRuntime.__dataclass_fields__ if k not in _RUNTIME_SKIP}
    body = {"format": FORMAT, "version": __version__, "state": s, "runtime": r}
    return zlib.compress(pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL), 1)


def loads(blob: bytes, settings: StateSettings) -> tuple[JobState, JobRuntime | None]:
    try:
        body = pickle.loads(zlib.decompress(blob))  # noqa: S301 - our own database, see above
    except Exception as exc:  # noqa: BLE001 - any damage means: not usable
        raise Incompatible(f"unreadable snapshot ({type(exc).__name__})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise Incompatible("snapshot format differs")
    if body.get("version") != __version__:
        raise Incompatible(f"snapshot of failslow {body.get('version')}, this is {__version__}")
    state = JobState.__new__(JobState)
    state.__dict__.update(body["state"])
    state.lock = threading.RLock()
    state.settings = settings
    state.last_wall = time.monotonic()
    state.clock.rebase(state.last_wall)  # its host times were another process's monotonic clock
    state.deltas = {}
    state.dirty_streams = set()
    state.new_registrations = {}
    state.topology.dirty_ranks = set()
    state.topology.dirty_comms = set()
    state.committing = 0
    state.persisted = True
    state.unsaved = False  # what it holds is this snapshot
    state.__dict__.setdefault("closed_through", {})  # a snapshot from before they were kept
    state.__dict__.setdefault("closed_again", 0)
    rt = None
    r: dict[str, Any] | None = body["runtime"]
    if r is not None:
        rt = JobRuntime(pipeline=r.pop("pipeline"), history=r.pop("history"))
        for k, v in r.items():
            setattr(rt, k, v)
    return state, rt
