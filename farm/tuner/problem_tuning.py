"""A workload problem on one device: its candidates (plan specs) there, and what tuning it produced.

Discovery (farm.fleet.on_ray.worker.expand_problems) and the crash journal's attribution call ``plan_specs_for``; both
executors report a problem's ``ProblemOutcome``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from farm.devices.properties import DeviceProperties
from farm.errors import FarmError
from farm.model.plans import PlanSpec
from farm.model.problem import Problem
from farm.model.records import AutotuneResult
from farm.model.workload import WorkloadProblem
from farm.tuner.autotuner import Autotuner
from farm.tuner.judging.confirm import ConfirmRun

log = logging.getLogger("farm.tune")


@dataclass(frozen=True)
class ProblemOutcome:
    """What tuning one problem on one device produced."""

    problem: WorkloadProblem
    results: tuple[AutotuneResult, ...]
    error: str = ""  # set when the problem could not be tuned at all (no engine, every candidate failed)
    wall_ms: float = 0.0
    skipped: int = 0  # candidates measured before (resume)
    confirmations: tuple[ConfirmRun, ...] = ()  # the confirmation stage, per calling mode
    pruned: int = 0  # candidates a cost model ranked out (farm tune --prune): not measured

    @property
    def winner(self) -> AutotuneResult | None:
        return self.results[0] if self.results and self.results[0].succeeded else None


def memory_shortfall(problem: Problem, props: DeviceProperties) -> str:
    """'' when the problem's tensors fit in the device's memory, else why not (nothing is allocated to find out)."""
    need = sum(t.nbytes for t in problem.tensors)
    if props.vendor == "sim" or not props.total_memory or need <= props.total_memory:
        return ""
    return (f"its tensors need {need / 2**30:.1f} GiB; {props.name} has {props.total_memory / 2**30:.1f} GiB "
            "of memory")


def plan_specs_for(wp: WorkloadProblem, tuner: Autotuner) -> list[PlanSpec]:
    """Add the workload's candidates for this problem to ``tuner``; returns them in order.

    Engines that do not apply on the tuner's device are left out (discovery
    happens where the device is); sweeps of such engines are skipped. A problem
    that cannot fit in the device's memory raises FarmError (before any allocation).
    """
    too_big = memory_shortfall(wp.problem, tuner.device.properties)
    if too_big:
        raise FarmError(f"{wp.name}: {too_big}")
    sel = wp.engines
    configs = [c for c in tuner.engine_configs() if sel.selects(c.engine_name)]
    applicable = {c.engine_name for c in configs}
    if sel.defaults and configs:
        tuner.add_engine_configs(configs)
    sweeps = []
    for sweep in sel.sweeps:
        if str(sweep.engine) in applicable:
            sweeps.append(sweep)
        elif sel.selects(str(sweep.engine)) and str(sweep.engine) in {e.name for e in tuner.registry.for_op(wp.problem.op)}:
            # a top-level sweep meets problems of other ops too: only an engine that serves this op is news
            log.info("autotune: sweep of %s skipped for %s: not applicable on %s", sweep.engine, wp.name,
                     tuner.device.properties.name)
    if sweeps:
        tuner.add_engine_sweep(sweeps)
    return list(tuner.specs)
