"""``failslow lab --service URL``: checks before anything starts, and where the agents run.

The lab's agents run inside the nodes' network namespaces, so that active probes cross the
faulty veth. A service given by URL must therefore be reachable from there; a loopback URL
(``127.0.0.1``, ``localhost``, ``::1``) never is, so for it the agents run in the root namespace
instead (they read the ranks' telemetry over unix sockets, which namespaces do not separate;
active probes are off). Whatever the URL, the lab stops at once, with the reason, when the
service does not answer or refuses the token, rather than run a job whose every delivery is
refused and report "NOT found" for each fault.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from failslow.harness.lab.system import LabError


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_service(url: str, token: str | None, *, timeout_s: float = 5.0) -> None:
    """Raise :class:`LabError` unless ``url`` answers and takes ``token`` for reading and for
    ingest (the lab's agents send, the lab reads incidents)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(timeout=timeout_s, headers=headers) as http:
            ready = http.get(f"{url}/readyz")
            if ready.status_code != 200:
                raise LabError(f"the service at {url} is not ready (/readyz: {ready.status_code})")
            read = http.get(f"{url}/v1/jobs")
            ingest = http.post(f"{url}/v1/ingest", json={})  # 4xx for the body, not the token
    except httpx.HTTPError as exc:
        raise LabError(
            f"the service at {url} does not answer ({type(exc).__name__}: {exc})"
        ) from None
    for role, answer in (("read", read), ("ingest", ingest)):
        if answer.status_code in (401, 403):
            why = "needs a token: pass --token" if not token else "refuses the --token given"
            raise LabError(
                f"the service at {url} {why} (HTTP {answer.status_code} for {role}); the lab's "
                "agents need the ingest role and the lab the read role"
            )


def check_from_namespace(url: str, exec_argv: list[str], *, timeout_s: float = 10.0) -> None:
    """Raise :class:`LabError` unless ``url`` answers /readyz from inside a node's namespace
    (``exec_argv``: how to run a command there)."""
    probe = f"import httpx; print(httpx.get({url + '/readyz'!r}, timeout={timeout_s}).status_code)"
    try:
        done = subprocess.run([*exec_argv, sys.executable, "-c", probe], capture_output=True,
                              text=True, timeout=timeout_s + 10)  # fmt: skip
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0 or done.stdout.strip() != "200":
        raise LabError(
            f"the service at {url} is not reachable from the lab's network namespaces; give a "
            "URL on an address they can reach (the bridge's, e.g. http://10.77.0.254:PORT, with "
            "the service listening there) or a loopback URL (the agents then run outside the "
            "namespaces, without active probes)"
        )


def agent_stats(state_dir: Path) -> dict[str, object]:
    """What an agent last wrote to its ``stats.json`` ({} before it wrote any)."""
    try:
        return json.loads((state_dir / "stats.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def check_delivery(url: str, stats: list[dict[str, object]]) -> None:
    """Raise :class:`LabError` when the agents (their ``stats.json``) could not deliver: a
    refused token, or nothing accepted at all by the end of the warm-up."""
    refused = sum(int(s.get("auth_failures") or 0) for s in stats)  # type: ignore[call-overload]
    accepted = sum(int(s.get("records_accepted") or 0) for s in stats)  # type: ignore[call-overload]
    errors = sorted({str(s["last_error"]) for s in stats if s.get("last_error")})
    if refused and not accepted:
        raise LabError(f"the service at {url} refuses the agents' token ({refused} attempts)")
    if not accepted:
        raise LabError(
            f"no agent delivered anything to {url} during the warm-up"
            + (f" (last errors: {'; '.join(errors)})" if errors else "")
        )
