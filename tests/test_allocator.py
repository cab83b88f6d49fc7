"""`failslow serve` keeps freed memory for reuse (cli.keep_freed_memory,
Settings.allocator_keep_mib): the v2 core's array temporaries then stop faulting in fresh pages
at every pass."""

from __future__ import annotations

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
