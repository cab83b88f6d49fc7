"""A private PostgreSQL server for tests: Debian's ``postgresql`` binaries, its own data directory,
port and socket directory under a temporary directory, run as the ``postgres`` system user (the
server refuses root), stopped and removed at the end."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def unavailable() -> str | None:
    """Why a real PostgreSQL cannot run here, or None when it can."""
    if _bindir() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'failslow[postgres]')"
    if os.geteuid() != 0:
        return "the private PostgreSQL server is started as the postgres user, which needs root"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres system user"
    return None


@dataclass(frozen=True)
class Server:
    port: int
    socket_dir: str
    data: str = ""  # the data directory (for restart)
    options: str = ""  # the server's command-line options (for restart)

    def restart(self, down_s: float = 0.0) -> None:
        """Crash the server (``-m immediate``: no checkpoint, connections cut), wait ``down_s``
        and start it again on the same port and data; returns once it accepts connections."""
        ctl = [*_AS_PG, str(_bindir() / "pg_ctl"), "-D", self.data]  # type: ignore[operator]
        subprocess.run([*ctl, "-m", "immediate", "-w", "stop"], check=True, capture_output=True)
        time.sleep(down_s)
        log = str(Path(self.data).parent / "log")
        subprocess.run([*ctl, "-o", self.options, "-l", log, "-w", "-t", "60", "start"],
                       check=True, capture_output=True)  # fmt: skip
        _wait_accepting(self.port)

    def url(self, db: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def create_database(self) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


_AS_PG = ["runuser", "-u", "postgres", "--"]


def _wait_accepting(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)


@contextlib.contextmanager
def server() -> Iterator[Server]:
    bindir = _bindir()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="failslow-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    shutil.chown(root, "postgres")
    shutil.chown(sock, "postgres")
    as_pg = _AS_PG
    port = free_port()
    subprocess.run(
        [*as_pg, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
         "--no-sync", "-E", "UTF8"],
        check=True, capture_output=True,
    )  # fmt: skip
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run(
        [*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"),
         "-w", "-t", "60", "start"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        _wait_accepting(port)
        yield Server(port, str(sock), str(data), opts)
    finally:
        subprocess.run(
            [*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
