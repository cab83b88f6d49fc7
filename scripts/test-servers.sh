#!/bin/sh
# Best effort: install the real servers some tests run against (Debian packages), when this
# machine allows it. Tests whose server is still missing are skipped with the reason printed.
#   Slurm (slurmctld, slurmd, scontrol) + munge: the slurm actuator against a real cluster.
set -u
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
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        slurmctld slurmd slurm-client munge >/tmp/failslow-test-servers.log 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >>/tmp/failslow-test-servers.log 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        slurmctld slurmd slurm-client munge >>/tmp/failslow-test-servers.log 2>&1 ||
        echo "test-servers: install failed (see /tmp/failslow-test-servers.log); test skipped"
fi
# the packages' own services are not wanted: tests start private daemons
for svc in slurmctld slurmd munge; do
    command -v systemctl >/dev/null 2>&1 && systemctl stop "$svc" >/dev/null 2>&1
done
exit 0
