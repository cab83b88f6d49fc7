#!/bin/sh
# Slurm prolog (runs as root on every node of a job before it starts): one failslow agent per job
# and node. Configure in slurm.conf: Prolog=/etc/slurm/failslow-prolog.sh,
# Epilog=/etc/slurm/failslow-epilog.sh, and put FAILSLOW_SERVICE / FAILSLOW_TOKEN in
# /etc/failslow/agent.env. The training script records with
#   agents.Recorder(f"slurm-{SLURM_JOB_ID}", socket_path=f"/run/failslow/failslow-slurm-{SLURM_JOB_ID}.sock")
set -eu
[ -r /etc/failslow/agent.env ] && . /etc/failslow/agent.env
: "${FAILSLOW_SERVICE:?FAILSLOW_SERVICE not set in /etc/failslow/agent.env}"
job="slurm-${SLURM_JOB_ID:?}"
run=/run/failslow
mkdir -p "$run" /var/lib/failslow-agent
chown "${SLURM_JOB_UID:-0}" "$run" 2>/dev/null || true
FAILSLOW_TOKEN="${FAILSLOW_TOKEN:-}" nohup /usr/local/bin/failslow agent \
    --service "$FAILSLOW_SERVICE" --job "$job" --host "$(hostname -s)" \
    --socket "$run/failslow-$job.sock" --state-dir "/var/lib/failslow-agent/$job" \
    --task-poll 5 >"/var/log/failslow-agent-$job.log" 2>&1 &
echo $! >"$run/agent-$job.pid"
exit 0
