"""Active link probes: which host pairs to test, in which rounds, and what the results say.

Passive data cannot separate the links of a ring whose every communicator crosses the same hosts
(the slow hop is in all of them). FALCON splits the ring and tests the parts; here every suspect
pair is tested directly with a pairwise bandwidth test, arranged in rounds in which no host takes
part twice (so tests do not disturb each other), plus a hypercube over the suspect hosts — round
``k`` pairs host ``i`` with host ``i xor 2^k`` — which in ``ceil(log2 n)`` rounds gives every
host ``log2 n`` partners through disjoint paths: a host slow with all its partners is a slow NIC;
one slow pair whose hosts are fine with everyone else is a slow cable (host pair). Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

Pair = tuple[str, str]


def _pair(a: str, b: str) -> Pair:
    return (a, b) if a < b else (b, a)


def hypercube(hosts: list[str]) -> list[list[Pair]]:
    """``ceil(log2 n)`` rounds; in round ``k`` host ``i`` meets host ``i ^ 2^k`` (if it exists)."""
    hosts = sorted(set(hosts))
    n = len(hosts)
    out: list[list[Pair]] = []
    for k in range(math.ceil(math.log2(n)) if n > 1 else 0):
        rnd = [(hosts[i], hosts[i ^ (1 << k)]) for i in range(n) if i < (i ^ (1 << k)) < n]
        if rnd:
            out.append(rnd)
    return out


def plan_rounds(hosts: Iterable[str], suspect_pairs: Iterable[Pair]) -> list[list[Pair]]:
    """Rounds of disjoint pairs covering the hypercube over ``hosts`` and every suspect pair.

    The hypercube's rounds come first (already disjoint); suspect pairs not yet covered are added
    greedily to the first round in which neither host is busy, opening a new round when none
    fits (a ring's edges need at most three)."""
    rounds = hypercube(list(hosts))
    covered = {_pair(a, b) for rnd in rounds for a, b in rnd}
    busy = [{h for pair in rnd for h in pair} for rnd in rounds]
    for a, b in sorted({_pair(a, b) for a, b in suspect_pairs if a != b}):
        if (a, b) in covered:
            continue
        for i, used in enumerate(busy):
            if a not in used and b not in used:
                rounds[i].append((a, b))
                used.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
        covered.add((a, b))
    return rounds


@dataclass(frozen=True, slots=True)
class PairResult:
    a: str
    b: str
    bps: float | None  # the slower direction's bytes per second; None: the test failed
    error: str | None = None


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.1%}" if x >= 0.001 else "<0.1%"


def analyse(results: list[PairResult], *, slow_below: float = 0.5) -> dict[str, object]:
    """The slow component the probes point to.

    Reference: the 75th percentile of the measured pairs (the fast ones: a slow NIC is in at
    most ``log2 n + 2`` of them). A pair is slow below ``slow_below`` x reference. A host whose
    every measured pair (two or more) is slow while some other pair is fast is a slow NIC; slow
    pairs not explained by such a host are slow links. ``component``: ``host:<h>``, or
    ``link:<a>|<b>``, or None (nothing slow, or nothing measured)."""
    ok = [r for r in results if r.bps is not None and r.bps > 0]
    out: dict[str, object] = {
        "pairs": [
            {"a": r.a, "b": r.b, "bps": None if r.bps is None else round(r.bps), "error": r.error}
            for r in results
        ],
        "component": None,
        "hosts": [],
    }
    if len(ok) < 2:
        out["reason"] = f"{len(ok)} pair(s) measured: too few to compare"
        return out
    speeds = sorted(r.bps for r in ok if r.bps is not None)
    ref = speeds[min(len(speeds) - 1, math.ceil(0.75 * (len(speeds) - 1)))]
    # ... and below the widest ratio between neighbouring speeds: with few pairs the reference
    # is the fastest, and probes on busy hosts vary 2-4x (a lab's healthy pairs: 0.5 and 2.2
    # GB/s), while a slow NIC is 100x slower
    cut = speeds[max(range(len(speeds) - 1), key=lambda i: speeds[i + 1] / speeds[i])]
    slow = {
        (r.a, r.b)
        for r in ok
        if r.bps is not None and r.bps < slow_below * ref and r.bps <= cut
    }
    out["reference_bps"] = round(ref)
    for p in out["pairs"]:  # type: ignore[attr-defined]
        p["slow"] = (p["a"], p["b"]) in slow
    if not slow or len(slow) == len(ok):
        out["reason"] = "no pair is slower than the others" if not slow else "every pair is slow"
        return out
    per_host: dict[str, list[bool]] = {}
    for r in ok:
        for h in (r.a, r.b):
            per_host.setdefault(h, []).append((r.a, r.b) in slow)
    nics = sorted(h for h, flags in per_host.items() if len(flags) >= 2 and all(flags))
    cables = sorted(p for p in slow if not (set(p) & set(nics)))
    slowest = min(r.bps for r in ok if (r.a, r.b) in slow and r.bps is not None)
    if len(nics) == 1 and not cables:
        h = nics[0]
        out.update(component=f"host:{h}", hosts=[h])
        out["reason"] = (
            f"every pair through {h} is slow (down to {_share(slowest / ref)} of the fast pairs), "
            "the others are fast: its NIC"
        )
    elif not nics and len(cables) == 1:
        a, b = cables[0]
        out.update(component=f"link:{a}|{b}", hosts=[a, b])
        out["reason"] = (
            f"only {a}<->{b} is slow ({_share(slowest / ref)} of the fast pairs); both hosts are "
            "fast with other partners: the link between them"
        )
    else:
        out["reason"] = f"several components are slow (NICs {nics}, pairs {cables})"
        out["hosts"] = sorted({*nics, *(h for p in cables for h in p)})
    return out
