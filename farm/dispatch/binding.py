"""A problem bound to the plan that runs it, and what a call of that layout does with it.

``Bound`` is the engine's side (its plan and workspace); ``Binding`` adds the call's side: the output to
allocate, the conversion back to the caller's tensor type, the separate graph decision, and ``call``, the
whole steady-state call as one function of the tensors (no ``out=``): what a cache hit runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from farm.model.knobs import KnobSettings
from farm.model.problem import Problem


@dataclass
class Bound:
    """A problem bound to the engine that runs it (the steady-state path is ``run``, or ``produce``).

    A plan's workspace is its scratch space: it belongs to one call at a time. ``workspace`` is the first
    caller's; with ``alloc`` (a fresh workspace of the plan's size) every other thread calling the plan gets one of
    its own, so threads calling one bound plan never share scratch. Without ``alloc`` (the tuner's plans, called
    from one thread) every call gets ``workspace``.
    """

    problem: Problem
    engine_name: str
    knobs: KnobSettings
    plan: Any
    workspace: Any
    source: str  # "recorded", "tuned", the answering policy's name, "measured" (the tuner's own)
    alloc: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # plans that can hand back the library's own output (no copy into a given one), when they need no workspace
        self.produce = getattr(self.plan, "produce", None) if self.workspace is None else None
        self._owner = threading.get_ident()
        self._scratch = threading.local()
        self._lock = threading.Lock()

    def scratch(self) -> Any:
        """This thread's workspace (None for a plan that needs none)."""
        if self.workspace is None or self.alloc is None or threading.get_ident() == self._owner:
            return self.workspace
        mine = getattr(self._scratch, "workspace", None)
        if mine is None:
            with self._lock:  # an allocator need not be thread-safe
                mine = self._scratch.workspace = self.alloc()
        return mine

    def run(self, tensors: Mapping[str, Any], stream: Any = None) -> None:
        self.plan.run(tensors, self.scratch(), stream)


@dataclass(frozen=True)
class Binding:
    """What a call of one layout runs. ``call(tensors)`` is the whole call without ``out=``: the library's
    own output where the plan hands it back, else a fresh output written by the plan."""

    bound: Bound
    out_id: str
    out_dims: tuple[int, ...]
    out_dtype: str
    out_strides: tuple[int, ...]
    framework: Any
    back: Callable[[Any], Any] | None  # results back to the caller's type (torch CPU tensors); None: as they are
    alloc: Callable[[], Any]  # a fresh output of the bound layout (no per-call dtype or device lookup)
    # the engine recorded for calls inside a captured graph, when it is not ``bound``'s, and how to tell a capture
    graph: "Binding | None" = None
    capturing: Callable[[], bool] | None = None
    call: Callable[[Mapping[str, Any]], Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "call", self._steady_call())

    def _steady_call(self) -> Callable[[Mapping[str, Any]], Any]:
        if self.graph is not None:
            eager, graph, capturing = self._own_call(), self.graph.call, self.capturing
            assert capturing is not None

            def either(tensors: Mapping[str, Any]) -> Any:
                return graph(tensors) if capturing() else eager(tensors)  # type: ignore[misc]

            return either
        return self._own_call()

    def _own_call(self) -> Callable[[Mapping[str, Any]], Any]:
        produce, back = self.bound.produce, self.back
        if back is not None:  # torch tensors on the CPU run as numpy arrays (shared memory)
            def converted(tensors: Mapping[str, Any]) -> Any:
                return back(self._into_new({k: v.numpy() for k, v in tensors.items()}))

            return converted
        if produce is not None:
            return produce  # the library call itself
        return self._into_new

    def _into_new(self, tensors: Mapping[str, Any]) -> Any:
        produce = self.bound.produce
        if produce is not None:
            return produce(tensors)
        out = self.alloc()
        self.bound.plan.run({**tensors, self.out_id: out}, self.bound.scratch(), None)
        return out

    def into(self, tensors: Mapping[str, Any], out: Any) -> Any:
        """The call with ``out=`` given: checked against the bound layout; a torch output of another layout is
        written through a buffer of the bound one (the plan writes the layout it was tuned for)."""
        from farm.errors import InputError

        chosen = self.graph if self.graph is not None and self.capturing() else self  # type: ignore[misc]
        if chosen.back is not None:
            tensors = {k: v.numpy() for k, v in tensors.items()}
            given = out
            out = out.numpy()
        dims, strides, _ = chosen.framework.describe(out)
        if dims != chosen.out_dims:
            raise InputError(f"out must have shape {list(chosen.out_dims)}", field="out", value=list(dims))
        if chosen.back is None and chosen.framework.name == "torch" and strides != chosen.out_strides:
            given, buffer = out, chosen.alloc()
            chosen.bound.run({**tensors, chosen.out_id: buffer})
            return given.copy_(buffer)
        chosen.bound.run({**tensors, chosen.out_id: out})
        return out if chosen.back is None else given
