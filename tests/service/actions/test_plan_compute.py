"""Plan arithmetic: micro-batch shares and ring orders."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.service.plans.compute import (
    avoid_edges,
    group_host,
    makespan,
    nic_crossings,
    rebalance_shares,
    ring_edges,
    separate_pair,
)


@given(
    speeds=st.lists(st.floats(0.1, 3.0), min_size=1, max_size=12),
    extra=st.integers(0, 60),
)
@settings(max_examples=200, deadline=None)
def test_shares_are_integers_at_least_one_summing_to_the_batch(speeds, extra):
    total = len(speeds) + extra
    shares = rebalance_shares(speeds, total)
    assert sum(shares) == total
    assert min(shares) >= 1
    assert all(isinstance(s, int) for s in shares)


@given(
    speeds=st.lists(st.sampled_from([0.5, 2 / 3, 1.0, 1.25]), min_size=2, max_size=5),
    extra=st.integers(0, 8),
)
@settings(max_examples=100, deadline=None)
def test_shares_minimise_the_makespan_exhaustively(speeds, extra):
    total = len(speeds) + extra
    best = min(
        makespan(c, speeds)
        for c in itertools.product(range(1, total + 1), repeat=len(speeds))
        if sum(c) == total
    )
    assert makespan(rebalance_shares(speeds, total), speeds) == pytest.approx(best)


def test_a_slow_rank_gets_fewer_micro_batches_roughly_in_proportion():
    shares = rebalance_shares([1, 1, 1, 1, 1, 1, 1, 1 / 1.5], 64)
    assert shares[-1] < min(shares[:-1])
    assert shares[-1] == pytest.approx(64 * (1 / 1.5) / (7 + 1 / 1.5), abs=1)
    assert rebalance_shares([1.0] * 4, 16) == [4, 4, 4, 4]


def test_shares_refuse_impossible_requests():
    with pytest.raises(ValueError, match="smaller than"):
        rebalance_shares([1, 1, 1], 2)
    with pytest.raises(ValueError, match="> 0"):
        rebalance_shares([1, 0], 4)
    with pytest.raises(ValueError, match="no data-parallel"):
        rebalance_shares([], 4)


HOST2 = {i: f"h{i // 2}" for i in range(32)}  # two ranks per host


def test_separate_pair_moves_the_pair_apart_and_keeps_hosts_contiguous():
    order = list(range(16))  # hosts h0..h7 in a ring
    new = separate_pair(order, HOST2, ("h2", "h3"))
    assert new is not None and sorted(new) == order
    edges = {frozenset(e) for e in ring_edges(new, HOST2)}
    assert frozenset(("h2", "h3")) not in edges
    assert len(ring_edges(new, HOST2)) == len(ring_edges(order, HOST2))  # no extra hops


def test_separate_pair_when_nothing_to_do_or_impossible():
    order = list(range(16))
    assert separate_pair(order, HOST2, ("h0", "h4")) is None  # not neighbours already
    assert separate_pair(list(range(6)), HOST2, ("h0", "h1")) is None  # 3 hosts: all adjacent


@given(n_hosts=st.integers(5, 12), seed=st.integers(0, 1000))
@settings(max_examples=60, deadline=None)
def test_avoid_edges_avoids_every_candidate_of_a_ring(n_hosts, seed):
    import random

    rng = random.Random(seed)
    hosts = list(range(n_hosts))
    rng.shuffle(hosts)
    order = [2 * h + k for h in hosts for k in (0, 1)]
    candidates = ring_edges(order, HOST2)  # every hop of the ring is a suspect
    new = avoid_edges(order, HOST2, candidates)
    assert new is not None and sorted(new) == sorted(order)
    bad = {frozenset(e) for e in candidates}
    assert not any(frozenset(e) in bad for e in ring_edges(new, HOST2))


def test_group_host_reduces_nic_crossings():
    order = [0, 2, 1, 3, 4, 5]  # h0's ranks 0 and 1 are split: 4 hops through h0's NIC
    assert nic_crossings(order, HOST2, "h0") == 4
    new = group_host(order, HOST2, "h0")
    assert new is not None and nic_crossings(new, HOST2, "h0") == 2
    assert group_host(list(range(6)), HOST2, "h0") is None
