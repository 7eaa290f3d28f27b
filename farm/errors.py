"""The exceptions tunefarm raises.

    FarmError                 anything the farm reports on purpose
    ├── InputError            bad user input: names the source, field and value
    ├── UnknownNameError      an engine, op or policy name that nobody registered
    ├── UsageError            an API called out of order (guards)
    ├── AutotuneError         tuning could not produce a winner
    ├── FlatBufferError       bytes that are not a well-formed buffer (farm.devices.fb.verify)
    ├── RuntimeUnavailable    a GPU runtime that cannot be loaded (farm.devices.runtimes.base)
    │   └── NoDeviceError     the runtime loads but sees no device
    ├── RuntimeCallError      a runtime call that failed (farm.devices.runtimes.base)
    ├── NoSelection           no policy chose an engine (farm.replay.selection)
    ├── WorkerFailed          a farm worker could not open its device (farm.fleet.on_ray.worker)
    └── FarmFailed            the farm could not run: no devices, workers that never start (farm.fleet.on_ray.launcher)

The CLI prints a FarmError as one line and exits non-zero; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

from typing import Any

_NO_VALUE = object()


class FarmError(Exception):
    """Base class of every error tunefarm raises on purpose."""


def _brief(value: Any) -> str:
    """A value as the user wrote it, cut short when long (a hostile file can hold a megabyte in one field)."""
    try:
        text = repr(value)
    except ValueError:  # an integer too long to print
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return text if len(text) <= 200 else f"{text[:120]}... ({len(text)} characters)"


class InputError(FarmError, ValueError):
    """Bad input. The message names where (source and field path) and the value."""

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        value: Any = _NO_VALUE,
        source: str = "",
    ) -> None:
        self.reason = message
        self.field = field
        self.value = None if value is _NO_VALUE else value
        self.has_value = value is not _NO_VALUE
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = ": ".join(part for part in (self.source, self.field) if part)
        text = f"{where}: {self.reason}" if where else self.reason
        if self.has_value:
            text += f" (got {_brief(self.value)})"
        return text

    def within(self, *, source: str = "", prefix: str = "") -> "InputError":
        """The same error, located inside a file and/or under a parent field."""
        field = self.field
        if prefix:
            field = f"{prefix}.{field}" if field and not field.startswith("[") else f"{prefix}{field}"
        err = InputError(
            self.reason,
            field=field,
            value=self.value if self.has_value else _NO_VALUE,
            source=source or self.source,
        )
        return err


class UnknownNameError(FarmError, LookupError):
    """A name (engine, op, policy, knob) that is not registered."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0]) if self.args else ""


class UsageError(FarmError, RuntimeError):
    """An API used out of order, e.g. adding plan specs after plans were built."""


class AutotuneError(FarmError, RuntimeError):
    """Tuning could not complete: no candidates, every candidate failed, or priming aborted.

    ``results`` holds the per-candidate results produced before the failure.
    """

    def __init__(self, message: str, results: Any = ()) -> None:
        super().__init__(message)
        self.results = list(results)


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (200 characters at most), or its type's name when it says nothing."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
