"""The CLI's output: consoles that never print a control character from a file, JSON, and log lines."""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import logging
import os
import re
import sys
from typing import Any, Iterable, Iterator

from rich.console import Console
from rich.segment import Segment

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class _SafeConsole(Console):
    """A console that prints the text of names and messages with their control characters made visible:
    a name from a file (workload, results, override file) cannot move the cursor or retitle the terminal."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", seg.text), seg.style)
            for seg in buffer)


MIN_WIDTH = 80  # narrower, a table's columns shrink to nothing and its figures vanish: it runs wider instead


def make_console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    # piped output (logs, CI) gets wide tables rather than 80-column wrapping, unless COLUMNS says a width
    columns = os.environ.get("COLUMNS", "").strip()
    width = probe.width if probe.is_terminal or (columns.isdigit() and int(columns) > 0) else 200
    return _SafeConsole(stderr=stderr, highlight=False, width=max(width, MIN_WIDTH))


# where --json output goes: the process's real stdout while json_stdout() holds it (else sys.stdout)
_JSON_OUT: contextvars.ContextVar[Any] = contextvars.ContextVar("farm_json_out", default=None)


def print_json(data: Any) -> None:
    """``data`` as strict JSON (a time that is not finite is null: JSON has no Infinity or NaN, and jq, DuckDB and
    browsers refuse them)."""
    out = _JSON_OUT.get() or sys.stdout
    out.write(json.dumps(_finite(data), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")
    out.flush()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@contextlib.contextmanager
def json_stdout() -> Iterator[None]:
    """While a --json command runs, file descriptor 1 points at stderr, so whatever else writes to stdout (Ray's
    "(raylet) A worker died..." lines, a library's print) lands on stderr; the JSON goes to the real stdout.
    Where stdout is no file (a test's capture), nothing is moved."""
    try:
        sys.stdout.flush()
        fd, err = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    saved = os.dup(fd)
    os.dup2(err, fd)
    out = os.fdopen(saved, "w", encoding="utf-8", closefd=True)
    token = _JSON_OUT.set(out)
    try:
        yield
    finally:
        _JSON_OUT.reset(token)
        sys.stdout.flush()
        os.dup2(saved, fd)
        out.close()


def real_stdout() -> Any:
    """The real stdout while a --json command runs (json_stdout), else None. Read it in the command's thread."""
    return _JSON_OUT.get()


def real_stdout_back(out: Any) -> None:
    """Before this process replaces itself (os.execv), file descriptor 1 is ``out`` (:func:`real_stdout`) again:
    a --json command that restarts prints its JSON where the first one would have."""
    if out is not None:
        sys.stdout.flush()
        os.dup2(out.fileno(), sys.stdout.fileno())


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (it may be replaced after setup, e.g. by test capture)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _SafeFormatter(logging.Formatter):
    """Log lines with control characters made visible (names in them come from files)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)
                         for line in super().format(record).split("\n"))


def setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _StderrHandler()
    handler.setFormatter(_SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("farm")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
