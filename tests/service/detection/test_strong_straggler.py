"""A rank 10x slower than its peers for 90 steps is one slow GPU for all of them.

Its peers wait for it in their collectives for ~87% of every step, so their communication fills
their steps: their compute looked unobservable, the job turned "blind" after ~35 frames (judged
on lateness against a pool that had learnt the straggler's own), the incident resolved while
the rank was still 10x slow, a ``job_slowdown`` opened ("no GPU, node or link is to blame") and
the ``slow_gpu`` opened again 13 steps later. A frame in which the job waits half a step for a
late rank is now no sample of how its compute and communication overlap
(``detectors/blind.py``, ``WAITED``). It opened after 3 steps, not 2: its peers' compute
unknown, its own ratio to them was too, and only a known ratio made it a strong suspect."""

from __future__ import annotations

import pytest

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.model import Noise
from tests.simrun import run

L16 = Layout(tp=2, pp=2, dp=4, gpus_per_host=4)


@pytest.mark.parametrize("factor", [5.0, 10.0])
def test_a_strong_straggler_stays_one_open_slow_gpu(factor: float) -> None:
    sc = Scenario(job="strong", layout=L16, steps=150, seed=1, hang_tail_s=20.0,
                  noise=Noise(hiccup_prob=0.01),
                  faults=(Fault("slow_gpu", 60, factor=factor, ranks=(4,)),))  # fmt: skip
    r = run(sc)
    changes = [(f.status.value, f.kind.value, rank) for rank, f in r.findings
               if f.status.value in ("opened", "resolved")]  # fmt: skip
    assert changes == [("opened", "slow_gpu", 4)], changes
    # within two steps: its compute is unknown once its peers wait ~87% of their steps, but it
    # waits least itself (a slow GPU, not a slow link) and opens as a strong suspect does
    (opened,) = [f for _, f in r.opened()]
    assert opened.detected_index is not None and opened.detected_index - 60 <= 2, opened
