"""Pure plan arithmetic: micro-batch shares from measured speeds, and ring orders that avoid links.

Nothing here touches the database or the clock; the policy calls these to predict what an action
would gain before proposing it, and the plans domain calls them to build the published plan.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence


def rebalance_shares(speeds: Sequence[float], total: int) -> list[int]:
    """Integer micro-batch shares, at least one each, summing to ``total``, that minimise the
    slowest data-parallel rank's time ``share / speed`` (the step's makespan).

    Greedy on the makespan: every rank starts with one micro-batch and each further micro-batch
    goes to the rank that would finish it earliest. For identical machines this is exactly
    proportional to speed up to rounding, and it is optimal for the makespan of a sum of equal
    units on uniformly related machines.
    """
    n = len(speeds)
    if n == 0:
        raise ValueError("no data-parallel ranks")
    if total < n:
        raise ValueError(f"global batch {total} is smaller than the {n} data-parallel ranks")
    if any(not s > 0 for s in speeds):
        raise ValueError("speeds must be > 0")
    shares = [1] * n
    heap = [((1 + 1) / s, i) for i, s in enumerate(speeds)]
    heapq.heapify(heap)
    for _ in range(total - n):
        _, i = heapq.heappop(heap)
        shares[i] += 1
        heapq.heappush(heap, ((shares[i] + 1) / speeds[i], i))
    return shares


def makespan(shares: Sequence[int], speeds: Sequence[float]) -> float:
    """Time of the slowest data-parallel rank, in units of one micro-batch at speed 1."""
    return max(s / v for s, v in zip(shares, speeds, strict=True))


def host_blocks(order: Sequence[int], host_of: Mapping[int, str]) -> list[tuple[str, list[int]]]:
    """Members grouped by host, hosts in order of first appearance, members in their order."""
    blocks: dict[str, list[int]] = {}
    for r in order:
        blocks.setdefault(host_of.get(r, f"?{r}"), []).append(r)
    return list(blocks.items())


def ring_edges(order: Sequence[int], host_of: Mapping[int, str]) -> list[tuple[str, str]]:
    """The cross-host hops of a ring in this order (each hop once, as an ordered pair)."""
    n = len(order)
    if n < 2:
        return []
    out = []
    for i in range(n):
        a, b = host_of.get(order[i]), host_of.get(order[(i + 1) % n])
        if a != b and a is not None and b is not None:
            out.append((a, b))
    return out


def pair_adjacent(order: Sequence[int], host_of: Mapping[int, str], pair: tuple[str, str]) -> bool:
    return any({a, b} == set(pair) for a, b in ring_edges(order, host_of))


def avoid_edges(
    order: Sequence[int],
    host_of: Mapping[int, str],
    edges: Iterable[tuple[str, str]],
    *,
    budget: int = 50_000,
) -> list[int] | None:
    """A ring order that crosses none of ``edges`` (host pairs), or None when the ring crosses
    none of them already, or no such order is found.

    Members stay grouped per host, so the ring crosses as many host boundaries as before; the
    host order is searched depth-first (at most ``budget`` steps), preferring the original
    order, so that the new ring changes as little as possible. With the true slow link unknown
    among several candidates (a passive measurement of one ring cannot tell its hops apart), all
    of them are avoided: for five or more hosts such a ring always exists.
    """
    bad = {frozenset(e) for e in edges if len(set(e)) == 2}
    if not bad or not any(frozenset(e) in bad for e in ring_edges(order, host_of)):
        return None
    blocks = host_blocks(order, host_of)
    names = [h for h, _ in blocks]
    m = len(names)
    if m < 3:
        return None
    rank = {h: i for i, h in enumerate(names)}
    path = [names[0]]
    used = {names[0]}
    steps = 0

    def ok(a: str, b: str) -> bool:
        return frozenset((a, b)) not in bad

    def dfs() -> bool:
        nonlocal steps
        steps += 1
        if steps > budget:
            return False
        if len(path) == m:
            return ok(path[-1], path[0])
        last = path[-1]
        # prefer hosts close after ``last`` in the original order: small changes first
        for h in sorted(
            (h for h in names if h not in used), key=lambda h: (rank[h] - rank[last]) % m
        ):
            if ok(last, h):
                path.append(h)
                used.add(h)
                if dfs():
                    return True
                path.pop()
                used.discard(h)
        return False

    if not dfs():
        return None
    members = dict(blocks)
    return [r for h in path for r in members[h]]


def separate_pair(
    order: Sequence[int], host_of: Mapping[int, str], pair: tuple[str, str]
) -> list[int] | None:
    """A ring order in which the two hosts are never neighbours (None: already so, or
    impossible, as in a ring of fewer than four hosts)."""
    return avoid_edges(order, host_of, [pair])


def nic_crossings(order: Sequence[int], host_of: Mapping[int, str], host: str) -> int:
    """How many ring hops go through ``host``'s network interface."""
    return sum(1 for a, b in ring_edges(order, host_of) if host in (a, b))


def group_host(order: Sequence[int], host_of: Mapping[int, str], host: str) -> list[int] | None:
    """A ring order in which ``host``'s members are contiguous, so the ring crosses its NIC only
    twice (in and out); None when that is already so (nothing to gain)."""
    if nic_crossings(order, host_of, host) <= 2:
        return None
    blocks = host_blocks(order, host_of)
    out = [r for _, rs in blocks for r in rs]
    return out if nic_crossings(out, host_of, host) < nic_crossings(order, host_of, host) else None
