"""The same faults give the same rows and the same winner on both executors (issue 55): ``farm tune --in-process``
and the Ray farm run one orchestration (farm.fleet.driver and its scheduler), so a crash, a hang, an engine's
SystemExit or KeyboardInterrupt, in the main round or in the confirmation stage, ends the same way on both.

Each problem of one workload has its own fault (tests/data/flaky_plugin.py, as tests/end_to_end/test_stage_failures.py runs
it); ``farm tune`` runs as a user runs it. In-process, a native crash ends the process: the user runs the same
command again, and the candidate that ended it twice is quarantined (the Ray farm restarts its worker itself).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from farm.store.dataset import ResultsDataset
from farm.store.overrides.parsing import load_overrides
from tests.end_to_end.test_stage_failures import REPO, _tune

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the Ray farm needs ray[default]")
EXECUTORS = [pytest.param(("--in-process",), id="in-process"), pytest.param((), id="ray", marks=needs_ray)]

# problem (A's first dimension) -> fault: 'MODE@N:WHO' (N = 11: the stage only; N = 1: the main round on)
FAULTS = {64: "abort@11:default", 96: "exit@11:fast", 128: "kbint@11:default", 160: "hang@11:fast",
          192: "hang@1:fast"}
FAST = (("variant", 3),)


def _until_done(tmp_path, faults, executor, runs=3):
    """``farm tune`` until it finishes (in-process, a native crash ends a run: the same command goes on)."""
    for _ in range(runs):
        proc, out = _tune(tmp_path, faults, *executor, "--candidate-timeout", "4", timeout=400)
        if proc.returncode == 0:
            return proc, out
    raise AssertionError(f"farm tune did not finish in {runs} runs: {proc.stderr[-3000:]}")


def _outcome(out):
    """Per problem: its failed rows (round, calling mode, disposition, knobs) and the winner's knobs."""
    rows = ResultsDataset(out / "results").table(
        ["problem_name", "round", "call", "disposition", "knobs"]).to_pylist()
    failed = {(r["problem_name"], r["round"], r["call"] or "", r["disposition"],
               tuple((k["id"], int(k["value"])) for k in r["knobs"] or ())) for r in rows if r["disposition"] != "succeeded"}
    (path,) = (out / "overrides").glob("*.json")
    winners = {e.metadata["problem_name"]: tuple((k, int(v)) for k, v in dict(e.knobs).items())
               for e in load_overrides(path).entries}
    return failed, winners


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_each_fault_leaves_the_same_failed_rows_and_winner(tmp_path, executor):
    proc, out = _until_done(tmp_path, FAULTS, executor)
    failed, winners = _outcome(out)
    dispositions = {(name, rnd, disp, knobs) for name, rnd, _call, disp, knobs in failed}
    assert dispositions == {
        ("p64", "confirm", "crashed", ()),           # a native crash in the stage: quarantined
        ("p96", "confirm", "failed_run", FAST),      # SystemExit(3) from the engine: that candidate fails
        ("p128", "confirm", "failed_run", ()),       # the engine's own KeyboardInterrupt: likewise
        ("p160", "confirm", "timed_out", FAST),      # a hang in the stage
        ("p192", "main", "timed_out", FAST),         # a hang in the main round
    }, sorted(failed)
    assert all(call == "eager" for _n, rnd, call, _d, _k in failed if rnd == "confirm")
    # the winner is the candidate that did not fail: the real winner where the default failed, else the default
    assert winners == {"p64": FAST, "p96": (), "p128": FAST, "p160": (), "p192": ()}, winners


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_users_ctrl_c_stops_the_run_on_both_executors(tmp_path, executor):
    """An engine's KeyboardInterrupt fails its candidate; a SIGINT from the user stops the run (exit 130)."""
    proc, out = _tune(tmp_path, {64: "mark@11:default"}, *executor, wait_for=True)
    mark = tmp_path / "mark"
    deadline = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
    assert json.loads((out / "job.json").read_text())["runs"][-1]["state"] == "failed"
    assert not list((out / "overrides").glob("*.json")) if (out / "overrides").exists() else True


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_winner_that_hangs_only_where_it_is_replayed_is_fixed_and_the_job_ends(tmp_path, executor):
    """farm tune's check replays each decision beside the direct call within --candidate-timeout: a winner whose
    replay hangs (simulated: ``hang_replay``) gets a timed-out verify row, the default is published in its place,
    and the next decision is checked in a new process (both here hang too)."""
    (tmp_path / "sim.yaml").write_text("devices: [{name: Sim H200, count: 1}]\nnoise: 0.0\n"
                                       "faults: [{kind: hang_replay, engine: sim.gemm}]\n")
    (tmp_path / "wl.yaml").write_text(
        "name: hangs-replayed\nautotune: {strategy: fixed_average, timed_iterations: 3, check: 'off'}\n"
        "engines: {include: [sim.vendor, sim.gemm], sweep: {sim.gemm: {block: [16, 32, 64, 128], stages: [2, 3]}}}\n"
        "problems:\n  - {name: mm, op: matmul, dtype: fp16, tensors: {A: [2048, 2048], B: [2048, 2048]}}\n"
        "  - {name: mm2, op: matmul, dtype: fp16, tensors: {A: [1024, 4096], B: [4096, 1024]}}\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "farm", "tune", str(tmp_path / "wl.yaml"), "--devices",
                           f"sim:{tmp_path / 'sim.yaml'}", "--out", str(out), "--candidate-timeout", "3", "--json",
                           *executor], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert sorted(r["verdict"].split(":")[0] for r in summary["verified"]) == ["fixed", "fixed"], summary["verified"]
    [entries] = [load_overrides(p).entries for p in (out / "overrides").glob("*.json")]
    assert sorted((e.metadata["problem_name"], e.engine_name, e.knobs) for e in entries) == \
        [("mm", "sim.vendor", ()), ("mm2", "sim.vendor", ())]
    rows = ResultsDataset(out / "results").table(["problem_name", "round", "disposition", "error"]).to_pylist()
    hung = sorted(r["problem_name"] for r in rows if r["round"] == "verify" and r["disposition"] == "timed_out")
    assert hung == ["mm", "mm2"] and all("hangs where it is replayed" in r["error"] for r in rows
                                         if r["round"] == "verify" and r["disposition"] == "timed_out")
