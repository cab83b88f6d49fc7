"""A real small disk for tests: a tmpfs of a given size, and a way to fill it to ENOSPC."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "1m") -> Iterator[Path | str]:
    """Mount a tmpfs of ``size`` on ``where``; yields the path, or why it could not (a str)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        yield f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}"
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """Write ``where/filler`` until the disk is full; delete the file to free the space."""
    filler = where / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as fh:  # until ENOSPC (close too)
        while True:
            fh.write(os.urandom(64 << 10))
            fh.flush()
    return filler
