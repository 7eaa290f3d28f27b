"""The records of tuning: its settings (AutotuneConfig) and one candidate's outcome (AutotuneResult)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from farm.errors import InputError
from farm.model.knobs import KnobSettings, candidate_label
from farm.model.measurement import StopRule, Strategy
from farm.model.plans import PlanSpec


class TuneMode(str, enum.Enum):
    STANDARD = "standard"
    EXHAUSTIVE = "exhaustive"


class PrimingFailurePolicy(str, enum.Enum):
    ABORT = "abort"
    BENCHMARK_UNPRIMED = "benchmark_unprimed"


class BuildPolicy(str, enum.Enum):
    """Which plans build_plans() compiles (cuDNN's build policies)."""

    ALL = "all"
    HEURISTICS_CHOICE = "heuristics_choice"  # the first plan in heuristic order that compiles


class HeuristicMode(str, enum.Enum):
    """How get_engine_configs() ranks the engines that apply (the autotuning RFC's heuristic modes)."""

    A = "a"  # the selection policies in force (FARM_HEUR_POLICY_ORDER...: a tuned winner first)
    B = "b"  # SelectionHeuristic::StaticOrdering alone: the engines' declared priority
    FALLBACK = "fallback"  # discovery order


class CallMode(str, enum.Enum):
    """How production calls a problem's op: what the confirmation stage times and ranks by."""

    EAGER = "eager"  # back-to-back calls from Python through the replay path: launch cost included
    GRAPH = "graph"  # inside a captured CUDA/HIP graph: device time only


# the one order of calling modes: a problem's primary decision (the override entry's own; the tuner's first-ranked
# row) is its first mode's, the eager one when it has one; the others are written beside it
CALL_ORDER = {c.value: i for i, c in enumerate(CallMode)}


def parse_calls(value: Any, field_name: str = "call") -> tuple[CallMode, ...]:
    """``eager``, ``graph``, or a list of both (each measured and decided on its own)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise InputError("expected eager, graph, or a list of them", field=field_name, value=value)
    out: list[CallMode] = []
    for v in items:
        mode = _enum(CallMode, v, field_name) if isinstance(v, (str, CallMode)) else None
        if mode is None:
            raise InputError("expected eager, graph, or a list of them", field=field_name, value=value)
        if mode in out:
            raise InputError("a calling mode is listed twice", field=field_name, value=value)
        out.append(mode)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class ConfirmSettings:
    """The confirmation stage (farm.tuner.judging.confirm): who is re-measured, how long, when it stops.

    Per problem and calling mode it costs at most ``budget_ms`` of timed rounds, or the 8 rounds a 99 %
    interval needs when those take longer; ``max_candidates`` bounds who is in it.
    """

    enabled: bool = True
    max_rounds: int = 64  # paired rounds at most
    budget_ms: float = 2000.0  # timed rounds stop once they have taken this long (at least 8 rounds run)
    max_candidates: int = 6  # the leader, the default and the incumbent always; then the nearest by median
    runners_up: int = 2  # each session's next fastest are in too, inside the noise band or not (a busy main round)
    # an eager sample times back-to-back calls lasting at least this long (every participant of a round the same
    # number of calls: the reference's in this time); None: 2 ms on a GPU (device events), 10 ms on a CPU (several
    # scheduler periods: what a busy machine does to a call, averaged), 1 ms on a simulated device
    sample_ms: float | None = None
    precision: float = 0.05  # a win stops the rounds once its speed-up's interval is within +-5 % (or the budget ends)
    # a resume runs again a stage whose budget ended undecided (farm tune --reconfirm); else a resume measures only
    # what is missing
    redo_undecided: bool = False

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise InputError(rule, field=f"confirm.{name}", value=getattr(self, name))

        need(isinstance(self.enabled, bool), "enabled", "must be true or false")
        need(isinstance(self.redo_undecided, bool), "redo_undecided", "must be true or false")
        for name, low in (("max_rounds", 8), ("max_candidates", 2), ("runners_up", 0)):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= low, name, f"must be an integer >= {low}")
        for name in ("budget_ms", "sample_ms"):
            v = getattr(self, name)
            need((v is None and name == "sample_ms") or
                 (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")), name,
                 "must be a number of milliseconds > 0")
        v = self.precision
        need(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1, "precision",
             "must be a fraction in (0, 1), e.g. 0.05 for +-5 %")

    @staticmethod
    def parse(value: Any) -> "ConfirmSettings":
        """``true`` / ``false``, or a mapping of these settings (``rounds`` for max_rounds, ``candidates`` for
        max_candidates)."""
        if isinstance(value, ConfirmSettings):
            return value
        if isinstance(value, bool):
            return ConfirmSettings(enabled=value)
        if not isinstance(value, Mapping):
            raise InputError("expected true, false, or a mapping of confirmation settings", field="confirm",
                             value=value)
        aliases = {"rounds": "max_rounds", "candidates": "max_candidates"}
        allowed = {"enabled", "max_rounds", "budget_ms", "max_candidates", "runners_up", "sample_ms", "precision",
                   "redo_undecided",
                   *aliases}
        kwargs = {}
        for key, v in value.items():
            if key not in allowed:
                raise InputError(f"unknown field (allowed: {', '.join(sorted(allowed))})", field=f"confirm.{key}",
                                 value=v)
            kwargs[aliases.get(key, key)] = v
        return ConfirmSettings(**kwargs)


@dataclass(frozen=True, kw_only=True)
class PruneSettings:
    """Measure only what a cost model ranks worth it (farm tune --prune; docs/costmodel.md).

    Per problem: the default, the incumbent, the ``top_k`` candidates by predicted time, and ``explore`` (a
    share) of the rest drawn at random with ``seed``; the others get a ``pruned`` row.
    """

    model: str  # the model file (farm model train --out)
    top_k: int = 7
    explore: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise InputError(rule, field=f"prune.{name}", value=getattr(self, name))

        need(isinstance(self.model, str) and bool(self.model.strip()), "model", "must name a model file")
        need(isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 1, "top_k",
             "must be an integer >= 1")
        need(isinstance(self.explore, (int, float)) and not isinstance(self.explore, bool) and 0 <= self.explore <= 1,
             "explore", "must be a share in [0, 1], e.g. 0.05")
        need(isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0, "seed",
             "must be an integer >= 0")

    @staticmethod
    def parse(value: Any) -> "PruneSettings | None":
        """A model file's path, or a mapping of these settings; None or false: no pruning."""
        if value is None or value is False or isinstance(value, PruneSettings):
            return value or None
        if isinstance(value, str):
            return PruneSettings(model=value)
        if not isinstance(value, Mapping):
            raise InputError("expected a model file's path or a mapping (model, top_k, explore, seed)", field="prune",
                             value=value)
        allowed = {"model", "top_k", "explore", "seed"}
        for key, v in value.items():
            if key not in allowed:
                raise InputError(f"unknown field (allowed: {', '.join(sorted(allowed))})", field=f"prune.{key}",
                                 value=v)
        if "model" not in value:
            raise InputError("names no model file", field="prune.model", value=None)
        return PruneSettings(**dict(value))

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "top_k": self.top_k, "explore": self.explore, "seed": self.seed}


class ResultCheck(str, enum.Enum):
    AUTO = "auto"  # float64 reference for small problems, else the first candidate's output
    REFERENCE = "reference"
    FIRST = "first"
    OFF = "off"


class Disposition(str, enum.Enum):
    SUCCEEDED = "succeeded"
    BARRED_BY_DESELECT = "barred_by_deselect"
    EXCLUDED_BY_FILTER = "excluded_by_filter"
    EXCEEDS_WORKSPACE_LIMIT = "exceeds_workspace_limit"
    FAILED_COMPILE = "failed_compile"
    FAILED_FINALIZE = "failed_finalize"
    FAILED_WARMUP = "failed_warmup"
    FAILED_RUN = "failed_run"
    WRONG_RESULT = "wrong_result"
    # Set by the farm, outside the in-process loop:
    TIMED_OUT = "timed_out"
    CRASHED = "crashed"
    # Not measured: a cost model ranked it out of the candidates worth measuring (farm tune --prune). Never a
    # failure, never a winner; the row carries the model's predicted time relative to the problem's best.
    PRUNED = "pruned"

    @property
    def is_failure(self) -> bool:
        """A candidate that was tried and did not give a result (not a success, not a candidate skipped by a
        filter, a limit or a cost model)."""
        return self not in _NOT_FAILURES


_NOT_FAILURES = frozenset({Disposition.SUCCEEDED, Disposition.PRUNED})


def _enum(cls: type[enum.Enum], value: Any, field_name: str) -> Any:
    if isinstance(value, cls):
        return value
    if value is False and "off" in cls._value2member_map_:
        return cls("off")  # YAML 1.1 reads an unquoted `off` (or `no`) as false: `check: off` means off
    try:
        return cls(str(value).lower())
    except ValueError:
        allowed = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise InputError(f"expected one of {allowed}", field=field_name, value=value) from None


RANKINGS = ("winner_rule", "fastest")


class ResultStorage(Protocol):
    """Where autotune() records its winner (the autotuning RFC's AutotuneStorageConfig)."""

    def write(self, problem: Any, results: Sequence["AutotuneResult"], device: Any) -> None: ...


@dataclass(frozen=True, kw_only=True)
class AutotuneConfig:
    """Tuning settings. Strings are accepted for the enum fields.

    Defaults follow the RFC: STANDARD mode, RUN_UNTIL_STABLE with a window of 3
    under a 5 % coefficient of variation, at most 100 iterations, 1 warmup.
    """

    mode: TuneMode = TuneMode.STANDARD
    strategy: Strategy = Strategy.RUN_UNTIL_STABLE
    warmup_iterations: int = 1
    timed_iterations: int = 10  # FIXED_AVERAGE
    max_iterations: int = 100  # RUN_UNTIL_STABLE cap
    window: int = 3
    stability_threshold: float = 0.05
    max_tuning_duration_ms: float | None = None  # per candidate (TunableOp)
    max_tuning_samples: int | None = None  # per candidate (TunableOp)
    workspace_limit: int | None = None  # bytes; compiled plans above it are skipped
    engine_id_filter: tuple[int, ...] = ()
    ranking_fn: Callable[[list["AutotuneResult"]], Any] | None = field(default=None, compare=False)
    # how the results are ranked: "winner_rule" (ours: the faster median, the default kept within noise) or
    # "fastest" (the autotuning RFC's: the lowest minimum time); ranking_fn, when given, reorders either
    ranking: str = "winner_rule"
    # where autotune() writes its winner (the RFC's storage config, farm.store.autotune_storage); None: nowhere
    storage: "ResultStorage | None" = field(default=None, compare=False)
    priming_failure: PrimingFailurePolicy = PrimingFailurePolicy.ABORT
    cold_cache: bool = False
    check: ResultCheck = ResultCheck.AUTO
    compile_workers: int = 0  # >0: compile in a thread pool, overlapped with measuring
    rotating_buffers: int = 0  # >0: that many extra input sets, used in turn, so inputs are not in cache
    graph_repeats: int = 0  # >0: time replays of a device graph holding that many runs (microsecond kernels)
    confirm: ConfirmSettings = field(default_factory=ConfirmSettings)  # the paired re-check before a winner is published
    prune: PruneSettings | None = None  # measure only what a cost model ranks worth it (farm tune --prune)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _enum(TuneMode, self.mode, "mode"))
        object.__setattr__(self, "strategy", _enum(Strategy, self.strategy, "strategy"))
        object.__setattr__(self, "priming_failure", _enum(PrimingFailurePolicy, self.priming_failure, "priming_failure"))
        object.__setattr__(self, "check", _enum(ResultCheck, self.check, "check"))
        object.__setattr__(self, "engine_id_filter", tuple(int(i) for i in self.engine_id_filter))
        object.__setattr__(self, "confirm", ConfirmSettings.parse(self.confirm))
        object.__setattr__(self, "prune", PruneSettings.parse(self.prune))
        self._validate()

    def _validate(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise InputError(rule, field=name, value=getattr(self, name))

        def is_int(name: str) -> bool:
            v = getattr(self, name)
            return isinstance(v, int) and not isinstance(v, bool)

        for name in ("warmup_iterations", "timed_iterations", "max_iterations", "window", "compile_workers",
                     "rotating_buffers", "graph_repeats"):
            need(is_int(name), name, "must be an integer")
        need(self.warmup_iterations >= 0, "warmup_iterations", "must be >= 0")
        need(self.timed_iterations >= 1, "timed_iterations", "must be >= 1")
        need(self.compile_workers >= 0, "compile_workers", "must be >= 0")
        need(self.rotating_buffers >= 0, "rotating_buffers", "must be >= 0")
        need(self.graph_repeats >= 0, "graph_repeats", "must be >= 0")
        need(isinstance(self.cold_cache, bool), "cold_cache", "must be true or false")
        need(self.ranking in RANKINGS, "ranking", f"must be one of {', '.join(RANKINGS)}")
        need(self.storage is None or callable(getattr(self.storage, "write", None)), "storage",
             "must have a write(problem, results, device) method (farm.AutotuneStorageConfig)")
        if self.strategy is Strategy.RUN_UNTIL_STABLE:
            need(self.window >= 2, "window", "must be >= 2")
            need(self.max_iterations >= self.window, "max_iterations", f"must be >= window ({self.window})")
            t = self.stability_threshold
            need(isinstance(t, (int, float)) and not isinstance(t, bool) and 0.0 < t < 1.0,
                 "stability_threshold", "must be in (0, 1), exclusive")
        if self.max_tuning_duration_ms is not None:
            need(isinstance(self.max_tuning_duration_ms, (int, float)) and self.max_tuning_duration_ms > 0,
                 "max_tuning_duration_ms", "must be > 0")
        if self.max_tuning_samples is not None:
            need(is_int("max_tuning_samples") and self.max_tuning_samples >= 1, "max_tuning_samples", "must be an integer >= 1")
        if self.workspace_limit is not None:
            need(is_int("workspace_limit") and self.workspace_limit >= 0, "workspace_limit", "must be an integer >= 0 (bytes)")

    def bounded_by(self, candidate_timeout_s: float | None) -> "AutotuneConfig":
        """This config with each candidate's measuring ending within the candidate timeout: its warm-up, its timed
        runs and a noisy candidate's second round of them each within a quarter of it (the last quarter for its
        compile and check), so a workload asking for a billion iterations gets a result in bounded time, not a
        hang, on both executors (farm.fleet.local_run.run_local and farm.fleet.on_ray.cluster.run_farm apply it)."""
        if not candidate_timeout_s:
            return self
        budget = candidate_timeout_s * 1e3 / 4
        if self.max_tuning_duration_ms is not None and self.max_tuning_duration_ms <= budget:
            return self
        return dataclasses.replace(self, max_tuning_duration_ms=budget)

    def stop_rule(self) -> StopRule:
        iterations = self.timed_iterations if self.strategy is Strategy.FIXED_AVERAGE else self.max_iterations
        return StopRule(
            strategy=self.strategy,
            iterations=iterations,
            window=self.window,
            threshold=float(self.stability_threshold),
            max_samples=self.max_tuning_samples,
            max_duration_ms=self.max_tuning_duration_ms,
        )


@dataclass(frozen=True)
class AutotuneResult:
    """One candidate's outcome. ``rank`` is 0-based among successes, -1 otherwise."""

    problem_key: str
    engine_id: int
    engine_name: str
    knobs: KnobSettings
    disposition: Disposition
    mode: TuneMode
    strategy: Strategy
    rank: int = -1
    candidate: int = -1  # position in the candidate list (discovery order first)
    error: str = ""
    min_ms: float | None = None
    avg_ms: float | None = None
    stddev_ms: float | None = None
    median_ms: float | None = None
    mad_ms: float | None = None
    samples: tuple[float, ...] = ()
    iterations: int = 0
    warmups: int = 0
    converged: bool = False
    workspace_size: int = -1  # -1: never compiled (the autotuning RFC's value)
    estimated_workspace: int | None = None
    ran_exhaustive: bool = False
    supports_exhaustive: bool = False
    exhaustive_not_run_reason: str = ""  # EXHAUSTIVE mode only: why it was not primed (the error stays empty)
    device_name: str = ""
    max_rel_error: float | None = None
    compile_ms: float | None = None
    tuning_ms: float = 0.0
    started_at: str = ""
    predicted_rel: float | None = None  # a pruned candidate: the cost model's time relative to the problem's best
    # confirmation and verify rows: calls a sample (the same for every participant of a round), what a call
    # called (farm.tuner.callers: "direct", "replay" or "plan") and the input sets the calls rotated over
    calls_per_sample: int | None = None
    call_path: str = ""
    input_sets: int | None = None
    # eager confirmation and verify rows: the host's time a call (issuing it, not waiting for the device), and
    # "host" where its samples are those host times (a model's step the host bounds pays them, not device time)
    host_ms: float | None = None
    ranked_by: str = ""

    @property
    def compiled_plan_index(self) -> int:
        """The autotuning RFC's compiledPlanIndex: the plan's index in the compiled-plan list (its candidate
        index), or -1 for a candidate never compiled (barred, excluded, failed to compile)."""
        return self.candidate if self.workspace_size is not None and self.workspace_size >= 0 else -1

    @property
    def succeeded(self) -> bool:
        return self.disposition is Disposition.SUCCEEDED

    @property
    def spec(self) -> PlanSpec:
        return PlanSpec(self.engine_id, self.knobs)

    @property
    def label(self) -> str:
        return candidate_label(self.engine_name, self.knobs)
