"""farm verify: every published decision replayed through farm.ops in its calling mode, beside the direct call.

For each decision an override file records (the entry's own, and each ``calls`` mode beside it) the
problem's tensors are made on the device, and two callers are timed in paired, interleaved rounds:

* farm.ops' own entry point, its binder reading the file under test through the Config policy
  (``FARM_HEUR_CONFIG_PATH``), as a production process would;
* the direct call a user makes without the farm (the default engine's ``direct_call``: ``torch.matmul``,
  ``F.conv2d``, ``np.matmul``...; the default's plan called straight where it has none).

Eager: each sample is one loop of back-to-back calls over the input sets in turn (the rotation the
confirmation stage used, recorded in the file; with none recorded, enough to keep the inputs out of the
device's cache), synchronised at its ends only. Graph: each sample is a replay of a captured device graph
of those calls (farm.ops runs its graph decision while a capture is under way).

The delivered speed-up is the paired ratio direct / farm.ops. A decision is flagged when it delivers less
than ``min_delivered`` of the direct call, or when its delivered figure is more than ``max_gap`` off the one
published; fixing one publishes the default in its place, saying why.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from farm.devices.arrays import make_tensors
from farm.devices.device import Device, eager_device
from farm.devices.runtimes.cpu import host_cpu
from farm.model.engine import EngineRegistry, default_engine_registry, settings_to_resolved
from farm.model.knobs import candidate_label
from farm.model.problem import OPS_LIBRARIES, Problem
from farm.model.records import AutotuneResult, Disposition, TuneMode
from farm.model.measurement import Strategy
from farm.store.overrides.entries import OverrideEntry, OverrideFile
from farm.tuner.callers import (REPLAY, Caller, direct_caller, graph_sampler, estimate_ms, eager_sampler, input_set_cap,
                                input_set_count, input_sets, plan_caller, replay_caller)
from farm.tuner.interrupts import reraise_user_interrupt
from farm.tuner.judging.paired import PairedRatio, paired_ratio
from farm.tuner.interrupts import ENGINE_ERRORS
from farm.tuner.judging.winner import ConfirmedRule
from farm.replay.file_replay import FileReplay
from farm.replay.verified import CALLS, Decision, Verified, VerifySettings, canonical_knobs, decisions_in, median_of

log = logging.getLogger("farm.replay.verify")

__all__ = ["VerifyOutcome", "fixed_entries", "judge", "mark_fixes", "result_rows", "verify_file", "verify_for_job"]

# -- measuring --------------------------------------------------------------------------------------
def verify_file(path: str, f: OverrideFile, device: Device, *, keys: Sequence[str] | None = None,
                calls: Sequence[str] = CALLS, settings: VerifySettings | None = None,
                registry: EngineRegistry | None = None,
                progress: Callable[[int, int, Verified], None] | None = None) -> tuple[list[Verified], list[tuple[str, str]]]:
    """Replay every decision of ``f`` (read from ``path``) on ``device``; -> (each decision verified, entries
    that could not be). Never raises for one decision's failure: it is flagged with the reason."""
    settings = settings or VerifySettings()
    registry = registry or default_engine_registry()
    decisions, skipped = decisions_in(f, keys=keys, calls=calls)
    replay = FileReplay(path, device, registry)
    rng = np.random.default_rng(settings.seed)
    out: list[Verified] = []
    for i, d in enumerate(decisions):
        v = _bounded(lambda d=d: _checked(d, device, replay, registry, settings, rng), settings.timeout_s)
        if v is None:  # its replay hangs: the thread holding it cannot be taken back, so nothing more runs here
            out.append(_hung(d, device, replay, registry, settings))
            out += [Verified(x, device.signature, host_cpu(), measured_at=_now(), after_hang=True,
                             skipped=f"the replay of {d.name} ({d.call}) before it hung") for x in decisions[i + 1:]]
            log.error("verify: %s (%s): its replay did not end within %g s; the rest are not replayed", d.name,
                      d.call, settings.timeout_s)
            break
        out.append(v)
        if progress is not None:
            progress(i + 1, len(decisions), v)
    return out, skipped


def _checked(d: Decision, device: Device, replay: FileReplay, registry: EngineRegistry, settings: VerifySettings,
             rng: np.random.Generator) -> Verified:
    try:
        if d.default_failed:
            return Verified(d, device.signature, host_cpu(), measured_at=_now(),
                            skipped=f"the default failed in the confirmation stage ({d.default_failed}): "
                                    "no direct call to replay it beside")
        return _verify_one(d, device, replay, registry, settings, rng)
    except ENGINE_ERRORS as exc:  # one decision's failure is its own verdict (an engine's SystemExit too)
        reraise_user_interrupt(exc)
        log.warning("verify: %s (%s): %s: %s", d.name, d.call, type(exc).__name__, exc)
        return Verified(d, device.signature, host_cpu(), flagged=f"replaying it failed: {type(exc).__name__}: {exc}",
                        measured_at=_now())


def _bounded(check: Callable[[], Verified], timeout_s: float | None) -> Verified | None:
    """``check()``, or None when it has not ended within ``timeout_s`` (it goes on in a daemon thread: a hung
    native call cannot be interrupted; the process that owns it ends it)."""
    if timeout_s is None:
        return check()
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(check())
        except BaseException as exc:  # handed to the caller as raised (a user's Ctrl-C included)
            box.append(exc)

    thread = threading.Thread(target=run, name="farm-verify-replay", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return None
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _hung(d: Decision, device: Device, replay: FileReplay, registry: EngineRegistry,
          settings: VerifySettings) -> Verified:
    """A decision whose replay did not end within the timeout: flagged, and fixable unless it is the default."""
    default = next(iter(registry.discover(d.problem, replay.exec_device)), None)
    name = registry.get(default.engine_id).name if default is not None else ""
    is_default = d.engine_name == name and not d.knobs
    return Verified(d, device.signature, host_cpu(), replayed=d.label, direct_engine=name,
                    flagged=f"its replay did not end within the candidate timeout ({settings.timeout_s:g} s): it "
                            "hangs where it is replayed", fixable=not is_default, loses=True, hung=True,
                    measured_at=_now())


def _now() -> str:
    from farm.store.results import now_iso

    return now_iso()


def _set_count(d: Decision, stage: Device) -> int:
    """The file's count of input sets, held to the memory the tuner allows them here; else the tuner's own."""
    if d.input_sets:
        return min(d.input_sets, input_set_cap(d.problem, stage))
    return input_set_count(d.problem, stage, cold_cache=True)


def _verify_one(d: Decision, device: Device, replay: FileReplay, registry: EngineRegistry, settings: VerifySettings,
                rng: np.random.Generator) -> Verified:
    problem = d.problem
    started = _now()
    cpu = host_cpu()
    base = Verified(d, device.signature, cpu, measured_at=started)
    notes = _cpu_notes(d, cpu)
    eager = d.call == "eager"
    stage, timer = eager_device(replay.exec_device) if eager else (device, device.timer)
    if not eager and device.extras.get("capture_graph") is None:
        return dataclasses.replace(base, skipped=f"{device.runtime.name} devices capture no graphs", notes=notes)
    default = next(iter(registry.discover(problem, replay.exec_device)), None)
    if default is None:
        return dataclasses.replace(base, skipped=f"no engine runs {problem.label()} here", notes=notes)
    default_engine = registry.get(default.engine_id)
    sets = input_sets(problem, stage, make_tensors(problem, stage.arrays, settings.seed), _set_count(d, stage))
    stage.synchronize()
    replayed, binding = _replayed(problem, replay, stage, sets)
    if replayed is None:
        return dataclasses.replace(base, skipped=f"farm.ops has no entry point for {problem.label()}", notes=notes)
    ran = binding.bound if binding is not None else None
    if not eager and binding is not None and binding.graph is not None:
        ran = binding.graph.bound
        binding.graph.call(sets[0])  # its first run outside the capture (lazy set-up must not be captured)
    ran_label = candidate_label(ran.engine_name, ran.knobs) if ran is not None else "?"
    direct = direct_caller(problem, default_engine, stage, sets)
    if direct is None:
        plan = default_engine.compile(problem, settings_to_resolved(default_engine, ()), replay.exec_device)
        ws = stage.runtime.malloc(plan.workspace_size) if getattr(plan, "workspace_size", 0) else None
        direct = plan_caller(problem, stage, default_engine.name, plan, ws, sets)
    direct.calls[0]()
    stage.synchronize()
    # the calls a sample of the stage that published it held (the same protocol, so the figures compare), else
    # ``calls``; fewer where a sample would outlast ``sample_ms``
    clock = eager_device(replay.exec_device)[1]  # one call's time, as an eager caller's stream sees it
    est = [estimate_ms(clock, c) for c in (replayed, direct)]
    budget = settings.sample_ms or (20.0 if stage.vendor == "cpu" else 50.0)
    wanted = settings.calls if settings.calls_given or d.calls_per_sample is None else d.calls_per_sample
    n = max(1, min(wanted, math.floor(budget / max(max(est), 1e-9)) if eager else wanted))
    if eager:
        samplers = [eager_sampler(timer, replayed, n), eager_sampler(timer, direct, n)]
    else:
        samplers = [graph_sampler(stage, replayed, n)[0], graph_sampler(stage, direct, n)[0]]
    got: list[list[float]] = [[], []]
    while True:
        for _ in range(settings.rounds if not got[0] else 3):
            for j in rng.permutation(2):
                got[j].append(samplers[j]())
        ratio = paired_ratio(got[0], got[1])
        # a verdict its own interval does not bear out (a busy host) gets more rounds, up to three times as many
        if len(got[0]) >= 3 * settings.rounds or not _uncertain(ratio, d.published, settings):
            break
    v = dataclasses.replace(base, replayed=ran_label, direct=direct.label, direct_engine=default_engine.name,
                            direct_path=direct.path, delivered=ratio, replay_samples=tuple(got[0]),
                            direct_samples=tuple(got[1]), calls_per_sample=n, input_sets=len(sets), notes=notes)
    return judge(v, settings, is_default=(d.engine_name == default_engine.name and not d.knobs))


def _replayed(problem: Problem, replay: FileReplay, stage: Device, sets: Sequence[Mapping[str, Any]]
              ) -> tuple[Caller | None, Any]:
    """The decision's calls as production makes them, and the binding they run: farm.ops' entry point, or for a
    model's call that farm.ops never makes of its tensors (a torch model's call on a CPU, library "torch"; a
    hand-written layer's anywhere, library "module") the file's own binding of the problem, as farm.apply runs it."""
    if problem.library and (stage.vendor == "cpu" or problem.library not in OPS_LIBRARIES):
        binding = replay.own_binding(problem, next(iter(sets[0].values())))
        return Caller(tuple(functools.partial(binding.call, s) for s in sets), REPLAY, "farm.apply's call"), binding
    caller = replay_caller(problem, replay.calls, sets)
    return caller, replay.binding_of(problem) if caller is not None else None


def _uncertain(r: PairedRatio, published: float | None, settings: VerifySettings) -> bool:
    """The point estimate crosses a threshold its interval straddles: below ``min_delivered`` or off the
    published figure by more than ``max_gap``, yet the interval reaches the other side."""
    if not r.rounds or not math.isfinite(r.ratio):
        return False
    if r.speedup < settings.min_delivered <= r.speedup_high:
        return True
    if published:
        off = abs(r.speedup / published - 1.0) > settings.max_gap
        return off and r.speedup_low <= published <= r.speedup_high
    return False


def _cpu_notes(d: Decision, cpu: str) -> tuple[str, ...]:
    others = [c for c in d.measured_cpus if c != cpu]
    if d.call != "eager" or not others:
        return ()
    return (f"measured on {', '.join(sorted(set(d.measured_cpus)))}, replayed here on {cpu}: an eager call's time is "
            "the host's as much as the device's, so a decision for a host-bound call may not carry over",)


def judge(v: Verified, settings: VerifySettings, *, is_default: bool) -> Verified:
    """The verdict: flagged when farm.ops runs another candidate than the one published, delivers less than
    ``min_delivered`` of the direct call, or more than ``max_gap`` off the published figure."""
    d = v.decision
    if v.replayed != d.label:
        why = f"farm.ops runs {v.replayed} here, not the published {d.label}"
        if d.engine_name not in default_engine_registry():  # hipDNN's HIPBLASLT_ENGINE in a shared file: not ours
            return dataclasses.replace(v, flagged=why + " (an engine the farm does not run: left as it is)",
                                       fixable=False, loses=True)
        return dataclasses.replace(v, flagged=why, fixable=not is_default, loses=True)
    got = v.delivered_speedup
    if got is None or not math.isfinite(got):
        return dataclasses.replace(v, flagged="no usable time was measured", fixable=False)
    problems = []
    if got < settings.min_delivered:
        problems.append(f"delivers {got:.3f}x of the direct call {v.direct} (below {settings.min_delivered:g})")
    rel = v.ratio_to_published
    if rel is not None and abs(rel - 1.0) > settings.max_gap:
        problems.append(f"delivers {got:.3f}x where {d.published:.3f}x was published ({100 * (rel - 1):+.1f} %)")
    if not problems:
        return v
    why = "; ".join(problems)
    if is_default:  # what a caller without the farm runs (farm.apply leaves such a call alone): it holds
        return dataclasses.replace(v, notes=(*v.notes, f"the default: {why}; what shows is farm.ops' own cost a "
                                                        "call over the direct call"))
    return dataclasses.replace(v, flagged=why, fixable=True, loses=got < settings.min_delivered)


# -- fixing -------------------------------------------------------------------------------------------
def fixed_entries(f: OverrideFile, verified: Sequence[Verified]) -> list[OverrideEntry]:
    """The entries of ``f`` with each verified decision's check recorded (``selection.verified``), and every
    decision marked ``fixed`` replaced by the default (why said in its ``selection``)."""
    by_entry: dict[int, list[Verified]] = {}
    for v in verified:
        by_entry.setdefault(v.decision.entry_index, []).append(v)
    out: list[OverrideEntry] = []
    registry = default_engine_registry()
    for index, vs in sorted(by_entry.items()):
        entry = f.entries[index]
        if entry.engine_name not in registry:  # another tool's decision in a shared file: never rewritten
            continue
        meta = dict(entry.metadata or {})
        engine, knobs = entry.engine_name, tuple(entry.knobs)
        calls = {k: dict(v) for k, v in (meta.get("calls") or {}).items()} if isinstance(meta.get("calls"), Mapping) \
            else None
        for v in vs:
            if v.skipped:
                continue
            fix = v.fixed
            own = v.decision.call == (meta.get("call") or "eager") and \
                (engine, canonical_knobs(engine, knobs)) == (v.decision.engine_name, v.decision.knobs)
            if own:
                meta["selection"] = _with_check(meta.get("selection"), v, fix)
                if v.corrected:
                    meta["selection"] = _corrected(meta["selection"], v)
                if fix:
                    engine, knobs = v.direct_engine, ()
                    meta.pop("knobs", None)
                    meta["median_time_ms"] = median_of(v.direct_samples)
            elif calls is not None and v.decision.call in calls:
                rec = calls[v.decision.call]
                rec["selection"] = _with_check(rec.get("selection"), v, fix)
                if v.corrected:
                    rec["selection"] = _corrected(rec["selection"], v)
                if fix:
                    rec["engine_name"], rec["knobs"] = v.direct_engine, []
                    rec["median_time_ms"] = median_of(v.direct_samples)
        if calls is not None:
            meta["calls"] = calls
        out.append(dataclasses.replace(entry, engine_name=engine, knobs=knobs, metadata=meta))
    return out


def _corrected(selection: dict[str, Any], v: Verified) -> dict[str, Any]:
    """The selection with the delivered figure published in place of the recorded one (the decision stays)."""
    d = v.delivered
    assert d is not None
    return {**selection, "speedup_over_default": d.speedup,
            "figure_corrected": {"was": v.decision.published, "delivered": d.speedup,
                                 "interval": [d.speedup_low, d.speedup_high], "by": "farm verify --fix"}}


def _with_check(selection: Any, v: Verified, fixed: bool) -> dict[str, Any]:
    sel = dict(selection) if isinstance(selection, Mapping) else {}
    sel["verified"] = v.metadata()
    if fixed:
        sel.update(rule=ConfirmedRule.NOT_DELIVERED.value, why=f"default published by farm verify: the winner "
                   f"{v.decision.label} {v.flagged}", speedup_over_default=1.0,
                   replaced=v.decision.label)
    return sel


def mark_fixes(verified: Sequence[Verified], *, only_losers: bool = False) -> list[Verified]:
    """The verified decisions with ``fixed`` set where a fix applies: every fixable flagged one; with
    ``only_losers`` (farm tune's own check) only those that run another candidate than published, or lose to the
    direct call beyond noise (the delivered interval below 1): a confirmed decision is not undone on a few
    noisy rounds, and a figure off the published one but still a gain is flagged, not undone."""
    out = []
    for v in verified:
        fix = v.fixable and bool(v.flagged)
        d = v.delivered
        beats = v.replayed == v.decision.label and d is not None and d.rounds > 0 and d.speedup_low > 1.0
        if fix and only_losers:  # a replay that hangs loses whatever it would have delivered
            fix = v.hung or v.replayed != v.decision.label or (d is not None and d.rounds > 0 and d.speedup_high < 1.0)
        elif fix and beats:  # a gain beyond noise is never undone: its figure is corrected instead
            out.append(dataclasses.replace(v, fixed=False, corrected=True))
            continue
        out.append(dataclasses.replace(v, fixed=fix))
    return out


# -- results rows ------------------------------------------------------------------------------------
def result_rows(verified: Sequence[Verified], device: Device, registry: EngineRegistry | None = None,
                ) -> list[tuple[AutotuneResult, Decision, Any]]:
    """Two rows per measured decision for the results dataset (round ``verify``): farm.ops' calls and the direct
    calls, samples paired by position; with the measurement context each is written under."""
    from farm.model.ids import engine_name_to_id
    from farm.model.measurement import summarize
    from farm.store.results import MeasurementContext, new_id

    out = []
    for v in verified:
        if v.hung:
            out.append(_hung_row(v, device))
            continue
        if v.skipped or v.delivered is None:
            continue
        where = MeasurementContext(device.properties, session_id=new_id(), round="verify", call=v.decision.call,
                                   session_size=2, host_cpu=v.host_cpu, verdict=v.verdict)
        d = v.decision
        for engine, knobs, samples, path, note in (
                (d.engine_name, d.knobs, v.replay_samples, "replay", f"farm.ops replaying {v.replayed}"),
                (v.direct_engine, (), v.direct_samples, v.direct_path, v.direct)):
            s = summarize(samples)
            out.append((AutotuneResult(
                problem_key=d.problem.key, engine_id=engine_name_to_id(engine), engine_name=engine, knobs=knobs,
                disposition=Disposition.SUCCEEDED, mode=TuneMode.STANDARD, strategy=Strategy.FIXED_AVERAGE,
                candidate=-1, min_ms=s.min, avg_ms=s.mean, stddev_ms=s.stddev, median_ms=s.median, mad_ms=s.mad,
                samples=tuple(samples), iterations=len(samples), warmups=1, converged=True,
                error=f"verify ({d.call}): {note}; {v.verdict}", device_name=device.properties.name,
                started_at=v.measured_at, calls_per_sample=v.calls_per_sample, call_path=path,
                input_sets=v.input_sets), d, where))
    return out


def _hung_row(v: Verified, device: Device) -> tuple[AutotuneResult, Decision, Any]:
    """A decision whose replay hung: one ``timed_out`` row of round verify (no samples: nothing ended), its verdict
    what the reducer reads (fixed: the default is published in its place)."""
    from farm.model.ids import engine_name_to_id
    from farm.store.results import MeasurementContext, new_id

    d = v.decision
    where = MeasurementContext(device.properties, session_id=new_id(), round="verify", call=d.call, session_size=1,
                               host_cpu=v.host_cpu, verdict=v.verdict)
    return (AutotuneResult(
        problem_key=d.problem.key, engine_id=engine_name_to_id(d.engine_name), engine_name=d.engine_name,
        knobs=d.knobs, disposition=Disposition.TIMED_OUT, mode=TuneMode.STANDARD, strategy=Strategy.FIXED_AVERAGE,
        candidate=-1, error=f"verify ({d.call}): farm.ops replaying {v.replayed}; {v.verdict}",
        device_name=device.properties.name, started_at=v.measured_at, call_path="replay"), d, where)


def write_temp_file(text: str) -> str:
    """``text`` in a private temporary file (a worker given a file's text replays it from there)."""
    fd, path = tempfile.mkstemp(prefix="farm-verify-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


@dataclass(frozen=True)
class VerifyOutcome:
    """What a verification run gives a job: rows for its results (result, problem, problem name, where measured),
    each decision's record (Verified.as_dict), and the entries it could not replay (name, why)."""

    rows: tuple[tuple[AutotuneResult, Problem, str, Any], ...]
    records: tuple[dict[str, Any], ...]
    skipped: tuple[tuple[str, str], ...] = ()
    unreplayed: tuple[str, ...] = ()  # problem keys an earlier replay's hang left unchecked (records not included)

    def then(self, later: "VerifyOutcome") -> "VerifyOutcome":
        """This outcome with ``later`` (a new process's check of what this one left unreplayed) after it."""
        return VerifyOutcome(self.rows + later.rows, self.records + later.records, self.skipped + later.skipped,
                             later.unreplayed)


def verify_for_job(device: Device, text: str, keys: Sequence[str] | None = None, *,
                   settings: VerifySettings | None = None, only_losers: bool = True) -> VerifyOutcome:
    """farm tune's check after its reduce, run where the device is (in-process, or on a farm worker): the override
    file's decisions of the problems ``keys`` replayed beside the direct call; a decision that loses to the direct
    call is fixed (``only_losers``: a figure off the published one is flagged only)."""
    from farm.store.overrides.parsing import parse_overrides

    path = write_temp_file(text)
    try:
        f = parse_overrides(text, source=path, strict=False)
        verified, skipped = verify_file(path, f, device, keys=keys, settings=settings)
    finally:
        os.unlink(path)
    verified = mark_fixes(verified, only_losers=only_losers)
    rows = tuple((r, d.problem, d.name, where) for r, d, where in result_rows(verified, device))
    # a new process replays what a hang left, by problem: not a problem one of whose decisions it checked here
    done = {v.decision.problem.key for v in verified if not v.after_hang}
    left = tuple(k for k in dict.fromkeys(v.decision.problem.key for v in verified if v.after_hang) if k not in done)
    kept = [v for v in verified if not (v.after_hang and v.decision.problem.key in left)]
    return VerifyOutcome(rows, tuple(v.as_dict() for v in kept), tuple(skipped), left)
