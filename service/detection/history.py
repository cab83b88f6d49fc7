"""Downsampling of per-frame signals into per-job history rows and per-rank history columns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.detectors.straggler import FrameScores
from failslow.detectors.types import Frame
from failslow.service.jobs.history import FIELDS, RankColumns, bucket_row


@dataclass(slots=True)
class HistoryAccumulator:
    """Sums per rank slot over one bucket of ``every`` frames; emits rows when it rolls over."""

    job: str
    every: int
    bucket: int | None = None
    frames: int = 0
    end_ns: int = 0
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)

    def add(
        self, frame: Frame, scores: FrameScores, slot_rank: list[int], baseline: float | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        bucket = frame.index // self.every
        out: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
        if self.bucket is not None and bucket != self.bucket:
            out = self.rows(slot_rank, baseline)
        if self.bucket != bucket:
            self.bucket, self.frames, self.sums, self.counts, self.step_times = (
                bucket,
                0,
                {},
                {},
                [],
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.where(np.isfinite(scores.compute_ratio), 1.0 / scores.compute_ratio, np.nan)
        values = {
            "step_time_s": frame.step_time,
            "compute_s": scores.compute,
            "comm_s": np.where(np.isfinite(scores.late), frame.comm_time, np.nan),
            "lateness_s": scores.late,
            "score": score,
        }
        for name, arr in values.items():
            s = self.sums.get(name)
            if s is None or s.size < arr.size:
                grown = np.zeros(arr.size)
                cnt = np.zeros(arr.size)
                if s is not None:
                    grown[: s.size] = s
                    cnt[: s.size] = self.counts[name]
                self.sums[name], self.counts[name] = grown, cnt
            ok = np.isfinite(arr)
            self.sums[name][: arr.size][ok] += arr[ok]
            self.counts[name][: arr.size][ok] += 1
        self.frames += 1
        self.end_ns = max(self.end_ns, frame.end_ns)
        if np.isfinite(scores.frame_time):
            self.step_times.append(scores.frame_time)
        return out

    def rows(
        self, slot_rank: list[int], baseline: float | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if self.bucket is None or self.frames == 0:
            return [], []
        bucket = self.bucket * self.every
        job_rows: list[dict[str, Any]] = []
        med = float(np.median(self.step_times)) if self.step_times else None
        job_rows.append(
            {
                "job_id": self.job,
                "bucket": bucket,
                "steps": self.frames,
                "end_ns": self.end_ns,
                "step_time_s": med,
                "step_time_max_s": float(np.max(self.step_times)) if self.step_times else None,
                "slowdown": (med / baseline) if med and baseline else None,
            }
        )
        n = min(len(slot_rank), max((a.size for a in self.sums.values()), default=0))
        present = self.counts.get("lateness_s", np.zeros(0))[:n]
        seen = np.flatnonzero(present > 0)  # slots seen in the bucket
        values = {}
        for name in FIELDS:
            s, c = self.sums.get(name), self.counts.get(name)
            mean = np.full(seen.size, np.nan)
            if s is not None and c is not None:
                inside = seen[seen < s.size]
                with np.errstate(divide="ignore", invalid="ignore"):
                    mean[: inside.size] = np.where(c[inside] > 0, s[inside] / c[inside], np.nan)
            values[name] = mean
        cols = RankColumns(
            np.asarray(slot_rank, np.int64)[seen], present[seen].astype(np.int64), values
        )
        return job_rows, [bucket_row(self.job, bucket, self.end_ns, cols)] if len(cols) else []
