"""Where device time goes (farm.tuner.phases): the split's arithmetic, the driver's accounting of lost and idle
time, and a farm run on simulated devices with compile costs whose split reaches job.json, the summary and
``farm report`` (text and --json)."""

import json
import os

import pytest

from farm.analysis.phases import run_phases
from farm.fleet.driver import finish_phases
from farm.fleet.on_ray.worker import TaskEnd
from farm.tuner.phases import COMPILE, CONFIRM, DISCOVER, IDLE, LOST, MEASURE, PHASES, SETUP, PhaseClock, PhaseSplit
from tests.fleet.test_driver import result, setup


def test_a_split_adds_up_and_idle_is_what_the_phases_leave_of_the_window():
    a = PhaseSplit.of({MEASURE: 3.0, COMPILE: 1.0})
    b = PhaseSplit.of({MEASURE: 1.0, DISCOVER: 0.5})
    total = a + b
    assert total.get(MEASURE) == 4.0 and total.get(COMPILE) == 1.0 and total.get(DISCOVER) == 0.5
    assert total.with_idle(10.0).get(IDLE) == pytest.approx(4.5) and total.with_idle(10.0).total == pytest.approx(10.0)
    assert total.with_idle(2.0).get(IDLE) == 0.0  # phases that overlap (discovery beside a task) never go negative
    assert list(total.to_json()) == list(PHASES)


def test_a_hand_edited_split_is_read_as_far_as_it_makes_sense():
    split = PhaseSplit.from_json({"measure": 2, "compile": "a lot", "idle": -1, "warp": 3, "setup": True})
    assert split.seconds == ((MEASURE, 2.0),)
    assert PhaseSplit.from_json(["measure", 2]) == PhaseSplit()


def test_a_clock_hands_over_what_it_counted_and_starts_again():
    clock = PhaseClock()
    with clock.phase(MEASURE):
        pass
    clock.add(COMPILE, 0.25)
    clock.add(COMPILE, -1.0)  # nothing negative is counted
    taken = clock.take()
    assert taken.get(COMPILE) == 0.25 and taken.get(MEASURE) >= 0.0
    assert clock.take() == PhaseSplit()


def test_the_driver_adds_each_tasks_split_counts_a_dead_workers_task_as_lost_and_the_rest_as_idle():
    driver, [w], sink, clock, cs = setup()
    driver.assignments()
    driver.on_started(w)
    clock.t = 2.0
    driver.on_batch(w, [result(cs[0])])
    driver.on_lost(w, "SIGKILL")  # 2 s of work that bought one row
    driver.on_back(w)
    clock.t = 3.0
    driver.assignments()
    driver.on_started(w)
    clock.t = 6.0
    driver.on_batch(w, [result(c) for c in cs[1:]])
    driver.on_end(w, TaskEnd("s", {}, phases=PhaseSplit.of({SETUP: 0.5, COMPILE: 1.0, MEASURE: 1.5})))
    driver.on_stream_end(w)
    total = finish_phases(driver.workers, 10.0)
    assert w.status.phases.get(LOST) == 2.0 and w.status.phases.get(MEASURE) == 1.5
    assert w.status.phases.get(IDLE) == pytest.approx(5.0) and total.total == pytest.approx(10.0)


@pytest.mark.parametrize("compile_, field", [({"ms": -1}, "compile.ms"), ({"cache": "disk"}, "compile.cache"),
                                             ({"build_ms": "slow"}, "compile.build_ms"), ("fast", "compile"),
                                             ({"ms": 1, "when": 2}, "compile")])
def test_a_bad_compile_cost_in_a_simulation_config_is_named(compile_, field):
    from farm.devices.sim import SimConfig
    from farm.errors import InputError

    with pytest.raises(InputError) as err:
        SimConfig.parse({"devices": [{"name": "Sim", "count": 1}], "compile": compile_}, "sim.yaml")
    assert err.value.field == field and "sim.yaml" in str(err.value)


def test_run_phases_reads_the_latest_run_that_has_a_split():
    record = {"runs": [
        {"run_id": "r1", "workers": [{"name": "sim:0", "phases": {"measure": 1.0}}], "phases": {"tuning_s": 1.0}},
        {"run_id": "r2", "workers": [{"name": "sim:0", "signature": "s", "phases": {"measure": 3.0, "idle": 1.0}},
                                     {"name": "sim:1", "signature": "s", "phases": {"compile": 2.0, "idle": 2.0}}],
         "phases": {"tuning_s": 4.0}},
        {"run_id": "r3", "workers": "nonsense"},
    ]}
    got = run_phases(record)
    assert got is not None and got.run_id == "r2" and got.tuning_s == 4.0 and len(got.workers) == 2
    assert got.total.get(MEASURE) == 3.0 and got.overhead()[0] == (IDLE, 0.375)
    assert run_phases({"runs": []}) is None and run_phases("junk") is None


ray = pytest.importorskip("ray", reason="the farm needs ray[default]")


@pytest.mark.slow
def test_a_farm_run_on_simulated_devices_reports_where_its_device_time_went(tmp_path, capsys):
    from farm.cli.main import main
    from farm.devices.sim import SimConfig
    from farm.fleet.options import DeviceRequest, FarmOptions
    from farm.fleet.on_ray.cluster import run_farm
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload

    wl = parse_workload({
        "name": "phases",
        "autotune": {"strategy": "fixed_average", "max_iterations": 3, "warmup_iterations": 1, "check": "off",
                     "confirm": {"sample_ms": 0.02}},
        "engines": {"include": ["sim.gemm"], "sweep": {"sim.gemm": {"block": [32, 64, 128], "stages": [2, 3]}}},
        "problems": [{"name": f"p{i}", "op": "matmul", "tensors": {"A": [256 + 64 * i, 512], "B": [512, 256]}}
                     for i in range(4)],
    }, registry=default_engine_registry())
    cache = tmp_path / "kernels"
    sim = SimConfig.parse({"devices": [{"name": "Sim GPU", "count": 2}], "noise": 0.0, "sleep": 50,
                           "compile": {"ms": 30, "setup_ms": 10, "cache": "host", "cache_dir": str(cache)}})
    out = tmp_path / "run"
    report = run_farm(wl, out, devices=DeviceRequest("sim", 2, sim), options=FarmOptions(shard_size=4))
    # every kernel (a knob setting: shared by the four shapes) compiled once on the host, whichever worker did it
    assert len([f for f in os.listdir(cache) if not f.endswith(".tmp")]) == 6
    record = json.loads((out / "job.json").read_text())
    run = record["runs"][-1]
    assert run["phases"]["devices"] == 2
    for w in run["workers"]:
        split = PhaseSplit.from_json(w["phases"])
        # the phases cover the tuning window: idle is the rest of it, not a figure of its own
        assert split.total == pytest.approx(run["phases"]["tuning_s"], rel=0.02, abs=0.01)
        assert split.get(MEASURE) > 0 and split.get(SETUP) > 0
    total = PhaseSplit.from_json(run["phases"]["total"])
    assert total.get(COMPILE) > 0 and total.get(CONFIRM) > 0 and total.get(DISCOVER) > 0
    assert total == report.phases.__class__.from_json(report.phases.to_json())

    assert main(["report", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["phases"]
    assert shown["run_id"] == run["run_id"] and shown["total"] == run["phases"]["total"]
    assert [w["phases"] for w in shown["workers"]] == [w["phases"] for w in run["workers"]]
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Device time by phase" in text and "sim:0" in text and "sim:1" in text and "measure" in text
