#!/bin/sh
# Best effort: install the real servers some tests run against (Debian packages), when this
# machine allows it. Tests whose server is still missing are skipped with the reason printed.
#   PostgreSQL: storage and API tests, two services on one database (private server per run).
#   Prometheus: promtool checks the rules; a real server scrapes failslow end to end.
#   Chromium + chromium-driver: the status page (/ui) in a real headless browser.
#   docker-compose: `docker-compose config` validates deploy/docker/compose.yml (no daemon).
#   Slurm (slurmctld, slurmd, scontrol) + munge: the slurm actuator against a real cluster.
set -u
LOG=/tmp/failslow-test-servers.log
apt_install() {  # packages...; quiet, with one retry after apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >>"$LOG" 2>&1 && return 0
    DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$LOG" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >>"$LOG" 2>&1
}
# ensure PRESENT WHAT SERVICES PACKAGES...: unless the shell test PRESENT holds, install PACKAGES
# (as root, with apt-get) for WHAT's tests, then stop the SERVICES the packages start (the tests
# start private servers); otherwise say those tests will be skipped.
ensure() {
    present=$1 what=$2 services=$3
    shift 3
    (eval "$present") >/dev/null 2>&1 && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "test-servers: not root or no apt-get: the $what tests will be skipped"
        return 0
    fi
    echo "test-servers: installing Debian's $* ($what) ..."
    apt_install "$@" || echo "test-servers: $* install failed (see $LOG); $what tests skipped"
    for svc in $services; do
        command -v systemctl >/dev/null 2>&1 && systemctl stop "$svc" >/dev/null 2>&1
    done
    return 0
}
ensure "ls /usr/lib/postgresql/*/bin/initdb" PostgreSQL postgresql postgresql
ensure "command -v promtool" Prometheus prometheus prometheus
ensure "command -v docker-compose" "compose-file" "" docker-compose
ensure "command -v chromedriver" "status-page browser" "" chromium chromium-driver
ensure "for b in slurmctld slurmd scontrol sbatch munged; do command -v \$b || exit 1; done" \
    "real-Slurm" "slurmctld slurmd munge" slurmctld slurmd slurm-client munge
exit 0
