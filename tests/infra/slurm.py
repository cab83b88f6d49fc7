"""A private single-node Slurm cluster for tests: munged, slurmctld and slurmd from Debian's
packages, with their own key, sockets, ports, state and logs under a temporary directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch")


def unavailable() -> str | None:
    """Why a real Slurm cannot run here, or None when it can."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing; Debian: "
            "apt-get install slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        return "the private Slurm cluster runs its daemons as root"
    return None


@dataclass(frozen=True)
class Cluster:
    conf: Path
    node: str
    root: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str) -> str:
        p = subprocess.run(
            list(args), env=self.env(), capture_output=True, text=True, timeout=30, check=True
        )
        return p.stdout

    def submit(self, name: str) -> int:
        out = self.run("sbatch", "--parsable", "-J", name, "-o", "/dev/null", "--wrap", "sleep 600")
        return int(out.strip().split(";")[0])

    def field(self, kind: str, name: str, key: str) -> str:
        text = self.run("scontrol", "show", kind, name)
        for token in text.replace("\n", " ").split(" "):
            if token.startswith(key + "="):
                return token.split("=", 1)[1]
        raise KeyError(f"{key} not in scontrol show {kind} {name}")


@contextmanager
def cluster(root: Path) -> Iterator[Cluster]:
    munge = root / "munge"
    for d in (munge, root / "state", root / "spool", root / "log"):
        d.mkdir(parents=True)
    munge.chmod(0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    ctl_port, d_port = free_port(), free_port()
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=failslowtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={munge}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
ReturnToService=2
MpiDefault=none
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pids = [munge / "munged.pid", root / "slurmctld.pid", root / "slurmd.pid"]
    try:
        subprocess.run(
            ["munged", "--force", f"--key-file={key}", f"--socket={munge}/munge.sock"]
            + [f"--pid-file={pids[0]}", f"--log-file={munge}/munged.log"]
            + [f"--seed-file={munge}/seed"],
            check=True,
            timeout=30,
        )
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, timeout=30)
        subprocess.run(["slurmd", "-f", str(conf)], env=env, check=True, timeout=30)
        c = Cluster(conf, node, root)
        deadline = time.monotonic() + 30
        while True:
            try:
                if "IDLE" in c.field("node", node, "State"):
                    break
            except (subprocess.SubprocessError, KeyError):
                pass
            if time.monotonic() > deadline:
                log = (root / "log" / "slurmctld.log").read_text()[-2000:]
                raise RuntimeError(f"the test Slurm node did not become idle:\n{log}")
            time.sleep(0.3)
        yield c
    finally:
        for pid_file in reversed(pids):
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
