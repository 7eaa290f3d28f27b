"""What the engines over a library's own plan list share (cuDNN's execution plans, cuBLASLt's algorithms).

Such an engine's knobs are the library's vocabulary (an engine or algorithm id and its knob values, each
``-1`` when the plan leaves it to the library); ``list_plans`` names the plans the library's heuristics
offer for a problem, best first, and each becomes a candidate. Plans are built once per problem, device
and setting and kept (``PlanCache``), so a replay that compiles the recorded winner again finds it built.

On AMD the same contract takes hipBLASLt's solution list and MIOpen's find results: an engine that lists
them (``list_plans``) and builds one by its id plugs in beside these with no change to the farm.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from typing import Any, Callable, Generic, Hashable, TypeVar

from farm.plugin import InputError, Knob

PLANS_ENV = "FARM_LIBRARY_PLANS"
DEFAULT_PLANS = 16
UNSET = -1  # a knob the plan leaves to the library

T = TypeVar("T")


def plan_limit() -> int:
    """How many of a library's listed plans become candidates (FARM_LIBRARY_PLANS, default 16)."""
    text = os.environ.get(PLANS_ENV, "").strip()
    if not text:
        return DEFAULT_PLANS
    try:
        value = int(text)
    except ValueError:
        raise InputError("must be a whole number of plans", field=PLANS_ENV, value=text) from None
    if value < 1:
        raise InputError("must be at least 1", field=PLANS_ENV, value=text)
    return value


def id_knob(name: str, doc: str) -> Knob:
    return Knob.int(name, UNSET, min=UNSET, doc=doc)


class PlanCache(Generic[T]):
    """Built objects by key, each built once even when threads ask together (a lock per key)."""

    def __init__(self) -> None:
        self._items: dict[Hashable, T] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        item = self._items.get(key)
        if item is not None:
            return item
        with self._lock:
            key_lock = self._locks.setdefault(key, threading.Lock())
        with key_lock:
            item = self._items.get(key)
            if item is None:
                item = make()
                self._items[key] = item
            return item

    def __len__(self) -> int:
        return len(self._items)


@functools.lru_cache(maxsize=None)
def import_or_reason(module: str, package: str) -> tuple[Any, str]:
    """The module, or None and why (the package to install), importing torch first: the libraries load
    the CUDA libraries torch already loaded."""
    try:
        importlib.import_module("torch")
        return importlib.import_module(module), ""
    except ImportError as exc:
        return None, f"{package} is not installed (pip install 'tunefarm[cuda-libs]'): {exc}"
    except Exception as exc:  # a library that finds no CUDA library to load raises something else
        return None, f"{package} does not load here: {type(exc).__name__}: {exc}"
