"""The fault lab's real faults on this machine: namespaces on a bridge, a link throttled with
``tc tbf`` (measured with a real TCP transfer), a CPU quota with cgroup v1 (measured with a busy
loop), and cleanup that leaves nothing behind. Skipped with the reason where the machine lacks
root, namespaces, tc or cgroup v1."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from failslow.harness.lab import system

missing = system.preflight()
pytestmark = pytest.mark.skipif(bool(missing), reason="fault lab needs " + "; ".join(missing))

SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(n / (time.perf_counter() - t0), flush=True)
"""
CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5201)); buf = b"x" * (1 << 16)
t0 = time.perf_counter(); total = int(sys.argv[2]); sent = 0
while sent < total:
    c.sendall(buf); sent += len(buf)
c.close(); print(sent / (time.perf_counter() - t0), flush=True)
"""


def _throughput(net: system.LabNetwork, src: int, dst: int, nbytes: int) -> float:
    server = subprocess.Popen(
        net.exec(dst, [sys.executable, "-c", SERVER, net.ip(dst)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        subprocess.run(
            net.exec(src, [sys.executable, "-c", CLIENT, net.ip(dst), str(nbytes)]),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        out, _ = server.communicate(timeout=30)
        return float(out.strip())  # bytes/s as received
    finally:
        server.kill()


def _links(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if f" {prefix}" in line]


def test_throttled_link_and_cleanup() -> None:
    prefix = "fst"
    with system.LabNetwork(2, prefix=prefix, net=78) as net:
        free = _throughput(net, 0, 1, 40 << 20)
        net.throttle(1, rate="16mbit")
        slow = _throughput(net, 0, 1, 4 << 20)
        net.unthrottle(1)
        again = _throughput(net, 0, 1, 40 << 20)
    assert slow < 3e6 < free / 5  # 16 Mbit/s is 2 MB/s; the bridge does hundreds of MB/s
    assert again > 5 * slow
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in listing and _links(prefix) == []


def test_cpu_quota_limits_a_busy_process() -> None:
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with system.CpuQuota("fst-quota", 0.2) as q:
            q.add(loop.pid)
            t0, c0 = time.monotonic(), _cpu_s(loop.pid)
            time.sleep(1.5)
            share = (_cpu_s(loop.pid) - c0) / (time.monotonic() - t0)
            q.lift()
            t1, c1 = time.monotonic(), _cpu_s(loop.pid)
            time.sleep(1.0)
            lifted = (_cpu_s(loop.pid) - c1) / (time.monotonic() - t1)
        assert share < 0.3 and lifted > 0.5
        assert not (system.CGROUP_CPU / "fst-quota").exists()
    finally:
        loop.kill()
        loop.wait()


def _cpu_s(pid: int) -> float:
    import os
    from pathlib import Path

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_stale_leftovers_are_removed() -> None:
    subprocess.run(["ip", "netns", "add", "fsz3"], check=True)
    subprocess.run(["ip", "link", "add", "name", "fszbr", "type", "bridge"], check=True)
    removed = system.cleanup_stale("fsz")
    assert "fsz3" in removed and "fszbr" in removed
    assert _links("fsz") == []


@pytest.mark.skipif(
    not system._bridge_filtered() or shutil.which("ping") is None,
    reason="bridged traffic is not filtered by iptables here (or no ping)",
)
def test_on_a_docker_host_the_bridge_is_let_through_and_the_rule_removed() -> None:
    """With br_netfilter on and FORWARD's policy DROP (Docker's set-up), namespaces on a bridge
    cannot reach one another unless the lab lets its bridge through; the rule goes at close,
    and a crashed run's rule is removed by the stale cleanup."""

    def rules() -> str:
        return subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout

    with system.LabNetwork(2, prefix="fsy", net=79) as net:
        assert "-i fsybr -o fsybr -j ACCEPT" in rules()
        ping = subprocess.run(
            net.exec(0, ["ping", "-c", "1", "-W", "2", net.ip(1)]), capture_output=True
        )
        assert ping.returncode == 0
    assert "fsybr" not in rules()
    subprocess.run(["iptables", *system._forward_rule("-I", "fsybr")], check=True)
    assert "iptables FORWARD fsybr" in system.cleanup_stale("fsy")
    assert "fsybr" not in rules()
