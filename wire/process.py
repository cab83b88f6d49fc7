"""How every failslow process sets itself up: the service (``failslow serve``), a relay and a
job's shard processes (service/stream/shards). Here, below all three, because each must do the
same and none may import another (docs/architecture.md)."""

from __future__ import annotations

import contextlib
import gc

MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX)
_kept_mib = 0  # what keep_freed_memory set in this process (0: glibc's defaults)


def raise_file_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (a service or relay holds
    one connection per node agent); the limit now."""
    import resource  # noqa: PLC0415 - POSIX only

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def keep_freed_memory(mib: int) -> bool:
    """On glibc: keep up to ``mib`` MiB of freed memory in the process (M_TRIM_THRESHOLD) and
    serve blocks under 32 MiB from the heap (M_MMAP_THRESHOLD), so that numpy's temporaries reuse
    pages instead of faulting in new ones; whether it was set (False: 0, or not glibc)."""
    import ctypes  # noqa: PLC0415

    if mib <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator as it is
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    ok = bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD) and mallopt(m_trim_threshold, mib << 20))
    if ok:
        global _kept_mib  # noqa: PLW0603 - a fact about this process
        _kept_mib = mib
    return ok


def current() -> tuple[int, int]:
    """``(kept MiB, young collection threshold)`` as this process is set up: what a process it
    starts for the same work (a shard) sets up in turn with :func:`same_as`."""
    return _kept_mib, gc.get_threshold()[0]


def same_as(setup: tuple[int, int]) -> None:
    """Set this process up as the one :func:`current` was read in."""
    keep_freed_memory(setup[0])
    collect_less_often(setup[1])


def collect_less_often(young: int) -> bool:
    """Python's collector: a young-generation collection every ``young`` allocations instead
    of 700 (the older generations' thresholds unchanged); whether it was set (False: 0)."""
    if young <= 0:
        return False
    gc.set_threshold(young, *gc.get_threshold()[1:])
    return True
