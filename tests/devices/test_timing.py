import math


from farm.devices.timing import HostTimer
from farm.model.measurement import StopRule, Strategy, coefficient_of_variation, summarize


def test_summarize_edge_cases():
    empty = summarize([])
    assert empty.count == 0 and empty.min is None and empty.mean is None and empty.cov is None
    one = summarize([2.5])
    assert (one.min, one.max, one.mean, one.stddev, one.median) == (2.5, 2.5, 2.5, 0.0, 2.5)
    flat = summarize([1.0] * 7)
    assert flat.stddev == 0.0 and flat.cov == 0.0
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s.mean == 2.5 and s.median == 2.5 and s.min == 1.0 and s.max == 4.0
    assert s.mad == 1.0  # deviations 1.5, 0.5, 0.5, 1.5
    assert summarize([1.0, 1.0, 1.0, 50.0]).mad == 0.0  # one outlier does not move it
    assert one.mad == 0.0 and empty.mad is None
    assert math.isclose(s.stddev, math.sqrt(1.25))


def test_mean_stays_inside_min_max_under_rounding():
    samples = [0.1 + 1e-17 * i for i in range(10)] + [0.1]
    s = summarize(samples)
    assert s.min <= s.mean <= s.max


def test_cov_with_zero_mean():
    assert coefficient_of_variation([0.0, 0.0, 0.0]) == 0.0
    assert coefficient_of_variation([-1.0, 1.0]) == math.inf
    assert coefficient_of_variation([]) == 0.0
    assert math.isclose(coefficient_of_variation([1.0, 3.0]), 0.5)


def run_rule(rule, series):
    samples = []
    for t in series:
        samples.append(t)
        stop, converged = rule.done(samples, elapsed_ms=0.0)
        if stop:
            return len(samples), converged
    return len(samples), None


def test_run_until_stable_converges_on_a_stable_sequence():
    rule = StopRule(Strategy.RUN_UNTIL_STABLE, iterations=100, window=3, threshold=0.05)
    n, converged = run_rule(rule, [5.0, 1.0, 1.01, 0.99, 1.0, 1.0])
    assert (n, converged) == (4, True)  # the first window of 3 under 5 % CoV ends at sample 4


def test_run_until_stable_caps_an_unstable_sequence():
    rule = StopRule(Strategy.RUN_UNTIL_STABLE, iterations=10, window=3, threshold=0.05)
    n, converged = run_rule(rule, [1.0, 2.0] * 50)
    assert (n, converged) == (10, False)


def test_fixed_average_and_single_shot():
    assert run_rule(StopRule(Strategy.FIXED_AVERAGE, iterations=7), [1.0, 9.0] * 10) == (7, True)
    assert run_rule(StopRule(Strategy.SINGLE_SHOT, iterations=7), [3.0] * 10) == (1, True)


def test_budgets_smaller_bound_wins_and_at_least_one_sample():
    rule = StopRule(Strategy.FIXED_AVERAGE, iterations=50, max_samples=4)
    assert run_rule(rule, [1.0] * 60) == (4, False)
    rule = StopRule(Strategy.FIXED_AVERAGE, iterations=50, max_samples=40, max_duration_ms=1.0)
    samples = [1.0]
    assert rule.done(samples, elapsed_ms=5.0) == (True, False)  # duration already spent after one sample
    assert rule.done([], elapsed_ms=5.0) == (False, False)  # never stop before the first sample
    # the iteration count is smaller than both budgets: it wins and the run counts as complete
    rule = StopRule(Strategy.FIXED_AVERAGE, iterations=3, max_samples=40, max_duration_ms=1e9)
    assert run_rule(rule, [1.0] * 10) == (3, True)


def test_host_timer_measures_the_call():
    import time

    ms = HostTimer().measure(lambda: time.sleep(0.01))
    assert 9.0 <= ms < 200.0
