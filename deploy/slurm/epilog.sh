#!/bin/sh
# Slurm epilog: stop this job's failslow agent (it delivers what it holds first, up to its
# --drain-timeout) and remove its state once everything was delivered.
set -u
job="slurm-${SLURM_JOB_ID:?}"
pidfile="/run/failslow/agent-$job.pid"
if [ -r "$pidfile" ]; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$pid" 2>/dev/null
    rm -f "$pidfile"
fi
# an empty outbox means everything reached the service: the state can go
outbox="/var/lib/failslow-agent/$job/outbox"
[ -d "$outbox" ] && [ -z "$(ls -A "$outbox" 2>/dev/null | grep -v '^dead$')" ] && rm -rf "/var/lib/failslow-agent/$job"
exit 0
