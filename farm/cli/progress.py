"""Progress of a farm run for people: a live display on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import os
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text


def clock(seconds: float) -> str:
    """``0:07``, ``12:30``, ``1:02:03``: a duration as a clock reads (never a bracket that looks like a terminal code)."""
    s = max(int(seconds), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def progress_line(status: Any) -> str:
    """One plain line: counts, elapsed time, and what is left (``done`` at the end, never an unknown ETA there)."""
    if not status.total and status.phase != "done":  # the workers list the candidates of the first problems
        return f"discovering candidates in {clock(status.elapsed_s)}; {len(status.workers)} worker(s) up"
    busy = sum(w.state == "busy" for w in status.workers)
    restarting = sum(w.state == "restarting" for w in status.workers)
    pct = 100 * status.finished / status.total if status.total else 100.0
    if status.phase == "done" or (status.total and status.finished >= status.total):
        left = "done"
    elif status.eta_s is None:
        left = "time left: estimating"
    else:
        left = f"about {clock(status.eta_s)} left"
    live = [w for w in status.workers if w.state != "lost"]
    return (f"{status.finished}/{status.total} candidates ({pct:.0f} %) in {clock(status.elapsed_s)}: "
            f"{status.remeasured} re-measured, {status.failed} failed; {busy}/{len(live)} workers busy"
            f"{f', {restarting} restarting' if restarting else ''}{nodes_part(status)}; {left}")


def nodes_part(status: Any) -> str:
    """``; 3 nodes (1 lost, 1 joined); waiting for a device of SIG (25 s left)`` ('' on one node that stayed)."""
    nodes = getattr(status, "nodes", [])
    lost = sum(n.state == "lost" for n in nodes)
    joined = sum(n.joined_s is not None for n in nodes)
    text = ""
    if len(nodes) > 1 or lost or joined:
        more = ", ".join(x for x in (f"{lost} lost" if lost else "", f"{joined} joined" if joined else "") if x)
        text = f"; {len(nodes)} nodes" + (f" ({more})" if more else "")
    for sig, left in getattr(status, "waiting", {}).items():
        text += f"; waiting for a device of {sig} ({left:.0f} s left)"
    for sig, names in getattr(status, "given_up", {}).items():
        text += f"; {len(names)} problem(s) wait for a device of {sig}"
    return text


def node_events(status: Any, seen: dict[Any, tuple[str, Any, int]]) -> list[str]:
    """Lines for nodes that joined or were lost since the last status (``seen``: node id -> (state, joined))."""
    lines = []
    for n in getattr(status, "nodes", []):
        before = seen.get(n.node_id)
        seen[n.node_id] = (n.state, n.joined_s, len(n.workers))
        where = f"node {n.short_id} ({n.host or '?'}: {', '.join(n.workers)})"
        if n.state == "lost" and (before is None or before[0] != "lost"):
            lines.append(f"{where} lost at {clock(n.lost_s or 0)}: its tasks run again on devices of its kind")
        elif before is None and n.joined_s is not None:
            lines.append(f"{where} joined at {clock(n.joined_s)}: its devices take work now")
        elif before is not None and n.state != "lost" and len(n.workers) > before[2]:
            # a joined node's devices start one by one: the ones that started since its join line are named too
            lines.append(f"node {n.short_id} ({n.host or '?'}): {', '.join(n.workers[before[2]:])} take(s) work now too")
    for sig, names in getattr(status, "given_up", {}).items():
        if ("given up", sig) not in seen:
            seen[("given up", sig)] = ("", None, 0)  # type: ignore[index]
            lines.append(f"no device of {sig} came back: {len(names)} problem(s) wait for one (a resume measures them)")
    return lines


PHASE_LINES = {"starting": "starting Ray and the device workers...",
               "verifying": "verifying the decisions where they are replayed (farm.ops beside the direct call)..."}


class ProgressView:
    """Feed it FarmStatus snapshots (``update``); ``close`` at the end."""

    def __init__(self, console: Console, title: str, *, interval_s: float = 10.0, header: Any = None,
                 joining: str = "") -> None:
        self.console = console
        # the starting line as it is: an embedded instance is started, a cluster (``joining``: its address) joined
        self.phase_lines = dict(PHASE_LINES, **({"starting": f"joining the Ray cluster at {joining} and starting the "
                                                             "device workers..."} if joining else {}))
        self.interval_s = interval_s
        self.live: Live | None = None
        self._last_line = 0.0
        self.header = header  # printed with the first update: a run that starts no Ray instance prints none
        self.title = title
        self.bar: Progress | None = None
        self._nodes: dict[Any, tuple[str, Any]] = {}  # what node_events has reported
        self._done: tuple[int, int, int] | None = None  # the counts of the "done" line printed (printed once)
        self.load_peak = 0.0  # the highest 1-minute load average of this host seen during the run

    def _start(self) -> None:
        if self.header is not None:
            self.console.print(self.header, soft_wrap=True)
            self.header = None
        console, title = self.console, self.title
        if console.is_terminal and self.bar is None:
            self.bar = Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("candidates"), TimeElapsedColumn(), TextColumn("ETA"),
                                TimeRemainingColumn(), console=console)
            self.task = self.bar.add_task("tune", total=None)
            self.live = Live(Text(""), console=console, refresh_per_second=4, transient=True)
            self.live.start()

    def update(self, status: Any) -> None:
        if self.header is not None or (self.bar is None and self.console.is_terminal):
            self._start()
        try:
            self.load_peak = max(self.load_peak, os.getloadavg()[0])
        except (AttributeError, OSError):  # not on this platform
            pass
        for line in node_events(status, self._nodes):  # a node joining or lost is news, shown at once
            self.console.print(Text(line, style="yellow" if " lost " in line or "came back" in line else ""),
                               soft_wrap=True)
        if status.phase in self.phase_lines:  # no candidate counts to show: what is happening instead
            line = self.phase_lines[status.phase]
            if self.live is not None:
                self.live.update(Text(f"{self.title}: {line}", style="dim"))
            else:
                self.console.print(Text(line), soft_wrap=True)
            return
        if self.live is not None:
            self.bar.update(self.task, total=status.total, completed=status.finished)
            self.live.update(Group(self.bar, self._workers(status)))
            return
        now = time.monotonic()
        line = progress_line(status)
        done = line.endswith("; done")
        if (now - self._last_line < self.interval_s and not done) or (done and self._done == (
                status.finished, status.total, status.failed)):
            return  # the last update and the run's end both say "done": one line
        self._last_line = now
        if done:
            self._done = (status.finished, status.total, status.failed)
        self.console.print(Text(line), soft_wrap=True)

    def _workers(self, status: Any) -> Table:
        t = Table(show_header=True, header_style="dim", box=None)
        nodes = len({w.node_id for w in status.workers}) > 1
        for col in ("worker", *(("node",) if nodes else ()), "device", "state", "working on", "candidates", "failed",
                    "restarts"):
            t.add_column(col)
        for w in status.workers:
            style = {"busy": "green", "restarting": "yellow", "idle": "dim", "lost": "red"}.get(w.state, "")
            t.add_row(Text(w.name), *((Text(w.node_id[:8]),) if nodes else ()), Text(w.device),
                      Text(w.state, style=style), Text(w.problem), str(w.candidates), str(w.failures), str(w.restarts))
        t.caption = Text(f"{status.failed} failed, {status.remeasured} re-measured{nodes_part(status)}")
        return t

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
