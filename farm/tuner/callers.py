"""What a confirmation sample (and ``farm verify``) calls: each participant's call as production makes it.

* The default is timed as the plain library call a user makes without the farm (the engine's
  ``direct_call``: ``torch.matmul(A, B)``, ``F.conv2d(...)``, ``np.matmul(A, B)``): a winner must beat
  that, not the farm's own wrapper of it.
* Every other participant is called through farm.ops' own entry point (``farm.dispatch.OpCalls``) bound
  to its plan, so the dispatch, the engine's wrapper, flag contexts and the output allocation are part
  of its time, as they are of a replaying caller's.
* Where farm.ops has no entry point for the problem (conv_dgrad, a layout it would not produce), the plan
  itself is called, as replay would run it.

Each caller holds one call per input set; samples take the sets in turn. With ``cold_cache`` the sets
are sized from the device's last-level cache, so that no call finds its inputs there.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from farm.devices.arrays import make_tensors
from farm.devices.device import Device
from farm.devices.timing import Timer
from farm.dispatch.binding import Bound
from farm.dispatch.calls import OpCalls, entry_point
from farm.dispatch.frameworks import Placement
from farm.model.engine import DirectCall, DirectCallable, Engine
from farm.model.problem import Problem

DIRECT, REPLAY, PLAN = "direct", "replay", "plan"  # what a caller calls (the results' call_path column)

COLD_CACHE_FACTOR = 2.0  # with cold_cache, the input sets hold at least twice the last-level cache
MAX_INPUT_SETS = 1024
MEMORY_SHARE = 0.25  # of the device's memory, at most, for the input sets


@dataclass(frozen=True)
class Caller:
    """One participant's production call, once per input set (each a function of no arguments)."""

    calls: tuple[Callable[[], Any], ...]
    path: str  # DIRECT, REPLAY or PLAN
    label: str  # what is called: "torch.matmul(A, B)", "farm.ops.matmul", "cpu.conv.im2col's plan"

    def describe(self) -> str:
        return {DIRECT: f"the direct call {self.label}", REPLAY: f"through {self.label} (its dispatch included)",
                PLAN: f"{self.label}, called straight (no farm dispatch)"}[self.path]


# -- input sets ---------------------------------------------------------------------------------
def cache_bytes(device: Device) -> int:
    """The cache inputs must outgrow to come from memory: the GPU's L2, the host's last-level cache."""
    if device.vendor == "cpu":
        from farm.devices.runtimes.cpu import last_level_cache_bytes

        return max(last_level_cache_bytes(), device.properties.l2_bytes)
    return int(device.properties.l2_bytes)


def input_set_count(problem: Problem, device: Device, *, rotating_buffers: int = 0, cold_cache: bool = False) -> int:
    """How many input sets calls rotate over: ``1 + rotating_buffers``, and with ``cold_cache`` enough that
    the others' inputs fill twice the cache between two uses of one set (within a quarter of the device's
    memory and MAX_INPUT_SETS)."""
    base = 1 + rotating_buffers
    if not cold_cache:
        return base
    per_set = max(1, sum(problem.tensor(t).nbytes for t in problem.input_ids))
    need = 1 + math.ceil(COLD_CACHE_FACTOR * cache_bytes(device) / per_set)
    return max(base, min(need, input_set_cap(problem, device)))


def input_set_cap(problem: Problem, device: Device) -> int:
    """The most input sets a caller rotates over with cold caches: MAX_INPUT_SETS, within a quarter of the
    device's memory (a count recorded elsewhere, a file's, is held to it too)."""
    per_set = max(1, sum(problem.tensor(t).nbytes for t in problem.input_ids))
    return max(1, min(MAX_INPUT_SETS, int(MEMORY_SHARE * device.properties.total_memory) // per_set))


def input_sets(problem: Problem, device: Device, tensors: Mapping[str, Any], count: int) -> list[Mapping[str, Any]]:
    """The given tensors, then ``count - 1`` sets with inputs in other memory (outputs shared).

    Where the arrays live on a device (``clone``), the others are device copies of the given inputs: other
    memory is what keeps them out of the cache, and copying on the device costs nothing next to drawing
    gigabytes of random numbers on the host. Elsewhere they are fresh random inputs.
    """
    sets: list[Mapping[str, Any]] = [tensors]
    clone = getattr(device.arrays, "clone", None)
    for i in range(count - 1):
        fresh = {t: clone(tensors[t]) for t in problem.input_ids} if clone is not None else \
            make_tensors(problem, device.arrays, 1000 + i)
        sets.append({**{o: tensors[o] for o in problem.output_ids}, **{t: fresh[t] for t in problem.input_ids}})
    return sets


# -- callers ------------------------------------------------------------------------------------
def direct_caller(problem: Problem, engine: Engine | None, device: Device,
                  sets: Sequence[Mapping[str, Any]]) -> Caller | None:
    """The plain library call of ``engine`` (usually the op's default engine), or None where it has none."""
    make = engine.direct_call if isinstance(engine, DirectCallable) else None
    direct: DirectCall | None = make(problem, device) if make is not None else None
    if direct is None:
        return None
    return Caller(tuple(direct.bind(s) for s in sets), DIRECT, direct.label or getattr(direct.fn, "__name__", "?"))


class NotThisProblem(Exception):
    """farm.ops would make another problem of these tensors (another output layout): it never replays this one."""


def pinned_calls(problem: Problem, bound: Bound) -> OpCalls:
    """farm.ops' entry points with every call of ``problem`` bound to ``bound`` (a measured plan); a call that
    makes another problem raises NotThisProblem."""

    def binder(seen: Problem, where: Placement) -> tuple[Bound, None, None]:
        if seen.key != problem.key:
            raise NotThisProblem(f"farm.ops makes {seen.label()} of these tensors, not {problem.label()}")
        return bound, None, None

    return OpCalls(binder)


def replay_caller(problem: Problem, calls: OpCalls, sets: Sequence[Mapping[str, Any]]) -> Caller | None:
    """The problem's calls through ``calls``' entry point (the first is made now: it binds), or None where
    farm.ops has no entry point for it or would make another problem of its tensors."""
    entry = entry_point(problem)
    if entry is None:
        return None
    name, ids, kwargs = entry
    fn = getattr(calls, name)
    made = tuple(functools.partial(fn, *[s[t] for t in ids], **kwargs) for s in sets)
    try:
        made[0]()
    except NotThisProblem:
        return None
    return Caller(made, REPLAY, f"farm.ops.{name}")


def plan_caller(problem: Problem, device: Device, engine_name: str, plan: Any, workspace: Any,
                sets: Sequence[Mapping[str, Any]]) -> Caller:
    """The plan called as replay runs it: its ``produce`` (the library's own output) when it has one and needs
    no workspace, else a fresh output and ``run`` on the caller's stream."""
    one = eager_call(problem, device, plan, workspace)
    return Caller(tuple(functools.partial(one, s) for s in sets), PLAN, f"{engine_name}'s plan")


def eager_call(problem: Problem, device: Device, plan: Any, workspace: Any) -> Callable[[Mapping[str, Any]], Any]:
    """One call as replay makes it of a plan: ``produce`` when it has one and needs no workspace, else a fresh
    output and ``run`` on the caller's stream."""
    produce = getattr(plan, "produce", None) if workspace is None else None
    if produce is not None and all(problem.tensor(o).is_contiguous for o in problem.output_ids):
        return produce
    outputs = [problem.tensor(o) for o in problem.output_ids]
    empty = device.arrays.empty
    stream = device.stream

    def call(tensors: Mapping[str, Any]) -> None:
        plan.run({**tensors, **{d.id: empty(d) for d in outputs}}, workspace, stream)

    return call


def participant_caller(problem: Problem, device: Device, engine: Engine | None, engine_name: str, knobs: Any,
                       plan: Any, workspace: Any, sets: Sequence[Mapping[str, Any]], *, direct: bool) -> Caller:
    """A participant's caller, after one call (a warm-up). ``direct`` (the default): its engine's direct library
    call, else its plan called straight (the code a user without the farm runs, no farm dispatch). Any other:
    through farm.ops' entry point bound to ``plan``, else (no entry point for the problem) the plan itself."""
    if direct:
        caller = direct_caller(problem, engine, device, sets) or \
            plan_caller(problem, device, engine_name, plan, workspace, sets)
        caller.calls[0]()
        return caller
    caller = replay_caller(problem, pinned_calls(problem, Bound(problem, engine_name, knobs, plan, workspace,
                                                                "measured")), sets)
    if caller is not None:
        return caller
    caller = plan_caller(problem, device, engine_name, plan, workspace, sets)
    caller.calls[0]()
    return caller


# -- samples ------------------------------------------------------------------------------------
def estimate_ms(timer: Timer, caller: Caller, calls: int = 8) -> float:
    """One call's time, from ``calls`` back-to-back calls (after a warm-up): what sizes a sample."""
    seq = list(itertools.islice(itertools.cycle(caller.calls), calls))
    return timer.measure(lambda: [f() for f in seq]) / calls


def calls_per_sample(estimates: Mapping[Any, float], reference: Any, target_ms: float, *, most: int = 4096,
                     slowest_share: float = 10.0) -> int:
    """One number of calls a sample for every participant of a round: the reference's calls in ``target_ms``
    (the fastest's where there is no reference), so that a sample's fixed cost weighs the same on all; at most
    ``most``, and no more than keeps the slowest participant's sample within ``slowest_share`` targets."""
    finite = [v for v in estimates.values() if v > 0 and math.isfinite(v)]
    if not finite:
        return 1
    ref = estimates.get(reference)
    base = ref if ref is not None and ref > 0 and math.isfinite(ref) else min(finite)
    n = math.ceil(target_ms / base)
    n = min(n, max(1, math.floor(slowest_share * target_ms / max(finite))))
    return int(max(1, min(most, n)))


def eager_sampler(timer: Timer, caller: Caller, n: int, host: list[float] | None = None, *,
                  by_host: bool = False) -> Callable[[], float]:
    """``sample()`` -> ms a call of ``n`` back-to-back calls (no synchronisation between them), the input sets
    taken in turn across samples. An untimed call on the set before the sample's first comes just before it:
    every sample starts from the state a call leaves (a BLAS library's threads awake, a launch queue in
    flight), whichever participant ran last in the round; else the one timed second in a round gains from the
    first, and a round's order, not the candidate, decides a short sample. ``host`` receives each sample's host
    time a call (issuing the calls, not waiting for the device: a sample's calls stay far below a launch queue's
    depth); ``by_host``: the sample is that host time (what a step the host bounds pays)."""
    calls, m = caller.calls, len(caller.calls)
    turn = [0]
    issued = [0.0]

    def sample() -> float:
        k = turn[0]
        seq = [calls[(k + i) % m] for i in range(n)]  # made before the clock starts
        turn[0] = (k + n) % m
        calls[(k - 1) % m]()

        def loop() -> None:
            t0 = time.perf_counter()
            for f in seq:
                f()
            issued[0] = time.perf_counter() - t0

        t = timer.measure(loop) / n
        h = issued[0] * 1e3 / n
        if host is not None:
            host.append(h)
        return h if by_host else t

    return sample


def graph_sampler(device: Device, caller: Caller, repeats: int) -> tuple[Callable[[], float], str]:
    """``sample()`` -> ms a call of a captured device graph of ``repeats`` calls over the input sets in turn
    (device time: no launch cost), and a note; plain back-to-back calls where the device captures no graphs."""
    calls, m = caller.calls, len(caller.calls)
    capture = device.extras.get("capture_graph")
    if capture is None:
        seq = [calls[i % m] for i in range(repeats)]

        def plain() -> float:
            return device.timer.measure(lambda: [f() for f in seq]) / repeats

        return plain, f"{device.runtime.name} devices offer no graph capture; timed plain calls"
    turn = itertools.count()
    replay = capture(device, lambda: calls[next(turn) % m](), repeats)
    return (lambda: device.timer.measure(replay) / repeats), ""


def rotating_inputs(problem: Problem, device: Device, tensors: Mapping[str, Any],
                    config: Any) -> list[Mapping[str, Any]]:
    """The tensor sets timed runs cycle through: the given one, then ``rotating_buffers`` others, or with
    ``cold_cache`` as many as keep every run's inputs out of the device's cache."""
    count = input_set_count(problem, device, rotating_buffers=config.rotating_buffers, cold_cache=config.cold_cache)
    return input_sets(problem, device, tensors, count)
