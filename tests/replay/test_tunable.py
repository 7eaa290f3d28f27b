"""The replay runtime and farm.ops on the CPU: settings, record, replay, heal, untuned workloads."""

import json
import logging

import numpy as np
import pytest

import farm.ops as ops
from farm.devices.device import cpu_device
from farm.store.overrides.entries import OverrideEntry
from farm.store.overrides.parsing import load_overrides
from farm.store.overrides.files import write_overrides
from farm.replay.tunable_runtime import TunableRuntime
from farm.replay.tunable_settings import TunableSettings, with_ordinal
from farm.model.workload import load_workload
from tests.fakes import fake_props, matmul_problem

ENVS = ("FARM_TUNABLE_ENABLED", "FARM_TUNABLE_TUNING", "FARM_TUNABLE_RECORD_UNTUNED", "FARM_TUNABLE_VERBOSE",
        "FARM_TUNABLE_MAX_TUNING_DURATION_MS", "FARM_TUNABLE_MAX_TUNING_SAMPLES", "FARM_TUNABLE_FILENAME",
        "FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    ops.reset()
    yield
    ops.reset()


def quick(tmp_path, **changes):
    base = dict(enabled=True, tuning=True, max_tuning_duration_ms=2, max_tuning_samples=5,
                filename=str(tmp_path / "results.json"))
    return TunableSettings(**{**base, **changes})


# -- settings ------------------------------------------------------------------------------------
def test_settings_come_from_the_environment_and_bad_values_are_warned_and_ignored(caplog):
    env = {"FARM_TUNABLE_ENABLED": "1", "FARM_TUNABLE_TUNING": "off", "FARM_TUNABLE_RECORD_UNTUNED": "yes",
           "FARM_TUNABLE_MAX_TUNING_DURATION_MS": "-5", "FARM_TUNABLE_MAX_TUNING_SAMPLES": "many",
           "FARM_TUNABLE_VERBOSE": "perhaps", "FARM_TUNABLE_FILENAME": "out/r.json"}
    with caplog.at_level(logging.WARNING, logger="farm.replay.tunable_runtime"):
        s = TunableSettings.from_env(env)
    assert (s.enabled, s.tuning, s.record_untuned, s.filename) == (True, False, True, "out/r.json")
    default = TunableSettings()
    assert (s.max_tuning_duration_ms, s.max_tuning_samples, s.verbose) == (
        default.max_tuning_duration_ms, default.max_tuning_samples, default.verbose)
    for name in ("MAX_TUNING_DURATION_MS", "MAX_TUNING_SAMPLES", "VERBOSE"):
        assert f"FARM_TUNABLE_{name}" in caplog.text


def test_environment_is_read_once_at_first_use(monkeypatch):
    rt = TunableRuntime(cpu_device())
    monkeypatch.setenv("FARM_TUNABLE_ENABLED", "1")
    assert rt.is_enabled()
    monkeypatch.setenv("FARM_TUNABLE_ENABLED", "0")
    assert rt.is_enabled()  # not re-read
    rt.enable(False)
    assert not rt.is_enabled()  # the API overrides


def test_filename_gets_the_device_ordinal():
    assert with_ordinal("results.json", 3) == "results3.json"
    assert with_ordinal("dir/tuned_{ordinal}_x.json", 1) == "dir/tuned_1_x.json"
    rt = TunableRuntime(cpu_device(), settings=TunableSettings(filename="/tmp/r.json"))
    assert rt.get_filename() == "/tmp/r0.json"


# -- record, replay, heal ------------------------------------------------------------------------
def test_tuning_records_once_and_a_new_runtime_replays_without_measuring(tmp_path):
    p = matmul_problem(32, 24, 16)
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path))
    bound = rt.bind(p.key, p)
    assert bound.source == "tuned" and rt.measurements == 1
    assert rt.bind(p.key, p) is bound and rt.measurements == 1  # cached in-process
    recorded = load_overrides(tmp_path / "results0.json")
    assert [e.engine_name for e in recorded.entries] == [bound.engine_name]
    assert recorded.device_signature == cpu_device().signature

    fresh = TunableRuntime(cpu_device(), settings=quick(tmp_path, tuning=False))
    again = fresh.bind(p.key, p)
    assert (again.source, again.engine_name, again.knobs) == ("recorded", bound.engine_name, bound.knobs)
    assert fresh.measurements == 0
    assert fresh.results()[0]["engine"] == bound.engine_name
    assert fresh.get_results()[0][2].split("[")[0] == bound.engine_name  # (op, params, kernel, time_ms)


def test_tuning_off_and_nothing_recorded_uses_static_ordering(tmp_path):
    p = matmul_problem()
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path, tuning=False))
    b = rt.bind(p.key, p)
    assert b.source == "SelectionHeuristic::StaticOrdering" and b.engine_name == "cpu.matmul.blas"
    assert rt.measurements == 0 and not (tmp_path / "results0.json").exists()


def test_disabled_runtime_never_reads_or_writes_the_file(tmp_path):
    p = matmul_problem()
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path, enabled=False))
    assert rt.bind(p.key, p).source == "SelectionHeuristic::StaticOrdering"
    assert list(tmp_path.iterdir()) == []


def _record(tmp_path, p, engine, device=None):
    dev = device or cpu_device().properties
    write_overrides(tmp_path / "results0.json", [OverrideEntry.for_problem(p, engine, (), {"rank": 0, "min_time_ms": 1.0})],
                    device={"signature": dev.signature, "properties": dev.to_dict()}, mode="replace")


def test_a_recorded_winner_that_no_longer_compiles_is_retuned_and_the_file_heals(tmp_path, caplog):
    p = matmul_problem(16, 16, 16)
    _record(tmp_path, p, "cpu.matmul.removed_in_this_build")
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path, verbose=True))
    with caplog.at_level(logging.INFO, logger="farm.replay.tunable_runtime"):
        b = rt.bind(p.key, p)
    assert b.source == "tuned" and rt.measurements == 1
    assert "no longer compiles" in caplog.text
    healed = load_overrides(tmp_path / "results0.json")
    assert len(healed.entries) == 1 and healed.entries[0].engine_name == b.engine_name


def test_a_recorded_winner_that_no_longer_compiles_is_skipped_with_tuning_off(tmp_path):
    p = matmul_problem(16, 16, 16)
    _record(tmp_path, p, "cpu.matmul.removed_in_this_build")
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path, tuning=False))
    b = rt.bind(p.key, p)
    assert b.source == "SelectionHeuristic::StaticOrdering" and rt.measurements == 0


def test_a_file_for_another_device_is_skipped_and_left_where_it_is(tmp_path, caplog):
    """A results file shared by a mixed fleet must survive every process that reads it (never renamed)."""
    p = matmul_problem()
    _record(tmp_path, p, "cpu.matmul.einsum", device=fake_props())
    before = (tmp_path / "results0.json").read_bytes()
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path, tuning=False, verbose=True))
    with caplog.at_level(logging.WARNING, logger="farm.replay.tunable_runtime"):
        b = rt.bind(p.key, p)
    assert b.source != "recorded"
    assert "not used here" in caplog.text and fake_props().signature in caplog.text
    assert (tmp_path / "results0.json").read_bytes() == before
    assert [f.name for f in tmp_path.iterdir() if not f.name.startswith(".")] == ["results0.json"]  # nothing set aside


def test_the_runtime_api_is_tunableops(tmp_path):
    rt = TunableRuntime(cpu_device(), settings=TunableSettings())
    assert rt.get_filename() == ""  # empty until set or first used
    for on, off, query in ((rt.enable, rt.disable, rt.is_enabled), (rt.tuning_enable, rt.tuning_disable, rt.tuning_is_enabled),
                           (rt.record_untuned_enable, rt.record_untuned_disable, rt.record_untuned_is_enabled)):
        on()
        assert query()
        off()
        assert not query()
    rt.set_verbose(True)
    assert rt.is_verbose()
    rt.set_max_tuning_duration(0)  # 0 turns the limit off (TunableOp)
    rt.set_max_tuning_iterations(0)
    assert rt.get_max_tuning_duration() == 0 and rt.get_max_tuning_iterations() == 0
    with pytest.raises(ValueError):
        rt.set_max_tuning_duration(-1)
    rt.set_filename(str(tmp_path / "mine.json"))
    assert rt.get_filename() == str(tmp_path / "mine0.json")
    assert rt.untuned_filename() != rt.get_filename()


def test_a_zero_budget_tunes_without_that_limit(tmp_path):
    p = matmul_problem(8, 8, 8)
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path, max_tuning_duration_ms=0, max_tuning_samples=0))
    b = rt.bind(p.key, p)
    assert b.source == "tuned" and rt.measurements == 1


@pytest.mark.parametrize("name", ["results.json", "untuned.json", "tuned.yaml", "r"])
def test_the_untuned_file_never_is_the_results_file(tmp_path, name):
    rt = TunableRuntime(cpu_device(), settings=TunableSettings(filename=str(tmp_path / name)))
    assert rt.untuned_filename() != rt.get_filename()


def test_read_file_merges_into_what_is_recorded(tmp_path):
    a, b = matmul_problem(12, 12, 12), matmul_problem(16, 16, 16)
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path))
    rt.bind(a.key, a)
    rt.write_file(str(tmp_path / "a.json"))
    other = TunableRuntime(cpu_device(), settings=quick(tmp_path, filename=str(tmp_path / "b.json")))
    other.bind(b.key, b)
    other.write_file(str(tmp_path / "b.json"))
    rt.read_file(str(tmp_path / "b.json"))
    assert sorted(r["problem_key"] for r in rt.results()) == sorted([a.key, b.key])


def test_untuned_problems_become_a_workload_farm_tune_accepts(tmp_path):
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path, tuning=False, record_untuned=True))
    problems = [matmul_problem(8, 6, 5), matmul_problem(9, 6, 5)]
    for p in problems + problems:  # the second round adds nothing
        rt.bind(p.key, p)
    untuned = tmp_path / "untuned0.yaml"
    wl = load_workload(untuned)
    assert sorted(wp.problem.key for wp in wl.problems) == sorted(p.key for p in problems)


def test_write_file_and_read_file_round_trip(tmp_path):
    p = matmul_problem(12, 12, 12)
    rt = TunableRuntime(cpu_device(), settings=quick(tmp_path))
    rt.bind(p.key, p)
    rt.write_file(str(tmp_path / "copy.json"))
    other = TunableRuntime(cpu_device(), settings=quick(tmp_path, tuning=False, filename=str(tmp_path / "none.json")))
    assert other.read_file(str(tmp_path / "copy.json"))
    assert other.results()[0]["problem_key"] == p.key


# -- farm.ops ----------------------------------------------------------------------------------------
def test_ops_compute_the_right_answers_with_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((33, 17)).astype(np.float32), rng.standard_normal((17, 9)).astype(np.float32)
    bias = rng.standard_normal(9).astype(np.float32)
    np.testing.assert_allclose(ops.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ops.matmul(a, b, bias), a @ b + bias, rtol=1e-4, atol=1e-4)
    out = np.empty((33, 9), np.float32)
    assert ops.matmul(a, b, out=out) is out
    with pytest.raises(Exception, match="out must have shape"):
        ops.matmul(a, b, out=np.empty((2, 2), np.float32))

    q = rng.standard_normal((1, 4, 16, 8)).astype(np.float32)
    kv = rng.standard_normal((1, 2, 16, 8)).astype(np.float32)
    o = ops.sdpa(q, kv, kv, causal=True)
    k2 = np.repeat(kv, 2, axis=1)
    s = q @ k2.transpose(0, 1, 3, 2) / np.sqrt(8)
    s = np.where(np.tril(np.ones((16, 16), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(o, (w / w.sum(-1, keepdims=True)) @ k2, rtol=1e-4, atol=1e-4)

    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = ops.conv2d(x, wt, stride=2, padding=1)
    ref = np.zeros((2, 4, 5, 5), np.float32)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for i in range(5):
        for j in range(5):
            ref[:, :, i, j] = np.einsum("nchw,kchw->nk", xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3], wt)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_ops_choose_once_per_shape(monkeypatch):
    a = np.ones((8, 4), np.float32)
    b = np.ones((4, 2), np.float32)
    ops.matmul(a, b)
    rt = ops.runtime("cpu", 0)
    calls = []
    real = rt.bind
    monkeypatch.setattr(rt, "bind", lambda k, p: calls.append(k) or real(k, p))
    for _ in range(5):
        ops.matmul(a, b)
    assert calls == []
    ops.matmul(np.ones((9, 4), np.float32), b)  # a new shape binds once
    assert len(calls) == 1
    assert {c["problem"] for c in ops.choices()} == {"matmul A[8,4] B[4,2] fp32", "matmul A[9,4] B[4,2] fp32"}


def test_ops_replay_a_recorded_file(tmp_path):
    a = np.random.default_rng(1).standard_normal((24, 24)).astype(np.float32)
    ops.enable()
    ops.set_filename(str(tmp_path / "r.json"))
    ops.set_max_tuning_duration(2)
    ops.matmul(a, a)
    tuned = ops.choices()[0]
    assert tuned["source"] == "tuned"
    ops.reset()
    ops.enable()
    ops.tuning_enable(False)
    ops.set_filename(str(tmp_path / "r.json"))
    np.testing.assert_allclose(ops.matmul(a, a), a @ a, rtol=1e-4, atol=1e-4)
    again = ops.choices()[0]
    assert (again["engine"], again["knobs"], again["source"]) == (tuned["engine"], tuned["knobs"], "recorded")
    assert ops.runtime("cpu", 0).measurements == 0


def test_ops_reject_what_they_cannot_run():
    from farm.errors import InputError

    with pytest.raises(InputError, match="numpy array or a torch tensor"):
        ops.matmul([[1.0]], [[1.0]])
    with pytest.raises(InputError):
        ops.matmul(np.ones((3, 4), np.float32), np.ones((5, 2), np.float32))  # inner dims differ
    with pytest.raises(InputError, match="strides"):
        ops.matmul(np.ones((4, 4), np.float32)[::-1], np.ones((4, 2), np.float32))


def test_ops_follow_the_environment_like_tunableop(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_TUNABLE_ENABLED", "1")
    monkeypatch.setenv("FARM_TUNABLE_MAX_TUNING_DURATION_MS", "2")
    monkeypatch.setenv("FARM_TUNABLE_FILENAME", str(tmp_path / "env_{ordinal}.json"))
    ops.matmul(np.ones((6, 6), np.float32), np.ones((6, 6), np.float32))
    data = json.loads((tmp_path / "env_0.json").read_text())
    assert len(data["engine_overrides"]) == 1


def test_a_file_in_the_rfc_layout_replays_with_its_knobs(tmp_path):
    """hipDNN writes knobs in autotune_metadata.knobs; replay here applies them (docs/overrides.md)."""
    a = np.random.default_rng(2).standard_normal((12, 12)).astype(np.float32)
    rule = {"op": "matmul", "engine_name": "cpu.matmul.blas", "criteria": {},
            "tensors": [{"tensor_id": "A", "dim": [12, 12]}, {"tensor_id": "B", "dim": [12, 12]}],
            "autotune_metadata": {"rank": 0, "min_time_ms": 0.01, "timestamp": "2026-04-21T10:30:00Z",
                                  "knobs": [{"knob_id": "order", "type": "string", "value": "transposed"}]}}
    (tmp_path / "hipdnn0.json").write_text(json.dumps({"version": 2, "engine_overrides": [rule]}))
    ops.enable()
    ops.tuning_enable(False)
    ops.set_filename(str(tmp_path / "hipdnn.json"))  # device 0 reads hipdnn0.json, as TunableOp names it
    np.testing.assert_allclose(ops.matmul(a, a), a @ a, rtol=1e-4, atol=1e-4)
    (choice,) = ops.choices()
    assert (choice["engine"], choice["knobs"], choice["source"]) == ("cpu.matmul.blas", {"order": "transposed"}, "recorded")


def test_no_measurement_while_a_graph_is_being_captured(tmp_path):
    """During CUDA graph capture the heuristic's choice is used (no tuning) and stays pinned after the capture."""
    import dataclasses

    capturing = {"now": True}
    dev = cpu_device()
    dev = dataclasses.replace(dev, extras={**dev.extras, "is_capturing": lambda d: capturing["now"]})
    rt = TunableRuntime(dev, settings=quick(tmp_path))
    p = matmul_problem()
    during = rt.bind(p.key, p)
    assert rt.measurements == 0 and during.source not in ("tuned", "recorded")
    assert not (tmp_path / "results0.json").exists()  # nothing measured, nothing recorded
    capturing["now"] = False
    assert rt.bind(p.key, p) is during and rt.measurements == 0  # pinned: the graph holds this choice
    other = matmul_problem(m=12)
    assert rt.bind(other.key, other).source == "tuned" and rt.measurements == 1  # outside capture: tuned as usual
