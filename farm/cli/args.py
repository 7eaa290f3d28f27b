"""Argument types of the farm command: numbers checked where they are parsed."""

from __future__ import annotations

import argparse


def _seconds(text: str, *, zero: bool) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(f"expected a {'' if zero else 'positive, '}finite number of seconds"
                                         f"{' >= 0' if zero else ''}, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    return _seconds(text, zero=False)


def nonnegative_seconds(text: str) -> float:
    return _seconds(text, zero=True)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def nonnegative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def fraction(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1] (e.g. 0.05), got {text!r}")
    return value


def add_verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """``-v`` after the command as well as before it (``farm report X -v`` as ``farm -v report X``), on every
    subcommand: its count goes to ``command_verbose`` (see :func:`verbose_level`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                if not any("-v" in a.option_strings for a in sub._actions):
                    sub.add_argument("-v", "--verbose", action="count", default=0, dest="command_verbose",
                                     help="every column in the tables and more log lines (as farm -v COMMAND)")
                add_verbose_everywhere(sub)


def verbose_level(args: argparse.Namespace) -> int:
    """How many -v were given, before and after the command."""
    return int(getattr(args, "verbose", 0) or 0) + int(getattr(args, "command_verbose", 0) or 0)
