"""Real Megatron-LM traces (OSDI'25 straggler study) as v1 envelopes, with what should be found.

``../shared/datasets/stragglers-osdi25/trace-{AR,ST,SE}.parquet`` hold per-rank, per-operation
timings of three jobs, one tensor-parallel rank per (data-parallel, pipeline) cell. Conversion:

* hosts: 8 GPUs per host in Megatron rank order (``host = rank // 8``);
* communicators among the recorded ranks: one data-parallel group per pipeline stage (the
  distributed optimizer's reduce-scatter and all-gather), one pipeline pair per adjacent stages
  and data-parallel rank (forward/backward send and recv, matched by their order within a step),
  and the embedding group of the first and last stage (its all-reduce), announced as kind
  ``other`` as a converter that knows nothing of failslow would. The tensor-parallel
  layernorm all-reduce is left out: its other members were not recorded;
* steps: the traces hold sampled steps whose clocks restart near zero, so the sampled steps are
  laid back to back on one timeline (gaps between samples carry no information anyway);
* message sizes were not recorded: bytes are 0, so bus bandwidth (link) analysis stays silent.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

T0 = 1_800_000_000_000_000_000
GPUS_PER_HOST = 8

EXPECTATIONS = {
    # trace: (incidents that must exist, incident kinds that must not exist besides those)
    "AR": ({("slow_gpu", (0,))}, {"slow_gpu", "slow_node", "slow_link", "hang", "job_slowdown"}),
    "ST": (set(), {"slow_gpu", "slow_node"}),
    "SE": (set(), {"slow_gpu", "slow_node", "slow_link"}),
}

DP_OPS = {"grads-reduce-scatter": ("reducescatter", 0), "params-all-gather": ("allgather", 1)}


def _meta(root: Path, trace: str) -> dict[str, int]:
    meta: dict[str, int] = {}
    for line in (root / f"meta-{trace}.yaml").read_text().splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if value.isdigit():
            meta[key.strip()] = int(value)
    return meta


def load_rows(root: Path, trace: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - dev/eval extra
        raise SystemExit(
            "reading the OSDI'25 traces needs pyarrow: pip install 'failslow[eval]'"
        ) from exc
    return pq.read_table(root / f"trace-{trace}.parquet").to_pylist()  # type: ignore[no-any-return]


def to_envelopes(root: Path, trace: str, *, job: str | None = None) -> list[dict[str, Any]]:
    """The trace as v1 envelopes (one per host per sampled step), in time order."""
    meta = _meta(root, trace)
    job = job or f"osdi-{trace}"
    rows = load_rows(root, trace)
    pp = meta["pp_size"]
    coords = {r["rank"]: (r["dp_rank"], r["stage"]) for r in rows}
    rank_at = {v: k for k, v in coords.items()}
    steps = sorted({r["step"] for r in rows})
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_step[r["step"]].append(r)
    host = {rank: f"host-{rank // GPUS_PER_HOST:03d}" for rank in coords}

    comms: dict[str, dict[str, Any]] = {}
    for stage in range(pp):
        members = sorted((dp, rk) for rk, (dp, st) in coords.items() if st == stage)
        if len(members) >= 2:
            comms[f"dp-{stage}"] = {
                "comm": f"dp-{stage}",
                "kind": "dp",
                "ranks": [rk for _, rk in members],
            }
    for (dp, stage), rk in rank_at.items():
        nxt = rank_at.get((dp, stage + 1))
        if nxt is not None:
            comms[f"pp-{stage}-{dp}"] = {
                "comm": f"pp-{stage}-{dp}",
                "kind": "pp",
                "ranks": [rk, nxt],
            }
        last = rank_at.get((dp, pp - 1))
        if stage == 0 and last is not None and last != rk:
            comms[f"emb-{dp}"] = {"comm": f"emb-{dp}", "kind": "other", "ranks": [rk, last]}

    envelopes: list[dict[str, Any]] = []
    offset_ns = 0
    for idx, step in enumerate(steps):
        ops = by_step[step]
        span = max(o["start_ts"] + o["duration"] for o in ops)
        ns = lambda s, off=offset_ns: T0 + off + int(s * 1e9)  # noqa: E731
        per_host: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(
            lambda: {"c": [], "s": []}
        )
        by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for o in ops:
            by_rank[o["rank"]].append(o)
        for rank, mine in by_rank.items():
            dp, stage = coords[rank]
            h = per_host[host[rank]]
            h["s"].append(
                {
                    "rank": rank,
                    "step": step,
                    "start_ns": ns(min(o["start_ts"] for o in mine)),
                    "end_ns": ns(max(o["start_ts"] + o["duration"] for o in mine)),
                }
            )
            ordered: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for o in sorted(mine, key=lambda o: o["start_ts"]):
                ordered[o["optype"]].append(o)
            for optype, (op, code) in DP_OPS.items():
                for k, o in enumerate(ordered.get(optype, [])):
                    if f"dp-{stage}" in comms:
                        h["c"].append(
                            _coll(rank, f"dp-{stage}", idx * 100 + code * 10 + k, op, o, ns)
                        )
            for k, o in enumerate(ordered.get("embedding-grads-all-reduce", [])):
                comm = f"emb-{dp}"
                if comm in comms and rank in comms[comm]["ranks"]:
                    h["c"].append(_coll(rank, comm, idx * 10 + k, "allreduce", o, ns))
            # forward: stage s sends to s+1; backward: stage s+1 sends to s. One comm per pair.
            m = 100_000
            for direction, send, recv in (
                (0, "forward-send", "forward-recv"),
                (1, "backward-send", "backward-recv"),
            ):
                for k, o in enumerate(ordered.get(send, [])):
                    peer_stage = stage + 1 if direction == 0 else stage - 1
                    peer = rank_at.get((dp, peer_stage))
                    comm = f"pp-{min(stage, peer_stage)}-{dp}"
                    if peer is not None and comm in comms:
                        h["c"].append(
                            _coll(rank, comm, idx * m + direction * m // 2 + k, "send", o, ns, peer)
                        )
                for k, o in enumerate(ordered.get(recv, [])):
                    peer_stage = stage - 1 if direction == 0 else stage + 1
                    peer = rank_at.get((dp, peer_stage))
                    comm = f"pp-{min(stage, peer_stage)}-{dp}"
                    if peer is not None and comm in comms:
                        h["c"].append(
                            _coll(rank, comm, idx * m + direction * m // 2 + k, "recv", o, ns, peer)
                        )
        for name in sorted(per_host):
            ranks = sorted(r for r, hh in host.items() if hh == name)
            envelopes.append(
                {
                    "job": job,
                    "host": name,
                    "sent_ns": ns(span) + 1_000_000,
                    "ranks": [
                        {"rank": r, "gpu": r % GPUS_PER_HOST, "world_size": meta["world_size"]}
                        for r in ranks
                    ],
                    "comms": [c for c in comms.values() if set(c["ranks"]) & set(ranks)],
                    "collectives": per_host[name]["c"],
                    "steps": per_host[name]["s"],
                }
            )
        offset_ns += int(span * 1e9) + 100_000_000
    return envelopes


def _coll(
    rank: int, comm: str, seq: int, op: str, o: dict[str, Any], ns: Any, peer: int | None = None
) -> dict[str, Any]:
    rec = {
        "rank": rank,
        "comm": comm,
        "seq": seq,
        "op": op,
        "bytes": 0,
        "start_ns": ns(o["start_ts"]),
        "end_ns": ns(o["start_ts"] + o["duration"]),
    }
    if peer is not None:
        rec["peer"] = peer
    return rec


def judge(trace: str, incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare the incidents a service opened for the trace with what should be found."""
    required, forbidden = EXPECTATIONS[trace]
    got = {(i["kind"], tuple(i["ranks"])) for i in incidents}
    missing = sorted(required - got)
    extra = sorted(k for k in got - required if k[0] in forbidden)
    return {
        "trace": trace,
        "incidents": sorted(got),
        "missing": missing,
        "unexpected": extra,
        "pass": not missing and not extra,
    }
