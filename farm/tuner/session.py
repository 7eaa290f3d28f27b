"""One autotune() call: classify, prime, compile (pipelined), measure, check, rank.

The Autotuner (farm.tuner.autotuner) is its API; this module is the measuring session behind it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence


from farm.errors import AutotuneError
from farm.model import dtypes
from farm.model.engine import Engine, Plan
from farm.model.knobs import KnobSettings
from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, AutotuneResult, Disposition, PrimingFailurePolicy, ResultCheck, TuneMode
from farm.tuner.callers import rotating_inputs
from farm.tuner.check import OutputCheck
from farm.tuner.compile_claims import CompileQueue
from farm.tuner.interrupts import ENGINE_ERRORS, reraise_user_interrupt
from farm.tuner.phases import COMPILE, MEASURE, PhaseClock, timed
from farm.tuner.sampling import noisy_near_top, sample, timed_call

if TYPE_CHECKING:
    from farm.tuner.autotuner import Autotuner

log = logging.getLogger("farm.tuner.autotuner")  # the tuner's lines, wherever in the tuner they come from
from farm.tuner.candidate import CandidateRun, candidate_row, close_plan, error_text, log_finished, started_iso


class TuningRun:
    """One autotune() call: classify, prime, compile, measure."""

    def __init__(self, tuner: Autotuner, config: AutotuneConfig, tensors: Mapping[str, Any],
                 listener: Callable[[AutotuneResult], None] | None, phases: PhaseClock | None = None) -> None:
        self.t = tuner
        self.phases = phases
        self.cfg = config
        self.tensors = tensors
        self.listener = listener
        self.rule = config.stop_rule()
        self.rotations = rotating_inputs(tuner.problem, tuner.device, tensors, config)
        self.results: list[AutotuneResult] = []
        self._plans: dict[tuple[int, KnobSettings], tuple[PlanSpec, Engine, Plan]] = {}
        self._prebuilt = False
        self._best: tuple[float, float] | None = None  # (median, MAD) of the fastest candidate so far
        self._alone = False  # one candidate only: nothing to tie with
        self.check = OutputCheck(tuner.problem, tuner.device, tensors, config.check)

    # -- the pipeline ----------------------------------------------------------------
    def execute(self, candidates: list[CandidateRun], *, prebuilt: bool) -> list[AutotuneResult]:
        self._prebuilt = prebuilt
        # the inputs were made on the caller's stream; the device stream does not wait for it by itself
        self.t.device.synchronize()
        self._total = len(candidates)
        todo: list[CandidateRun] = []
        for cand in candidates:
            cand.started, cand.started_at = time.perf_counter(), started_iso()
            cand.spent_ms, cand.note, cand.not_primed, cand.ran_exhaustive = 0.0, "", "", False  # a slot is measured again
            reason = self.t.barred_reason(cand.spec)
            if reason is not None:
                self._finish(cand, Disposition.BARRED_BY_DESELECT, error=reason)
            elif self.cfg.engine_id_filter and cand.spec.engine_id not in self.cfg.engine_id_filter:
                self._finish(cand, Disposition.EXCLUDED_BY_FILTER, error="not in engine_id_filter")
            else:
                todo.append(cand)
        if not todo:
            return self.results
        self._alone = len(todo) == 1
        if self.cfg.mode is TuneMode.EXHAUSTIVE:
            with timed(self.phases, COMPILE):  # a build and one run each: plan building, for the device
                for cand in todo:
                    self._prime(cand)
            primed = sum(c.ran_exhaustive for c in todo)
            log.info("autotune: primed %d of %d candidate(s); %d not primed", primed, len(todo), len(todo) - primed)
        if prebuilt or self.cfg.compile_workers == 0:
            unbuilt = [c for c in todo if c.plan is None and not c.error]  # the plan-spec path: all of them
            if unbuilt:
                t0 = time.perf_counter()
                with timed(self.phases, COMPILE):
                    for cand in unbuilt:
                        self.t.compile_candidate(cand)
                ok = sum(c.plan is not None for c in unbuilt)
                log.info("autotune: compiled %d of %d candidate(s) in %.0f ms", ok, len(unbuilt), (time.perf_counter() - t0) * 1e3)
            for cand in todo:
                with timed(self.phases, MEASURE):
                    self._measure(cand)
        else:
            self._compile_while_measuring(todo)
        return self.results

    def _compile_while_measuring(self, todo: list[CandidateRun]) -> None:
        """Compile threads feed the measuring loop, which takes candidates as they are ready.

        The order of compiles follows host-wide claims (farm.tuner.compile_claims): an artifact another
        process on this host is compiling is left for later, when it is a cache load.
        """
        work: CompileQueue[CandidateRun] = CompileQueue(todo, self.t.compile_key)
        ready: queue.Queue[CandidateRun] = queue.Queue()

        def compile_some() -> None:
            while (taken := work.take()) is not None:
                cand, claim = taken
                try:
                    self.t.compile_candidate(cand)  # records failures on the candidate
                finally:
                    claim.release()
                    ready.put(cand)

        with concurrent.futures.ThreadPoolExecutor(self.cfg.compile_workers, thread_name_prefix="farm-compile") as pool:
            threads = [pool.submit(compile_some) for _ in range(min(self.cfg.compile_workers, len(todo)))]
            try:
                for _ in todo:
                    with timed(self.phases, COMPILE):  # the device waits for a compile
                        cand = self._next_ready(ready, threads)
                    with timed(self.phases, MEASURE):
                        self._measure(cand)
            finally:
                work.close()
        if work.deferred:
            log.info("autotune: %d compile(s) deferred: another process on this host was compiling them", work.deferred)

    @staticmethod
    def _next_ready(ready: "queue.Queue[CandidateRun]", threads: list[concurrent.futures.Future]) -> CandidateRun:
        while True:
            try:
                return ready.get(timeout=0.5)
            except queue.Empty:
                if all(t.done() for t in threads) and ready.empty():
                    for t in threads:
                        t.result()  # a compile thread that died raises here
                    raise RuntimeError("compile threads ended with candidates left")  # pragma: no cover

    def _prime(self, cand: CandidateRun) -> None:
        """EXHAUSTIVE mode: build a plan with the benchmarking knob, run it once, discard it."""
        engine = cand.engine
        if engine is None:
            return
        if not engine.supports_exhaustive:
            cand.not_primed = "the engine does not support exhaustive priming"
            return
        t0 = time.perf_counter()
        plan = self.t.compile_candidate(cand, benchmarking=True)
        failure = ""
        over = workspace_bar(self.cfg.workspace_limit, self.t.ceiling_reason, int(plan.workspace_size)) \
            if plan is not None else None
        if plan is None:
            failure, cand.error = cand.error, ""
        elif over is not None:
            cand.not_primed = f"priming skipped: {over}"
            log.info("autotune: priming of %s skipped: %s", cand.spec.describe(self.t.registry), over)
        else:
            try:
                self.t.device.synchronize()  # what the build did on its own thread's stream comes first
                plan.run(self.tensors, self.t.workspace_for(plan.workspace_size), self.t.device.stream)
                self.t.device.synchronize()
                cand.ran_exhaustive = True
            except ENGINE_ERRORS as exc:
                reraise_user_interrupt(exc)
                failure = f"{engine.name}: priming run: {error_text(exc)}"
        if plan is not None:
            close_plan(plan)
        cand.spent_ms += (time.perf_counter() - t0) * 1e3
        if failure:
            if self.cfg.priming_failure is PrimingFailurePolicy.ABORT:
                raise AutotuneError(f"priming failed for {cand.spec.describe(self.t.registry)}: {failure} "
                                    "(priming_failure=abort; use benchmark_unprimed to continue)", self.results)
            cand.not_primed = f"priming failed, benchmarked unprimed: {failure}"
            log.warning("autotune: %s: %s", cand.spec.describe(self.t.registry), cand.not_primed)

    def _measure(self, cand: CandidateRun) -> None:
        # the candidate's own time starts here (its compile is counted apart): with compiles
        # pipelined, the time since the batch began would include other candidates' work
        cand.started, cand.started_at = time.perf_counter(), started_iso()
        self.t.in_flight[cand.spec] = time.monotonic()
        log.info("autotune: [%d/%d] %s: start", cand.index + 1, self._total, cand.spec.describe(self.t.registry))
        plan = cand.plan
        if plan is None:
            self._finish(cand, Disposition.FAILED_COMPILE, error=cand.error)
            return
        ws = int(getattr(plan, "workspace_size", 0) or 0)
        ceiling = self.t.ceiling_reason(ws)
        if ceiling is not None:  # the real workspace, now the plan is compiled
            self._finish(cand, Disposition.BARRED_BY_DESELECT, error=ceiling, workspace=ws)
            return
        if self._over_workspace_limit(cand, ws):
            return
        try:
            workspace = self.t.workspace_for(ws)
            finalize = getattr(plan, "finalize", None)
            if callable(finalize):
                finalize(workspace)
        except ENGINE_ERRORS as exc:
            reraise_user_interrupt(exc)
            self._finish(cand, Disposition.FAILED_FINALIZE, error=f"{cand.engine.name}: finalize: {error_text(exc)}", workspace=ws)
            return
        warmed = self._warm_up(cand, plan, workspace, ws)
        if warmed is None:
            return
        warmups, max_err = warmed
        timed, per_call, note = timed_call(self.t.device, self.t.problem, self.cfg.graph_repeats, self.rotations,
                                           plan, workspace, cand.spec.describe(self.t.registry))
        samples: list[float] = []
        try:
            label = cand.spec.describe(self.t.registry)
            converged = sample(self.t.device, self.cfg, self.rule, timed, per_call, samples, label)
            if not self._alone and noisy_near_top(samples, self._best):
                # its noise would decide ties: measure again rather than promote or demote it on noise
                converged = sample(self.t.device, self.cfg, self.rule, timed, per_call, samples, label)
                note = "; ".join(x for x in (note, f"noisy near the top: re-measured ({len(samples)} samples)") if x)
        except ENGINE_ERRORS as exc:
            reraise_user_interrupt(exc)
            self._finish(cand, Disposition.FAILED_RUN, error=f"{cand.engine.name}: run {len(samples) + 1}: {error_text(exc)}",
                         workspace=ws, warmups=warmups, samples=samples, max_err=max_err)
            return
        self._finish(cand, Disposition.SUCCEEDED, workspace=ws, warmups=warmups, samples=samples,
                     converged=converged, max_err=max_err, error="; ".join(x for x in (cand.note, note) if x))
        self._plans[(cand.spec.engine_id, cand.spec.knobs)] = (cand.spec, cand.engine, plan)

    def _over_workspace_limit(self, cand: CandidateRun, ws: int) -> bool:
        """Finish the candidate when its compiled plan needs more workspace than the limit."""
        limit = self.cfg.workspace_limit
        if limit is None or ws <= limit:
            return False
        if cand.estimated_workspace is not None and cand.estimated_workspace <= limit:
            log.warning("autotune: %s needs %d B of workspace after compile (estimate %d B): over the %d B limit",
                        cand.spec.describe(self.t.registry), ws, cand.estimated_workspace, limit)
        self._finish(cand, Disposition.EXCEEDS_WORKSPACE_LIMIT, error=f"workspace {ws} B > limit {limit} B", workspace=ws)
        return True

    def _warm_up(self, cand: CandidateRun, plan: Plan, workspace: Any, ws: int) -> tuple[int, float | None] | None:
        """The untimed runs; the first one's outputs are checked. (warmups, max error), or None: finished."""
        dev = self.t.device
        checking = self.cfg.check is not ResultCheck.OFF
        warmups = max(self.cfg.warmup_iterations, 1 if checking else 0)
        max_err = None
        budget_s = self.cfg.max_tuning_duration_ms / 1e3 if self.cfg.max_tuning_duration_ms else None
        t0 = time.perf_counter()
        try:
            dev.synchronize()
            for i in range(warmups):
                if i and budget_s is not None and time.perf_counter() - t0 >= budget_s:  # the candidate's budget
                    warmups = i
                    break
                if i == 0 and checking:
                    for out in self.t.problem.output_ids:
                        if self.t.problem.tensor(out).dtype in dtypes.FLOAT_DTYPES:
                            dev.arrays.fill(self.tensors[out], float("nan"))
                    dev.synchronize()  # the fill ran on the caller's stream, the plan runs on the device's
                plan.run(self.tensors, workspace, dev.stream)
                if i == 0 and checking:
                    dev.synchronize()
                    max_err, problem_text = self.check.compare(cand.spec.describe(self.t.registry))
                    if problem_text:
                        self._finish(cand, Disposition.WRONG_RESULT, error=problem_text, workspace=ws, warmups=1,
                                     max_err=max_err)
                        return None
            dev.synchronize()
        except ENGINE_ERRORS as exc:
            reraise_user_interrupt(exc)
            self._finish(cand, Disposition.FAILED_WARMUP, error=f"{cand.engine.name}: warmup: {error_text(exc)}", workspace=ws)
            return None
        return warmups, max_err

    # -- numerical check ---------------------------------------------------------------
    # -- bookkeeping -----------------------------------------------------------------
    def _finish(self, cand: CandidateRun, disposition: Disposition, *, error: str = "", workspace: int | None = None,
                warmups: int = 0, samples: Sequence[float] = (), converged: bool = False,
                max_err: float | None = None) -> None:
        self.t.in_flight.pop(cand.spec, None)
        result = candidate_row(cand, self.t.problem.key, self.cfg, self.t.device.properties.name, disposition,
                               error=error, workspace=workspace, warmups=warmups, samples=samples,
                               converged=converged, max_err=max_err)
        self.results.append(result)
        if disposition is Disposition.SUCCEEDED and result.median_ms is not None:
            if self._best is None or result.median_ms < self._best[0]:
                self._best = (result.median_ms, result.mad_ms or 0.0)
        log_finished(result, error)
        if disposition not in (Disposition.SUCCEEDED, Disposition.BARRED_BY_DESELECT, Disposition.EXCLUDED_BY_FILTER):
            if cand.plan is not None and not self._prebuilt:
                close_plan(cand.plan)
        if self.listener is not None:
            self.listener(result)

    def plan_of(self, result: AutotuneResult) -> tuple[PlanSpec, Engine, Plan]:
        return self._plans[(result.engine_id, result.knobs)]

    def release_plans(self, keep: tuple[PlanSpec, Engine, Plan] | None) -> None:
        if self._prebuilt:
            return  # compiled-plan path: the tuner owns them
        for entry in self._plans.values():
            if keep is None or entry[2] is not keep[2]:
                close_plan(entry[2])


def workspace_bar(limit: int | None, ceiling: Callable[[int], str | None], ws: int) -> str | None:
    """Why a plan of this workspace may not run (the config's limit, or the deselect ``ceiling``), or None."""
    if limit is not None and ws > limit:
        return f"workspace {ws} B over the limit {limit} B"
    return ceiling(ws)
