"""A candidate that fails in the confirmation stage never wins (issue 47).

A plugin engine (tests/data/flaky_plugin.py, installed with an entry point) behaves in the main round and fails
from its 11th run on, so only in the confirmation stage: a native crash, SystemExit, a KeyboardInterrupt it raises,
a hang, a NaN or a negative time. ``farm tune`` runs as a user runs it, on both executors; each problem has its
own fault, on the default or on the real winner (2 % faster than the default).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from farm.errors import InputError
from farm.store.dataset import ResultsDataset
from farm.store.overrides.parsing import load_json, load_overrides

REPO = Path(__file__).resolve().parents[2]
DEFAULT, FAST = {}, {"variant": 3}  # the default's knobs, the real winner's


def _plugin(root: Path) -> Path:
    """The flaky engine as an installed-looking distribution under ``root``."""
    pkg = root / "flaky_engines"
    if pkg.exists():
        return root
    pkg.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "data" / "flaky_plugin.py", pkg / "__init__.py")
    info = root / "flaky_engines-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flaky_engines\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[farm.engines]\nflaky = flaky_engines:ENGINES\n")
    return root


def _tune(tmp_path: Path, faults: dict[int, str], *args: str, timeout: float = 240, wait_for: Any = None
          ) -> tuple[subprocess.CompletedProcess | subprocess.Popen, Path]:
    """``farm tune --json`` of one problem per entry of ``faults`` (A's first dimension: 'MODE@N:WHO')."""
    problems = "\n".join(f"  - {{name: p{m}, op: matmul, tensors: {{A: {{dims: [{m}, 1024]}}, B: {{dims: [1024, 1024]}}}}}}"
                         for m in faults)
    wl = tmp_path / "flaky.yaml"
    wl.write_text("name: flaky\n"
                  "autotune: {strategy: fixed_average, timed_iterations: 3, check: 'off', warmup_iterations: 1}\n"
                  "engines: {include: [flaky.gemm], sweep: {flaky.gemm: {variant: [1, 2, 3]}}}\n"
                  f"problems:\n{problems}\n")
    (tmp_path / "sim.yaml").write_text("devices: [{name: Sim H200, count: 1}]\nnoise: 0.01\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(_plugin(tmp_path / "plugin")), str(REPO))),
               FLAKY=json.dumps({str(m): f for m, f in faults.items()}), FLAKY_MARK=str(tmp_path / "mark"),
               COLUMNS="200")
    env.pop("FARM_IN_PROCESS_RESTARTS", None)
    cmd = [sys.executable, "-m", "farm", "tune", str(wl), "--devices", f"sim:{tmp_path / 'sim.yaml'}", "--out",
           str(out), "--json", *args]
    if wait_for is not None:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout), out


def _check(proc: subprocess.CompletedProcess, out: Path, faults: dict[int, str], runs: int = 1) -> dict:
    """What every surface says agrees, and no candidate that failed in a stage is published."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    job = json.loads((out / "job.json").read_text())
    assert len(job["runs"]) == runs and job["runs"][-1]["state"] == "finished"
    path = next((out / "overrides").glob("*.json"))
    load_json(path.read_text(), str(path))  # strict JSON: no NaN, no Infinity
    f = load_overrides(path)
    table = pq.read_table(next((out / "overrides").glob("*.winners.parquet"))).to_pylist()
    rows = ResultsDataset(out / "results").table(
        ["problem_name", "round", "call", "disposition", "error", "knobs", "engine_name", "median_ms"]).to_pylist()
    decided = {p["name"]: p["winner"] for p in summary["signatures"][next(iter(summary["signatures"]))]}
    for m, fault in faults.items():
        name, who = f"p{m}", fault.partition(":")[2] or "default"
        bad, good = (DEFAULT, FAST) if who == "default" else (FAST, DEFAULT)
        entry = next(e for e in f.entries if e.metadata["problem_name"] == name)
        assert dict(entry.knobs) == good, (name, entry.metadata["selection"]["why"])
        assert decided[name]["knobs"] == good
        parquet = next(r for r in table if r["problem_name"] == name)
        assert {k["id"]: int(k["value"]) for k in parquet["knobs"] or ()} == good
        bad_label = "flaky.gemm[default]" if bad == DEFAULT else "flaky.gemm[variant=3]"
        assert bad_label in decided[name]["failed_in_stage"] and bad_label in decided[name]["why"]
        selection = entry.metadata["selection"]
        if who == "default":  # the stage says so and decides among the rest: no speed-up over a default that failed
            assert selection["rule"] == "default_failed" and selection["speedup_over_default"] is None
            assert selection["why"].startswith("the default, flaky.gemm[default], failed in the confirmation stage")
        else:
            assert selection["rule"] == "default_not_beaten" and "variant=3" in selection["why"]
        stage_failures = [r for r in rows if r["problem_name"] == name and r["round"] == "confirm"
                          and r["disposition"] != "succeeded"]
        assert stage_failures and all(r["call"] == "eager" and r["error"].startswith("confirmation (eager)")
                                      for r in stage_failures), stage_failures
        assert all(r["median_ms"] is None or (math.isfinite(r["median_ms"]) and r["median_ms"] > 0) for r in rows)
    return summary


@pytest.mark.slow
def test_in_process_a_participant_that_exits_raises_hangs_or_times_badly_costs_only_itself(tmp_path):
    faults = {64: "exit0@11:default", 96: "kbint@11:fast", 128: "neg@11:default", 160: "nan@11:fast",
              192: "hang@11:default"}
    proc, out = _tune(tmp_path, faults, "--in-process", "--candidate-timeout", "3")
    # the hang restarts the process once (the stage's timed_out row written first); the resume runs that stage
    # again without it
    _check(proc, out, faults, runs=2)
    assert "hung for" in proc.stderr and "in the confirmation stage" in proc.stderr
    errors = {r["problem_name"]: r["error"] for r in ResultsDataset(out / "results").table(
        ["problem_name", "round", "error", "disposition"]).to_pylist() if r["round"] == "confirm" and r["error"]
        and r["disposition"] != "succeeded"}
    assert "SystemExit: 0" in errors["p64"] and "KeyboardInterrupt" in errors["p96"]
    assert "unusable time" in errors["p128"] and "unusable time nan" in errors["p160"]
    assert "candidate timeout" in errors["p192"]
    # farm publish takes the file (it would refuse a NaN)
    pub = subprocess.run([sys.executable, "-m", "farm", "publish", str(out / "overrides"), "--to", str(tmp_path / "pub")],
                         env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    assert pub.returncode == 0, pub.stderr


@pytest.mark.skipif(shutil.which("ray") is None and not __import__("importlib").util.find_spec("ray"),
                    reason="the Ray farm needs ray[default]")
@pytest.mark.slow
def test_on_ray_a_stage_that_kills_or_hangs_its_worker_runs_again_without_the_culprit(tmp_path):
    faults = {64: "abort@11:default", 96: "exit@11:fast", 128: "hang@11:fast", 160: "kbint@11:default"}
    proc, out = _tune(tmp_path, faults, "--candidate-timeout", "4")
    summary = _check(proc, out, faults)
    rows = ResultsDataset(out / "results").table(["problem_name", "round", "disposition", "error"]).to_pylist()
    got = {(r["problem_name"], r["disposition"]) for r in rows if r["round"] == "confirm" and r["disposition"] != "succeeded"}
    assert got == {("p64", "crashed"), ("p96", "failed_run"), ("p128", "timed_out"), ("p160", "failed_run")}
    crashed = next(r for r in rows if r["disposition"] == "crashed")
    assert "run alone after its stage lost its worker" in crashed["error"]
    assert summary["counts"].get("crashed") == 1 and summary["counts"].get("timed_out") == 1


# -- the decision, from the rows (old parts included) --------------------------------------------------------

def _stage_rows(tmp_path, default_samples):
    """A main round (default 1.0 ms, the winner 0.982, two slower) and a stage whose default's samples are given."""
    from tests.fakes import fake_props, fake_result, matmul_problem, write_results

    p, props = matmul_problem(), fake_props()
    main = [fake_result(p, "flaky.gemm", [1.0] * 3, candidate=0),
            fake_result(p, "flaky.gemm", [0.982] * 3, knobs=(("variant", 3),), candidate=3),
            fake_result(p, "flaky.gemm", [1.2] * 3, knobs=(("variant", 2),), candidate=2)]
    write_results(tmp_path, {props: [(p, "mm", main)]})
    rng = np.random.default_rng(0)
    noise = lambda: 1 + 0.001 * rng.standard_normal(16)  # noqa: E731
    stage = [fake_result(p, "flaky.gemm", default_samples, candidate=0),
             fake_result(p, "flaky.gemm", list(0.982 * noise()), knobs=(("variant", 3),), candidate=3),
             fake_result(p, "flaky.gemm", list(1.2 * noise()), knobs=(("variant", 2),), candidate=2)]
    write_results(tmp_path, {props: [(p, "mm", stage)]}, round="confirm", job_id="job1")
    return p, props


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 0.0])
def test_a_stage_part_whose_default_has_unusable_times_publishes_the_real_winner_and_no_such_number(tmp_path, bad):
    from farm.store.deciding.rule import decide_results
    from farm.store.reduce import reduce_results

    p, props = _stage_rows(tmp_path, [bad] * 16)
    w = decide_results(tmp_path).winners[(props.signature, p.key)]
    assert dict(w.knobs) == FAST and w.median_ms > 0
    if math.isinf(bad):  # a row no writer makes: skipped at read (with a warning), so that stage is not whole
        assert w.rule.value == "fastest" and w.confirmed is None
    else:
        assert w.rule.value == "default_failed" and w.speedup_over_default is None and "unusable times" in w.why
    reduce_results(tmp_path, tmp_path / "overrides")
    path = next((tmp_path / "overrides").glob("*.json"))
    text = path.read_text()
    load_json(text, str(path))
    assert "NaN" not in text and "Infinity" not in text and "-1.0" not in text


def test_a_part_with_a_negative_main_round_median_is_no_fastest_and_no_tie(tmp_path):
    from farm.store.deciding.rule import decide_results
    from tests.fakes import fake_props, fake_result, matmul_problem, write_results

    p, props = matmul_problem(), fake_props()
    rows = [fake_result(p, "flaky.gemm", [1.0] * 3, candidate=0),
            fake_result(p, "flaky.gemm", [0.9] * 3, knobs=(("variant", 1),), candidate=1),
            fake_result(p, "flaky.gemm", [-1.0] * 3, knobs=(("variant", 2),), candidate=2),
            fake_result(p, "flaky.gemm", [0.0] * 3, knobs=(("variant", 3),), candidate=3)]
    write_results(tmp_path, {props: [(p, "mm", rows)]})
    d = decide_results(tmp_path)
    w = d.winners[(props.signature, p.key)]
    assert w.fastest == "flaky.gemm[variant=1]" and w.fastest_ms == pytest.approx(0.9) and w.candidates == 2
    assert not any(m <= 0 for m in d.table["median_ms"].to_pylist())


def test_an_override_file_holds_no_non_finite_number_and_publish_refuses_one(tmp_path):
    from farm.store.overrides.files import render
    from farm.store.overrides.entries import OverrideFile

    text = render(OverrideFile(2, [], extra={"generated_by": {"x": math.nan, "y": [math.inf, 1.0]}}))
    assert json.loads(text)["generated_by"] == {"x": None, "y": [None, 1.0]}
    bad = tmp_path / "root" / "bad.json"
    bad.parent.mkdir()
    bad.write_text('{"version": 2, "engine_overrides": [], "x": NaN}\n')
    with pytest.raises(InputError, match="NaN at line 1"):
        load_overrides(bad)
    pub = subprocess.run([sys.executable, "-m", "farm", "publish", str(bad.parent), "--to", str(tmp_path / "pub")],
                         env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    assert pub.returncode != 0 and "bad.json" in pub.stderr and "NaN" in pub.stderr and "Traceback" not in pub.stderr


def test_a_resume_never_counts_a_lone_failed_stage_row_as_a_stage_and_drops_its_candidate():
    from farm.fleet.tasks import Candidate, PriorRow, confirmed_calls, failed_in_stage
    from farm.fleet.scheduler import Scheduler
    from farm.model.plans import PlanSpec
    from farm.model.records import ConfirmSettings
    from farm.model.workload import EngineSelection, WorkloadProblem
    from tests.fakes import matmul_problem

    a, b, c = PlanSpec(1, ()), PlanSpec(1, (("variant", 3),)), PlanSpec(1, (("variant", 2),))
    main = [PriorRow(s, "main", "m", True, med, 0.0, "", 100.0) for s, med in ((a, 1.0), (b, 0.98), (c, 1.2))]
    hung = PriorRow(a, "confirm", "h", False, None, None, "eager", 200.0, None)  # written by the hang watch
    assert confirmed_calls(main + [hung]) == set() and failed_in_stage(main + [hung]) == {a}
    # the stage a resume queues (both executors': farm.fleet.scheduler) is of the others
    sched = Scheduler(confirm=ConfirmSettings())
    sched.add_problem("sig", 0, WorkloadProblem(0, "mm", matmul_problem(), EngineSelection()),
                      [Candidate(s, "flaky.gemm", i) for i, s in enumerate((a, b, c))], main + [hung])
    stage = sched.next_task("sig")
    assert stage is not None and stage.round == "confirm" and set(stage.specs) == {b, c}
    # measured again in a later main round: back in
    again = PriorRow(a, "main", "m2", True, 1.0, 0.0, "", 300.0)
    assert failed_in_stage(main + [hung, again]) == set()
    whole = [PriorRow(s, "confirm", "c", True, 1.0, 0.0, "eager", 400.0, 2) for s in (b, c)]
    assert confirmed_calls(main + [hung] + whole) == {"eager"}
    # a later stage whose budget ended undecided: a resume keeps it, one with --reconfirm runs it again
    undecided = [PriorRow(s, "confirm", "u", True, 1.0, 0.0, "eager", 500.0, 2, converged=False) for s in (b, c)]
    assert confirmed_calls(main + [hung] + whole + undecided) == {"eager"}
    assert confirmed_calls(main + [hung] + whole + undecided, redo_undecided=True) == set()
    decided = [PriorRow(s, "confirm", "d", True, 1.0, 0.0, "eager", 600.0, 2) for s in (b, c)]
    assert confirmed_calls(main + [hung] + whole + undecided + decided, redo_undecided=True) == {"eager"}


@pytest.mark.slow
def test_in_process_a_native_crash_in_the_stage_is_named_by_the_runs_after_it(tmp_path):
    """os.abort() takes farm tune --in-process with it; the journal of candidates in flight (a memory-mapped page
    of the output folder) names it: the next run measures it again (a kill names nobody), and when that run ends
    so too, the candidate gets a crashed row of the stage and the run goes on without it."""
    faults = {64: "abort@11:default"}
    codes = []
    for _ in range(3):
        proc, out = _tune(tmp_path, faults, "--in-process")
        codes.append(proc.returncode)
    assert codes[:2] == [-signal.SIGABRT] * 2, proc.stderr[-500:]
    assert "ended the process twice in the confirmation stage (eager) of p64" in proc.stderr
    _check(proc, out, faults, runs=3)
    rows = ResultsDataset(out / "results").table(["round", "disposition", "error"]).to_pylist()
    crashed = [r for r in rows if r["disposition"] == "crashed"]
    assert len(crashed) == 1 and crashed[0]["round"] == "confirm" and "two runs in a row" in crashed[0]["error"]


def test_the_in_flight_journal_survives_the_process_and_reads_a_foreign_page_as_nothing(tmp_path):
    from farm.model.plans import PlanSpec
    from farm.tuner.journal import InFlight, InFlightJournal, InFlightRecord

    path = tmp_path / ".in-flight"
    code = ("import sys, os, time; sys.path.insert(0, %r)\n"
            "from farm.tuner.journal import InFlight, InFlightJournal\n"
            "from farm.model.plans import PlanSpec\n"
            "f = InFlight('abc'); f.stage = 'eager'; f.journal = InFlightJournal(%r)\n"
            "f[PlanSpec(7, (('variant', 3),))] = time.monotonic()\n"
            "os.abort()\n") % (str(REPO), str(path))
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == -signal.SIGABRT
    journal = InFlightJournal(path)
    now, suspect = journal.read()
    assert now == InFlightRecord("abc", "eager", (PlanSpec(7, (("variant", 3),)).key,)) and suspect is None
    journal.settle(now)
    flight = InFlight("abc")
    flight.journal = journal
    flight[PlanSpec(1, ())] = 1.0
    flight[PlanSpec(2, ())] = 2.0
    assert len(journal.read()[0].candidates) == 2 and journal.read()[1] == now
    flight.pop(PlanSpec(1, ()))
    flight.pop(PlanSpec(2, ()))
    assert journal.read() == (None, now)
    journal.settle(None)
    assert journal.read() == (None, None)
    journal.close()
    path.write_bytes(b"\x89PNG not ours" + b"\0" * 100)
    assert InFlightJournal(path).read() == (None, None)
