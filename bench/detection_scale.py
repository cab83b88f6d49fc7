"""Detection CPU time per training step for 1K, 10K and 100K ranks (synthetic, in-process).

A job of TP=8 x PP=4 x DP=N/32 ranks, 8 GPUs per host. Each step has, per tensor-parallel group,
16 all-reduces; per pipeline pair, 8 send/recv; per data-parallel group, one all-reduce; one slow
GPU. What is timed is exactly what a detection pass does after ingest: lateness of every completed
collective, attribution to frames, closing the frame, and every detector (peer lateness, node,
link, job), per step. Building the records (ingest's job) is not timed. Also reported: memory held
per rank.

Steps are timed in steady state, once every detector's history is full (the link detector keeps
200 frames per communicator): runs of a few steps miss the cost of the full windows. With numba
installed the frame builder uses its compiled kernels (``FAILSLOW_JIT=0``: the numpy path).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import save  # noqa: E402
from failslow.detectors.pipeline import JobPipeline  # noqa: E402
from failslow.detectors.types import KIND_INDEX, P2P  # noqa: E402
from failslow.service.settings import StateSettings  # noqa: E402
from failslow.service.stream.frames import FrameBuilder  # noqa: E402
from failslow.service.stream.join import ReadyBatch  # noqa: E402
from failslow.service.stream.records import (  # noqa: E402
    CommAnnouncement,
    RankAnnouncement,
    StepRecord,
)
from failslow.service.stream.shape import job_shape  # noqa: E402
from failslow.service.stream.state import JobState  # noqa: E402

TP, PP, GPUS = 8, 4, 8
STEADY = 210  # frames before every detector history is full
NS = 1_000_000_000


def build(n: int) -> tuple[JobState, dict[str, list[int]]]:
    dp = n // (TP * PP)
    state = JobState("scale", StateSettings(max_ranks=n + 1, max_comms=10 * n, max_open_frames=8))
    topo = state.topology
    for h in range(n // GPUS):
        topo.touch_host(f"h{h:05d}", 0, 0.0)
    for r in range(n):
        topo.announce_rank(f"h{r // GPUS:05d}", RankAnnouncement(r, r % GPUS, n))
    groups: dict[str, list[int]] = {}
    for p in range(PP):
        for d in range(dp):
            groups[f"tp-{p}-{d}"] = [t + TP * (d + dp * p) for t in range(TP)]
        for t in range(TP):
            groups[f"dp-{p}-{t}"] = [t + TP * (d + dp * p) for d in range(dp)]
    for p in range(PP - 1):
        for d in range(dp):
            for t in range(TP):
                groups[f"pp-{p}-{d}-{t}"] = [t + TP * (d + dp * p), t + TP * (d + dp * (p + 1))]
    for name, ranks in groups.items():
        kind = name.split("-")[0]
        topo.announce_comm(CommAnnouncement(name, kind, tuple(ranks)))
    return state, groups


@dataclass
class Layout:
    """The collectives of one step, by member count, fixed across steps (columns)."""

    size: int
    comm: np.ndarray  # (rows,)
    kind: np.ndarray  # (rows,)
    offset: np.ndarray  # (rows,) start within the step, ns
    extra: np.ndarray  # (rows, size) the slow GPU's lateness, ns


def layouts(state: JobState, groups: dict[str, list[int]], slow: int) -> list[Layout]:
    """Per tensor-parallel group 16 all-reduces, per pipeline pair 8 send/recv, per
    data-parallel group one all-reduce; the slow GPU arrives 10 ms late at each TP all-reduce,
    and at the step's data-parallel all-reduce with all of it (16 x 10 ms)."""
    topo = state.topology
    rows: dict[int, list[tuple[int, int, int, np.ndarray]]] = {}
    for name, ranks in groups.items():
        comm = topo.comms[name]
        kind = name.split("-")[0]
        calls = 16 if kind == "tp" else (8 if kind == "pp" else 1)
        n = len(ranks)
        extra = np.zeros(n, dtype=np.int64)
        if slow in comm.position and kind != "pp":
            extra[comm.position[slow]] = 10_000_000 if kind == "tp" else 160_000_000
        for k in range(calls):
            offset = int((k + 1) * NS * 0.9 / (calls + 1))
            kind_col = P2P if kind == "pp" else KIND_INDEX[kind]
            rows.setdefault(n, []).append((comm.index, kind_col, offset, extra))
    return [
        Layout(
            n,
            np.array([r[0] for r in rs], dtype=np.int64),
            np.array([r[1] for r in rs], dtype=np.int64),
            np.array([r[2] for r in rs], dtype=np.int64),
            np.stack([r[3] for r in rs]),
        )
        for n, rs in rows.items()
    ]


def one_step(layout: list[Layout], step: int, rng: np.random.Generator) -> list[ReadyBatch]:
    """Completed collectives of one step (1 s), as the assembler hands them over (columns):
    members arrive up to 0.2 ms apart, the collective ends 0.1 ms after the last one."""
    t0 = step * NS
    batches = []
    for lay in layout:
        starts = rng.integers(0, 200_000, (lay.offset.size, lay.size))
        starts += lay.extra
        starts += (lay.offset + t0)[:, None]
        ends = np.repeat(starts.max(axis=1, keepdims=True) + 100_000, lay.size, axis=1)
        batches.append(
            ReadyBatch(
                lay.size, lay.comm, lay.kind, np.full(lay.comm.size, float(1 << 24)), starts, ends
            )
        )
    return batches


def add_steps(state: JobState, step: int) -> None:
    topo = state.topology
    for r, info in topo.ranks.items():
        state.frames.add_step(
            info.slot, StepRecord(r, step, step * NS, (step + 1) * NS - 1), topo.n_slots
        )


def measure(n: int, steps: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    state, groups = build(n)
    shape = job_shape(state.topology)
    pipe = JobPipeline()
    slow = n // 3
    layout = layouts(state, groups, slow)
    frames_s, detect_s = [], []
    started = time.monotonic()
    for step in range(steps):
        if step % 20 == 0:
            print(f"  step {step}/{steps} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        completed = one_step(layout, step, rng)  # ingest's work, not timed
        add_steps(state, step)  # ingest's work, not timed
        gc.collect()
        t = time.process_time()
        state.frames.add_collectives(completed, state.topology)
        closed = state.frames.advance((step + 1) * NS + 1, state.topology.n_slots, world=n)
        t1 = time.process_time()
        for frame in closed:
            pipe.process(frame, shape)
        t2 = time.process_time()
        frames_s.append(t1 - t)
        detect_s.append(t2 - t1)
    # steady state: after the longest history a detector keeps (the link detector's 200-frame
    # noise ring) has filled; shorter runs time their second half
    tail = slice(STEADY if steps >= STEADY + 10 else steps // 2, None)
    found = [(str(k), str(s)) for k, s in pipe.opened if k == "slow_gpu"]
    total = [a + b for a, b in zip(frames_s[tail], detect_s[tail], strict=True)]
    return {
        "ranks": n,
        "timed_steps": len(frames_s[tail]),
        "collectives_per_step": sum(len(b) for b in completed),
        "records_per_step": sum(len(b) * b.size for b in completed),
        "frames_ms_per_step": round(1e3 * statistics.median(frames_s[tail]), 1),
        "detectors_ms_per_step": round(1e3 * statistics.median(detect_s[tail]), 1),
        "total_ms_per_step": round(1e3 * statistics.median(total), 1),
        "total_ms_mean": round(1e3 * statistics.fmean(total), 1),
        "total_ms_max": round(1e3 * max(total), 1),
        "found_the_slow_gpu": found == [("slow_gpu", f"slot:{state.topology.ranks[slow].slot}")],
    }


def memory_per_rank(n: int) -> float:
    tracemalloc.start()
    state, groups = build(n)
    before = tracemalloc.get_traced_memory()[0]
    pipe = JobPipeline()
    shape = job_shape(state.topology)
    rng = np.random.default_rng(1)
    layout = layouts(state, groups, -1)
    for step in range(8):
        state.frames.add_collectives(one_step(layout, step, rng), state.topology)
        add_steps(state, step)
        for frame in state.frames.advance((step + 1) * NS + 1, n, world=n):
            pipe.process(frame, shape)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return round(used / n, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1024,10240,102400")
    ap.add_argument(
        "--steps", type=int, default=240, help="steps per size; those after the first 210 are timed"
    )
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        print(f"{n} ranks...", file=sys.stderr, flush=True)
        r = measure(n, args.steps)
        r["detector_state_bytes_per_rank"] = memory_per_rank(min(n, 10240))
        results.append(r)
        print(r, file=sys.stderr, flush=True)
    save(
        "detection_scale",
        {
            "layout": f"TP={TP} x PP={PP} x DP=N/{TP * PP}",
            "compiled_frames": FrameBuilder(grace_ns=1, time_frame_ns=1, max_open_frames=1).jit,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
