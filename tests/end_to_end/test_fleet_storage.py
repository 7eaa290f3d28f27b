"""Results on shared storage (a pyarrow.fs URI; S3 through moto here): workers write their own parts,
the driver counts, resume and the reducer read the dataset where it lies."""

import collections
import json
import os

import pytest

from fakes import fake_props, fake_result, matmul_problem
from farm.errors import InputError
from farm.store.dataset import ResultsDataset
from farm.store.location import Location, is_uri
from farm.store.results import MeasurementContext, ResultWriter, RunContext, result_row

pytestmark = pytest.mark.slow  # an end-to-end test of the farm: Ray, a cluster, the docs run whole

P1 = matmul_problem()


def test_a_location_is_a_local_folder_or_a_uri(tmp_path):
    local = Location.of(tmp_path / "out")
    assert local.local and local.path == str(tmp_path / "out") and not is_uri(str(tmp_path))
    assert is_uri("s3://bucket/x") and is_uri("file:///mnt/shared") and not is_uri("runs/x")
    shared = Location.of(f"file://{tmp_path}/mount")
    assert shared.local and shared.join("results").path == f"{tmp_path}/mount/results"
    with pytest.raises(InputError) as info:
        Location.of("nosuchscheme://bucket/path")
    assert info.value.field == "out" and info.value.value == "nosuchscheme://bucket/path"


def test_a_job_on_storage_that_cannot_be_reached_is_one_clear_error(monkeypatch):
    from farm.fleet.job import JobRun
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    wl = parse_workload({"name": "w", "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [8, 5], "B": [5, 6]}}]},
                        registry=default_engine_registry())
    uri = "s3://nobucket/x?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    with pytest.raises(InputError) as info:
        JobRun(uri, wl, {})
    assert info.value.field == "out" and info.value.value == uri and "cannot read or write there" in str(info.value)


def test_parts_on_s3_are_read_back_as_a_dataset(s3_bucket):
    fs, query = s3_bucket
    uri = f"s3://tunefarm/job1/results?{query}"
    assert Location.of(uri).join("x").uri == f"s3://tunefarm/job1/results/x?{query}"
    run, where = RunContext(job_id="j"), MeasurementContext(fake_props())
    with ResultWriter(uri, run.run_id, flush_rows=2, flush_seconds=3600, name="w1") as w:
        w.append([result_row(fake_result(P1, f"e{i}"), P1, "mm", run, where) for i in range(5)])
    assert w.rows_written == 5 and [n for _, n in w.part_rows] == [5]
    [part] = w.files_written
    assert part.startswith("tunefarm/job1/results/device_signature=") and "-w1-" in part
    data = ResultsDataset(uri)
    assert sorted(data.table(["engine_name"]).column("engine_name").to_pylist()) == [f"e{i}" for i in range(5)]
    # a file that is no results file is skipped by name, as on a disk; a hidden one is not even looked at
    fs.open_output_stream(part.rsplit("/", 1)[0] + "/junk.parquet").close()
    fs.open_output_stream(part.rsplit("/", 1)[0] + "/.part-x.tmp.parquet").close()
    again = ResultsDataset(uri)
    assert [s.path.rsplit("/", 1)[1] for s in again.skipped] == ["junk.parquet"]
    assert again.table(["engine_name"]).num_rows == 5


def test_a_worker_reports_a_result_only_once_its_row_is_in_a_part(tmp_path):
    """What a killed worker can lose: rows it had not reported (they are measured again), never reported ones."""
    from farm.fleet.on_ray.worker import PartSink, _TaskRows
    from farm.model.engine import default_engine_registry
    from farm.model.workload import WorkloadProblem, parse_workload

    wl = parse_workload({"name": "w", "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [8, 5], "B": [5, 6]}}]},
                        registry=default_engine_registry())
    wp: WorkloadProblem = wl.problems[0]
    sink = PartSink(str(tmp_path / "results"), RunContext(job_id="j"), part_interval_s=3600)
    writer = ResultWriter(sink.results, sink.run.run_id, flush_rows=1 << 30, flush_seconds=float("inf"), name="w")
    rows = _TaskRows(writer, sink, wp, MeasurementContext(fake_props()))
    rows.add([fake_result(wp.problem, "a", samples=(1.0, 1.1, 0.9))])
    assert not rows.due(careful=False) and rows.due(careful=True)
    assert writer.rows_written == 0  # held: not on the storage, so not reported
    reported = rows.release({"{}": 0})
    assert writer.rows_written == 1 and [r.engine_name for r in reported] == ["a"]
    assert reported[0].samples == () and reported[0].median_ms == pytest.approx(1.0)  # slim: what scheduling needs
    assert rows.parts() == ((writer.files_written[0], 1),)
    assert ResultsDataset(tmp_path / "results").table(["samples_ms"]).column("samples_ms").to_pylist() == [[1.0, 1.1, 0.9]]


# -- the farm, end to end, into a bucket -------------------------------------------------------------------
ray = pytest.importorskip("ray", reason="the farm needs ray[default]")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance whose workers have the test bucket's credentials (workers write to S3 themselves)."""
    from farm.fleet.options import DeviceRequest
    from farm.fleet.on_ray.cluster import _init_ray

    keys = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    if ray.is_initialized():
        ray.shutdown()
    _init_ray(None, DeviceRequest("sim"))
    yield
    ray.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_a_farm_run_into_s3_workers_write_and_a_crash_costs_no_row(s3_bucket, local_ray, tmp_path):
    from farm.devices.sim import SimConfig
    from farm.fleet.options import DeviceRequest, FarmOptions
    from farm.fleet.on_ray.cluster import run_farm
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload
    from farm.store.overrides.parsing import load_overrides

    fs, query = s3_bucket
    sweep = {"sim.gemm": {"block": [16, 32, 64, 128], "stages": [1, 2, 3]}}
    wl = parse_workload({"name": "s3", "autotune": {"strategy": "fixed_average", "timed_iterations": 3},
                         "engines": {"sweep": sweep},
                         "problems": [{"name": f"mm{i}", "op": "matmul", "tensors": {"A": [64 * (i + 1), 256],
                                                                                     "B": [256, 128]}}
                                      for i in range(3)]}, registry=default_engine_registry())
    sim = SimConfig.parse({"devices": [{"name": "Sim A", "count": 2}, {"name": "Sim B", "count": 1, "speed": 2}],
                           "faults": [{"kind": "crash", "engine": "sim.gemm", "knobs": {"block": 32, "stages": 2}}]})
    out = f"s3://tunefarm/job?{query}"
    report = run_farm(wl, out, devices=DeviceRequest("sim", 3, sim), options=FarmOptions(shard_size=6))
    data = ResultsDataset(f"s3://tunefarm/job/results?{query}")
    t = data.table(["device_signature", "problem_name", "candidate_key", "round", "disposition", "samples_ms"]).to_pylist()
    sigs = sorted({r["device_signature"] for r in t})
    assert len(sigs) == 2 and report.rows_written == len(t)
    main = collections.Counter((r["device_signature"], r["problem_name"], r["candidate_key"]) for r in t
                               if r["round"] == "main")
    assert max(main.values()) == 1 and len(main) == report.total  # every candidate once, the crashed ones too
    assert {r["disposition"] for r in t} == {"succeeded", "crashed"}
    assert all(r["samples_ms"] for r in t if r["disposition"] == "succeeded")  # workers wrote whole rows
    # the workers wrote the parts: the run's manifest names them and their rows add up
    job = json.loads(fs.open_input_stream("tunefarm/job/job.json").read())
    run = job["runs"][-1]
    manifest = json.loads(fs.open_input_stream(f"tunefarm/job/{run['manifest']}").read())
    assert sum(p["rows"] for p in manifest["parts"]) == len(t) == run["rows_written"]
    assert {p["path"] for p in manifest["parts"]} == set(data.files)
    # the override files went up beside the results: ordinary override files, a winner per problem
    for sig in sigs:
        with fs.open_input_stream(f"tunefarm/job/overrides/{sig}.json") as f:
            (tmp_path / f"{sig}.json").write_bytes(f.read())
        overrides = load_overrides(tmp_path / f"{sig}.json")
        assert all(overrides.match(wp.problem) is not None for wp in wl.problems)
    # report and diff read the bucket as they read a folder, and name the winners the override files name
    from farm.analysis.diff import diff_paths
    from farm.analysis.report import build_report

    assert {r.status for r in diff_paths(out, out)} == {"same winner"} and len(diff_paths(out, out)) == 2 * 3
    rep = build_report(f"s3://tunefarm/job/results?{query}")
    assert sorted(s.signature for s in rep.signatures) == sigs
    # resume reads the bucket: nothing is measured again
    again = run_farm(wl, out, devices=DeviceRequest("sim", 3, sim), options=FarmOptions(shard_size=6))
    assert again.rows_written == 0
    assert len(ResultsDataset(f"s3://tunefarm/job/results?{query}").table(["candidate_key"])) == len(t)


def test_the_reduce_on_ray_writes_the_single_process_files_byte_for_byte(tmp_path, local_ray):
    from fakes import write_results
    from farm.fleet.on_ray.distributed_reduce import reduce_on_ray
    from farm.store.reduce import reduce_results

    devices = [fake_props(), fake_props(name="Other GPU"), fake_props(name="Third GPU", arch="sm_80")]
    problems = [matmul_problem(8 * (i + 1), 6, 5) for i in range(4)]
    rows = {d: [(p, f"mm{i}", [fake_result(p, e, samples=(1.0 + j + 0.1 * k, 1.01 + j + 0.1 * k, 0.99 + j + 0.1 * k))
                               for j, e in enumerate(("torch.matmul", "triton.gemm", "cublaslt"))])
                for i, p in enumerate(problems)] for k, d in enumerate(devices)}
    write_results(tmp_path / "results", rows)
    one, many = tmp_path / "one", tmp_path / "many"
    for out in (one, many):  # the same current files to append to, one of them corrupt
        out.mkdir()
        (out / f"{devices[2].signature}.json").write_text("{not json")
    single = reduce_results(tmp_path / "results", one, tunableop_csv=True)
    spread = reduce_on_ray(tmp_path / "results", many, tunableop_csv=True)
    names = sorted(p.name for p in one.iterdir() if ".corrupt-" not in p.name and not p.name.startswith("."))
    assert names == sorted(p.name for p in many.iterdir() if ".corrupt-" not in p.name and not p.name.startswith("."))
    assert len([n for n in names if n.endswith(".json")]) == 3
    for name in names:
        assert (one / name).read_bytes() == (many / name).read_bytes(), name
    assert [r.signature for r in spread.signatures] == [r.signature for r in single.signatures]
    assert spread.rows == single.rows and all(r.write.path.startswith(str(many)) for r in spread.signatures)
    # the corrupt file was moved aside, not overwritten, on both paths
    assert len(list(many.glob("*.corrupt-*"))) == len(list(one.glob("*.corrupt-*"))) == 1


def test_a_reduce_task_returns_the_files_it_wrote_not_the_corrupt_copy_it_set_aside(tmp_path):
    # The driver sets the original aside; the task's own copy, set aside in its scratch folder, is not an output
    # (it came back beside the driver's whenever the two were set aside in different seconds).
    from fakes import write_results
    from farm.fleet.on_ray.distributed_reduce import reduce_signature

    dev = fake_props(name="Third GPU", arch="sm_80")
    problem = matmul_problem(8, 6, 5)
    write_results(tmp_path / "results", {dev: [(problem, "mm0", [fake_result(problem, "torch.matmul")])]})
    rep, files, rows, skipped = reduce_signature(str(tmp_path / "results"), dev.signature, b"{not json", 3,
                                                 "append", True, None)
    assert rep is not None and rep.write.moved_aside and rows == 1 and not skipped
    assert f"{dev.signature}.json" in files and not [n for n in files if ".corrupt-" in n], sorted(files)


def test_a_few_thousand_candidates_into_s3_with_the_benchmarks_own_run(s3_bucket, local_ray):
    """benchmarks/fleet_scale.py at a size CI affords: every candidate one row, written by the workers."""
    import importlib.util
    import pathlib

    fs, query = s3_bucket
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_scale.py"
    spec = importlib.util.spec_from_file_location("fleet_scale", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.one(3200, 4, 2, f"s3://tunefarm/scale?{query}")
    assert result["candidates"] == result["rows"] == 3200 and result["confirm_rows"] > 0
    assert result["rows_written"] == result["rows"] + result["confirm_rows"]
    # the driver's growth while tuning (this process held what earlier tests left in its heap: 1.3 GB after the
    # eager-call tests); a fresh driver starts near 250 MB, so this is the old "< 1 GB in all"
    assert result["tuning_peak_rss_mb"] - result["start_rss_mb"] < 768
    import pyarrow.fs as pafs

    assert len(fs.get_file_info(pafs.FileSelector("tunefarm/scale/manifests"))) == 1  # the run's manifest


def _one_matmul_job(tmp_path):
    """A job folder on storage (a file:// URI) for a workload of one matmul: (the workload, its run, a device)."""
    from farm.fleet.job import JobRun
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload

    wl = parse_workload({"name": "w", "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [8, 5], "B": [5, 6]}}]},
                        registry=default_engine_registry())
    return wl, JobRun(f"file://{tmp_path}/out", wl, {}), fake_props()


def test_a_part_a_lost_node_s_worker_writes_after_its_task_ran_again_is_set_aside_not_read(tmp_path):
    """Exactly once across a node loss: what a worker wrote before the driver looked is counted (not measured
    again); a part of the same session that lands later (its node dying, or cut off) is renamed at the run's end."""
    wl, jr, props = _one_matmul_job(tmp_path)
    wp, sig = wl.problems[0], props.signature

    writers = {}

    def worker_part(session, engines, name):  # a worker's writer lives as long as the worker: its parts are numbered
        w = writers.setdefault(name, ResultWriter(jr.job.results, jr.run.run_id, flush_rows=1 << 20,
                                                  flush_seconds=3600, name=name))
        where = MeasurementContext(props, session_id=session)
        w.append([result_row(fake_result(wp.problem, e), wp.problem, wp.name, jr.run, where) for e in engines])
        w.flush()

    worker_part("s-lost", ["e0", "e1"], "w1")  # written before the driver looked: counted
    counted = jr.results_of_session(sig, "matmul", "s-lost")
    assert sorted(r.engine_name for r in counted) == ["e0", "e1"]
    jr.fence(sig, "matmul", "s-lost")
    worker_part("s-lost", ["e2"], "w1")  # the same worker's late part, after its rest ran again elsewhere
    worker_part("s-other", ["e3"], "w2")
    summary = jr.finish(reduce=False)
    engines = sorted(ResultsDataset(jr.job.results).table(["engine_name"]).column("engine_name").to_pylist())
    assert engines == ["e0", "e1", "e3"]  # the late part is not data; nothing else moved
    run = json.loads((tmp_path / "out" / "job.json").read_text())["runs"][-1]
    [aside] = run["set_aside"]
    assert aside["session_id"] == "s-lost" and aside["rows"] == 1 and ".lost-worker-" in aside["path"]
    assert os.path.exists(aside["path"]) and summary is not None
    # and the readers the docs show skip it too: pyarrow's dataset (pandas reads through it) as the farm's own
    import pyarrow.dataset as pads

    plain = pads.dataset(str(tmp_path / "out" / "results"), format="parquet", partitioning="hive")
    assert sorted(plain.to_table(columns=["engine_name"]).column("engine_name").to_pylist()) == ["e0", "e1", "e3"]


def test_a_lost_sessions_late_rows_beside_others_keep_the_others_and_a_part_after_the_run_is_not_read(tmp_path):
    """A late part mixing the lost session's rows with another session's keeps those (the part written again
    without the lost rows); a part that lands after the run's end is skipped by the farm's readers, which the run
    record tells which sessions ran again elsewhere (issue 64: the whole mixed part was set aside, and a part after
    the end was read twice)."""
    from farm.analysis.report import build_report
    from farm.fleet.job import JobRun

    wl, jr, props = _one_matmul_job(tmp_path)
    wp, sig = wl.problems[0], props.signature
    writer = ResultWriter(jr.job.results, jr.run.run_id, flush_rows=1 << 20, flush_seconds=3600, name="w1")

    def rows(session, engines):
        where = MeasurementContext(props, session_id=session)
        return [result_row(fake_result(wp.problem, e), wp.problem, wp.name, jr.run, where) for e in engines]

    writer.append(rows("s-lost", ["e0"]))
    writer.flush()
    jr.results_of_session(sig, "matmul", "s-lost")  # counted
    jr.fence(sig, "matmul", "s-lost")
    writer.append(rows("s-lost", ["e1"]) + rows("s-other", ["e2"]))  # one late part, two sessions
    writer.flush()
    jr.finish(reduce=False)
    engines = sorted(ResultsDataset(jr.job.results).table(["engine_name"]).column("engine_name").to_pylist())
    assert engines == ["e0", "e2"]  # s-other's row kept, the lost session's late row not data
    run = json.loads((tmp_path / "out" / "job.json").read_text())["runs"][-1]
    [aside] = run["set_aside"]
    assert aside["rows"] == 1 and aside["kept_in"].endswith("-kept.parquet")
    assert run["fenced"][0]["session_id"] == "s-lost"
    # after the run's end, the lost node's worker writes once more: the farm's readers skip that part
    writer.append(rows("s-lost", ["e3"]))
    writer.flush()
    data = ResultsDataset(jr.job.results)
    assert sorted(data.table(["engine_name"]).column("engine_name").to_pylist()) == ["e0", "e2"]
    assert any("after its run ended" in s.reason for s in data.skipped)
    assert build_report(tmp_path / "out" / "results") is not None  # the report reads the same rows
    late = JobRun(f"file://{tmp_path}/out", wl, {})  # the job's next run sets it aside: plain readers skip it too
    late.finish(reduce=False)
    import pyarrow.dataset as pads

    plain = pads.dataset(str(tmp_path / "out" / "results"), format="parquet", partitioning="hive")
    assert sorted(plain.to_table(columns=["engine_name"]).column("engine_name").to_pylist()) == ["e0", "e2"]
