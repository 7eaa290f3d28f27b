"""One Ray instance on this machine, told apart from the others by its temp dir, and stopping it alone.

``ray stop`` stops every Ray process this user may stop here: a developer's own cluster, another job's head, a
test's embedded instance. A head started with ``ray start --head --temp-dir=DIR`` is known by DIR instead: its GCS
server, raylet and the daemons beside them name DIR on their command lines, the client server names the GCS port,
and the agents and workers are the raylet's children. Linux only (it reads /proc).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from farm.errors import FarmError

log = logging.getLogger("farm.fleet.on_ray.ray_instance")


def _processes() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, arguments) of this user's processes."""
    me = os.getuid()
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != me:
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:  # it ended meanwhile
            continue
        ppid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
        out[int(entry.name)] = (ppid, [a.decode(errors="replace") for a in args if a])
    return out


def instance_processes(temp_dir: str | Path) -> list[int]:
    """The pids of the Ray instance started with ``--temp-dir=temp_dir`` (empty when none runs)."""
    if not Path("/proc").is_dir():
        raise FarmError("finding one Ray instance's processes needs Linux's /proc; elsewhere stop it with `ray stop` "
                        "where no other Ray runs")
    names = {str(temp_dir).rstrip("/"), os.path.realpath(temp_dir)}
    procs = _processes()

    def names_dir(arg: str) -> bool:
        return any(arg.endswith("=" + n) or arg == n or f"{n}/session_" in arg for n in names)

    seeds = {pid for pid, (_, args) in procs.items() if any(names_dir(a) for a in args)}
    ports = {a.split("=", 1)[1] for pid in seeds for a in procs[pid][1] if a.startswith("--gcs_server_port=")}
    seeds |= {pid for pid, (_, args) in procs.items()
              if any(a.startswith(("--address=", "--gcs-address=")) and a.rsplit(":", 1)[-1] in ports for a in args)}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(seeds)
    while todo:
        pid = todo.pop()
        if pid in found or pid == os.getpid():
            continue
        found.add(pid)
        todo += children.get(pid, [])
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended: only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_instance(temp_dir: str | Path, grace_s: float = 10.0) -> list[int]:
    """Stop the Ray instance started with ``--temp-dir=temp_dir`` and no other: SIGTERM, then SIGKILL what is left
    after ``grace_s``. -> the pids it stopped."""
    pids = instance_processes(temp_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        if not any(_alive(p) for p in pids):
            break
        log.info("ray: %d process(es) of %s still up after SIGTERM; killing them", sum(map(_alive, pids)), temp_dir)
    return pids
