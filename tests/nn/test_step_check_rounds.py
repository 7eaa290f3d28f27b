"""The model check's paired rounds stop for a variant once its interval decides (no torch needed: a fake step)."""

import numpy as np

from farm.nn.step_check import CheckSettings, _StepTimer


class _FakeSteps(_StepTimer):
    """Each variant's step takes its own time, with noise; nothing runs."""

    def __init__(self, ms: dict[frozenset, float], seed: int = 1) -> None:
        self.ms = ms
        self.rng = np.random.default_rng(seed)
        self.calls: dict[frozenset, int] = {}

    def sampler(self, keys, n):
        def sample():
            self.calls[keys] = self.calls.get(keys, 0) + 1
            return self.ms[keys] * (1.0 + 0.01 * self.rng.standard_normal())
        return sample


VARIANTS = {"untouched": frozenset(), "faster": frozenset({"a"}), "slower": frozenset({"b"}),
            "same": frozenset({"c"})}
TIMES = {frozenset(): 1.0, frozenset({"a"}): 0.8, frozenset({"b"}): 1.25, frozenset({"c"}): 1.0}


def test_a_variant_whose_interval_decides_stops_at_the_eighth_round_the_undecided_go_on():
    samples, _ = _FakeSteps(TIMES).rounds(VARIANTS, CheckSettings(rounds=16))
    assert len(samples["faster"]) == len(samples["slower"]) == 8  # wholly above / below 1 at the first look
    assert len(samples["same"]) == len(samples["untouched"]) == 16  # within noise: every round


def test_without_sequential_every_variant_runs_every_round():
    samples, _ = _FakeSteps(TIMES).rounds(VARIANTS, CheckSettings(rounds=12, sequential=False))
    assert {len(v) for v in samples.values()} == {12}


def test_when_every_variant_decides_the_rounds_end_there():
    steps = _FakeSteps({frozenset(): 1.0, frozenset({"a"}): 0.7})
    samples, _ = steps.rounds({"untouched": frozenset(), "faster": frozenset({"a"})}, CheckSettings(rounds=30))
    assert len(samples["untouched"]) == len(samples["faster"]) == 8
    assert steps.calls[frozenset()] == 8 + 2  # the 8 rounds, and the probe: a warm-up, then the one that sizes a sample
