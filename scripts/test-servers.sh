#!/bin/sh
# Best effort: install the real servers some tests run against (Debian packages), when this
# machine allows it. Tests whose server is still missing are skipped with the reason printed.
#   PostgreSQL: storage and API tests, two services on one database (private server per run).
#   Prometheus: promtool checks the rules; a real server scrapes failslow end to end.
#   Chromium + chromium-driver: the status page (/ui) in a real headless browser.
#   docker-compose: `docker-compose config` validates deploy/docker/compose.yml (no daemon).
#   Slurm (slurmctld, slurmd, scontrol) + munge: the slurm actuator against a real cluster.
set -u
apt_install() {  # packages...; quiet, with one retry after apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >>/tmp/failslow-test-servers.log 2>&1 && return 0
    DEBIAN_FRONTEND=noninteractive apt-get update -q >>/tmp/failslow-test-servers.log 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >>/tmp/failslow-test-servers.log 2>&1
}
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test-servers: installing Debian's postgresql ..."
        apt_install postgresql ||
            echo "test-servers: postgresql install failed (see /tmp/failslow-test-servers.log)"
        # the package's own cluster is not needed (tests start a private one on a free port)
        command -v systemctl >/dev/null 2>&1 && systemctl stop postgresql >/dev/null 2>&1
    else
        echo "test-servers: not root or no apt-get: the PostgreSQL tests will be skipped"
    fi
fi
if ! command -v promtool >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test-servers: installing Debian's prometheus (promtool) ..."
        apt_install prometheus ||
            echo "test-servers: prometheus install failed (see /tmp/failslow-test-servers.log)"
        command -v systemctl >/dev/null 2>&1 && systemctl stop prometheus >/dev/null 2>&1
    else
        echo "test-servers: not root or no apt-get: the promtool tests will be skipped"
    fi
fi
if ! command -v docker-compose >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test-servers: installing Debian's docker-compose (to validate deploy/docker) ..."
        apt_install docker-compose ||
            echo "test-servers: docker-compose install failed (see /tmp/failslow-test-servers.log)"
    fi
fi
if ! command -v chromedriver >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test-servers: installing Debian's chromium and chromium-driver ..."
        apt_install chromium chromium-driver ||
            echo "test-servers: chromium install failed (see /tmp/failslow-test-servers.log)"
    else
        echo "test-servers: not root or no apt-get: the status-page browser test will be skipped"
    fi
fi
need=""
for bin in slurmctld slurmd scontrol sbatch munged; do
    command -v "$bin" >/dev/null 2>&1 || need="yes"
done
[ -z "$need" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "test-servers: not root, cannot install Slurm; its real-cluster test will be skipped"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test-servers: no apt-get; the real-Slurm test will be skipped"
    exit 0
fi
echo "test-servers: installing Debian's slurmctld slurmd slurm-client munge ..."
apt_install slurmctld slurmd slurm-client munge ||
    echo "test-servers: install failed (see /tmp/failslow-test-servers.log); test skipped"
# the packages' own services are not wanted: tests start private daemons
for svc in slurmctld slurmd munge; do
    command -v systemctl >/dev/null 2>&1 && systemctl stop "$svc" >/dev/null 2>&1
done
exit 0
