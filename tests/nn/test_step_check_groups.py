"""The model check's step 2b (farm.nn.step_check): decisions within noise alone but leaning faster are timed
together, and kept together where the group makes the step faster beyond noise. Timed here by a fake step timer
(the step's samples given), so the rule is checked exactly; tests/nn/test_models.py times real steps."""

import numpy as np

from farm.model.problem import Problem
from farm.nn.step_check import CheckSettings, Judged, _with_small_gains
from farm.tuner.judging.paired import paired_ratio

ROUNDS = 11


def _samples(ms, noise, seed):
    return list(ms * (1 + noise * np.random.default_rng(seed).standard_normal(ROUNDS)))


def _judged(n, speedup, noise, holds=False):
    out = []
    for i in range(n):
        base = _samples(10.0, noise, 100 + i)
        mine = [b / speedup * (1 + noise * e) for b, e in zip(base, np.random.default_rng(i).standard_normal(ROUNDS))]
        alone = paired_ratio(mine, base)
        problem = Problem.create("matmul", {"A": [1, 64 + 16 * i], "B": [64 + 16 * i, 32]})
        out.append(Judged(problem, "cpu.matmul.einsum", (), "cpu.matmul.blas", ("m",), alone, tuple(mine),
                          tuple(base), holds, "holds: ..." if holds else "withdrawn: ... no faster beyond noise"))
    return out


class FakeTimer:
    """Step samples by how many leaning decisions a variant routes: each takes ``gain`` off the step."""

    def __init__(self, gain, noise=0.001):
        self.gain, self.noise, self.calls = gain, noise, []

    def rounds(self, variants, settings):
        self.calls.append(dict(variants))
        shared = np.random.default_rng(7).standard_normal(ROUNDS)  # the round's own drift, paired away

        def samples(keys):
            own = np.random.default_rng(len(keys)).standard_normal(ROUNDS)
            return list(10.0 * (1 - self.gain * len(keys)) * (1 + self.noise * shared + self.noise * own))

        return {name: samples(keys) for name, keys in variants.items()}, 3


def test_small_gains_within_noise_alone_are_kept_where_together_they_are_faster():
    leaning = _judged(3, 1.004, 0.01)
    assert all(j.alone.speedup > 1 and j.alone.speedup_low < 1 for j in leaning)  # within noise alone
    timer = FakeTimer(gain=0.005)
    judged, kept, measured = _with_small_gains(timer, CheckSettings(), leaning, lambda _: None, "graph")
    assert kept == frozenset(j.problem.key for j in leaning) and all(j.kept for j in judged)
    assert all(j.verdict.startswith("holds: with it alone") and "all 3 such" in j.verdict for j in judged)
    samples, steps, name = measured
    assert name == "group" and set(samples) == {"untouched", "group"} and steps == 3


def test_a_group_no_faster_beyond_noise_stays_withdrawn_and_a_slower_one_is_not_tried():
    leaning = _judged(2, 1.004, 0.01)
    judged, kept, _ = _with_small_gains(FakeTimer(gain=0.0, noise=0.02), CheckSettings(), leaning,
                                         lambda _: None, "eager")
    assert kept == frozenset() and not any(j.kept for j in judged)
    slower = _judged(2, 0.97, 0.01)  # leaning slower: never tried together
    timer = FakeTimer(gain=0.01)
    judged, kept, measured = _with_small_gains(timer, CheckSettings(), slower, lambda _: None, "graph")
    assert kept == frozenset() and measured is None and timer.calls == []


def test_the_group_is_timed_against_the_decisions_that_hold_alone():
    holding = _judged(1, 1.2, 0.001, holds=True)
    leaning = _judged(2, 1.004, 0.01)
    timer = FakeTimer(gain=0.004)
    judged, kept, measured = _with_small_gains(timer, CheckSettings(), holding + leaning, lambda _: None, "graph")
    assert timer.calls[0]["holding"] == frozenset({holding[0].problem.key})
    assert kept == frozenset(j.problem.key for j in holding + leaning)
    assert "beside the 1 that hold alone" in judged[1].verdict and measured[2] == "group"
