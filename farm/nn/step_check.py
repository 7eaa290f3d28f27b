"""The model check: does each routed decision make the model's step faster, where it is called?

A loop of one operation hides what a model's step pays for it (a host cost behind the device's time, or the
other way round), so each decision ``farm.apply`` routes is judged on the step itself, in its calling mode
(eager calls, or one captured CUDA graph of the step):

1. paired rounds, the order drawn anew each round: the step untouched (every call the library's), with every
   routed decision, and with each decision alone; a variant stops once its 99 % interval against the untouched
   step lies wholly on one side of 1 (8 rounds at the least), the others go on to the most rounds;
2. a decision the step is not faster with, beyond noise (the 99 % interval of its paired speed-up wholly above
   1), is withdrawn: applying the farm never costs the model what it did not gain;
2b. except where small gains add up: the decisions within noise alone but leaning faster (a speed-up above 1,
   its interval not wholly below) are timed together, with the ones that hold, against the ones that hold; if
   the step is faster with them beyond noise, they are kept together (28 layers of a microsecond each are
   0.6 % of a decode step: below one decision's noise, above the group's);
3. the step with the decisions kept is measured against the untouched step again; if it is slower beyond noise
   (its 99 % interval below 1), every decision is withdrawn.

The result (``StepCheck``) says which were withdrawn and why; farm.nn.step_record writes it where the decisions
live, so a later reduce, ``farm report`` and a replay agree.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from farm.errors import UsageError
from farm.model.knobs import candidate_label
from farm.model.problem import Problem
from farm.nn.routing import Applied, Routed
from farm.nn.torch_calls import torch_module
from farm.tuner.judging.paired import PairedRatio, min_rounds, paired_ratio

log = logging.getLogger("farm.nn.step_check")
MODES = ("eager", "graph")


@dataclass(frozen=True)
class CheckSettings:
    """Up to ``rounds`` paired rounds (at least the 8 a 99 % interval needs), each sample ``sample_ms`` of steps or
    more; with ``sequential``, a variant stops once its interval decides."""

    rounds: int = 11  # the most: a variant whose interval decides stops there (``sequential``)
    sample_ms: float = 40.0
    seed: int = 0
    sequential: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or self.rounds < min_rounds():
            raise UsageError(f"rounds: at least {min_rounds()} (what a 99 % interval needs), got {self.rounds!r}")
        if not self.sample_ms > 0:
            raise UsageError(f"sample_ms: must be > 0, got {self.sample_ms!r}")


@dataclass(frozen=True)
class Judged:
    """One routed decision on the step: the step alone with it against the untouched one, and the verdict."""

    problem: Problem
    engine: str  # the decision
    knobs: tuple[tuple[str, Any], ...]
    default: str  # the default's engine name (what runs in its place)
    sites: tuple[str, ...]
    alone: PairedRatio | None
    with_samples: tuple[float, ...]
    without_samples: tuple[float, ...]
    kept: bool
    verdict: str  # 'holds: ...' | 'withdrawn: ...'

    @property
    def label(self) -> str:
        return candidate_label(self.engine, self.knobs)


@dataclass(frozen=True)
class StepCheck:
    model: str
    call: str
    untouched_ms: float  # the step, median of its samples
    applied_ms: float  # the step with the decisions kept (the untouched one's where none is kept)
    result: PairedRatio | None  # kept decisions vs untouched (None: nothing kept, or nothing routed)
    judged: tuple[Judged, ...] = ()
    steps_per_sample: int = 0
    rounds: int = 0
    note: str = ""
    checked_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def withdrawn(self) -> list[Judged]:
        return [j for j in self.judged if not j.kept]

    @property
    def speedup(self) -> float:
        return self.result.speedup if self.result is not None else 1.0


def check_step(step: Callable[[], Any], applied: Applied, *, call: str = "eager", model: str = "model",
               settings: CheckSettings | None = None, progress: Callable[[str], None] | None = None) -> StepCheck:
    """Judge every decision ``applied`` routes for ``step()`` (one step of the model, inputs bound), in calling
    mode ``call``; the model is left routing the decisions kept."""
    if call not in MODES:
        raise UsageError(f"call: expected eager or graph, got {call!r}")
    settings = settings or CheckSettings()
    say = progress or (lambda _: None)
    timer = _StepTimer(step, applied, call)
    routed = timer.warm()
    if not routed:
        applied.only(None)
        ms = timer.once()
        return StepCheck(model, call, ms, ms, None, note="no call of the step has a decision other than the default: "
                                                         "nothing is routed, the step runs as it did")
    unfit = timer.uncapturable() if call == "graph" else None
    if unfit is not None:  # nobody can replay this step as a graph: its graph decisions have nothing to run in
        applied.only(frozenset())
        why = f"withdrawn: the model's own step cannot be captured in a CUDA graph ({unfit})"
        judged = [Judged(r.problem, r.route.graph.bound.engine_name, tuple(r.route.graph.bound.knobs),
                         applied.decisions.default_engine(r.problem), tuple(r.sites), None, (), (), False, why)
                  for r in routed if r.route.graph is not None]
        ms = timer.once()
        return StepCheck(model, call, ms, ms, None, tuple(judged), note=why.removeprefix("withdrawn: "))
    keys = [r.problem.key for r in routed]
    variants: dict[str, frozenset[str]] = {"untouched": frozenset(), "all": frozenset(keys)}
    if len(keys) > 1:
        variants.update({k: frozenset((k,)) for k in keys})
    say(f"model check ({call}): {len(keys)} routed decision(s), {len(variants)} variants of the step, "
        f"{settings.rounds} paired rounds")
    samples, n = timer.rounds(variants, settings)
    base = samples["untouched"]
    judged = [_judge(r, samples[r.problem.key if len(keys) > 1 else "all"], base, call,
                     applied.decisions.default_engine(r.problem)) for r in routed]
    judged, kept, measured = _with_small_gains(timer, settings, judged, say, call)
    result: PairedRatio | None = None
    final = base
    if kept:
        if measured is not None:
            again, n, name = measured
        elif kept == frozenset(keys):
            again, name = samples, "all"
        else:
            say(f"model check ({call}): the {len(kept)} decision(s) kept, against the untouched step")
            (again, n), name = timer.rounds({"untouched": frozenset(), "kept": kept}, settings), "kept"
        base, final = again["untouched"], again[name]
        result = paired_ratio(final, base)
    if result is not None and result.speedup_high < 1.0:
        why = f"withdrawn: together with the other decisions kept, the step ran {result.describe()}"
        judged = [_withdraw(j, why) if j.kept else j for j in judged]
        result, final, kept = None, base, frozenset()
    applied.only(kept)
    return StepCheck(model, call, float(np.median(base)), float(np.median(final)), result, tuple(judged), n,
                     settings.rounds)


def _judge(r: Routed, mine: Sequence[float], base: Sequence[float], call: str, default: str) -> Judged:
    base = base[:len(mine)]  # the rounds it was timed in (it may have stopped early): the rows pair by position
    alone = paired_ratio(mine, base)  # with / untouched: its speedup is the step's (untouched / with)
    binding = r.route.eager if call == "eager" else r.route.graph
    assert binding is not None
    if alone.rounds and alone.speedup_low > 1.0:
        verdict = f"holds: the step ran {alone.describe()} with it alone"
    elif alone.rounds and alone.speedup_high < 1.0:
        verdict = f"withdrawn: the step ran {alone.describe()} with it alone: slower than without it"
    else:
        verdict = f"withdrawn: the step ran {alone.describe()} with it alone: no faster beyond noise"
    return Judged(r.problem, binding.bound.engine_name, tuple(binding.bound.knobs), default, tuple(r.sites), alone,
                  tuple(mine), tuple(base), verdict.startswith("holds"), verdict)


def _leaning(j: Judged) -> bool:
    """Withdrawn for want of evidence only: faster alone by its point estimate, not slower beyond noise."""
    a = j.alone
    return not j.kept and a is not None and bool(a.rounds) and a.speedup > 1.0 and a.speedup_high >= 1.0


def _with_small_gains(timer: "_StepTimer", settings: CheckSettings, judged: list[Judged],
                      say: Callable[[str], None], call: str
                      ) -> tuple[list[Judged], frozenset[str], tuple[dict[str, list[float]], int, str] | None]:
    """Step 2b: the decisions leaning faster, timed together with those that hold against those that hold; kept
    where that group is faster beyond noise. Returns the verdicts, the keys kept, and where this timed the kept
    set against the untouched step, (samples, steps a sample, the kept set's variant name)."""
    holding = frozenset(j.problem.key for j in judged if j.kept)
    leaning = [j for j in judged if _leaning(j)]
    if len(judged) < 2 or not leaning:
        return judged, holding, None
    group = holding | {j.problem.key for j in leaning}
    say(f"model check ({call}): {len(leaning)} decision(s) within noise alone but leaning faster, together")
    variants = {"untouched": frozenset(), "group": group, **({"holding": holding} if holding else {})}
    # judged against each other, not against the untouched step: every round counts
    again, n = timer.rounds(variants, dataclasses.replace(settings, sequential=False))
    gain = paired_ratio(again["group"], again["holding" if holding else "untouched"])
    if not (gain.rounds and gain.speedup_low > 1.0):
        return judged, holding, ((again, n, "holding") if holding else None)
    beside = f" (beside the {len(holding)} that hold alone)" if holding else ""
    keep = {j.problem.key for j in leaning}
    judged = [dataclasses.replace(j, kept=True, verdict=(
        f"holds: with it alone the step ran {j.alone.describe()}, within noise; with all {len(leaning)} such "
        f"decision(s){beside} it ran {gain.describe()} against without them")) if j.problem.key in keep else j
              for j in judged]
    return judged, group, (again, n, "group")


def _withdraw(j: Judged, why: str) -> Judged:
    return dataclasses.replace(j, kept=False, verdict=why)


class _StepTimer:
    """Times the step with a chosen set of routed problems: back-to-back steps (eager), or replays of a CUDA graph
    captured of the step for each set (graph)."""

    def __init__(self, step: Callable[[], Any], applied: Applied, call: str) -> None:
        self.step, self.applied, self.call = step, applied, call
        self.gpu = applied.decisions.device.vendor != "cpu"
        torch = torch_module()
        self.sync = (lambda: torch.cuda.synchronize()) if self.gpu else (lambda: None)
        if call == "graph" and not self.gpu:
            raise UsageError("a graph model check needs a CUDA device (the model's parameters are on the CPU)")
        self.graphs: dict[frozenset[str], Any] = {}

    def warm(self) -> list[Routed]:
        """Bind every route the step meets (eager calls, then with routing off); the routed decisions of this mode."""
        self.applied.only(None)
        for _ in range(2):
            self.step()
        self.sync()
        mode = self.call
        return [r for r in self.applied.routed.values()
                if (r.route.eager if mode == "eager" else r.route.graph) is not None]

    def once(self) -> float:
        self.sync()
        t0 = time.perf_counter()
        self.step()
        self.sync()
        return (time.perf_counter() - t0) * 1e3

    def _graph(self, keys: frozenset[str]) -> Any:
        g = self.graphs.get(keys)
        if g is None:
            torch = torch_module()
            self.applied.only(keys)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step()  # warm on a side stream, as torch.cuda.graph asks
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.step()
            self.graphs[keys] = g
        return g

    def uncapturable(self) -> str | None:
        """Why the model's own step (nothing routed) cannot be captured in a CUDA graph (a host copy in its cache
        update, a sync...), or None when it can."""
        try:
            self._graph(frozenset())
        except Exception as exc:  # whatever torch refuses to capture: the reason, in its own words
            self.graphs.pop(frozenset(), None)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"{type(exc).__name__}: {first[:200]}"
        return None

    def sampler(self, keys: frozenset[str], n: int) -> Callable[[], float]:
        """ms a step of ``n`` steps (synchronised at their ends) with ``keys`` routed: replays of the set's graph, or
        eager steps after one untimed step (the set's tables bound again, its state warm)."""
        if self.call == "graph":
            run = self._graph(keys).replay
            return lambda: self._timed(run, n)

        def eager() -> float:
            self.applied.only(keys)
            self.step()
            return self._timed(self.step, n)

        return eager

    def _timed(self, run: Callable[[], Any], n: int) -> float:
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        self.sync()
        return (time.perf_counter() - t0) * 1e3 / n

    def rounds(self, variants: dict[str, frozenset[str]], settings: CheckSettings) -> tuple[dict[str, list[float]], int]:
        """Paired rounds of every variant (``untouched`` among them); a variant stops once the 99 % interval of its
        speed-up against the untouched step lies wholly on one side of 1 (sequential: ``settings.rounds`` is the
        most), so a decision that decides early costs no more rounds. -> samples by variant, steps a sample."""
        probe = self.sampler(variants["untouched"], 1)
        probe()
        n = max(1, math.ceil(settings.sample_ms / max(probe(), 1e-3)))
        samplers = {name: self.sampler(keys, n) for name, keys in variants.items()}
        rng = np.random.default_rng(settings.seed)
        names = list(samplers)
        out: dict[str, list[float]] = {name: [] for name in names}
        timing = set(names)
        for r in range(settings.rounds):
            order = [names[i] for i in rng.permutation(len(names))]  # drawn in full each round: repeatable
            for name in order:
                if name in timing:
                    out[name].append(samplers[name]())
            if settings.sequential and r + 1 >= min_rounds():
                timing -= {name for name in timing - {"untouched"} if _decided(out[name], out["untouched"])}
                if timing == {"untouched"}:
                    break
        return out, n


def _decided(mine: Sequence[float], base: Sequence[float]) -> bool:
    """The paired speed-up's 99 % interval lies wholly above or wholly below 1."""
    ratio = paired_ratio(mine, base)
    return bool(ratio.rounds) and (ratio.speedup_low > 1.0 or ratio.speedup_high < 1.0)
