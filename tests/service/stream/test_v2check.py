"""The v2 record rules: the compiled pass and the numpy form give the same reason per record, on
random envelopes that break every rule (and on empty tables)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.service.stream import kernels, v2check
from failslow.service.stream.records import Reject
from failslow.wire.v2 import NO_END, NO_PEER, OPS

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed")

SEND = OPS.index(next(op for op in OPS if op.value == "send"))


def tables(rng: np.random.Generator, n_ranks: int, n_codes: int) -> dict[str, np.ndarray]:
    ranks = np.sort(rng.choice(64, n_ranks, replace=False)).astype(np.int64)
    position = rng.integers(-1, 4, (n_codes, n_ranks)).astype(np.int64)
    shape = (n_codes, n_ranks)
    other = np.where(rng.random(shape) < 0.5, NO_PEER, rng.integers(0, 64, shape))
    return {
        "ranks": ranks,
        "slots": rng.integers(0, 16, n_ranks).astype(np.int64),
        "position": position,
        "other": other.astype(np.int64),
        "slot_host": rng.integers(-1, 3, 16).astype(np.int64),
    }


def columns(rng: np.random.Generator, n: int, t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    pick = t["ranks"] if t["ranks"].size else np.array([0])
    rank = np.where(rng.random(n) < 0.9, rng.choice(pick, n), rng.integers(0, 64, n))
    start = rng.integers(-2, 100, n)
    return {
        "rank": rank.astype("<i4"),
        "comm": rng.integers(0, t["position"].shape[0] + 2, n).astype("<u4"),
        "seq": rng.integers(-1, 5, n).astype("<i8"),
        "op": rng.integers(0, len(OPS) + 2, n).astype("u1"),
        "bytes": rng.integers(-1, 10, n).astype("<i8"),
        "start_ns": start.astype("<i8"),
        "end_ns": np.where(rng.random(n) < 0.2, NO_END, start + rng.integers(-3, 50, n)).astype(
            "<i8"
        ),
        "peer": np.where(rng.random(n) < 0.5, NO_PEER, rng.integers(0, 64, n)).astype("<i4"),
    }


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_ranks=st.integers(0, 8), n_codes=st.integers(0, 6),
       n=st.integers(0, 300), host=st.integers(-1, 2))  # fmt: skip
def test_compiled_and_numpy_agree(seed: int, n_ranks: int, n_codes: int, n: int, host: int) -> None:
    rng = np.random.default_rng(seed)
    t = tables(rng, n_ranks, n_codes)
    c = columns(rng, n, t)
    args = (c, t["ranks"], t["slots"], t["position"], t["other"], t["slot_host"], host)
    a = v2check.reasons_numpy(*args)
    b = v2check.reasons_compiled(*args)
    np.testing.assert_array_equal(a[0], b[0])
    ok = a[0] == 0  # code, slot and position matter where the record is valid
    for x, y in zip(a[1:], b[1:], strict=True):
        np.testing.assert_array_equal(x[ok], y[ok])
    s = {"rank": c["rank"], "step": c["seq"], "start_ns": c["start_ns"], "end_ns": c["end_ns"]}
    sa = v2check.step_reasons_numpy(s, t["ranks"], t["slots"], t["slot_host"], host)
    sb = v2check.step_reasons_compiled(s, t["ranks"], t["slots"], t["slot_host"], host)
    np.testing.assert_array_equal(sa[0], sb[0])
    np.testing.assert_array_equal(sa[1][sa[0] == 0], sb[1][sb[0] == 0])


def test_each_rule_has_its_code() -> None:
    t = {
        "ranks": np.array([4, 5], np.int64),
        "slots": np.array([0, 1], np.int64),
        "position": np.array([[0, 1], [0, -1]], np.int64),  # code 1: rank 5 is not a member
        "other": np.array([[5, 4], [NO_PEER, NO_PEER]], np.int64),
        "slot_host": np.array([0, 1], np.int64),  # rank 5 (slot 1) moved to host 1
    }
    base = {"rank": 4, "comm": 0, "seq": 0, "op": 0, "bytes": 8, "start_ns": 10, "end_ns": 20,
            "peer": NO_PEER}  # fmt: skip
    cases = [
        ({}, 0),
        ({"rank": 9}, 1),
        ({"comm": 7}, 2),
        ({"rank": 5}, 3),
        ({"comm": 1, "rank": 4}, 0),
        ({"seq": -1}, 5),
        ({"op": 250}, 6),
        ({"bytes": -1}, 7),
        ({"start_ns": -1, "end_ns": NO_END}, 8),
        ({"end_ns": 5}, 9),
        ({"op": SEND, "peer": 5}, 0),
        ({"op": SEND, "peer": 6}, 10),
        ({"peer": 5}, 10),
    ]
    dtypes = {"rank": "<i4", "comm": "<u4", "op": "u1", "peer": "<i4"}
    c = {k: np.array([(base | d)[k] for d, _ in cases], dtypes.get(k, "<i8")) for k in base}
    for fn in (v2check.reasons_numpy, v2check.reasons_compiled):
        got = fn(c, t["ranks"], t["slots"], t["position"], t["other"], t["slot_host"], 0)[0]
        assert got.tolist() == [want for _, want in cases]
    assert v2check.RULES[2][0] == Reject.WRONG_HOST and v2check.RULES[3][0] == Reject.NOT_MEMBER
