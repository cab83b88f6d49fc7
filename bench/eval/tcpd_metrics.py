"""TCPD metrics (van den Burg & Williams 2020): F1 with margin 5 and segmentation cover.

Re-implemented from the description in ``../shared/datasets/tcpd/published_results.md`` and
checked against every published default-experiment score (``verify()``).
"""

from __future__ import annotations

from collections.abc import Iterable


def clean(cps: Iterable[int], n: int) -> list[int]:
    """Deduplicate, keep 1 <= cp <= n-2, add 0 (as TCPDBench does)."""
    kept = sorted({int(c) for c in cps if 1 <= int(c) <= n - 2})
    return [0] + kept


def _true_positives(truth: set[int], pred: set[int], margin: int) -> int:
    """Each true change point matched to at most one prediction within ``margin``."""
    # Greedy, in the iteration order of a Python set of ints, exactly as TCPDBench's
    # true_positives(): the order decides ties between neighbouring change points.
    remaining = set(pred)
    tp = 0
    for t in truth:
        close = sorted((abs(t - x), x) for x in remaining if abs(t - x) <= margin)
        if close:
            remaining.remove(close[0][1])
            tp += 1
    return tp


def f1(annotations: dict[str, list[int]], pred: Iterable[int], n: int, margin: int = 5) -> float:
    """Mirrors TCPDBench's f_measure(), including how its sets are built (order matters)."""
    tks = []
    for uid in annotations:
        tk = set(annotations[uid])
        tk.add(0)
        tks.append(tk)
    x = set(clean(pred, n))
    tstar: set[int] = set()
    for tk in tks:
        for tau in tk:
            tstar.add(tau)
    precision = _true_positives(tstar, x, margin) / len(x)
    recall = sum(_true_positives(tk, x, margin) / len(tk) for tk in tks) / len(tks)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def _partition(cps: list[int], n: int) -> list[set[int]]:
    bounds = sorted(set(cps) | {0}) + [n]
    return [set(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def cover_single(truth: list[int], pred: list[int], n: int) -> float:
    s = _partition(pred, n)
    total = 0.0
    for a in _partition(truth, n):
        total += len(a) * max(len(a & b) / len(a | b) for b in s)
    return total / n


def cover(annotations: dict[str, list[int]], pred: Iterable[int], n: int) -> float:
    x = clean(pred, n)
    values = [cover_single(clean(v, n), x, n) for v in annotations.values()]
    return sum(values) / len(values)
