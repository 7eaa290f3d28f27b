"""farm tune --dry-run says what the tune would cost (issue 46): the candidate total per signature and the device time
estimated from the results history (a candidate's own last time, else its engine's for the op), or that there is
none; what the run folder has already is what a resume skips."""

import dataclasses
import json

from farm.cli import main
from farm.devices.device import cpu_device
from tests.fakes import fake_result, matmul_problem, write_results

WORKLOAD = """name: est
autotune: {confirm: {budget_ms: 500}}
engines: {include: [cpu.matmul.blas, cpu.matmul.einsum], defaults: true}
problems:
  - {name: mm, op: matmul, tensors: {A: [24, 16], B: [16, 20]}}
"""


def _dry(tmp_path, capsys, *extra):
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOAD)
    assert main(["tune", str(wl), "--devices", "cpu", "--dry-run", "--json", "--out", str(tmp_path / "run"),
                 *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    [estimate] = out["estimate"]
    return out, estimate


def _timed(problem, engine, ms, candidate):
    return dataclasses.replace(fake_result(problem, engine, (0.1,) * 3, candidate=candidate), tuning_ms=ms)


def test_no_history_says_so_and_the_stage_is_bounded_by_its_budget(tmp_path, capsys):
    out, e = _dry(tmp_path, capsys)
    [problem] = out["problems"]
    assert e["signature"] == cpu_device().signature and e["problems"] == 1
    assert e["candidates"] == len(problem["candidates"]) == 2
    assert e["main_round_s"] is None and e["estimated_from"]["none"] == 2 and e["history"] == []
    assert e["confirmation_s"] is None and e["confirmation_budget_s"] == 0.5 and e["total_s"] is None


def test_history_times_each_candidate_and_the_run_folder_is_skipped_on_resume(tmp_path, capsys, monkeypatch):
    props = cpu_device().properties
    mm = matmul_problem(24, 20, 16)
    other = matmul_problem(64, 64, 64)
    assert mm.key != other.key
    history = tmp_path / "old" / "results"
    # mm's blas measured before (120 ms of tuning); einsum only ever on another matmul (40 and 60 ms: median 50)
    write_results(history, {props: [(mm, "mm", [_timed(mm, "cpu.matmul.blas", 120.0, 0)]),
                                    (other, "big", [_timed(other, "cpu.matmul.einsum", 40.0, 0)])]})
    write_results(history, {props: [(other, "big", [_timed(other, "cpu.matmul.einsum", 60.0, 0)])]}, job_id="job2")
    write_results(history, {props: [(mm, "mm", [_timed(mm, "cpu.matmul.blas", 700.0, 0),
                                                _timed(mm, "cpu.matmul.einsum", 300.0, 1)])]}, round="confirm")
    _, e = _dry(tmp_path, capsys, "--history", str(history))
    assert (e["estimated_from"], e["measured_before"]) == ({"own_history": 1, "same_engine_and_op": 1, "none": 0}, 0)
    assert abs(e["main_round_s"] - 0.170) < 1e-9 and abs(e["confirmation_s"] - 1.0) < 1e-9
    # the run folder has mm's blas already: a resume skips it, the rest is estimated as before
    write_results(tmp_path / "run" / "results", {props: [(mm, "mm", [_timed(mm, "cpu.matmul.blas", 90.0, 0)])]})
    _, e = _dry(tmp_path, capsys, "--history", str(history))
    assert e["measured_before"] == 1 and abs(e["main_round_s"] - 0.050) < 1e-9
    assert len(e["history"]) == 2
    assert abs(e["total_s"] - 1.050) < 1e-9
    # and the table says it (wide enough for each cell on one line)
    monkeypatch.setenv("COLUMNS", "250")
    wl = tmp_path / "w.yaml"
    assert main(["tune", str(wl), "--devices", "cpu", "--dry-run", "--out", str(tmp_path / "run"),
                 "--history", str(history)]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "What the tune would cost" in text and "about 0.1 s (1 from the same engine and op)" in text  # 50 ms
    assert "1 measured already (a resume skips them)" in text and "about 1.0 s (as before) about 1.1 s" in text


def test_a_history_folder_that_is_not_there_is_an_error_naming_it(tmp_path, capsys):
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOAD)
    assert main(["tune", str(wl), "--devices", "cpu", "--dry-run", "--out", str(tmp_path / "run"),
                 "--history", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "results folder not found" in err


def test_a_history_row_with_a_time_that_is_not_finite_is_left_out_and_the_json_stays_json(tmp_path, capsys):
    props = cpu_device().properties
    mm = matmul_problem(24, 20, 16)
    history = tmp_path / "old" / "results"
    write_results(history, {props: [(mm, "mm", [_timed(mm, "cpu.matmul.blas", float("inf"), 0),
                                                _timed(mm, "cpu.matmul.einsum", 30.0, 1)])]})
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOAD)
    assert main(["tune", str(wl), "--devices", "cpu", "--dry-run", "--json", "--out", str(tmp_path / "run"),
                 "--history", str(history)]) == 0
    text = capsys.readouterr().out
    assert "Infinity" not in text and "NaN" not in text
    [e] = json.loads(text)["estimate"]
    # the infinite row tells nothing: blas has no time (none of its engine either), einsum its own 30 ms
    assert e["estimated_from"] == {"own_history": 1, "same_engine_and_op": 0, "none": 1}
    assert abs(e["main_round_s"] - 0.030) < 1e-9
    assert main(["tune", str(wl), "--devices", "cpu", "--dry-run", "--out", str(tmp_path / "run"),
                 "--history", str(history)]) == 0  # the table, no traceback


def test_a_dry_run_without_out_reads_earlier_runs_of_the_workload_in_other_folders(tmp_path, capsys, monkeypatch):
    """The Quick start tunes into runs/quick; `farm tune examples/cpu-quick.yaml --dry-run` (no --out: the default
    folder is runs/cpu-quick) estimates from it: every run folder beside the default whose job.json names the
    workload. A folder of another workload is not read."""
    monkeypatch.chdir(tmp_path)
    props = cpu_device().properties
    mm = matmul_problem(24, 20, 16)
    for folder, name in (("quick", "est"), ("other", "not-est")):
        write_results(tmp_path / "runs" / folder / "results",
                      {props: [(mm, "mm", [_timed(mm, "cpu.matmul.blas", 120.0, 0)])]})
        (tmp_path / "runs" / folder / "job.json").write_text(json.dumps({"workload": {"name": name}}))
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    assert main(["tune", "w.yaml", "--devices", "cpu", "--dry-run", "--json"]) == 0
    [e] = json.loads(capsys.readouterr().out)["estimate"]
    assert [h.split("runs")[-1] for h in e["history"]] == ["/quick/results"], e["history"]
    assert e["estimated_from"]["own_history"] == 1 and e["main_round_s"] is not None


def test_history_times_that_sum_past_infinity_are_left_out_in_the_table_and_the_json(tmp_path, capsys):
    """Each one finite, together infinite (1e308 twice): no OverflowError, no Infinity in the JSON (issue 64)."""
    props = cpu_device().properties
    mm = matmul_problem(24, 20, 16)
    history = tmp_path / "old" / "results"
    write_results(history, {props: [(mm, "mm", [_timed(mm, "cpu.matmul.blas", 1e308, 0),
                                                _timed(mm, "cpu.matmul.einsum", 1e308, 1)])]})
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOAD)
    assert main(["tune", str(wl), "--devices", "cpu", "--dry-run", "--out", str(tmp_path / "run"),
                 "--history", str(history)]) == 0  # the table: once an OverflowError
    capsys.readouterr()
    assert main(["tune", str(wl), "--devices", "cpu", "--dry-run", "--json", "--out", str(tmp_path / "run"),
                 "--history", str(history)]) == 0
    text = capsys.readouterr().out
    assert "Infinity" not in text and "NaN" not in text
    [e] = json.loads(text)["estimate"]
    assert e["estimated_from"]["none"] == 2 and e["main_round_s"] is None  # impossible times estimate nothing
