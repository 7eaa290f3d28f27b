"""The autotuning RFC's smaller points (issue 45): create_execution_plan_ext, a never-compiled plan's workspace -1,
autotune() writing the override file through its storage config, and the RFC's minimum-time ranking by name."""

import json
import logging

import numpy as np
import pytest

from fakes import TILE, FakeEngine, ScriptedTimer, fake_device, matmul_problem, registry_of, tensors_for
from farm import AutotuneStorageConfig
from farm.errors import AutotuneError, InputError
from farm.model.engine import engine_id
from farm.model.records import AutotuneConfig, Disposition
from farm.store.overrides.parsing import load_overrides
from farm.tuner.autotuner import Autotuner


def tuner_with(*engines, timer=None):
    return Autotuner(matmul_problem(), fake_device(timer), registry=registry_of(*engines))


def test_create_execution_plan_ext_hard_selects_one_engine_and_ignores_knobs_it_lacks(caplog):
    a, b = FakeEngine("a", knobs=(TILE,)), FakeEngine("b", knobs=(TILE,))
    t = tuner_with(a, b)
    t.add_all_engines()
    with caplog.at_level(logging.WARNING):
        spec = t.create_execution_plan_ext("b", {"tile": 32, "SPLIT_K": 2})
    assert spec.engine_id == engine_id(b) and spec.knobs == (("tile", 32),)
    assert "SPLIT_K" in caplog.text and b.calls.compile[-1]["tile"] == 32 and not a.calls.compile
    tensors = tensors_for(t.problem)
    t.execute(tensors)
    np.testing.assert_allclose(tensors["C"], tensors["A"] @ tensors["B"], rtol=1e-5)
    assert t.workspace_size_at_index(-1) == 0
    with pytest.raises(InputError):  # a bad value of a knob it has
        t.create_execution_plan_ext("b", {"tile": 33})
    with pytest.raises(InputError):
        t.create_execution_plan_ext("nope")
    with pytest.raises(AutotuneError, match="unsupported tile"):
        tuner_with(FakeEngine("c", fail_at="compile")).create_execution_plan_ext("c")


def test_a_candidate_never_compiled_reports_workspace_minus_one():
    t = tuner_with(FakeEngine("ok", estimate=128), FakeEngine("broken", fail_at="compile"), timer=ScriptedTimer([1.0]))
    t.add_all_engines()
    results = {r.engine_name: r for r in t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=2))}
    assert results["broken"].disposition is Disposition.FAILED_COMPILE
    assert results["broken"].workspace_size == -1 and results["broken"].compiled_plan_index == -1
    assert results["ok"].workspace_size == 128


def test_autotune_writes_its_winner_through_the_storage_config(tmp_path):
    path = tmp_path / "overrides.json"
    slow, fast = FakeEngine("slow"), FakeEngine("fast")
    cfg = AutotuneConfig(strategy="fixed_average", timed_iterations=3, storage=AutotuneStorageConfig(path))
    t = Autotuner(matmul_problem(), fake_device(ScriptedTimer([2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])),
                  registry=registry_of(slow, fast))
    t.add_all_engines()
    ranked = t.autotune(config=cfg)
    f = load_overrides(path)
    assert [e.engine_name for e in f.entries] == [ranked[0].engine_name]
    assert f.match(matmul_problem()).metadata["rank"] == 0
    # appended: another problem's entry joins; delete_all_existing: the file holds the new winner alone
    t2 = Autotuner(matmul_problem(m=16), fake_device(ScriptedTimer([1.0])), registry=registry_of(FakeEngine("x")))
    t2.add_all_engines()
    t2.autotune(config=cfg)
    assert len(load_overrides(path).entries) == 2
    t3 = Autotuner(matmul_problem(m=32), fake_device(ScriptedTimer([1.0])), registry=registry_of(FakeEngine("y")))
    t3.add_all_engines()
    t3.autotune(config=AutotuneConfig(strategy="fixed_average", storage=AutotuneStorageConfig(path, True)))
    assert [e.engine_name for e in load_overrides(path).entries] == ["y"]
    assert json.loads(path.read_text())["version"] == 2


class PerEngineTimer:
    """Each engine's runs take its own times, in turn."""

    def __init__(self, times):
        self.engines, self.times = {}, {name: list(ts) for name, ts in times.items()}

    def measure(self, fn):
        before = {e.name: e.calls.run for e in self.engines.values()}
        fn()
        ran = next(e.name for e in self.engines.values() if e.calls.run != before[e.name])
        ts = self.times[ran]
        ts.append(ts.pop(0))
        return ts[-1]


def ranked(ranking):
    a, b = FakeEngine("a"), FakeEngine("b")
    # b has the lower minimum (0.5) but the higher median (3.0); a runs 1.0 every time
    timer = PerEngineTimer({"a": [1.0], "b": [0.5, 3.0, 3.0]})
    timer.engines = {"a": a, "b": b}
    t = tuner_with(a, b, timer=timer)
    t.add_all_engines()
    cfg = AutotuneConfig(strategy="fixed_average", timed_iterations=3, warmup_iterations=0, ranking=ranking)
    return [r.engine_name for r in t.autotune(config=cfg) if r.succeeded]


def test_the_rfcs_minimum_time_ranking_by_name():
    assert ranked("winner_rule")[0] == "a" and ranked("fastest")[0] == "b"
    with pytest.raises(InputError, match="ranking"):
        AutotuneConfig(ranking="slowest")
