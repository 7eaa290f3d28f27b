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


def test_a_step_that_cannot_be_captured_in_a_graph_withdraws_its_graph_decisions_with_the_reason(monkeypatch):
    """transformers' sliding-window static cache copies from the host in its update: torch refuses to capture the
    model's own step, so the graph check has nothing to compare; it says why and routes nothing in graphs."""
    from types import SimpleNamespace

    import farm.nn.step_check as step_check
    from farm.model.problem import Problem
    from farm.nn.routing import Routed

    problem = Problem.create("matmul", {"A": [1, 64], "B": [64, 64]}, dtype="bf16")
    bound = SimpleNamespace(engine_name="triton.gemv", knobs=(("BLOCK_K", 64),))
    routed = Routed(problem, SimpleNamespace(graph=SimpleNamespace(bound=bound), eager=None), ["layers.0.q_proj"])
    why = "RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture"

    class Uncapturable:
        def __init__(self, step, applied, call):
            pass

        def warm(self):
            return [routed]

        def uncapturable(self):
            return why

        def once(self):
            return 5.0

    only = []
    applied = SimpleNamespace(only=only.append, decisions=SimpleNamespace(default_engine=lambda p: "torch.matmul"))
    monkeypatch.setattr(step_check, "_StepTimer", Uncapturable)
    check = step_check.check_step(lambda: None, applied, call="graph")
    assert only == [frozenset()]  # nothing routed in graphs
    assert [j.kept for j in check.judged] == [False] and why in check.judged[0].verdict
    assert why in check.note and check.untouched_ms == check.applied_ms == 5.0
