"""One override file's decisions on one device, as farm.apply routes a model's calls to them.

The file is read and chosen from exactly as production does it (farm.replay.file_replay.FileReplay: the Config
policy over the file, StaticOrdering behind it), so a routed call runs what ``farm.ops`` would. What apply adds:
whether a decision is the *default* (the first engine a problem discovers, with default knobs: what the plain
library call runs), since a call whose decision is the default is not intercepted at all; and which weights
could have a decision that is not (so only those modules are patched).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from farm.devices.arrays import TORCH_DTYPES
from farm.devices.device import Device
from farm.dispatch.binding import Binding, Bound
from farm.dispatch.frameworks import NUMPY, torch_framework
from farm.errors import InputError, UnknownNameError
from farm.model.engine import settings_to_resolved
from farm.model.knobs import candidate_label
from farm.model.problem import Problem
from farm.replay.file_replay import FileReplay
from farm.store.overrides.parsing import call_choice, load_overrides
from farm.store.overrides.entries import OverrideEntry, TensorRule

CALLS = ("eager", "graph")


@dataclass(frozen=True)
class Route:
    """What a call of one problem runs in each calling mode: a Binding (farm.dispatch) where its decision is not
    the default, None where it is (the call goes to the library as if not intercepted)."""

    problem: Problem
    eager: Binding | None
    graph: Binding | None
    labels: Mapping[str, str]  # calling mode -> the decision's label ("torch.matmul[default]" for a default)

    @property
    def routed(self) -> bool:
        return self.eager is not None or self.graph is not None


class Decisions:
    """The decisions of the override file at ``path`` for ``device`` (a GPU: the caller's torch stream runs them)."""

    def __init__(self, path: str, device: Device, calls: tuple[str, ...] = CALLS) -> None:
        self.path = path
        self.device = device
        self.calls = calls  # the calling modes whose decisions are routed
        self.file = load_overrides(path)  # what production would refuse is refused here, naming the rule
        self.replay = FileReplay(path, device)
        self.registry = self.replay.runtime.registry
        self._weights = self._non_default_weights()
        # the ops each calling mode may route (function calls: attention, a module's own matmul)
        self.ops_by_call = {call: {e.op for e in self.file.entries if self._maybe_not_default(e, (call,))}
                            for call in self.calls}

    # -- which modules may be routed ------------------------------------------------------------
    def _non_default_weights(self) -> dict[str, list[TensorRule]]:
        """Per op, the rules of the weight-like tensor (matmul's B, conv's W, a norm's scale) of every entry whose
        decision (in some calling mode) may not be the default; sdpa entries are kept whole (no weight)."""
        out: dict[str, list[TensorRule]] = {}
        for entry in self.file.entries:
            if not self._maybe_not_default(entry):
                continue
            tid = {"matmul": "B", "conv_fprop": "W", "layernorm": "scale", "rmsnorm": "scale"}.get(entry.op)
            rule = next((t for t in entry.tensors if t.tensor_id == tid), None) if tid else None
            out.setdefault(entry.op, []).append(rule or TensorRule(tid, ()))
        return out

    def _maybe_not_default(self, entry: OverrideEntry, calls: tuple[str, ...] | None = None) -> bool:
        """The entry's engine (what every calling mode without a decision of its own runs) or a calling mode's
        decision may not be its problem's default (the exact check is made when a call binds)."""
        chosen = []
        for call in calls or self.calls:
            try:
                # a mode without a decision of its own runs the entry's engine, as production does
                chosen.append(call_choice(entry, call) or (entry.engine_name, entry.knobs))
            except InputError:  # an unreadable graph decision: production would not use it; the others count
                pass
        problem = self._entry_problem(entry)
        first = self.default_engine(problem) if problem is not None else ""
        for pick in chosen:
            if pick is None:
                continue
            engine, knobs = pick
            try:
                e = self.registry.get(engine)
            except UnknownNameError:
                continue  # an engine this process does not run: production declines it too
            if knobs and settings_to_resolved(e, knobs) != settings_to_resolved(e, ()):
                return True
            if problem is not None:  # an exact rule: its problem's default, as a call of it will find it
                if engine != first:
                    return True
            elif getattr(e, "priority", 100) > _first_priority(self.registry, entry.op, self.device.vendor):
                return True  # a wildcard rule: any engine after the first this device runs may not be the default
        return False

    def _entry_problem(self, entry: OverrideEntry) -> Problem | None:
        """The problem an exact rule describes, as a torch model's call makes it here (on a CPU its default is
        torch's own kernel: library "torch"); None for a wildcard or positional rule."""
        problem = entry.problem()
        if problem is not None and self.device.vendor == "cpu" and not problem.library:
            problem = dataclasses.replace(problem, library="torch")
        return problem

    def may_route(self, op: str, weight: tuple[tuple[int, ...], tuple[int, ...], str] | None = None) -> bool:
        """Whether a call of ``op`` with this weight layout (dims, strides, dtype) could have a decision that is not
        the default (False: the module calling it is left as it is)."""
        rules = self._weights.get(op, [])
        if weight is None:
            return bool(rules)
        dims, strides, dtype = weight
        return any(_rule_matches(r, dims, strides, dtype) for r in rules)

    def uncovered(self, op: str, covered: Iterable[tuple[tuple[int, ...], tuple[int, ...], str]]) -> bool:
        """Whether a call of ``op`` could have a decision that is not the default for a weight none of
        ``covered`` (the weight layouts routed modules call it with) matches: a function call of the model's."""
        seen = list(covered)
        return any(not r.dims or not any(_rule_matches(r, *w) for w in seen) for r in self._weights.get(op, []))

    # -- routes ---------------------------------------------------------------------------------
    def route(self, problem: Problem, call: str) -> Route:
        """Bind ``problem``: the decision of each calling mode ``call`` asks for ("auto": both, farm.ops'
        choice by whether a graph is being captured), each as a Binding unless it is the default."""
        eager_bound, graph_bound, _ = self.replay.bind_problem(problem)
        graph_bound = graph_bound or eager_bound
        labels = {"eager": candidate_label(eager_bound.engine_name, eager_bound.knobs),
                  "graph": candidate_label(graph_bound.engine_name, graph_bound.knobs)}
        eager = None if call == "graph" or self.is_default(problem, eager_bound) else self._binding(problem, eager_bound)
        graph = None if call == "eager" or self.is_default(problem, graph_bound) else (
            eager if graph_bound is eager_bound and eager is not None else self._binding(problem, graph_bound))
        return Route(problem, eager, graph, labels)

    def default_engine(self, problem: Problem) -> str:
        """The engine a problem's default runs (its first discovered one, default knobs)."""
        found = self.registry.discover(problem, self.replay.exec_device)
        return self.registry.get(found[0].engine_id).name if found else ""

    def is_default(self, problem: Problem, bound: Bound) -> bool:
        """The bound plan is the problem's default: its first discovered engine with default knobs (a knob
        spelled out at its default value included)."""
        found = self.registry.discover(problem, self.replay.exec_device)
        if not found:
            return True
        first = self.registry.get(found[0].engine_id)
        return bound.engine_name == first.name and \
            settings_to_resolved(first, tuple(bound.knobs)) == settings_to_resolved(first, ())

    def _binding(self, problem: Problem, bound: Bound) -> Binding:
        """farm.ops' per-call path (farm.dispatch) bound to ``bound``: a fresh output of the problem's layout (the
        library's own where the plan hands it back), the caller's stream; CPU torch tensors run as numpy arrays."""
        from farm.nn.torch_calls import torch_module

        torch = torch_module()
        out = problem.output_ids[0]
        d = problem.tensor(out)
        if self.device.vendor == "cpu":
            alloc = NUMPY.allocator(None, d.dims, d.dtype, d.strides)
            if not d.is_contiguous:  # a channels-last convolution's output: numpy's view of torch's strided memory
                bound.produce = None  # a library's own output is contiguous: write the problem's layout instead
                dt = getattr(torch, TORCH_DTYPES[d.dtype])
                alloc = functools.partial(_numpy_of, torch.empty_strided, d.dims, d.strides, dt)
            return Binding(bound, out, d.dims, d.dtype, d.strides, NUMPY, torch.from_numpy, alloc)
        fw = torch_framework(torch)
        like = types.SimpleNamespace(device=torch.device("cuda", self.device.index))
        return Binding(bound, out, d.dims, d.dtype, d.strides, fw, None, fw.allocator(like, d.dims, d.dtype, d.strides))


def _numpy_of(empty_strided: Any, dims: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> Any:
    return empty_strided(dims, strides, dtype=dtype).numpy()


def _first_priority(registry: Any, op: str, vendor: str) -> int:
    """The lowest priority of the engines serving ``op`` that a device of ``vendor`` may run first (a library's
    own CPU kernels are first on a CPU only)."""
    engines = [e for e in registry if op in e.ops and (vendor == "cpu" or not getattr(e, "library", ""))]
    return min((getattr(e, "priority", 100) for e in engines), default=100)


def _rule_matches(rule: TensorRule, dims: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> bool:
    if not rule.dims:
        return True
    if len(rule.dims) != len(dims) or any(r not in (-1, d) for r, d in zip(rule.dims, dims)):
        return False
    if rule.strides and (len(rule.strides) != len(strides) or any(r not in (-1, s) for r, s in zip(rule.strides, strides))):
        return False
    return rule.data_type in (None, dtype)
