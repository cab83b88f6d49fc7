"""The node's hardware as the agent reads and reports it: NVML/nvidia-smi UUIDs, else PCI bus ids
from sysfs, else nothing; RDMA devices, else physical interfaces; delivered to a real service."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from failslow.agents.hardware import (
    InventoryReporter,
    gpus_from_smi,
    gpus_from_sysfs,
    nics_from_sysfs,
    read_inventory,
)
from failslow.agents.transport import Sender
from failslow.service.settings import Settings
from tests.live import live_service
from tests.ports import free_port


def fake_sysfs(root: Path, *, ib: bool) -> Path:
    """A sysfs tree as a DGX-like node shows it: two NVIDIA GPUs, a NIC, an NVIDIA audio function
    (not a GPU), a bridge interface (virtual)."""
    pci = root / "bus" / "pci" / "devices"
    for addr, vendor, cls in (("0000:18:00.0", "0x10de", "0x030200"),
                              ("0000:3b:00.0", "0x10de", "0x030000"),
                              ("0000:3b:00.1", "0x10de", "0x040300"),
                              ("0000:5e:00.0", "0x15b3", "0x020700")):  # fmt: skip
        (pci / addr).mkdir(parents=True)
        (pci / addr / "vendor").write_text(vendor + "\n")
        (pci / addr / "class").write_text(cls + "\n")
    if ib:
        dev = root / "class" / "infiniband" / "mlx5_0"
        dev.mkdir(parents=True)
        (dev / "node_guid").write_text("b859:9f03:00d4:1a2c\n")
    net = root / "class" / "net"
    (root / "devices" / "pci0000:00" / "eth0").mkdir(parents=True)
    (root / "devices" / "pci0000:00" / "eth0" / "address").write_text("0c:42:a1:00:00:01\n")
    (root / "devices" / "virtual" / "net" / "docker0").mkdir(parents=True)
    net.mkdir(parents=True)
    os.symlink(root / "devices" / "pci0000:00" / "eth0", net / "eth0")
    os.symlink(root / "devices" / "virtual" / "net" / "docker0", net / "docker0")
    return root


def test_gpus_by_pci_and_nics_from_sysfs(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path / "sys", ib=True)
    gpus = gpus_from_sysfs(root)
    assert [(g["index"], g["pci_bus_id"], g["uuid"]) for g in gpus] == [
        (0, "0000:18:00.0", None), (1, "0000:3b:00.0", None)]  # fmt: skip
    assert nics_from_sysfs(root) == [
        {"name": "mlx5_0", "address": "b859:9f03:00d4:1a2c", "kind": "infiniband"}]  # fmt: skip
    eth = fake_sysfs(tmp_path / "sys2", ib=False)
    assert nics_from_sysfs(eth) == [
        {"name": "eth0", "address": "0c:42:a1:00:00:01", "kind": "ethernet"}]  # fmt: skip
    inv = read_inventory(root, smi=str(tmp_path / "no-such-smi"))
    assert "GPUs from sysfs PCI" in inv["note"] and "infiniband" in inv["note"]


U0, U1 = "GPU-5c1e9d2a-8f55-2c4f-3a1b-0e6f4b3d2a11", "GPU-77aa01b3-1d2e-9c4f-8b6a-5e4d3c2b1a00"


def test_uuids_from_nvidia_smi(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"  # what nvidia-smi prints for this query on a 2-GPU node
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in --query-gpu=index,uuid,pci.bus_id,name) ;; *) exit 9;; esac\n'
        f"echo '0, {U0}, 00000000:18:00.0, NVIDIA H100 80GB HBM3'\n"
        f"echo '1, {U1}, 00000000:3B:00.0, NVIDIA H100 80GB HBM3'\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    gpus = gpus_from_smi(str(smi))
    assert gpus is not None and [g["uuid"] for g in gpus] == [U0, U1]
    assert gpus[1] == {"index": 1, "uuid": gpus[1]["uuid"], "pci_bus_id": "00000000:3B:00.0",
                       "name": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    inv = read_inventory(fake_sysfs(tmp_path / "sys", ib=True), smi=str(smi))
    assert inv["note"].startswith("GPUs from nvidia-smi") and len(inv["gpus"]) == 2
    failing = tmp_path / "broken-smi"  # a driver mismatch: nvidia-smi exits non-zero
    failing.write_text("#!/bin/sh\necho 'Failed to initialize NVML' >&2\nexit 9\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    assert gpus_from_smi(str(failing)) is None


def test_this_machine_reads_without_failing() -> None:
    inv = read_inventory()  # whatever this machine has: never an exception
    assert isinstance(inv["gpus"], list) and isinstance(inv["nics"], list) and inv["note"]
    assert all(n["name"] != "lo" for n in inv["nics"])


def test_the_reporter_delivers_to_the_service_and_retries_while_it_is_down(tmp_path: Path) -> None:
    body = read_inventory(fake_sysfs(tmp_path / "sys", ib=True), smi=str(tmp_path / "none"))
    down = Sender(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    assert InventoryReporter(down, "node-7", read=lambda: body).report_once() == "retry"
    down.close()
    settings = Settings(database_url=f"sqlite:///{tmp_path}/hw.db")
    with live_service(settings) as url:
        sender = Sender(url)
        try:
            assert InventoryReporter(sender, "node-7", read=lambda: body).report_once() == "ok"
            got = sender.client.get(f"{url}/v1/fleet/hosts/node-7/hardware").json()
            assert got["gpus"][1]["pci_bus_id"] == "0000:3b:00.0"
            assert got["nics"][0]["name"] == "mlx5_0" and got["note"] == body["note"]
            bad = InventoryReporter(sender, "node-7", read=lambda: {"gpus": "x", "nics": []})
            assert bad.report_once() == "refused"  # invalid: said in the log, never retried
        finally:
            sender.close()
