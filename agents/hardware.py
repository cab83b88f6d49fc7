"""What this node runs on, as the fleet ledger knows hardware (docs/fleet.md): GPUs by local
index with their identity, and NICs.

A GPU's identity is the best the node offers, in this order: NVML's UUID (through ``pynvml``
where installed, else ``nvidia-smi``), else its PCI bus id (from sysfs: NVIDIA's vendor id,
display class), else nothing but its local index (the service then says ``index``). NICs are
the RDMA devices under ``/sys/class/infiniband`` (what NCCL's IB transport uses), else the
physical network interfaces under ``/sys/class/net``. Reading never fails: what cannot be read
is missing, and ``note`` says how it was read.

``InventoryReporter`` PUTs it to ``/v1/fleet/hosts/{host}/hardware`` once at agent start (and
again every ``every_s``), retrying with backoff while the service is unreachable.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from failslow.agents.transport import Backoff, Sender

log = logging.getLogger(__name__)

NVIDIA_VENDOR = "0x10de"
SMI_QUERY = "index,uuid,pci.bus_id,name"


def gpus_from_nvml() -> list[dict[str, Any]] | None:
    try:
        import pynvml  # type: ignore[import-not-found]  # noqa: PLC0415 - optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: try the next source
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append({"index": i, "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                        "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                        "name": _text(pynvml.nvmlDeviceGetName(h))})  # fmt: skip
        return out
    finally:
        pynvml.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def gpus_from_smi(smi: str | None = None, timeout_s: float = 10.0) -> list[dict[str, Any]] | None:
    smi = smi or shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        cmd = [smi, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return None
    if res.returncode != 0:
        log.warning("nvidia-smi exited %d: %s", res.returncode, res.stderr.strip()[:200])
        return None
    out = []
    for row in csv.reader(io.StringIO(res.stdout)):
        if len(row) < 4 or not row[0].strip().isdigit():
            continue
        index, uid, bus, name = (c.strip() for c in row[:4])
        out.append({"index": int(index), "uuid": uid or None, "pci_bus_id": bus or None,
                    "name": name or None})  # fmt: skip
    return out


def gpus_from_sysfs(sysfs: Path = Path("/sys")) -> list[dict[str, Any]]:
    """NVIDIA display/3D controllers by PCI address; indexed in bus order (as CUDA's
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""
    found = []
    for dev in sorted((sysfs / "bus" / "pci" / "devices").glob("*")):
        vendor, cls = _read(dev / "vendor"), _read(dev / "class")
        if vendor == NVIDIA_VENDOR and cls and cls.startswith("0x03"):
            found.append(dev.name)
    return [{"index": i, "uuid": None, "pci_bus_id": bus, "name": None}
            for i, bus in enumerate(found)]  # fmt: skip


def nics_from_sysfs(sysfs: Path = Path("/sys")) -> list[dict[str, Any]]:
    ib = sorted((sysfs / "class" / "infiniband").glob("*"))
    if ib:
        return [{"name": d.name, "address": _read(d / "node_guid"), "kind": "infiniband"}
                for d in ib]  # fmt: skip
    out = []
    for d in sorted((sysfs / "class" / "net").glob("*")):
        if d.name == "lo" or "/virtual/" in str(d.resolve()):
            continue  # loopback, bridges, veths, tunnels: not hardware
        out.append({"name": d.name, "address": _read(d / "address"), "kind": "ethernet"})
    return out


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip() or None
    except OSError:
        return None


def read_inventory(sysfs: Path = Path("/sys"), smi: str | None = None) -> dict[str, Any]:
    """The body of ``PUT /v1/fleet/hosts/{host}/hardware``."""
    how = []
    gpus = gpus_from_nvml()
    if gpus is not None:
        how.append("GPUs from NVML")
    else:
        gpus = gpus_from_smi(smi)
        if gpus is not None:
            how.append("GPUs from nvidia-smi")
        else:
            gpus = gpus_from_sysfs(sysfs)
            how.append("GPUs from sysfs PCI (no NVML, no nvidia-smi)" if gpus else "no GPUs found")
    nics = nics_from_sysfs(sysfs)
    kinds = sorted({n["kind"] for n in nics})
    how.append(f"NICs from sysfs ({', '.join(kinds)})" if nics else "no NICs found")
    return {"gpus": gpus, "nics": nics, "note": "; ".join(how)}


class InventoryReporter:
    """Report the inventory at start and every ``every_s``; retry with backoff until delivered."""

    def __init__(self, sender: Sender, host: str, *, every_s: float = 3600.0,
                 read: Any = read_inventory) -> None:  # fmt: skip
        self.sender, self.host, self.every_s, self.read = sender, host, every_s, read
        self.delivered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-inventory", daemon=True)

    def start(self) -> InventoryReporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def report_once(self) -> str:
        body = self.read()
        d = self.sender.put_hardware(self.host, json.dumps(body).encode())
        if d.outcome == "ok":
            self.delivered += 1
            log.info("hardware reported: %d GPU(s), %d NIC(s) (%s)", len(body["gpus"]),
                     len(body["nics"]), body["note"])  # fmt: skip
        elif d.outcome == "refused":
            log.warning("the service refused this node's hardware report: %s", d.error)
        return d.outcome

    def _run(self) -> None:
        backoff = Backoff(cap_s=300.0)
        while not self._stop.is_set():
            try:
                outcome = self.report_once()
            except Exception:  # noqa: BLE001 - a report must never stop the agent
                log.exception("cannot read or report this node's hardware")
                outcome = "refused"
            if outcome in ("ok", "refused"):
                backoff.reset()
                wait = self.every_s
            else:
                wait = backoff.next()
            if self._stop.wait(wait):
                return


__all__ = ["InventoryReporter", "gpus_from_smi", "gpus_from_sysfs", "nics_from_sysfs",
           "read_inventory"]  # fmt: skip
