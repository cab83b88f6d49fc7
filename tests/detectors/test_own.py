"""A rank against its own history (``detectors/own.py``)."""

from __future__ import annotations

import numpy as np

from failslow.detectors.own import judge


def _judge(**kw: object):  # type: ignore[no-untyped-def]
    n = 3
    args = dict(
        suspect=np.zeros(n, bool), strong=np.zeros(n, bool), elevated=np.ones(n, bool),
        is_open=np.zeros(n, bool), compute_ratio=1.05, static_ratio=1.5,
    )  # fmt: skip
    args.update(kw)
    return judge(np.array([1.08, 1.08, 1.08]), np.array([1.0, 1.06, 1.0]), **args)  # type: ignore[arg-type]


def test_a_change_that_stands_out_is_suspect_on_the_relaxed_lateness() -> None:
    """Issue 16: a 1.1x GPU in 5% noise keeps its peers waiting 1-4% of a step, under the 2%
    bar in half the frames. Rank 0 changed (1.08 against its normal 1.0) and stands out of the
    noise: suspect. Rank 1 is as slow but always was (1.06): drift, not suspect. Rank 2 changed
    but is inside the job's noise: not suspect."""
    v = _judge(standout=np.array([True, True, False]))
    assert v.suspect.tolist() == [True, False, False]
    assert not _judge().suspect.any()  # without the noise verdict, the peers' suspect decides


def test_an_open_incident_resolves_once_its_rank_is_back_inside_the_noise() -> None:
    """Open, not late any more (a rebalance hides it): rank 0 is still 8% slower than its
    normal beyond the noise (stays); rank 1 is back near its normal; rank 2 is 8% slower but
    inside a noise of tens of percent (a small pipeline whose ranks mostly wait): it resolves."""
    v = _judge(is_open=np.ones(3, bool), elevated=np.zeros(3, bool),
               beyond_noise=np.array([True, True, False]))  # fmt: skip
    assert v.elevated.tolist() == [True, False, False]
