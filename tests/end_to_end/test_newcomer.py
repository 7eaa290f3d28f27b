"""What a newcomer trips on (issue 36): engine listings, "did you mean", Ctrl-C, progress while Ray starts,
`farm report --html` into a new folder, and `farm publish` with malformed device properties, a malformed index
entry or a file:// root that does not exist yet."""

import io
import json

import pytest
from rich.console import Console

from farm.cli import main
from farm.errors import UnknownNameError
from tests.fakes import fake_props, matmul_problem
from tests.store.test_publish import entry, overrides


def test_farm_engines_here_lists_what_runs_on_this_machine_first_and_folds_long_knob_lists(capsys):
    assert main(["engines", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    runs = [e["runs_here"].startswith("yes") for e in listed]
    assert any(runs) and not all(runs)
    assert runs == sorted(runs, reverse=True)  # every engine that runs here before any that does not
    assert main(["engines", "--here", "--json"]) == 0
    here = json.loads(capsys.readouterr().out)
    assert here and all(e["runs_here"].startswith("yes") for e in here)
    assert {e["name"] for e in here} == {e["name"] for e, r in zip(listed, runs) if r}
    assert main(["engines", "--op", "conv_fprop"]) == 0
    text = capsys.readouterr().out
    long = next(e for e in listed if e["name"] == "cudnn.graph")
    assert len(long["knobs"]) > 8 and f"and {len(long['knobs']) - 7} more" in text


def test_an_unknown_engine_or_op_gets_did_you_mean(capsys):
    from farm.model.engine import default_engine_registry

    with pytest.raises(UnknownNameError, match="did you mean 'cpu.matmul.blas'"):
        default_engine_registry().get("cpu.matmul.blass")
    assert main(["engines", "--op", "conv_fprp"]) == 2
    assert "did you mean 'conv_fprop'" in capsys.readouterr().err


def test_ctrl_c_of_farm_tune_prints_the_command_that_resumes_it(monkeypatch, capsys, repo_root):
    import farm.cli.tune

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(farm.cli.tune, "_tune_on_ray", interrupted)
    code = main(["tune", f"{repo_root}/examples/cpu-quick.yaml", "--out", "runs/x y"])
    err = capsys.readouterr().err
    assert code == 130 and "to go on, run again" in err
    assert f"farm tune {repo_root}/examples/cpu-quick.yaml --out 'runs/x y'" in err  # quoted for a shell


def test_progress_says_ray_is_starting_and_prints_the_header_only_when_a_run_starts():
    from farm.cli.progress import ProgressView
    from farm.fleet.driver import FarmStatus

    out = io.StringIO()
    view = ProgressView(Console(file=out, width=120), "w", header="tuning w on a local Ray instance")
    view.close()
    assert out.getvalue() == ""  # a resume with nothing to measure starts no Ray: no header claiming it did
    view = ProgressView(Console(file=out, width=120), "w", header="tuning w on a local Ray instance", interval_s=0)
    view.update(FarmStatus(0, 0, 0, 0, 0.0, [], [], phase="starting"))
    view.update(FarmStatus(10, 3, 0, 0, 1.0, [], []))
    view.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "tuning w on a local Ray instance"
    assert lines[1] == "starting Ray and the device workers..." and lines[2].startswith("3/10 candidates")
    assert not any(line.startswith(("0/0 candidates", "0/?")) for line in lines)
    joined = io.StringIO()  # a run that joins a cluster starts no Ray: it says which one it joins
    view = ProgressView(Console(file=joined, width=120), "w", header="tuning w on Ray cluster auto", interval_s=0,
                        joining="auto")
    view.update(FarmStatus(0, 0, 0, 0, 0.0, [], [], phase="starting"))
    view.close()
    assert joined.getvalue().splitlines()[1] == "joining the Ray cluster at auto and starting the device workers..."


def test_report_html_into_a_folder_that_does_not_exist_yet(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="farm report --html needs matplotlib (tunefarm[report])")
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload
    from farm.fleet.local_run import run_local
    from farm.devices.device import cpu_device

    wl = parse_workload({"name": "h", "autotune": {"strategy": "fixed_average", "timed_iterations": 2,
                                                   "check": "off", "confirm": False},
                         "engines": {"include": ["cpu.matmul.blas", "cpu.matmul.einsum"]},
                         "problems": [{"name": "a", "op": "matmul", "tensors": {"A": [8, 8], "B": [8, 8]}}]},
                        registry=default_engine_registry())
    run_local(wl, tmp_path / "run", cpu_device(), default_engine_registry())
    target = tmp_path / "new" / "deeper" / "r.html"
    assert main(["report", str(tmp_path / "run"), "--html", str(target)]) == 0
    assert target.exists() and "<img" in target.read_text()


def _props_file(tmp_path, mutate):
    props = fake_props()
    src = tmp_path / "src"
    path = overrides(src, props, [entry(matmul_problem(8, 8, 8), "torch.matmul", 1.0, "p1")])
    data = json.loads(path.read_text())
    mutate(data["device"]["properties"])
    path.write_text(json.dumps(data))
    return src, path


@pytest.mark.parametrize("mutate, field", [
    (lambda p: p.update(libraries="torch 2.11"), "device.properties.libraries"),
    (lambda p: p.update(compute_units="132"), "device.properties.compute_units"),
    (lambda p: p.pop("arch"), "device.properties.arch"),
    (lambda p: p.update(total_memory=None), "device.properties.total_memory"),
])
def test_publish_refuses_malformed_device_properties_naming_the_field_and_creates_nothing(tmp_path, capsys, mutate,
                                                                                            field):
    src, path = _props_file(tmp_path, mutate)
    root = tmp_path / "root"
    assert main(["publish", str(src), "--to", str(root)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not root.exists()  # no empty root left behind


def test_publish_refuses_an_index_whose_files_entry_is_not_a_mapping(tmp_path, capsys):
    props = fake_props()
    src = tmp_path / "src"
    overrides(src, props, [entry(matmul_problem(8, 8, 8), "torch.matmul", 1.0, "p1")])
    root = tmp_path / "root"
    root.mkdir()
    index = {"version": 1, "files": {props.signature: "sm_90/x.json"}}
    (root / "index.json").write_text(json.dumps(index))
    assert main(["publish", str(src), "--to", str(root)]) == 2
    err = capsys.readouterr().err
    assert "index.json" in err and "not a mapping" in err
    assert json.loads((root / "index.json").read_text()) == index  # untouched


def test_publish_to_a_file_uri_whose_root_does_not_exist_yet(tmp_path):
    props = fake_props()
    src = tmp_path / "src"
    overrides(src, props, [entry(matmul_problem(8, 8, 8), "torch.matmul", 1.0, "p1")])
    root = tmp_path / "not" / "yet"
    assert main(["publish", str(src), "--to", f"file://{root}"]) == 0
    assert (root / "sm_90" / f"{props.signature}.json").exists() and (root / "index.json").exists()
    assert main(["publish", str(src), "--to", str(tmp_path / "dry"), "--dry-run"]) == 0
    assert not (tmp_path / "dry").exists()  # a dry run makes nothing


def test_config_says_under_verbose_which_fields_keep_the_nearest_entry_from_matching(tmp_path, caplog):
    import logging

    from farm.store.overrides.parsing import load_overrides

    props = fake_props()
    path = overrides(tmp_path / "o", props, [entry(matmul_problem(8, 8, 8), "torch.matmul", 1.0, "p1"),
                                             entry(matmul_problem(64, 64, 64), "torch.blas", 1.0, "p2")])
    f = load_overrides(path)
    miss = matmul_problem(8, 8, 9)
    why = f.nearest_miss(miss)
    assert "engine_overrides[0] (torch.matmul)" in why and "A.dims [8, 8] ([8, 9])" in why and "B.dims [8, 8] ([9, 8])" in why
    assert f.entries[0].differences(matmul_problem(8, 8, 8)) == []
    from farm.model.problem import Problem

    conv = Problem.create("conv_fprop", {"X": [1, 4, 8, 8], "W": [4, 4, 3, 3]}, criteria={"pad_h": 1, "pad_w": 1})
    assert f.nearest_miss(conv) == "no entry is for op conv_fprop"


def test_a_failed_atomic_write_leaves_no_temp_file_and_names_the_path(tmp_path, monkeypatch):
    import errno
    import os

    from farm import fsutil

    target = tmp_path / "x.json"
    target.write_text("old")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as err:
        fsutil.atomic_write_text(target, "new")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert err.value.filename == str(target) and err.value.errno == errno.ENOSPC
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_file_system_error_names_the_path_on_the_command_line(tmp_path, monkeypatch, capsys):
    import errno
    import os

    props = fake_props()
    src = tmp_path / "src"
    overrides(src, props, [entry(matmul_problem(8, 8, 8), "torch.matmul", 1.0, "p1")])

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert main(["publish", str(src), "--to", str(tmp_path / "root")]) != 0
    err = capsys.readouterr().err
    assert "No space left on device" in err and str(tmp_path / "root") in err and "a file:" not in err
    assert not [p for p in (tmp_path / "root").rglob("*.tmp")]


@pytest.mark.parametrize("where", ["warmup", "run", "compile"])
def test_an_engine_that_calls_sys_exit_fails_its_candidate_at_once(where, cpu):
    import sys

    from farm.model.records import Disposition
    from farm.tuner.autotuner import Autotuner
    from tests.fakes import FakeEngine, FakePlan, registry_of

    class Exiting(FakeEngine):
        def compile(self, problem, knobs, device):
            if where == "compile":
                sys.exit(3)
            return ExitingPlan(self, knobs)

    class ExitingPlan(FakePlan):
        def run(self, tensors, workspace, stream):
            self.engine.calls.run += 1
            if where == "warmup" or self.engine.calls.run >= 3:
                raise SystemExit(3)
            super().run(tensors, workspace, stream)

    good, bad = FakeEngine("good"), Exiting("bad")
    tuner = Autotuner(matmul_problem(), cpu, registry=registry_of(good, bad))
    tuner.add_all_engines()
    from farm.model.records import AutotuneConfig

    config = AutotuneConfig(strategy="fixed_average", timed_iterations=3, check="off", confirm=False)
    results = {r.engine_name: r for r in tuner.autotune(config=config)}
    expected = {"warmup": Disposition.FAILED_WARMUP, "run": Disposition.FAILED_RUN,
                "compile": Disposition.FAILED_COMPILE}[where]
    assert results["bad"].disposition is expected and "SystemExit" in results["bad"].error
    assert results["good"].succeeded


def test_a_part_with_a_corrupt_data_page_is_measured_again_by_an_in_process_resume(tmp_path, capsys):
    """The part's footer and key columns read fine, one column's page does not: resume and reduce agree that
    the part is unreadable, so its candidates are measured again and the run ends with every winner."""
    import pyarrow.parquet as pq

    wl = tmp_path / "w.yaml"
    wl.write_text("name: w\nautotune: {strategy: fixed_average, timed_iterations: 2, check: 'off', confirm: false}\n"
                  "engines: {include: [cpu.matmul.blas, cpu.matmul.einsum]}\n"
                  "problems: [{name: a, op: matmul, tensors: {A: [8, 8], B: [8, 8]}}]\n")
    out = tmp_path / "run"
    # --no-verify: one part, the main round's (farm verify's rows would be a second)
    assert main(["tune", str(wl), "--in-process", "--out", str(out), "--no-verify"]) == 0
    [part] = list((out / "results").rglob("*.parquet"))
    meta = pq.ParquetFile(part).metadata
    column = next(meta.row_group(0).column(i) for i in range(meta.num_columns)
                  if meta.row_group(0).column(i).path_in_schema.startswith("samples_ms"))
    data = bytearray(part.read_bytes())
    start = column.data_page_offset + 8
    data[start:start + 24] = bytes(24)  # zeros inside a compressed page
    part.write_bytes(bytes(data))
    assert pq.read_table(part, columns=["problem_key", "candidate_key"]).num_rows == 2  # the keys still read
    capsys.readouterr()
    assert main(["tune", str(wl), "--in-process", "--out", str(out), "--json", "--no-verify"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows_written"] == 2 and report["no_winner"] == {}  # measured again, and a winner


@pytest.mark.slow
def test_winners_measured_by_more_cpu_workers_than_cores_are_marked_and_not_published_unless_forced(
        tmp_path, monkeypatch, capsys):
    pytest.importorskip("ray", reason="the farm needs ray[default]")
    import farm.devices.runtimes.cpu as cpu_runtime

    monkeypatch.setattr(cpu_runtime, "usable_cores", lambda: 1)  # so two workers are one too many, on any host
    wl = tmp_path / "w.yaml"
    wl.write_text("name: w\nautotune: {strategy: fixed_average, timed_iterations: 2, check: 'off', confirm: false}\n"
                  "engines: {include: [cpu.matmul.blas, cpu.matmul.einsum]}\n"
                  "problems: [{name: a, op: matmul, tensors: {A: [8, 8], B: [8, 8]}}]\n")
    out = tmp_path / "run"
    assert main(["tune", str(wl), "--devices", "cpu:2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "2 CPU workers at once on 1 usable core" in err and "farm publish refuses them unless --force" in err
    [f] = list((out / "overrides").glob("*.json"))
    assert "1 usable core" in json.loads(f.read_text())["generated_by"]["measurement_warning"]
    assert main(["publish", str(out / "overrides"), "--to", str(tmp_path / "root")]) != 0
    printed = capsys.readouterr()
    assert "use --force to publish anyway" in " ".join((printed.out + printed.err).replace("│", " ").split())
    assert not list((tmp_path / "root").rglob("*.json"))
    assert main(["publish", str(out / "overrides"), "--to", str(tmp_path / "root"), "--force"]) == 0


def test_the_html_report_has_alt_text_readable_labels_and_shows_untrusted_winners(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="farm report --html needs matplotlib (tunefarm[report])")
    import re

    from farm.analysis import report as report_mod, report_html
    from farm.devices.device import cpu_device
    from farm.fleet.local_run import run_local
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload

    wl = parse_workload({"name": "h", "autotune": {"strategy": "fixed_average", "timed_iterations": 2,
                                                   "check": "off", "confirm": False},
                         "engines": {"include": ["cpu.matmul.blas", "cpu.matmul.blocked"],
                                     "sweep": {"cpu.matmul.blocked": {"block_k": [64, 128]}}},
                         "problems": [{"name": "a", "op": "matmul", "tensors": {"A": [8, 8], "B": [8, 8]}}]},
                        registry=default_engine_registry())
    run_local(wl, tmp_path / "run", cpu_device(), default_engine_registry())
    monkeypatch.setattr(report_mod.ProblemSummary, "untrusted", property(lambda self: True))
    monkeypatch.setattr(report_mod.ProblemSummary, "doubt", property(lambda self: "within noise of 1 other(s)"))
    report = report_mod.build_report(tmp_path / "run")
    report_html.write_html(report, tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    imgs = re.findall(r"<img [^>]*>", html)
    assert imgs and all(re.search(r"alt='[^']{10,}'", i) for i in imgs)
    assert "class=untrusted" in html and "not trusted: within noise of 1 other(s)" in html
    assert report_html._short("cudnn.graph[" + "X=1," * 40 + "engine=7]").endswith("engine=7]")
    assert len(report_html._short("x" * 200)) <= 48


@pytest.mark.slow
def test_farm_tune_json_is_json_alone_on_stdout_even_when_a_worker_dies(tmp_path, repo_root):
    """A crashing candidate kills its worker: Ray prints "(raylet) A worker died..." and the workers' lines; with
    --json, stdout holds the JSON document and nothing else."""
    pytest.importorskip("ray", reason="the farm needs ray[default]")
    import subprocess
    import sys

    import yaml

    (tmp_path / "sim.yaml").write_text(yaml.safe_dump({"devices": [{"name": "Sim A", "count": 1}], "faults": [
        {"kind": "crash", "engine": "sim.gemm", "knobs": {"block": 32, "stages": 2}}]}))
    (tmp_path / "w.yaml").write_text(yaml.safe_dump({
        "name": "w", "autotune": {"strategy": "fixed_average", "timed_iterations": 2, "confirm": False},
        "engines": {"include": ["sim.gemm"], "sweep": {"sim.gemm": {"block": [16, 32], "stages": [1, 2]}}},
        "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [64, 64], "B": [64, 64]}}]}))
    proc = subprocess.run([sys.executable, "-m", "farm", "tune", str(tmp_path / "w.yaml"), "--devices",
                           f"sim:{tmp_path / 'sim.yaml'}", "--out", str(tmp_path / "run"), "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": repo_root})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)  # the whole of stdout is one JSON document
    assert data["counts"].get("crashed") == 1
    assert "died" in proc.stderr or "crash" in proc.stderr.lower()  # Ray's lines went to stderr


def _descendants(root: int) -> set[int]:
    import os

    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = open(f"/proc/{name}/stat").read()
            except OSError:
                continue
            tree.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(name))
    out, todo = set(), [root]
    while todo:
        for pid in tree.get(todo.pop(), ()):
            out.add(pid)
            todo.append(pid)
    return out


def _cmdlines(pids: set[int]) -> list[str]:
    out = []
    for p in pids:
        try:
            out.append(open(f"/proc/{p}/cmdline").read().replace("\0", " "))
        except OSError:
            out.append(f"{p} (gone)")
    return out


def _has_ray_core(pids: set[int]) -> bool:
    lines = _cmdlines(pids)
    return all(any(word in line for line in lines) for word in ("gcs_server", "raylet", "default_worker"))


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc (Linux)")
def test_no_ray_process_of_the_job_survives_a_kill_9_of_the_driver(tmp_path, repo_root):
    pytest.importorskip("ray", reason="the farm needs ray[default]")
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    (tmp_path / "sim.yaml").write_text(yaml.safe_dump({"devices": [{"name": "Sim A", "count": 1}], "faults": [
        {"kind": "hang", "engine": "sim.gemm", "knobs": {"block": 32, "stages": 2}}]}))  # the job runs until killed
    (tmp_path / "w.yaml").write_text(yaml.safe_dump({
        "name": "w", "autotune": {"strategy": "fixed_average", "timed_iterations": 2, "confirm": False},
        "engines": {"include": ["sim.gemm"], "sweep": {"sim.gemm": {"block": [16, 32], "stages": [1, 2]}}},
        "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [64, 64], "B": [64, 64]}}]}))
    driver = subprocess.Popen([sys.executable, "-m", "farm", "tune", str(tmp_path / "w.yaml"), "--devices",
                               f"sim:{tmp_path / 'sim.yaml'}", "--out", str(tmp_path / "run")], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": repo_root})
    started: set[int] = set()
    # a bounded wait on a condition (not a count at one moment): the job's results folder is there and its Ray
    # core (a GCS server, a raylet) and a worker of it have been seen among the driver's descendants
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not ((tmp_path / "run" / "results").exists() and _has_ray_core(started)):
        started |= _descendants(driver.pid)
        time.sleep(0.5)
    assert (tmp_path / "run" / "results").exists() and _has_ray_core(started), _cmdlines(started)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in started):
        time.sleep(0.5)
    left = [open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:80] for p in started if _alive(p)]
    assert not left, left


def test_the_tune_summary_flags_a_noisy_winner_that_no_stage_confirmed():
    import dataclasses

    from farm.cli.tables.runs import summary_table
    from farm.model.records import AutotuneResult, Disposition, TuneMode
    from farm.model.measurement import Strategy
    from farm.model.workload import WorkloadProblem
    from farm.store.deciding.records import Winner
    from farm.tuner.problem_tuning import ProblemOutcome
    from farm.tuner.judging.winner import Rule

    from farm.model.workload import EngineSelection

    p = matmul_problem()
    wp = WorkloadProblem(0, "p", p, EngineSelection())
    r = AutotuneResult(p.key, 1, "e", (), Disposition.SUCCEEDED, TuneMode.STANDARD, Strategy.FIXED_AVERAGE, rank=0,
                       median_ms=1.0, mad_ms=0.2)
    w = Winner("sig", p.key, "p", "e", (), 1.0, 1.0, 0.2, True, Rule.FASTEST, "", "e[default]", 1.0, None, None, 2, 0)
    table = summary_table([ProblemOutcome(wp, (r,))], 1.0, lambda key: w)
    assert "Untrusted (noisy, no confirmation stage ran): p." in str(table.caption)
    quiet = summary_table([ProblemOutcome(wp, (r,))], 1.0, lambda key: dataclasses.replace(w, noisy=False))
    assert "nothing" in str(quiet.caption)
    shaky_default = dataclasses.replace(w, noisy=False, default="torch.matmul[default]", default_ms=1.3,
                                        default_noisy=True)
    table = summary_table([ProblemOutcome(wp, (r,))], 1.0, lambda key: shaky_default)
    assert "Untrusted (the default is noisy: the speed-up over it is doubtful): p." in str(table.caption)


def test_farm_report_says_the_same_of_a_noisy_default():
    from farm.analysis.report import ProblemSummary

    p = ProblemSummary(key="k", name="p", label="l", candidates=2, winner="e[x=1]", winner_ms=1.0, default="e[default]",
                       default_ms=1.3, why="", noise=0.01, near=0, device_winners={}, spread=1.0, default_noisy=True)
    assert p.untrusted and "the default is noisy" in p.doubt
    same = ProblemSummary(key="k", name="p", label="l", candidates=2, winner="e[default]", winner_ms=1.0,
                          default="e[default]", default_ms=1.0, why="", noise=0.01, near=0, device_winners={},
                          spread=1.0, default_noisy=True)
    assert not same.untrusted  # the default won: no speed-up to doubt


def test_a_keyboard_interrupt_an_engine_raises_fails_its_candidate_but_a_users_ctrl_c_stops(cpu, monkeypatch):
    import signal

    from farm.model.records import AutotuneConfig, Disposition
    from farm.tuner import interrupts
    from farm.tuner.autotuner import Autotuner
    from tests.fakes import FakeEngine, FakePlan, registry_of

    class InterruptingPlan(FakePlan):
        def run(self, tensors, workspace, stream):
            raise KeyboardInterrupt

    class Interrupting(FakeEngine):
        def compile(self, problem, knobs, device):
            return InterruptingPlan(self, knobs)

    watch = interrupts.SigintWatch()
    monkeypatch.setattr(interrupts, "SIGINTS", watch)
    previous = signal.getsignal(signal.SIGINT)
    try:
        # Python's own handler underneath, whatever an earlier test in this process left there (Ray's driver, a
        # worker's watch): the watch is tested against what a user's process has
        signal.signal(signal.SIGINT, signal.default_int_handler)
        watch.install()

        def tune():
            tuner = Autotuner(matmul_problem(), cpu, registry=registry_of(FakeEngine("good"), Interrupting("bad")))
            tuner.add_all_engines()
            config = AutotuneConfig(strategy="fixed_average", timed_iterations=2, check="off", confirm=False)
            return {r.engine_name: r for r in tuner.autotune(config=config)}

        results = tune()
        assert results["bad"].disposition is Disposition.FAILED_WARMUP and "KeyboardInterrupt" in results["bad"].error
        assert results["good"].succeeded
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C: noted, then raised as Python's own
        assert watch.seen.is_set()
        with pytest.raises(KeyboardInterrupt):
            tune()  # after a Ctrl-C, an interrupt stops the tuning
    finally:
        signal.signal(signal.SIGINT, previous)
