"""Stop what an embedded Ray instance started when its driver dies without shutting it down (``kill -9``).

Ray's raylet exits when its driver's session ends, but the processes it started (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) are orphaned and stay. A small watcher process, started with the embedded instance,
notes every descendant of the driver every two seconds; if the driver's end of a pipe closes without the word
that it shut Ray down itself, the watcher kills what it noted (checking each process's start time, so a reused
pid is never hit). Linux only (it reads /proc); elsewhere nothing is started.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

log = logging.getLogger("farm.fleet.reaper")

_WATCHER = r"""
import os, select, signal, sys
driver, me = int(sys.argv[1]), os.getpid()

def processes():
    by_parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:  # a process may end between the listing and the read: an empty or missing stat is skipped
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
            fields = text[text.rindex(")") + 2:].split()
            by_parent.setdefault(int(fields[1]), []).append((int(name), fields[19]))
        except (OSError, ValueError, IndexError):
            continue
    return by_parent

def descendants(root):
    tree, out, todo = processes(), {}, [root]
    while todo:
        for pid, started in tree.get(todo.pop(), ()):
            if pid != me:
                out[pid] = started
                todo.append(pid)
    return out

known = {}
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 2.0)
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
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid())], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
        except OSError as exc:  # no watcher: a kill -9 of this driver may leave Ray's agents behind, as before
            log.debug("farm: no watcher for the embedded Ray instance: %s", exc)

    def done(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(b"x")
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.proc = None
