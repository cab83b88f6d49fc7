"""The choice of the v2 encoding, measured: bytes per record and CPU per record to encode (from
the Python records an agent holds) and to decode into arrays (what the service needs), for one
host's envelope of one second of a 10K-rank job (~240 records), and for a 1,000-record one.

Candidates: v1 JSON (+gzip), raw little-endian columns (the v2 format, +gzip), msgpack of the
same columns, and Arrow IPC (a record batch of the same columns).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from failslow.harness.load.job import HostTemplate, JobLayout  # noqa: E402
from failslow.wire import v2  # noqa: E402


def records(n_hosts_step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    job = JobLayout(10240, 1_000_000_000)
    tmpl = HostTemplate(job, 5)
    _, cols = v2.decode(tmpl.body(3, 0, {"job": "j", "host": "h", "sent_ns": 0}))
    names = [c["comm"] for c in tmpl.registration["comms"]]
    c = cols.collectives
    colls = []
    for i in range(cols.n_collectives):
        rec = {"rank": int(c["rank"][i]), "comm": names[int(c["comm"][i])], "seq": int(c["seq"][i]),
               "op": v2.OPS[int(c["op"][i])].value, "bytes": int(c["bytes"][i]),
               "start_ns": int(c["start_ns"][i]), "end_ns": int(c["end_ns"][i])}  # fmt: skip
        if c["peer"][i] >= 0:
            rec["peer"] = int(c["peer"][i])
        colls.append(rec)
    s = cols.steps
    steps = [{"rank": int(s["rank"][i]), "step": int(s["step"][i]),
              "start_ns": int(s["start_ns"][i]), "end_ns": int(s["end_ns"][i])}
             for i in range(cols.n_steps)]  # fmt: skip
    reps = max(1, n_hosts_step // len(colls))
    colls = colls * reps
    return colls, steps, {n: i for i, n in enumerate(names)}


def columns(colls: list[dict[str, Any]], codes: dict[str, int]) -> dict[str, np.ndarray]:
    return {
        "rank": np.array([c["rank"] for c in colls], np.int32),
        "comm": np.array([codes[c["comm"]] for c in colls], np.uint32),
        "seq": np.array([c["seq"] for c in colls], np.int64),
        "op": np.array([v2.OP_CODE[v2.Op(c["op"])] for c in colls], np.uint8),
        "bytes": np.array([c["bytes"] for c in colls], np.int64),
        "start_ns": np.array([c["start_ns"] for c in colls], np.int64),
        "end_ns": np.array([c["end_ns"] for c in colls], np.int64),
        "peer": np.array([c.get("peer", -1) for c in colls], np.int32),
    }


def timeit(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20):
            fn()
        best = min(best, (time.perf_counter() - t) / 20)
    return best / n * 1e6


def candidates(
    colls: list[dict[str, Any]], steps: list[dict[str, Any]], codes: dict[str, int]
) -> dict[str, tuple[Callable[[], bytes], Callable[[bytes], Any]]]:
    header = {"job": "j", "host": "h", "sent_ns": 0, "agent": "a", "batch_seq": 0,
              "topology": "0123456789abcdef"}  # fmt: skip
    env = {**header, "collectives": colls, "steps": steps}
    cands: dict[str, tuple[Callable[[], bytes], Callable[[bytes], Any]]] = {
        "v1 json": (lambda: orjson.dumps(env), orjson.loads),
        "v2 columns": (lambda: v2.encode_records(header, codes, colls, steps), v2.decode),
    }
    try:
        import msgpack  # type: ignore[import-not-found]

        def mp_enc() -> bytes:
            cols = columns(colls, codes)
            return msgpack.packb({**header, **{k: v.tobytes() for k, v in cols.items()}})

        def mp_dec(b: bytes) -> Any:
            d = msgpack.unpackb(b)
            return {k: np.frombuffer(d[k], dt) for k, dt in v2.COLLECTIVE_COLUMNS}

        cands["msgpack columns"] = (mp_enc, mp_dec)
    except ImportError:
        pass
    try:
        import pyarrow as pa

        def pa_enc() -> bytes:
            names = [k for k, _ in v2.COLLECTIVE_COLUMNS]
            batch = pa.record_batch(list(columns(colls, codes).values()), names=names)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            return sink.getvalue().to_pybytes()

        def pa_dec(b: bytes) -> Any:
            t = pa.ipc.open_stream(b).read_all()
            return {k: t.column(k).to_numpy() for k, _ in v2.COLLECTIVE_COLUMNS}

        cands["arrow ipc"] = (pa_enc, pa_dec)
    except ImportError:
        pass
    return cands


def measure(size: int) -> dict[str, Any]:
    colls, steps, codes = records(size)
    n = len(colls) + len(steps)
    rows = {}
    for name, (enc, dec) in candidates(colls, steps, codes).items():
        raw = enc()
        gz = gzip.compress(raw, compresslevel=1)
        rows[name] = {
            "bytes_per_record": round(len(raw) / n, 1),
            "gzip1_bytes_per_record": round(len(gz) / n, 1),
            "encode_us_per_record": round(timeit(enc, n), 3),
            "decode_us_per_record": round(timeit(lambda r=raw, d=dec: d(r), n), 3),
            "gunzip_us_per_record": round(timeit(lambda g=gz: gzip.decompress(g), n), 3),
        }
    return {"records": n, "candidates": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.parse_args()
    print(json.dumps([measure(size) for size in (240, 1000)], indent=2))


if __name__ == "__main__":
    main()
