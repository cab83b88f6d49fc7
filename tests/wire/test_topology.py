"""Host topologies: member lists and ranges, their canonical form and the digest."""

from __future__ import annotations

import pytest

from failslow.wire import topology
from failslow.wire.topology import BadMembers, compact, members

RANKS = [{"rank": 3, "gpu": 3, "world_size": 64}, {"rank": 1, "gpu": 1, "world_size": 64}]


def test_progressions_become_ranges_and_back() -> None:
    dp = list(range(3, 64, 8))
    assert compact(dp) == {"start": 3, "stop": 60, "step": 8}
    assert members(compact(dp)) == tuple(dp)
    assert compact([0, 1, 2]) == [0, 1, 2]  # shorter than RANGE_MIN: a list
    assert compact([0, 2, 3, 5]) == [0, 2, 3, 5] and compact([5, 4, 3, 2]) == [5, 4, 3, 2]
    assert compact({"start": 3, "stop": 64, "step": 8}) == compact(dp)  # one canonical stop
    assert compact({"start": 0, "stop": 3}) == [0, 1, 2]


def test_the_digest_does_not_depend_on_the_form() -> None:
    as_list = [{"comm": "dp-0", "kind": "dp", "ranks": list(range(1, 64, 2))}]
    as_range = [{"comm": "dp-0", "kind": "dp", "ranks": {"start": 1, "stop": 64, "step": 2}}]
    assert topology.digest(RANKS, as_list) == topology.digest(list(reversed(RANKS)), as_range)
    other = [{"comm": "dp-0", "kind": "dp", "ranks": {"start": 1, "stop": 66, "step": 2}}]
    assert topology.digest(RANKS, other) != topology.digest(RANKS, as_range)


@pytest.mark.parametrize(
    "spec",
    [
        [],
        [1, 1],
        [-1, 2],
        [1, True],
        "0-7",
        {"start": 0, "stop": 0},
        {"start": -1, "stop": 4},
        {"start": 0, "stop": 4, "step": 0},
        {"start": 0, "stop": 4.0},
        {"start": 0, "stop": 4, "by": 1},
        {"start": 0, "stop": 1 << 30},
        {"start": 0, "stop": 2**63, "step": 2**40},  # len(range) overflowed: a 500, not a 422
        {"start": 2**63 - 8, "stop": 2**64 - 1, "step": 2**62},
        {"start": 2**31, "stop": 2**31 + 4},
        [0, 2**31],
    ],
)
def test_bad_member_specs(spec: object) -> None:
    with pytest.raises(BadMembers):
        members(spec)
