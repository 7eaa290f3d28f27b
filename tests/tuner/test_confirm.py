"""The confirmation stage: paired statistics, its decision rule, who is in it, and what it does to a tune.

The stage runs here on the real CPU runtime with engines whose time comes from a cost model under a drifting,
noisy clock (a busy machine): what the issue's cases look like, with known answers.
"""

import math
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from farm.errors import InputError
from farm.model.ids import engine_name_to_id
from farm.model.engine import EngineRegistry, Support
from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, CallMode, ConfirmSettings
from farm.model.workload import EngineSelection, WorkloadProblem
from farm.tuner.judging.confirm import Measured, participants, run_confirmation
from farm.tuner.judging.paired import CONFIDENCE, median_interval, min_rounds, order_statistic_rank, paired_ratio
from farm.tuner.judging.winner import ConfirmedRule, confirmed_why, decide_confirmed
from farm.tuner.problem_tuning import ProblemOutcome
from tests.fakes import fake_device, matmul_problem, tune_in_process


# -- paired statistics ------------------------------------------------------------------------------
def test_the_interval_needs_eight_rounds_at_99_percent_and_widens_with_confidence():
    assert min_rounds(0.99) == 8 and order_statistic_rank(7, 0.99) == 0 and order_statistic_rank(8, 0.99) == 1
    # P(Bin(20, 1/2) <= 3) = 0.0013 <= 0.005 < P(<= 4) = 0.0059
    assert order_statistic_rank(20, 0.99) == 4
    assert order_statistic_rank(20, 0.999) < order_statistic_rank(20, 0.99) < order_statistic_rank(20, 0.9)
    med, lo, hi = median_interval([3.0, 1.0, 2.0], 0.99)
    assert med == 2.0 and math.isinf(lo) and math.isinf(hi)  # too few rounds: no bound at all


def test_the_interval_covers_the_true_ratio_at_least_as_often_as_it_says():
    rng = np.random.default_rng(11)
    misses = 0
    trials = 2000
    for _ in range(trials):
        drift = rng.lognormal(0.0, 0.5, 24)  # a busy machine: every round at another speed
        a = 0.9 * drift * rng.lognormal(0.0, 0.05, 24)
        b = 1.0 * drift * rng.lognormal(0.0, 0.05, 24)
        r = paired_ratio(a, b)
        misses += not (r.low <= 0.9 <= r.high)
    assert misses / trials <= 1 - CONFIDENCE + 0.005  # 99 % coverage, whatever the drift


def test_pairing_cancels_drift_that_swamps_the_unpaired_medians():
    rng = np.random.default_rng(3)
    drift = rng.lognormal(0.0, 0.4, 32)
    fast = 0.97 * drift * rng.lognormal(0.0, 0.01, 32)
    default = 1.0 * drift * rng.lognormal(0.0, 0.01, 32)
    unpaired = np.median(fast) / np.median(default)
    d = decide_confirmed([default, fast], 0)
    assert (d.winner, d.rule, d.settled) == (1, ConfirmedRule.CONFIRMED, True)
    assert d.versus.low <= 0.97 <= d.versus.high and d.versus.high < 0.995
    assert abs(unpaired - 0.97) > abs(d.versus.ratio - 0.97)


# -- the decision ---------------------------------------------------------------------------------------
def test_a_noisy_candidate_no_faster_than_the_default_almost_never_wins():
    rng = np.random.default_rng(5)
    wins = 0
    for _ in range(500):
        default = 1.0 * rng.lognormal(0.0, 0.02, 16)
        noisy = 1.0 * rng.lognormal(0.0, 0.3, 16)  # its own noise is the only thing that could help it
        wins += decide_confirmed([default, noisy], 0).winner == 1
    assert wins <= 5


def test_the_default_is_kept_within_the_margin_and_the_incumbent_unless_beaten_beyond_it():
    base = np.ones(24)
    d = decide_confirmed([base, base * 0.997], 0)  # 0.3 % faster, exactly: not beyond the 0.5 % margin
    assert d.winner == 0 and d.rule is ConfirmedRule.DEFAULT_NOT_BEATEN and d.settled
    assert "0.3 % faster, not beyond the 0.5 % margin" in confirmed_why(d, lambda i: f"c{i}")
    # the incumbent (index 2) beat the default; a challenger 0.2 % faster than it does not unseat it
    d = decide_confirmed([base, base * 0.898, base * 0.9], 0, incumbent=2)
    assert (d.winner, d.rule) == (2, ConfirmedRule.INCUMBENT_NOT_BEATEN)
    d = decide_confirmed([base, base * 0.8, base * 0.9], 0, incumbent=2)
    assert (d.winner, d.rule) == (1, ConfirmedRule.CONFIRMED)
    # an incumbent slower than the default is no holder at all
    d = decide_confirmed([base, base * 0.95, base * 1.1], 0, incumbent=2)
    assert (d.winner, d.rule) == (1, ConfirmedRule.CONFIRMED)


def test_too_few_rounds_or_a_gain_under_the_margin_is_undecided_and_noise_alone_a_tie():
    # noise wider than any difference: no challenger faster at the confidence, a tie within the measured noise
    rng = np.random.default_rng(9)
    default = rng.lognormal(0.0, 0.3, 10)
    fast = 0.9 * rng.lognormal(0.0, 0.3, 10)
    d = decide_confirmed([default, fast], 0)
    assert d.winner == 0 and not d.settled and d.tie
    assert "a tie within the measured noise" in confirmed_why(d, lambda i: f"c{i}")
    # 5 rounds cannot bound anything at 99 %: no measured noise to tie within, undecided
    d = decide_confirmed([np.ones(5), np.ones(5) * 0.5], 0)
    assert d.winner == 0 and not d.settled and not d.tie
    # faster at the confidence (0.4-0.8 %), not shown faster than the 0.5 % margin when the budget ended: undecided
    rng = np.random.default_rng(1)
    base = 1 + 0.002 * rng.standard_normal(12)
    d = decide_confirmed([base, base * 0.994 * (1 + 0.002 * rng.standard_normal(12))], 0)
    assert d.winner == 0 and not d.settled and not d.tie and d.versus.high < 1.0
    assert "not confirmed when the budget ended" in confirmed_why(d, lambda i: f"c{i}")


# -- who is in the stage --------------------------------------------------------------------------------
def S(i):
    return PlanSpec(i, ())


def test_the_leader_its_near_rivals_the_default_and_the_incumbent_are_in_the_stage():
    measured = [Measured(S(0), 0, "a", 2.0, 0.0),  # the default: far behind
                Measured(S(1), 1, "a", 1.0, 0.01),  # the leader
                Measured(S(2), 2, "a", 1.01, 0.01),  # within its noise
                Measured(S(3), 3, "a", 1.5, 0.0),  # not
                Measured(S(4), 4, "a", 1.8, 0.0)]  # the incumbent
    assert participants(measured, default=S(0), incumbent=S(4), max_candidates=6) == (S(0), S(1), S(2), S(4))
    # the cap drops the rivals first, never the leader, the default or the incumbent
    assert participants(measured, default=S(0), incumbent=S(4), max_candidates=3) == (S(0), S(1), S(4))
    # shards: each session's leader is in
    two = measured + [Measured(S(5), 5, "b", 0.7, 0.0), Measured(S(6), 6, "b", 0.9, 0.0)]
    assert S(5) in participants(two, default=S(0), incumbent=None, max_candidates=6)
    # the default leading with nothing near it: nothing to confirm
    alone = [Measured(S(0), 0, "a", 1.0, 0.0), Measured(S(1), 1, "a", 2.0, 0.0)]
    assert participants(alone, default=S(0), incumbent=None, max_candidates=6) == ()
    # ... unless the runners-up are looked at again whatever the main round said (a busy machine's main round)
    assert participants(alone, default=S(0), incumbent=None, max_candidates=6, runners_up=1) == (S(0), S(1))
    assert participants(measured, default=S(0), incumbent=None, max_candidates=6, runners_up=2) == \
        (S(0), S(1), S(2), S(3))


# -- the stage on a busy machine ------------------------------------------------------------------------
class DriftingClock:
    """A device timer that returns what the plans spent: their cost x a drift x noise. The drift moves by up to
    the whole ``drift`` over tens of calls: slow next to one round of the stage, fast next to the main round."""

    def __init__(self, drift=0.4, noise=0.02, seed=0):
        self.rng = np.random.default_rng(seed)
        self.drift, self.noise, self.calls, self.spent = drift, noise, 0, 0.0

    def charge(self, ms):
        self.calls += 1
        self.spent += ms * math.exp(self.drift * math.sin(self.calls / 40.0)) * self.rng.lognormal(0.0, self.noise)

    def measure(self, fn):
        self.spent = 0.0
        fn()
        return self.spent


class CostPlan:
    workspace_size = 0

    def __init__(self, engine):
        self.engine = engine

    def run(self, tensors, workspace, stream):
        e = self.engine
        e.runs += 1
        e.clock.charge(e.ms * (e.slow_factor if e.runs <= e.slow_runs else 1.0))
        tensors["C"][...] = tensors["A"] @ tensors["B"]


class CostEngine:
    """A matmul engine that costs ``ms`` a run on the drifting clock (its first ``slow_runs`` cost ``slow_factor``
    times more: contention while the main round measured it)."""

    ops = frozenset({"matmul"})
    knobs = ()
    supports_exhaustive = False

    def __init__(self, name, ms, clock, priority=50, slow_runs=0, slow_factor=1.0):
        self.name, self.ms, self.clock, self.priority = name, ms, clock, priority
        self.slow_runs, self.slow_factor, self.runs = slow_runs, slow_factor, 0

    def applicable(self, problem, device):
        return Support.yes()

    def estimate_workspace(self, problem, knobs):
        return 0

    def compile(self, problem, knobs, device):
        return CostPlan(self)


def _tune(engines, clock, config=None, calls=(CallMode.EAGER,)):
    registry = EngineRegistry(engines)
    wp = WorkloadProblem(0, "mm", matmul_problem(16, 16, 16), EngineSelection(), calls)
    # samples of about one call: the clock's drift is slow next to a round of the stage (what pairing cancels)
    config = config or AutotuneConfig(strategy="fixed_average", timed_iterations=5, check="off",
                                      confirm={"sample_ms": 1.0})
    device = fake_device(clock)
    with tempfile.TemporaryDirectory() as out:
        report = tune_in_process(out, [wp], device, config, registry)
    (outcome,) = report.outcomes
    return Tuned(outcome, report.summary.winner(device.signature, wp.problem.key))


@dataclass(frozen=True)
class Tuned:
    """One problem tuned in-process: its outcome (rows, stages), and the decision its override file publishes."""

    outcome: ProblemOutcome
    winner: Any

    @property
    def results(self):
        return self.outcome.results

    @property
    def confirmations(self):
        return self.outcome.confirmations


def test_on_a_busy_machine_a_3_percent_faster_candidate_is_confirmed_with_an_interval_that_holds_it():
    clock = DriftingClock(drift=0.5, noise=0.01)
    out = _tune([CostEngine("lib.default", 1.0, clock, priority=10), CostEngine("tuned.fast", 0.97, clock),
                 CostEngine("tuned.slow", 1.3, clock)], clock)
    (run,) = out.confirmations
    assert run.call is CallMode.EAGER and run.rounds >= 8
    assert {r.engine_name for r in run.results} >= {"lib.default", "tuned.fast"}
    assert all(r.succeeded and len(r.samples) == run.rounds for r in run.results)  # paired: one sample a round
    assert out.winner.engine_name == "tuned.fast"  # what the stage decided is what is published
    ok = {r.engine_name: r.samples for r in run.results}
    r = paired_ratio(ok["tuned.fast"], ok["lib.default"])
    assert r.low <= 0.97 <= r.high and r.high < 0.995


def test_a_default_measured_under_contention_is_measured_again_so_the_headline_is_not_noise():
    # the gemm-384: the default measured at ~20x while something else ran; the winner is ~1.3x faster
    clock = DriftingClock(drift=0.1, noise=0.02)
    default = CostEngine("lib.default", 1.1, clock, priority=10, slow_runs=8, slow_factor=20.0)
    out = _tune([default, CostEngine("tuned.fast", 0.84, clock)], clock)
    main = {r.engine_name: r.median_ms for r in out.results}
    assert main["lib.default"] / main["tuned.fast"] > 10  # what the main round alone would have published
    (run,) = out.confirmations
    ok = {r.engine_name: r.samples for r in run.results}
    r = paired_ratio(ok["tuned.fast"], ok["lib.default"])
    assert 1.2 < r.speedup < 1.45 and r.speedup_low <= 1.1 / 0.84 <= r.speedup_high


def test_a_stage_stops_early_when_it_can_and_its_budget_bounds_it_when_it_cannot():
    clock = DriftingClock(drift=0.0, noise=0.001)
    clear = _tune([CostEngine("lib.default", 1.0, clock, priority=10), CostEngine("tuned.fast", 0.5, clock)], clock)
    assert clear.confirmations[0].rounds < 64 and clear.confirmations[0].settled
    tie_clock = DriftingClock(drift=0.0, noise=0.05)
    cfg = AutotuneConfig(strategy="fixed_average", timed_iterations=5, check="off",
                         confirm=ConfirmSettings(max_rounds=40, budget_ms=1e6, sample_ms=1.0))
    tie = _tune([CostEngine("lib.default", 1.0, tie_clock, priority=10), CostEngine("tuned.same", 0.998, tie_clock)],
                tie_clock, cfg)
    assert tie.confirmations[0].rounds == 40  # undecidable: it runs to its round limit and no further


def test_off_means_no_stage_and_each_calling_mode_gets_its_own():
    clock = DriftingClock(drift=0.0, noise=0.01)
    engines = [CostEngine("lib.default", 1.0, clock, priority=10), CostEngine("tuned.fast", 0.9, clock)]
    off = AutotuneConfig(strategy="fixed_average", timed_iterations=3, check="off", confirm=False)
    assert _tune(engines, clock, off).confirmations == ()
    both = _tune(engines, clock, calls=(CallMode.EAGER, CallMode.GRAPH))
    assert [r.call for r in both.confirmations] == [CallMode.EAGER, CallMode.GRAPH]
    # the CPU has no graph capture: the graph stage times plain runs and says so
    assert all("no graph capture" in r.error for r in both.confirmations[1].results)


def test_a_candidate_that_fails_in_the_stage_leaves_it_and_the_others_stay_paired():
    clock = DriftingClock(drift=0.0, noise=0.01)

    class Flaky(CostEngine):
        def compile(self, problem, knobs, device):
            plan = CostPlan(self)
            real = plan.run

            def run(tensors, workspace, stream):
                if self.runs >= 4:
                    raise RuntimeError("illegal memory access")
                real(tensors, workspace, stream)
            plan.run = run
            return plan

    registry = EngineRegistry([CostEngine("lib.default", 1.0, clock, priority=10), Flaky("tuned.flaky", 0.5, clock),
                               CostEngine("tuned.ok", 0.9, clock)])
    specs = [(PlanSpec(engine_name_to_id(e.name)), i) for i, e in enumerate(registry)]
    run = run_confirmation(matmul_problem(16, 16, 16), fake_device(clock), registry, specs, reference=specs[0][0],
                           config=AutotuneConfig(check="off"))
    by = {r.engine_name: r for r in run.results}
    assert not by["tuned.flaky"].succeeded and "confirmation (eager)" in by["tuned.flaky"].error
    assert len(by["lib.default"].samples) == len(by["tuned.ok"].samples) == run.rounds


# -- the workload's settings ---------------------------------------------------------------------------
def test_confirm_and_call_settings_are_validated_like_every_other_field():
    assert AutotuneConfig(confirm={"rounds": 32, "budget_ms": 500}).confirm.max_rounds == 32
    assert AutotuneConfig(confirm=False).confirm.enabled is False
    with pytest.raises(InputError, match="confirm.max_rounds"):
        AutotuneConfig(confirm={"rounds": 4})
    with pytest.raises(InputError, match="confirm.speed"):
        AutotuneConfig(confirm={"speed": 1})
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload

    wl = parse_workload({"call": "graph", "problems": [
        {"op": "matmul", "tensors": {"A": [8, 8], "B": [8, 8]}},
        {"op": "matmul", "tensors": {"A": [4, 8], "B": [8, 8]}, "call": ["eager", "graph"]}]},
        registry=default_engine_registry())
    assert [p.calls for p in wl.problems] == [(CallMode.GRAPH,), (CallMode.EAGER, CallMode.GRAPH)]
    with pytest.raises(InputError, match=r"problems\[0\].call"):
        parse_workload({"problems": [{"op": "matmul", "tensors": {"A": [8, 8], "B": [8, 8]}, "call": "lazy"}]},
                       registry=default_engine_registry())
