"""Progress of a farm run for people: a live display on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

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
    return (f"{status.finished}/{status.total} candidates ({pct:.0f} %) in {clock(status.elapsed_s)}: "
            f"{status.remeasured} re-measured, {status.failed} failed; {busy}/{len(status.workers)} workers busy"
            f"{f', {restarting} restarting' if restarting else ''}; {left}")


PHASE_LINES = {"starting": "starting Ray and the device workers...",
               "verifying": "verifying the decisions where they are replayed (farm.ops beside the direct call)..."}


class ProgressView:
    """Feed it FarmStatus snapshots (``update``); ``close`` at the end."""

    def __init__(self, console: Console, title: str, *, interval_s: float = 10.0, header: Any = None) -> None:
        self.console = console
        self.interval_s = interval_s
        self.live: Live | None = None
        self._last_line = 0.0
        self.header = header  # printed with the first update: a run that starts no Ray instance prints none
        self.title = title
        self.bar: Progress | None = None

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
        if status.phase in PHASE_LINES:  # no candidate counts to show: what is happening instead
            line = PHASE_LINES[status.phase]
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
        if now - self._last_line < self.interval_s and status.phase != "done":
            return
        self._last_line = now
        self.console.print(Text(progress_line(status)), soft_wrap=True)

    def _workers(self, status: Any) -> Table:
        t = Table(show_header=True, header_style="dim", box=None)
        for col in ("worker", "device", "state", "working on", "candidates", "failed", "restarts"):
            t.add_column(col)
        for w in status.workers:
            style = {"busy": "green", "restarting": "yellow", "idle": "dim"}.get(w.state, "")
            t.add_row(Text(w.name), Text(w.device), Text(w.state, style=style), Text(w.problem),
                      str(w.candidates), str(w.failures), str(w.restarts))
        t.caption = Text(f"{status.failed} failed, {status.remeasured} finalist re-measurements")
        return t

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
