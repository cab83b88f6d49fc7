"""`failslow serve` keeps freed memory for reuse (cli.keep_freed_memory,
Settings.allocator_keep_mib): the v2 core's array temporaries then stop faulting in fresh pages
at every pass; and it runs Python's young collections less often (cli.collect_less_often,
Settings.gc_young_objects)."""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys

import pytest

# 20 rounds of 8 arrays of 4 MiB, each written in full and all freed together: glibc by default
# gives the 32 MiB back to the kernel after every round (it is over its trim threshold), so the
# next round faults in thousands of pages again
ROUNDS = """
import resource, sys
import numpy as np
from failslow.cli import keep_freed_memory
print(keep_freed_memory(int(sys.argv[1])))
def rounds(n):
    for _ in range(n):
        arrays = [np.ones(1 << 19) for _ in range(8)]
        del arrays
rounds(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(keep_mib: int) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS, str(keep_mib)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_memory_is_reused_without_page_faults() -> None:
    set_, kept = faults(512)
    unset, default = faults(0)
    assert set_ and not unset
    assert default > 20 * 2000  # glibc's default: fresh pages round after round (81,440 here)
    assert kept < 1000  # kept: the same pages, faulted in once before the measured rounds


def test_the_setting_has_a_default_and_zero_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from failslow.cli import keep_freed_memory
    from failslow.service.settings import Settings

    assert Settings().allocator_keep_mib == 512
    monkeypatch.setenv("FAILSLOW_ALLOCATOR_KEEP_MIB", "0")
    assert Settings().allocator_keep_mib == 0
    assert keep_freed_memory(0) is False


# 200,000 container objects kept alive: each young collection finds them all still referenced
YOUNG = """
import gc, importlib, sys
collect_less_often = importlib.import_module(sys.argv[2]).collect_less_often
print(collect_less_often(int(sys.argv[1])))
before = gc.get_stats()[0]["collections"]
kept = [[i] for i in range(200_000)]
print(gc.get_stats()[0]["collections"] - before)
"""


def young_collections(young: int, module: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", YOUNG, str(young), module], capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    return out[0] == "True", int(out[1])


@pytest.mark.parametrize("module", ["failslow.cli", "failslow.relay.cli"])
def test_the_collector_runs_young_collections_less_often(
    monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    from failslow.relay.cli import register
    from failslow.service.settings import Settings

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    relay_default = parser.parse_args(["relay", "--upstream", "http://x"]).gc_young_objects
    assert Settings().gc_young_objects == relay_default == 10_000
    set_, fewer = young_collections(10_000, module)
    unset, default = young_collections(0, module)
    assert set_ and not unset
    assert default > 200  # every 700 allocations (every 10th a generation-1 one instead): 260
    assert fewer <= 200_000 // 10_000 + 2
    monkeypatch.setenv("FAILSLOW_GC_YOUNG_OBJECTS", "0")
    assert Settings().gc_young_objects == 0
