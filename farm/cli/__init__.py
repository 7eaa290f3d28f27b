"""The farm command line: farm tune | reduce | report | diff | publish | engines | devices | policies."""

from farm.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
