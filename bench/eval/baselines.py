"""What people use today, run on the same per-step data as failslow.

* ``prometheus_rule``: an alert rule "step time > 1.2x its trailing median for 3 steps" (no
  localisation).
* ``nvidia_straggler``: nvidia-resiliency-ext's straggler detector as described in its docs:
  per rank, the compute-section time averaged over a report window; a *relative* score
  (median rank time / this rank's time) and an *individual* score (this rank's best past window /
  current window); a rank is a straggler when either score is below 0.75. Localises ranks.
* ``falcon_trigger``: FALCON's trigger, a change of more than 10% in job iteration time between
  the last 10 iterations and the 30 before, alarms at least 10 iterations apart (no
  localisation; FALCON then probes links, which is out of scope here).

Each returns alarms as ``(step, ranks)``; ranks are empty for baselines that cannot localise.
Also :func:`cusum_delay_bound`: the delay of an optimal sequential test (Lorden's bound).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StepTable:
    """Per step: job step time; per (rank, step): compute time (step minus time in collectives)."""

    step_time: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    step_dur: dict[tuple[int, int], float] = field(default_factory=dict)
    starts: dict[int, list[tuple[int, int, int]]] = field(default_factory=lambda: defaultdict(list))
    comm: dict[int, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))

    def add(self, env: dict[str, Any]) -> None:
        for s in env.get("steps") or []:
            d = (s["end_ns"] - s["start_ns"]) / 1e9
            self.step_dur[(s["rank"], s["step"])] = d
            self.step_time[s["step"]].append(d)
            self.starts[s["rank"]].append((s["start_ns"], s["end_ns"], s["step"]))
        per_rank: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for c in env.get("collectives") or []:
            if c["end_ns"] is not None:
                per_rank[c["rank"]].append((c["start_ns"], c["end_ns"] - c["start_ns"]))
        for rank, rows in per_rank.items():
            self.comm[rank].append(np.array(rows, dtype=np.int64))

    def job_series(self) -> tuple[np.ndarray, np.ndarray]:
        steps = np.array(sorted(self.step_time))
        return steps, np.array([float(np.median(self.step_time[s])) for s in steps])

    def compute_matrix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ranks, steps, compute[rank, step]) with NaN where unknown."""
        ranks = np.array(sorted(self.starts))
        steps, _ = self.job_series()
        col = {int(s): i for i, s in enumerate(steps)}
        out = np.full((ranks.size, steps.size), np.nan)
        for i, r in enumerate(ranks):
            iv = sorted(self.starts[int(r)])
            los = np.array([a for a, _, _ in iv], dtype=np.int64)
            his = np.array([b for _, b, _ in iv], dtype=np.int64)
            cols = np.array([col[k] for _, _, k in iv])
            comm = np.zeros(steps.size)
            if self.comm.get(int(r)):
                rows = np.concatenate(self.comm[int(r)])
                j = np.searchsorted(los, rows[:, 0], side="right") - 1
                ok = (j >= 0) & (rows[:, 0] < his[np.clip(j, 0, None)])
                np.add.at(comm, cols[j[ok]], rows[ok, 1] / 1e9)
            for (_, _, k), c in zip(iv, cols, strict=True):
                d = self.step_dur[(int(r), k)]
                out[i, c] = max(d - comm[c], 0.0)
        return ranks, steps, out


def prometheus_rule(
    steps: np.ndarray, times: np.ndarray, *, ratio: float = 1.2, hold: int = 3, trailing: int = 20
) -> list[tuple[int, tuple[int, ...]]]:
    alarms: list[tuple[int, tuple[int, ...]]] = []
    run = 0
    for i in range(trailing, times.size):
        med = float(np.median(times[i - trailing : i]))
        run = run + 1 if times[i] > ratio * med else 0
        if run == hold:
            alarms.append((int(steps[i]), ()))
    return alarms


def nvidia_straggler(
    ranks: np.ndarray,
    steps: np.ndarray,
    compute: np.ndarray,
    *,
    window: int = 5,
    threshold: float = 0.75,
) -> list[tuple[int, tuple[int, ...]]]:
    alarms: list[tuple[int, tuple[int, ...]]] = []
    best = np.full(ranks.size, np.inf)
    for end in range(window, steps.size + 1, window):
        w = compute[:, end - window : end]
        with np.errstate(all="ignore"):
            mean = np.nanmean(w, axis=1)
            relative = np.nanmedian(mean) / mean
            individual = best / mean
        flagged = (relative < threshold) | (individual < threshold)
        flagged &= np.isfinite(mean) & (mean > 0)
        if flagged.any():
            alarms.append((int(steps[end - 1]), tuple(int(r) for r in ranks[flagged])))
        best = np.fmin(best, np.where(np.isfinite(mean) & (mean > 0), mean, np.inf))
    return alarms


def falcon_trigger(
    steps: np.ndarray,
    times: np.ndarray,
    *,
    shift: float = 0.10,
    recent: int = 10,
    before: int = 30,
    gap: int = 10,
) -> list[tuple[int, tuple[int, ...]]]:
    alarms: list[tuple[int, tuple[int, ...]]] = []
    last = -(10**9)
    for i in range(recent + before, times.size + 1):
        a = float(np.mean(times[i - recent - before : i - recent]))
        b = float(np.mean(times[i - recent : i]))
        if abs(b - a) > shift * a and i - last >= gap:
            alarms.append((int(steps[i - 1]), ()))
            last = i
    return alarms


def cusum_delay_bound(shift: float, sigma: float, arl: float) -> float:
    """Lorden (1971): an optimal sequential test for a mean shift ``shift`` in Gaussian noise
    ``sigma`` with in-control average run length ``arl`` needs about ``log(arl) / I`` samples,
    ``I = shift^2 / (2 sigma^2)`` the Kullback-Leibler information per sample."""
    if sigma <= 0 or shift <= 0 or arl <= 1:
        return float("nan")
    info = shift**2 / (2 * sigma**2)
    return math.log(arl) / info
