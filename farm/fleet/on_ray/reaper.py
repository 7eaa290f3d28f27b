"""Stop what an embedded Ray instance started when its driver dies without shutting it down (``kill -9``).

Ray's raylet exits when its driver's session ends, but the processes it started (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) are orphaned and stay. The driver puts a token in its environment before Ray starts,
so every process of the instance inherits it; a small watcher process, started first, waits on a pipe from the
driver. If the pipe closes without the word that the driver shut Ray down itself, the watcher kills every
process whose environment holds the token (or its raylet's pid), and the driver's descendants it noted four times
a second (checking each one's start time, so a reused pid is never hit). Linux only (it reads /proc).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from typing import Any

log = logging.getLogger("farm.fleet.on_ray.reaper")
OWNER_ENV = "FARM_RAY_OWNER"  # the token of the embedded instance this driver started

_WATCHER = r"""
import os, select, signal, sys
driver, token, me = int(sys.argv[1]), sys.argv[2].encode(), os.getpid()

def processes():
    by_parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:  # a process may end between the listing and the read: an empty or missing stat is skipped
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
            fields = text[text.rindex(")") + 2:].split()
            comm = text[text.index("(") + 1:text.rindex(")")]
            by_parent.setdefault(int(fields[1]), []).append((int(name), fields[19], comm))
        except (OSError, ValueError, IndexError):
            continue
    return by_parent

def descendants(root):
    tree, out, todo = processes(), {}, [root]
    while todo:
        for pid, started, comm in tree.get(todo.pop(), ()):
            if pid != me:
                out[pid] = started
                names[pid] = comm
                todo.append(pid)
    return out

known, names = {}, {}
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.25)
    if ready:
        if sys.stdin.read(1) == "x":
            sys.exit(0)  # the driver shut Ray down itself
        break  # the pipe closed: the driver is gone
    try:
        known.update(descendants(driver))
    except Exception:  # never die while the driver lives: a missed poll is taken again in two seconds
        pass
for _ in range(2):  # what they started in the meantime too
    for pid in list(known):
        try:
            known.update(descendants(pid))
        except Exception:
            pass
import time
# the instance's processes, wherever they were reparented: the token, or (where a retitled process has written
# over its environment) the pid of one of its raylets, which Ray puts in what a raylet starts
marks = [b"FARM_RAY_OWNER=" + token + b"\0"] + [b"RAY_RAYLET_PID=%d\0" % p for p, n in names.items() if n == "raylet"]
for _ in range(10):  # again, for what a dying raylet was starting as the driver died
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read()
                if any(m in env for m in marks):
                    os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.5)
for pid, started in known.items():
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        if text[text.rindex(")") + 2:].split()[19] == started:
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
"""


class Reaper:
    """The watcher of one embedded Ray instance; ``done()`` once Ray was shut down normally."""

    def __init__(self) -> None:
        self.proc: Any = None
        if not sys.platform.startswith("linux"):
            return
        token = uuid.uuid4().hex
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), token],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         close_fds=True)
        except OSError as exc:  # no watcher: a kill -9 of this driver may leave Ray's agents behind, as before
            log.debug("farm: no watcher for the embedded Ray instance: %s", exc)
            return
        # inherited by every process Ray starts from here (the watcher, started before, has none)
        os.environ[OWNER_ENV] = token

    def done(self) -> None:
        os.environ.pop(OWNER_ENV, None)
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(b"x")
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.proc = None
