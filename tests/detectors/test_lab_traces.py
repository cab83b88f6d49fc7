"""Real traces of the fault lab replayed through ingest and detection (hang check after every
envelope, which is stricter than the service's passes every 0.25 s).

A rank 5-7x slower than its peers keeps them waiting in their collectives for longer than the
2 s hang timeout; the previous hang detector called that a hang (a false incident in CI). These
traces pin the distinction: the straggler is a ``slow_gpu`` and never a hang, the stopped rank is
a hang rooted at it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.simrun import run

DATA = Path(__file__).parent.parent / "data" / "lab"


@dataclass
class Trace:
    job: str
    path: Path

    def envelopes(self) -> Iterator[dict[str, Any]]:
        with gzip.open(self.path, "rt") as f:
            for line in f:
                yield json.loads(line)


def replay(name: str) -> Any:
    return run(Trace("lab", DATA / name))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["compute-20pct.jsonl.gz", "compute-15pct.jsonl.gz"])
def test_a_cpu_starved_rank_is_a_slow_gpu_never_a_hang(name: str) -> None:
    r = replay(name)
    opened = [(rank, f.kind) for rank, f in r.opened(None)]
    assert (1, "slow_gpu") in opened, opened
    assert not [f for _, f in r.findings if f.kind == "hang"], opened
    assert {k for _, k in opened} <= {"slow_gpu", "job_slowdown"}, opened


def test_a_stopped_rank_is_a_hang_rooted_at_it() -> None:
    r = replay("hang-sigstop.jsonl.gz")
    hangs = [f for _, f in r.opened("hang")]
    assert len(hangs) == 1, hangs
    (hang,) = hangs
    assert [r.state.topology.slot_rank[s] for s in hang.slots] == [1], hang
    assert not [f for _, f in r.opened(None) if f.kind in ("slow_gpu", "slow_node", "slow_link")]
