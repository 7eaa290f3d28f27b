"""A user's Ctrl-C, told apart from an engine that raises KeyboardInterrupt itself.

Both arrive as KeyboardInterrupt. A process that runs tuning for a user (the ``farm`` command, a farm worker)
installs :data:`SIGINTS`; a KeyboardInterrupt raised while no SIGINT came is then an engine's doing, and fails
that candidate like any other exception. Without the watch installed (the Autotuner used as a library) every
KeyboardInterrupt stops the tuning, as Python's own would.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

# what an engine's code may raise that is that candidate's failure: an engine that calls sys.exit() (or whose
# library does) fails its candidate at once; it does not end the process (a farm worker: its whole task)
# and a KeyboardInterrupt an engine raised itself, told from a user's Ctrl-C by reraise_user_interrupt
ENGINE_ERRORS = (Exception, SystemExit, KeyboardInterrupt)


class SigintWatch:
    """Notes that a SIGINT arrived, then lets the handler that was there before act on it."""

    def __init__(self) -> None:
        self.installed = False
        self.seen = threading.Event()

    def install(self) -> None:
        if self.installed or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            self.seen.set()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)
        self.installed = True

    def from_engine(self, exc: BaseException) -> bool:
        """``exc`` is a KeyboardInterrupt an engine raised, not a user's Ctrl-C."""
        return isinstance(exc, KeyboardInterrupt) and self.installed and not self.seen.is_set()


SIGINTS = SigintWatch()  # the process's one watch: a signal handler is per process


def reraise_user_interrupt(exc: BaseException) -> None:
    """In an ``except`` that catches an engine's errors: a user's Ctrl-C goes on up."""
    if isinstance(exc, KeyboardInterrupt) and not SIGINTS.from_engine(exc):
        raise exc
