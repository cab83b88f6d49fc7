"""POST /v1/ingest through the real app: the spec's validation and partial-acceptance rules."""

from __future__ import annotations

import gzip

import orjson
import pytest
from fastapi.testclient import TestClient

from tests.helpers import MS, T0, coll, envelope, step, two_hosts

pytestmark = pytest.mark.both_databases  # storage and API: SQLite and PostgreSQL

PROBLEM = "application/problem+json"


def host_counts(client: TestClient, job: str = "job-a") -> dict[str, dict[str, int]]:
    return client.get(f"/v1/jobs/{job}").json()["ingest"]


def post(client: TestClient, body: object, **kw: object):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/ingest", content=orjson.dumps(body), headers={"Content-Type": "application/json"}, **kw
    )


def test_valid_envelope_is_accepted(client: TestClient) -> None:
    h0, _ = two_hosts()
    r = post(
        client,
        envelope(**h0, collectives=[coll(0, 0, T0, T0 + MS)], steps=[step(0, 0, T0, T0 + 5 * MS)]),
    )
    assert r.status_code == 200
    assert r.json() == {"accepted": 2, "duplicates": 0, "rejected": []}


@pytest.mark.parametrize(
    "body,loc",
    [
        (b"{not json", None),
        (b"[1, 2]", ""),
        (orjson.dumps({"host": "h0", "sent_ns": T0}), "job"),
        (orjson.dumps({"job": "a/b", "host": "h0", "sent_ns": T0}), "job"),
        (orjson.dumps({"job": "j", "host": "h0", "sent_ns": "soon"}), "sent_ns"),
        (orjson.dumps({"job": "j", "host": "h0", "sent_ns": True}), "sent_ns"),
        (orjson.dumps({"job": "j", "host": "h0", "sent_ns": T0, "collectives": {}}), "collectives"),
        (orjson.dumps({"job": "j", "host": "h0", "sent_ns": T0, "agent": "a"}), "batch_seq"),
    ],
)
def test_malformed_envelope_is_rejected_whole_and_stores_nothing(
    client: TestClient, body: bytes, loc: str | None
) -> None:
    r = client.post("/v1/ingest", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.headers["content-type"] == PROBLEM
    problem = r.json()
    assert {"type", "title", "status", "detail"} <= problem.keys() and problem["status"] == 400
    if loc is not None:
        assert loc in [e["loc"] for e in problem["errors"]]
    assert client.get("/v1/jobs").json() == []


def test_bad_records_are_rejected_one_by_one(client: TestClient) -> None:
    h0, _ = two_hosts()
    h0["comms"].append({"comm": "pp-0", "kind": "pp", "ranks": [0, 2]})
    records = [
        coll(0, 0, T0, T0 + MS),  # fine
        coll(0, 1, T0 + MS, T0),  # end before start
        coll(0, 2, T0, T0 + MS, nbytes=-1),  # negative bytes
        coll(0, 3, T0, T0 + MS, op="frobnicate"),  # unknown op
        coll(0, 0, T0, T0 + MS, comm="pp-0", op="send"),  # send without peer
        coll(1, 0, T0, T0 + MS, comm="pp-0"),  # rank 1 not a member of pp-0
        coll(2, 4, T0, T0 + MS),  # rank 2 was never announced: it is placed on this host
        coll(0, 5, T0, T0 + MS, comm="nope"),  # unknown comm
        coll(1, 0, T0, T0 + MS, op="AllReduce"),  # fine, NCCL spelling
        {"rank": 0},  # missing fields
    ]
    r = post(client, envelope(**h0, collectives=records))
    assert r.status_code == 200
    body = r.json()
    reasons = {x["index"]: x["reason"] for x in body["rejected"]}
    assert body["accepted"] == 3
    assert reasons["collectives[1]"] == "end_ns before start_ns"
    assert reasons["collectives[2]"] == "negative bytes"
    assert reasons["collectives[3]"].startswith("unknown op")
    assert reasons["collectives[4]"] == "send without peer"
    assert "not a member" in reasons["collectives[5]"]
    assert reasons["collectives[7]"].startswith("unknown comm")
    assert reasons["collectives[9]"] == "comm must be an identifier"
    assert set(reasons) == {f"collectives[{i}]" for i in (1, 2, 3, 4, 5, 7, 9)}
    assert host_counts(client)["h0"]["accepted"] == 3
    assert host_counts(client)["h0"]["rejected"] == 7


def test_integers_beyond_the_columns_are_rejected_per_record_and_never_block_the_job(
    client: TestClient,
) -> None:
    """Ranks, GPUs, world sizes and steps live in INTEGER columns: 2^31 used to fail the commit
    on PostgreSQL and, left pending, every later envelope of the job answered 503."""
    big = 2**31
    ranks = [{"rank": 0, "gpu": 0, "world_size": 4}, {"rank": big, "gpu": 0},
             {"rank": 1, "gpu": big}, {"rank": 2, "world_size": big}]  # fmt: skip
    comms = [{"comm": "dp-0", "kind": "dp", "ranks": [0, 1, 2, 3]},
             {"comm": "huge", "kind": "dp", "ranks": [0, big]}]  # fmt: skip
    records = [coll(0, 0, T0, T0 + MS), coll(big, 0, T0, T0 + MS)]
    steps = [step(0, big, T0, T0 + MS), step(0, 1, T0, T0 + MS)]
    r = post(client, envelope(ranks=ranks, comms=comms, collectives=records, steps=steps))
    assert r.status_code == 200
    reasons = {x["index"]: x["reason"] for x in r.json()["rejected"]}
    assert {"ranks[1]", "ranks[2]", "ranks[3]", "comms[1]", "collectives[1]", "steps[0]"} <= set(
        reasons
    ), reasons
    assert "2^31" in reasons["ranks[1]"] and "2^31" in reasons["steps[0]"]
    for seq in range(1, 4):  # the job goes on
        records = [coll(0, seq, T0, T0 + MS)]
        later = post(client, envelope(sent_ns=T0 + seq * MS, collectives=records))
        assert later.status_code == 200 and later.json()["accepted"] == 1
    ack = client.post("/v1/jobs/job-a/plan/ack", json={"version": 2**63, "step": 1})
    assert ack.status_code == 422 and ack.headers["content-type"] == PROBLEM


def test_conflicting_comm_announcement_is_rejected(client: TestClient) -> None:
    h0, _ = two_hosts()
    assert post(client, envelope(**h0)).status_code == 200
    r = post(client, envelope(comms=[{"comm": "dp-0", "kind": "dp", "ranks": [0, 1]}]))
    assert r.json()["rejected"] == [
        {"index": "comms[0]", "reason": "conflicting member list for comm dp-0"}
    ]


def test_rank_on_another_host_is_rejected(client: TestClient) -> None:
    h0, h1 = two_hosts()
    post(client, envelope(**h0))
    post(client, envelope(host="h1", **h1))
    r = post(client, envelope(host="h0", collectives=[coll(2, 0, T0, T0 + MS)]))
    assert r.json()["rejected"][0]["reason"] == "rank 2 lives on host h1, not h0"


def test_identical_resend_is_a_duplicate_and_conflicts_are_rejected(client: TestClient) -> None:
    h0, _ = two_hosts()
    env = envelope(**h0, collectives=[coll(0, 0, T0, T0 + MS)], steps=[step(0, 0, T0, T0 + 9 * MS)])
    assert post(client, env).json()["accepted"] == 2
    again = post(client, env).json()
    assert again == {"accepted": 0, "duplicates": 2, "rejected": []}
    changed = envelope(
        **h0, collectives=[coll(0, 0, T0, T0 + 2 * MS)], steps=[step(0, 0, T0, T0 + 8 * MS)]
    )
    body = post(client, changed).json()
    assert [x["reason"] for x in body["rejected"]] == ["conflicting re-send of a stored record"] * 2
    counts = host_counts(client)["h0"]
    assert (counts["accepted"], counts["duplicates"], counts["rejected"]) == (2, 2, 2)


def test_inflight_record_is_completed_by_a_resend(client: TestClient) -> None:
    h0, h1 = two_hosts()
    post(client, envelope(**h0, collectives=[coll(0, 0, T0, None), coll(1, 0, T0, T0 + MS)]))
    detail = client.get("/v1/jobs/job-a").json()["detector"]
    assert detail["inflight_collectives"] == 1
    r = post(client, envelope(**h0, collectives=[coll(0, 0, T0, T0 + MS)]))
    assert r.json() == {"accepted": 1, "duplicates": 0, "rejected": []}
    # a stale in-flight copy arriving after the completion is a duplicate, not a conflict
    r = post(client, envelope(**h0, collectives=[coll(0, 0, T0, None)]))
    assert r.json() == {"accepted": 0, "duplicates": 1, "rejected": []}
    assert client.get("/v1/jobs/job-a").json()["detector"]["inflight_collectives"] == 0


def test_agent_batch_resend_is_recognised_whole(client: TestClient) -> None:
    h0, _ = two_hosts()
    env = envelope(**h0, agent="agent-1", batch_seq=7, collectives=[coll(0, 0, T0, T0 + MS)])
    assert post(client, env).json()["accepted"] == 1
    assert post(client, env).json() == {"accepted": 0, "duplicates": 1, "rejected": []}
    older = envelope(**h0, agent="agent-1", batch_seq=3, collectives=[coll(0, 9, T0, T0 + MS)])
    assert post(client, older).json()["duplicates"] == 1


def test_gzip_body(client: TestClient) -> None:
    h0, _ = two_hosts()
    raw = orjson.dumps(envelope(**h0, collectives=[coll(0, 0, T0, T0 + MS)]))
    r = client.post(
        "/v1/ingest",
        content=gzip.compress(raw),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200 and r.json()["accepted"] == 1


def test_bad_gzip_is_400(client: TestClient) -> None:
    r = client.post(
        "/v1/ingest",
        content=b"\x1f\x8bnot-really",
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 400 and r.headers["content-type"] == PROBLEM


@pytest.mark.parametrize("field", ["job", "host", "agent"])
def test_an_id_ending_in_a_newline_is_refused(client: TestClient, field: str) -> None:
    """``re.match`` with ``$`` accepted ``"job\\n"``: stored, then unreachable (issue 17)."""
    body = envelope(steps=[step(0, 1, T0, T0 + MS)], ranks=[{"rank": 0, "world_size": 1}])
    body[field] = "job-a\n" if field == "job" else "x\n"
    body["batch_seq"] = 1
    r = post(client, body | ({} if field == "agent" else {"agent": "a"}))
    assert r.status_code == 400, r.text
    assert [e["loc"] for e in r.json()["errors"]] == [field]
    assert client.get("/v1/jobs").json() == []  # nothing was stored


def test_data_after_the_gzip_stream_is_400_not_ignored(client: TestClient) -> None:
    h0, _ = two_hosts()
    raw = orjson.dumps(envelope(**h0, collectives=[coll(0, 0, T0, T0 + MS)]))
    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    for tail in (b"garbage", gzip.compress(b"second member")):
        r = client.post("/v1/ingest", content=gzip.compress(raw) + tail, headers=gz)
        assert r.status_code == 400 and r.headers["content-type"] == PROBLEM
        assert "after the end of the gzip stream" in r.json()["detail"]
    assert client.post("/v1/ingest", content=gzip.compress(raw), headers=gz).status_code == 200


def test_wrong_content_type_is_415(client: TestClient) -> None:
    r = client.post(
        "/v1/ingest",
        content=b"job=x",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 415 and r.headers["content-type"] == PROBLEM
    r = client.post(
        "/v1/ingest",
        content=b"{}",
        headers={"Content-Type": "application/json", "Content-Encoding": "br"},
    )
    assert r.status_code == 415


def test_body_over_limit_is_413(client: TestClient) -> None:
    big = b'{"job": "j", "host": "h", "sent_ns": 1, "pad": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    r = client.post("/v1/ingest", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.headers["content-type"] == PROBLEM


def test_gzip_bomb_is_413_without_inflating_it(client: TestClient) -> None:
    bomb = gzip.compress(b"{" + b" " * (200 * 1024 * 1024) + b"}", compresslevel=9)
    assert len(bomb) < 1024 * 1024
    r = client.post(
        "/v1/ingest",
        content=bomb,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 413


def test_heartbeat_advances_the_watermark(client: TestClient) -> None:
    h0, _ = two_hosts()
    post(client, envelope(**h0))
    post(client, envelope(sent_ns=T0 + 5_000 * MS))
    assert client.get("/v1/jobs/job-a").json()["watermark_ns"] == T0 + 5_000 * MS


def test_load_shedding_is_429_with_retry_after(client: TestClient) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    ctx.ingest_inflight = ctx.settings.ingest.max_concurrent_requests
    try:
        r = post(client, envelope())
    finally:
        ctx.ingest_inflight = 0
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.headers["content-type"] == PROBLEM


def test_members_over_all_jobs_are_bounded_with_a_clear_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from failslow.service.app import create_app
    from failslow.service.settings import Settings
    from failslow.service.stream.settings import StateSettings

    settings = Settings(database_url=f"sqlite:///{tmp_path}/f.db",
                        state=StateSettings(max_total_comm_members=6))  # fmt: skip
    with TestClient(create_app(settings)) as c:
        h0, _ = two_hosts()  # a comm of 4 members
        assert post(c, envelope(**h0)).json()["rejected"] == []
        other = {"comm": "dp-9", "kind": "dp", "ranks": [0, 1, 2, 3]}
        r = post(c, envelope(job="job-b", comms=[other]))
        assert r.status_code == 200
        [rej] = r.json()["rejected"]
        assert rej["index"] == "comms[0]" and "over all jobs" in rej["reason"]
        reg = {"sent_ns": 1, "ranks": [{"rank": 0, "world_size": 4}], "comms": [other]}
        r = c.put("/v2/jobs/job-c/topology/h0", json=reg)
        assert r.status_code == 422 and "over all jobs" in r.text
