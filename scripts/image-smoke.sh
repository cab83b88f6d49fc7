#!/bin/sh
# Build the failslow image from the repository's Dockerfile and check it for real: the container
# runs as a non-root user, becomes healthy (its own HEALTHCHECK), takes a simulated faulty job
# over HTTP, finds the fault, and serves /metrics. `make image-smoke`; needs a Docker daemon.
# Where Docker Hub cannot be reached, the base image is built from Debian's packages
# (scripts/local-python-image.sh); PYTHON_IMAGE=... picks another one.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
IMAGE=${IMAGE:-failslow:smoke}
NAME=failslow-smoke-$$
PORT=${PORT:-$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}
TOKEN=smoke-$(date +%s)
WORK=$(mktemp -d)
cleanup() { docker rm -f "$NAME" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
docker info >/dev/null 2>&1 || { echo "image-smoke: needs a running Docker daemon (as root: apt-get install docker.io && dockerd &)" >&2; exit 2; }

if [ -z "${PYTHON_IMAGE:-}" ]; then
    if docker image inspect python:3.11-slim >/dev/null 2>&1 || docker pull -q python:3.11-slim >/dev/null 2>&1; then
        PYTHON_IMAGE=python:3.11-slim
    else
        PYTHON_IMAGE=failslow-local/python:3.11
        if ! docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then
            echo "image-smoke: python:3.11-slim cannot be pulled; building $PYTHON_IMAGE from Debian's packages" >&2
            sh scripts/local-python-image.sh "$PYTHON_IMAGE" >/dev/null
        fi
    fi
fi
echo "image-smoke: building $IMAGE on $PYTHON_IMAGE ..." >&2
docker build -q --network host --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" -t "$IMAGE" . >/dev/null
docker run -d --name "$NAME" -p "127.0.0.1:$PORT:8000" \
    -e FAILSLOW_AUTH__INGEST_TOKENS="$TOKEN" -e FAILSLOW_AUTH__READ_TOKENS="$TOKEN" \
    -e FAILSLOW_AUTH__OPERATOR_TOKENS="$TOKEN" "$IMAGE" >/dev/null
user=$(docker exec "$NAME" id -u)
[ "$user" != 0 ] || { echo "image-smoke: FAIL the service runs as root" >&2; exit 1; }
i=0
while [ "$(docker inspect -f '{{.State.Health.Status}}' "$NAME")" != healthy ]; do
    i=$((i + 1))
    [ $i -le 90 ] || { docker logs "$NAME" >&2; echo "image-smoke: FAIL not healthy after 90 s" >&2; exit 1; }
    sleep 1
done
echo "image-smoke: healthy after ${i} s, uid $user" >&2
"$PY" -m failslow.cli simulate --job smoke --tp 2 --pp 2 --dp 4 --steps 200 --seed 3 \
    --fault slow_gpu:rank=5,start=80,factor=1.6 --out "$WORK/job.jsonl" --quiet
"$PY" -m failslow.cli replay --service "http://127.0.0.1:$PORT" --token "$TOKEN" --quiet "$WORK/job.jsonl"
"$PY" - "$PORT" "$TOKEN" <<'PY'
import json, sys, urllib.request
port, token = sys.argv[1], sys.argv[2]
def get(path, auth=True):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()
incidents = json.loads(get("/v1/jobs/smoke/incidents?state=all"))
items = incidents["items"] if isinstance(incidents, dict) else incidents
found = [(i["kind"], i.get("ranks")) for i in items]
print("image-smoke: incidents", found, file=sys.stderr)
assert any(k == "slow_gpu" and 5 in (r or []) for k, r in found), found
assert not any(k in ("slow_node", "slow_link") for k, _ in found), found
metrics = get("/metrics")
assert "failslow_ingest_records_total" in metrics, "no ingest metrics"
print("image-smoke: OK", file=sys.stderr)
PY
