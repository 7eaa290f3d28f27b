"""Issue 18: what an operator sees. Verbose worker lines, exit codes, progress, warnings, no stray lock
files, a resume with nothing to do that starts no Ray, `farm engines` / `--dry-run` / `farm policies`."""

import json
import logging
import os
import subprocess
import sys

import pytest

from farm.cli.progress import clock, progress_line
from farm.fleet.driver import FarmStatus, WorkerStatus


def farm(repo_root, *args, env=None, timeout=600):
    full = dict(os.environ, PYTHONPATH=repo_root, COLUMNS="200", **(env or {}))
    full.pop("RAY_COLOR_PREFIX", None)
    return subprocess.run([sys.executable, "-m", "farm", *map(str, args)], cwd=repo_root, env=full,
                          capture_output=True, text=True, timeout=timeout)


TWO = "name: two\nproblems:\n  - {name: tiny-mm, op: matmul, tensors: {A: [16, 8], B: [8, 4]}}\n" \
      "  - {name: mm8, op: matmul, dtype: int8, tensors: {A: [8, 4], B: [4, 8]}}\n"


@pytest.mark.slow
def test_verbose_ray_run_names_problems_without_colour_codes_then_a_finished_resume_starts_no_ray(tmp_path, repo_root):
    (tmp_path / "w.yaml").write_text(TWO)
    out = tmp_path / "o"
    first = farm(repo_root, "tune", "-v", tmp_path / "w.yaml", "--devices", "cpu:1", "--out", out)
    # tiny-mm has a winner, mm8 (int8: no CPU engine) none: finished, but partial -> exit 3, one closing line
    assert first.returncode == 3, first.stderr[-2000:]
    worker_lines = [line for line in first.stderr.splitlines() if "autotune:" in line and "pid=" in line]
    assert worker_lines and all("\x1b[" not in line for line in worker_lines), first.stderr[-3000:]
    assert any("INFO tiny-mm: autotune: [1/" in line for line in worker_lines)  # the problem's name, not its key
    closing = " ".join(first.stderr.split())
    assert "1 of 2 problem(s) have a winner, 1 have none: mm8 (no applicable engine" in closing
    assert "--allow-partial" in closing
    # the same job again: nothing to measure, so no Ray; --allow-partial accepts the missing winner
    from farm.devices.runtimes.cpu import usable_cores

    many = usable_cores() + 1
    again = farm(repo_root, "tune", tmp_path / "w.yaml", "--devices", f"cpu:{many}", "--out", out, "--allow-partial",
                 "--json")
    assert f"--devices cpu:{many} starts {many} measuring workers" in " ".join(again.stderr.split())
    assert again.returncode == 0, again.stderr[-2000:]
    data = json.loads(again.stdout)
    assert data["rows_written"] == 0 and "mm8" in json.dumps(data["no_winner"])
    assert data["ray_started"] is False and "Ray" not in again.stderr, again.stderr[-1000:]
    # nothing is left behind: no .lock in the job folder, its overrides/ or beside them
    assert not [p for p in out.rglob("*") if p.name.endswith(".lock")]


def test_progress_line_reads_as_a_clock_and_says_done_at_the_end():
    w = [WorkerStatus("cpu:0", "sig", "CPU", "host", "busy")]
    mid = FarmStatus(total=100, finished=40, remeasured=2, failed=1, elapsed_s=75.0, workers=w, signatures=["sig"])
    line = progress_line(mid)
    assert line.startswith("40/100 candidates (40 %) in 1:15") and "about 1:52 left" in line and "[" not in line
    start = FarmStatus(total=100, finished=0, remeasured=0, failed=0, elapsed_s=0.2, workers=w, signatures=["sig"])
    assert "time left: estimating" in progress_line(start) and "?" not in progress_line(start)
    end = FarmStatus(total=100, finished=100, remeasured=0, failed=0, elapsed_s=3725.0, workers=w, signatures=["sig"])
    assert progress_line(end).endswith("; done") and "in 1:02:05" in progress_line(end) and "ETA" not in progress_line(end)
    assert clock(0) == "0:00" and clock(59.9) == "0:59"


def test_more_cpu_workers_than_cores_is_warned(monkeypatch):
    from farm.cli import tune as tune_cli
    from farm.devices.runtimes.cpu import usable_cores

    said = []

    class Console:
        def print(self, message, **kw):
            said.append(message)

    monkeypatch.setattr(tune_cli, "make_console", lambda stderr=False: Console())
    n = usable_cores() + 2
    tune_cli._warn_oversubscribed(n)
    tune_cli._warn_oversubscribed(usable_cores())  # as many as the cores: nothing to say
    assert len(said) == 1 and f"cpu:{n} starts {n} measuring workers on {usable_cores()} usable core(s)" in said[0]


def test_farm_engines_says_what_runs_here_and_dry_run_lists_other_devices_engines_once(repo_root):
    data = json.loads(farm(repo_root, "engines", "--json").stdout)
    here = {e["name"]: e["runs_here"] for e in data}
    assert here["cpu.matmul.blas"].startswith("yes: cpu:0")
    assert here["sim.gemm"] == "no: runs on simulated devices only"
    assert here["torch.matmul"].startswith("no: ")
    text = farm(repo_root, "tune", "examples/cpu-quick.yaml", "--dry-run").stdout
    flat = " ".join(text.split())
    assert flat.count("runs on simulated devices only") == 1  # once below the table, not once per problem
    assert "sim.conv, sim.gemm, sim.vendor: runs on simulated devices only" in flat


def test_a_wrong_config_path_warns_once_per_process_and_farm_policies_says_why(repo_root, tmp_path, monkeypatch, caplog):
    from farm.devices.fb import encode_device_properties
    from policies.config import ConfigPolicy
    from tests.fakes import fake_props

    missing = tmp_path / "nope.json"
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(missing))
    with caplog.at_level(logging.INFO, logger="farm.policies.config"):
        for index in (0, 1):  # two devices, two sessions, three problems each
            session = ConfigPolicy().session(encode_device_properties(fake_props(index=index)))
            for _ in range(3):
                assert session.order([1, 2], b"") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and str(missing) in r.getMessage()]
    assert len(warnings) == 1 and "no tuned winner from it is used" in warnings[0].getMessage()
    proc = farm(repo_root, "policies", "--json", env={"FARM_HEUR_CONFIG_PATH": str(missing)})
    (cpu,) = [c for c in json.loads(proc.stdout)["config"] if c["device"].startswith("cpu:0")]
    assert cpu["env"] == "FARM_HEUR_CONFIG_PATH" and cpu["path"] == str(missing) and cpu["loaded"] is False
    assert "No such file" in cpu["detail"]
    good = farm(repo_root, "policies", env={"FARM_HEUR_CONFIG_PATH": ""}).stdout
    assert "FARM_HEUR_CONFIG_PATH is not set" in " ".join(good.split())


def test_reduce_tunableop_csv_keeps_a_column_major_b(tmp_path, repo_root):
    from farm.model.problem import Problem
    from tests.fakes import fake_props, fake_result, write_results

    p = Problem.create("matmul", {"A": [16, 5], "B": {"dims": [5, 6], "strides": [1, 5]}})
    write_results(tmp_path / "results", {fake_props(): [(p, "colmajor", [fake_result(p, "e", (1.0, 1.0, 1.0))])]})
    proc = farm(repo_root, "reduce", tmp_path / "results", "--out", tmp_path / "ovr", "--tunableop-csv")
    assert proc.returncode == 0, proc.stderr
    (csv_file,) = (tmp_path / "ovr").glob("*.csv")
    assert "GemmTunableOp_float_TN,tn_6_16_5_ld_5_5_6,e," in csv_file.read_text()  # B transposed, its ld kept


def test_the_tunable_runtime_leaves_no_lock_file_in_the_working_directory(tmp_path, monkeypatch):
    import numpy as np

    import farm.ops as ops

    monkeypatch.chdir(tmp_path)
    for name in ("FARM_TUNABLE_FILENAME", "FARM_HEUR_CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)
    ops.reset()
    try:
        ops.enable()
        ops.set_max_tuning_duration(2)
        a = np.ones((8, 8), np.float32)
        ops.matmul(a, a)
    finally:
        ops.reset()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["farm_tunable_results0.json"], names


@pytest.mark.parametrize("argv, named", [(["tnue", "w.yaml"], "did you mean 'tune'?"),
                                         (["-v", "pubilsh"], "did you mean 'publish'?"),
                                         (["xyzzy"], "farm --help lists the commands")])
def test_a_mistyped_command_gets_one_line_naming_the_closest(argv, named, capsys):
    from farm.cli.main import main

    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error: unknown command") and named in err and err.count("error:") == 1, err


def test_a_share_above_the_whole_step_is_never_printed():
    """Timed alone on a busy machine a problem's calls can take longer than its step (capture printed 1416 %):
    the table says the figure is unusable instead."""
    from types import SimpleNamespace

    from farm.cli.capture import over_whole, share_text

    assert share_text(0.254) == "25.4 %" and share_text(None) == "-" and share_text(14.16) == "? (busy)"
    use = lambda share: SimpleNamespace(share=share)  # noqa: E731
    assert over_whole(SimpleNamespace(problems=[SimpleNamespace(uses=[use(0.3), use(14.16)])]))
    assert not over_whole(SimpleNamespace(problems=[SimpleNamespace(uses=[use(0.3), use(None)])]))


@pytest.mark.parametrize("command", ["engines", "devices"])
def test_listings_at_80_columns_keep_every_name_whole(command, repo_root):
    """At 80 columns farm engines showed no engine names (zero-width columns) and farm devices cut every cell:
    below the table's width each record is a block, and every name and signature is there whole."""
    import os
    import subprocess
    import sys

    from farm.devices.device import probe
    from farm.model.engine import default_engine_registry

    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(repo_root)}
    run = subprocess.run([sys.executable, "-m", "farm", command], cwd=repo_root, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 80
    words = {w for line in lines for w in line.split()}
    names = [e.name for e in default_engine_registry()] if command == "engines" else \
        [d.signature for p in probe() for d in p.devices]
    assert names and all(n in words for n in names), [n for n in names if n not in words]


def test_farm_publish_at_80_columns_keeps_the_signature_whole_and_folds_the_path(tmp_path, repo_root):
    import os
    import subprocess
    import sys

    from farm.devices.device import cpu_device
    from farm.store.overrides.entries import OverrideEntry
    from farm.store.overrides.files import write_overrides
    from tests.fakes import matmul_problem

    cpu = cpu_device()
    (tmp_path / "overrides").mkdir()
    write_overrides(str(tmp_path / "overrides" / f"{cpu.signature}.json"),
                    [OverrideEntry.for_problem(matmul_problem(), "cpu.matmul.blas", metadata={"min_time_ms": 1.0})],
                    device={"signature": cpu.signature, "properties": cpu.properties.to_dict()}, mode="replace")
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(repo_root)}
    run = subprocess.run([sys.executable, "-m", "farm", "publish", str(tmp_path / "overrides"), "--to",
                          str(tmp_path / "root"), "--dry-run"], cwd=repo_root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert cpu.signature in {w for line in lines for w in line.split()}  # whole, on one line
    joined = "".join(line.strip() for line in lines)
    assert f"{tmp_path / 'root'}" in joined and f"{cpu.signature}.json" in joined  # folded at the edge, not cut
