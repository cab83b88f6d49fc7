"""Which part a rank, a host or a link is: identities from the hosts' inventories.

A GPU is named by its UUID where the node agent could read one (NVML or ``nvidia-smi``): the
card keeps its name when it moves to another slot or host, and across jobs, restarts and renamed
jobs. Else by its PCI bus id on its host (stable while it stays in its slot), else by its local
device index on its host (the slot, not the card). A host is its node name. A NIC is named on
its host; passive data names a host's network, not one of several NICs, so a host with several
NICs (or none reported) has one network part, ``<host>/net``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from failslow.detectors.fleet import IdSource, PartKind

NET = "net"  # a host's network when it is not one known NIC


@dataclass(frozen=True, slots=True)
class Part:
    part_id: str
    kind: PartKind
    host: str
    label: str
    id_source: IdSource | None = None


def host_part(host: str) -> Part:
    return Part(host, PartKind.HOST, host, host)


def gpu_part(host: str, index: int, gpus: list[dict[str, Any]] | None,
             uuid: str | None = None) -> Part:  # fmt: skip
    """The GPU at local ``index`` on ``host``, named as well as the inventory allows (``uuid``:
    what a check on the GPU itself read: it finds the GPU whatever its index, and names one the
    inventory has no UUID for)."""
    if uuid:
        for g in gpus or ():
            if g.get("uuid") == uuid:
                return gpu_part(host, int(g.get("index", index)), gpus)
    for g in gpus or ():
        if g.get("index") != index:
            continue
        if g.get("uuid"):
            return Part(str(g["uuid"]), PartKind.GPU, host, f"gpu{index}", IdSource.UUID)
        if g.get("pci_bus_id"):
            bus = str(g["pci_bus_id"])
            return Part(f"{host}/{bus}", PartKind.GPU, host, f"gpu{index}", IdSource.PCI)
    if uuid:
        return Part(uuid, PartKind.GPU, host, f"gpu{index}", IdSource.UUID)
    return Part(f"{host}/gpu{index}", PartKind.GPU, host, f"gpu{index}", IdSource.INDEX)


def nic_part(host: str, nics: list[dict[str, Any]] | None) -> Part:
    """The network part of ``host``: its NIC when it reported exactly one."""
    named = [n for n in nics or () if n.get("name")]
    if len(named) == 1:
        name = str(named[0]["name"])
        return Part(f"{host}/{name}", PartKind.NIC, host, name)
    label = ",".join(sorted(str(n["name"]) for n in named)) or NET
    return Part(f"{host}/{NET}", PartKind.NIC, host, label)
