"""Real faults on one Linux machine: namespaces, veth pairs, a bridge, ``tc tbf`` and cgroup v1
CPU quotas. Everything created is removed on exit, on error, and by :func:`cleanup_stale` after a
crash (all names carry one prefix)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


class LabError(RuntimeError):
    pass


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if check and p.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {(p.stderr or p.stdout).strip()}")
    return p


def preflight() -> list[str]:
    """What this machine lacks for the lab (empty: ready)."""
    missing = []
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        missing.append("Linux network namespaces")
    if os.geteuid() != 0:
        missing.append("root (namespaces, tc and cgroups need it)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` (Debian: iproute2)")
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        missing.append("cgroup v1 `cpu` controller at /sys/fs/cgroup/cpu")
    return missing


@dataclass
class LabNetwork:
    """``n`` namespaces ``<prefix><i>`` with address ``10.<net>.0.<i+1>``, joined by a bridge."""

    n: int
    prefix: str = "fsl"
    net: int = 77
    created: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) for cleanup

    def __post_init__(self) -> None:
        if not 1 <= self.n <= 200 or len(self.prefix) > 6:
            raise ValueError("1..200 namespaces, a prefix of at most 6 characters")

    def ns(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def host_if(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def ns_if(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    def ip(self, i: int) -> str:
        return f"10.{self.net}.0.{i + 1}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway(self) -> str:
        """The bridge's own address: the root namespace (the service) as the nodes see it."""
        return f"10.{self.net}.0.254"

    def exec(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``i``."""
        return ["ip", "netns", "exec", self.ns(i), *argv]

    def __enter__(self) -> LabNetwork:
        cleanup_stale(self.prefix)
        try:
            _run("ip", "link", "add", "name", self.bridge, "type", "bridge")
            self.created.append(("link", self.bridge))
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            if _bridge_filtered():
                _run("iptables", *_forward_rule("-I", self.bridge))
                self.created.append(("iptables", self.bridge))
            for i in range(self.n):
                _run("ip", "netns", "add", self.ns(i))
                self.created.append(("netns", self.ns(i)))
                _run("ip", "link", "add", self.host_if(i), "type", "veth", "peer", "name",
                     self.ns_if(i))  # fmt: skip
                self.created.append(("link", self.host_if(i)))
                _run("ip", "link", "set", self.ns_if(i), "netns", self.ns(i))
                _run("ip", "link", "set", self.host_if(i), "master", self.bridge)
                _run("ip", "link", "set", self.host_if(i), "up")
                _run(*self.exec(i, ["ip", "addr", "add", f"{self.ip(i)}/24", "dev",
                                    self.ns_if(i)]))  # fmt: skip
                _run(*self.exec(i, ["ip", "link", "set", self.ns_if(i), "up"]))
                _run(*self.exec(i, ["ip", "link", "set", "lo", "up"]))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def throttle(self, i: int, *, rate: str = "20mbit", burst: str = "64kb") -> None:
        """Slow namespace ``i``'s link both ways with a token bucket (``tc tbf``)."""
        for argv in (
            ["tc", "qdisc", "replace", "dev", self.host_if(i), "root", "tbf", "rate", rate,
             "burst", burst, "latency", "100ms"],
            self.exec(i, ["tc", "qdisc", "replace", "dev", self.ns_if(i), "root", "tbf", "rate",
                          rate, "burst", burst, "latency", "100ms"]),
        ):  # fmt: skip
            _run(*argv)

    def unthrottle(self, i: int) -> None:
        _run("tc", "qdisc", "del", "dev", self.host_if(i), "root", check=False)
        _run(*self.exec(i, ["tc", "qdisc", "del", "dev", self.ns_if(i), "root"]), check=False)

    def close(self) -> None:
        for kind, name in reversed(self.created):
            if kind == "netns":
                _run("ip", "netns", "del", name, check=False)
            elif kind == "iptables":
                _run("iptables", *_forward_rule("-D", name), check=False)
            else:
                _run("ip", "link", "del", name, check=False)
        self.created.clear()


@dataclass
class CpuQuota:
    """A cgroup v1 ``cpu`` group limiting its processes to ``fraction`` of one CPU."""

    name: str
    fraction: float
    path: Path = field(init=False)

    def __post_init__(self) -> None:
        if not 0.01 <= self.fraction <= 64:
            raise ValueError("fraction of a CPU must be in [0.01, 64]")
        self.path = CGROUP_CPU / self.name

    def __enter__(self) -> CpuQuota:
        self.path.mkdir(exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text("100000")
        (self.path / "cpu.cfs_quota_us").write_text(str(int(self.fraction * 100000)))
        return self

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def set(self, fraction: float) -> None:
        self.fraction = fraction
        (self.path / "cpu.cfs_quota_us").write_text(str(int(fraction * 100000)))

    def lift(self) -> None:
        """No limit any more (the processes stay in the group)."""
        (self.path / "cpu.cfs_quota_us").write_text("-1")

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self.path.exists():
            return
        try:
            pids = (self.path / "cgroup.procs").read_text().split()
        except OSError:
            pids = []
        for pid in pids:  # back to the root group, then the group can go
            with contextlib.suppress(OSError):
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _bridge_filtered() -> bool:
    """Bridged traffic goes through iptables' FORWARD chain (br_netfilter, which Docker loads
    along with a FORWARD policy of DROP): the lab's namespaces could not reach one another."""
    flag = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    try:
        return flag.read_text().strip() == "1" and shutil.which("iptables") is not None
    except OSError:
        return False


def _forward_rule(action: str, bridge: str) -> list[str]:
    """Let traffic between the lab's own ports of ``bridge`` through (insert/delete)."""
    return [action, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def cleanup_stale(prefix: str) -> list[str]:
    """Remove namespaces, links, firewall rules and cgroups left by a crashed run with this
    prefix."""
    removed = []
    if _bridge_filtered():
        for _ in range(16):  # one rule per crashed run
            if _run("iptables", *_forward_rule("-D", f"{prefix}br"), check=False).returncode:
                break
            removed.append(f"iptables FORWARD {prefix}br")
    listing = _run("ip", "netns", "list", check=False).stdout.split("\n")
    for line in listing:
        name = line.split(" ")[0].strip()
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(": ")
        if len(parts) > 1:
            name = parts[1].split("@")[0]
            if name == f"{prefix}br" or (
                name.startswith(f"{prefix}h") and name[len(prefix) + 1 :].isdigit()
            ):
                _run("ip", "link", "del", name, check=False)
                removed.append(name)
    if CGROUP_CPU.exists():
        for d in CGROUP_CPU.glob(f"{prefix}-*"):
            CpuQuota(d.name, 1.0).close()
            removed.append(str(d))
    return removed
