"""The reducer: one ranked override file per device signature, noise-aware, resumable end to end."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fakes import fake_props, fake_result, matmul_problem, write_results
from farm.model.records import Disposition
from farm.store.overrides.parsing import load_overrides
from farm.store.reduce import reduce_results

P1, P2, P3 = matmul_problem(8), matmul_problem(16), matmul_problem(32)
GPU_A = fake_props("Fake GPU", units=132)
GPU_B = fake_props("Other GPU", arch="gfx942", units=304)


def synthetic(tmp_path):
    write_results(tmp_path, {
        GPU_A: [
            (P1, "p1", [fake_result(P1, "default", (1.00, 1.01, 1.02), candidate=0),
                        fake_result(P1, "variant", (0.995, 1.00, 1.03), candidate=1, knobs=(("tile", 64),)),
                        fake_result(P1, "slow", (3.0, 3.0, 3.0), candidate=2)]),
            (P2, "p2", [fake_result(P2, "default", (2.0, 2.0, 2.0), candidate=0),
                        fake_result(P2, "fast", (1.0, 1.0, 1.01), candidate=1, knobs=(("tile", 128),)),
                        fake_result(P2, "broken", candidate=2, disposition=Disposition.FAILED_COMPILE)]),
            (P3, "p3", [fake_result(P3, "broken", candidate=0, disposition=Disposition.WRONG_RESULT)]),
        ],
        GPU_B: [
            (P1, "p1", [fake_result(P1, "default", (5.0, 5.0, 5.0), candidate=0),
                        fake_result(P1, "amd", (1.0, 1.0, 1.0), candidate=1)]),
        ],
    })


def test_one_file_per_signature_with_ranked_winners(tmp_path):
    synthetic(tmp_path / "results")
    report = reduce_results(tmp_path / "results", tmp_path / "out", top_k=2)
    files = sorted(f for f in os.listdir(tmp_path / "out") if not f.startswith("."))
    assert files == sorted(f"{p.signature}{ext}" for p in (GPU_A, GPU_B) for ext in (".json", ".winners.parquet"))
    a = load_overrides(tmp_path / "out" / f"{GPU_A.signature}.json")
    assert a.device_signature == GPU_A.signature and a.device["properties"]["arch"] == "sm_90"
    e1, e2 = a.match(P1), a.match(P2)
    assert e1.engine_name == "default"  # variant is a hair faster, within noise
    assert e1.metadata["selection"]["rule"] == "default_within_noise"
    assert e1.metadata["selection"]["fastest"]["label"] == "variant[tile=64]"
    assert e1.metadata["selection"]["why"].startswith("default kept: variant[tile=64] ")
    assert [t["engine_name"] for t in e1.metadata["top_k"]] == ["default", "variant"]
    assert e2.engine_name == "fast" and e2.knobs == (("tile", 128),)
    assert e2.metadata["selection"]["rule"] == "fastest" and e2.metadata["rank"] == 0
    assert e2.metadata["converged"] is True and e2.metadata["iterations_run"] == 3
    assert a.match(P3) is None  # nothing succeeded
    rep_a = next(s for s in report.signatures if s.signature == GPU_A.signature)
    assert rep_a.problems == 3 and rep_a.entries == 2 and rep_a.no_winner == [P3.key] and rep_a.kept_over_fastest == 1
    b = load_overrides(tmp_path / "out" / f"{GPU_B.signature}.json")
    assert b.match(P1).engine_name == "amd" and b.device["properties"]["arch"] == "gfx942"


def test_latest_measurement_per_candidate_and_finalist_round(tmp_path):
    root = tmp_path / "results"
    write_results(root, {GPU_A: [(P1, "p1", [
        fake_result(P1, "a", (1.0, 1.0, 1.0), candidate=0, started_at="2026-11-30T00:00:00Z"),
        fake_result(P1, "b", (2.0, 2.0, 2.0), candidate=1, started_at="2026-11-30T00:00:00Z")])]})
    # b re-measured later and now much faster: the latest row counts
    write_results(root, {GPU_A: [(P1, "p1", [fake_result(P1, "b", (0.5, 0.5, 0.5), candidate=1,
                                                           started_at="2026-11-30T01:00:00Z")])]})
    reduce_results(root, tmp_path / "out")
    assert load_overrides(tmp_path / "out" / f"{GPU_A.signature}.json").match(P1).engine_name == "b"
    # a finalist round (shard winners measured together) overrides the shards' numbers
    write_results(root, {GPU_A: [(P1, "p1", [
        fake_result(P1, "a", (0.9, 0.9, 0.9), candidate=0, started_at="2026-11-30T02:00:00Z"),
        fake_result(P1, "c", (0.1, 0.1, 0.1), candidate=2, started_at="2026-11-30T00:30:00Z")])]}, round="finalist")
    write_results(root, {GPU_A: [(P1, "p1", [fake_result(P1, "b", (0.05, 0.05, 0.05), candidate=1,
                                                           started_at="2026-11-30T03:00:00Z")])]})
    reduce_results(root, tmp_path / "out")
    entry = load_overrides(tmp_path / "out" / f"{GPU_A.signature}.json").match(P1)
    assert entry.engine_name == "c"  # b's newer main-round row is not comparable with the finalists


def test_only_the_latest_finalist_round_counts(tmp_path):
    """A round cut short (a killed driver) is run again on resume; the reducer compares the new round only."""
    root = tmp_path / "results"
    write_results(root, {GPU_A: [(P1, "p1", [fake_result(P1, n, (t, t, t), candidate=i, started_at="2026-11-30T00:00:00Z")
                                            for i, (n, t) in enumerate([("a", 1.0), ("b", 0.8), ("c", 0.9)])])]})
    # the first round measured only c (0.1: a fluke of that round) before its driver died
    write_results(root, {GPU_A: [(P1, "p1", [fake_result(P1, "c", (0.1, 0.1, 0.1), candidate=2,
                                                           started_at="2026-11-30T01:00:00Z")])]}, round="finalist")
    write_results(root, {GPU_A: [(P1, "p1", [
        fake_result(P1, n, (t, t, t), candidate=i, started_at="2026-11-30T02:00:00Z")
        for i, (n, t) in ((0, ("a", 1.0)), (1, ("b", 0.8)))])]}, round="finalist")
    reduce_results(root, tmp_path / "out")
    entry = load_overrides(tmp_path / "out" / f"{GPU_A.signature}.json").match(P1)
    assert entry.engine_name == "b" and [t["engine_name"] for t in entry.metadata["top_k"]] == ["b", "a"]


def test_reduce_is_idempotent_in_append_mode(tmp_path):
    synthetic(tmp_path / "results")
    reduce_results(tmp_path / "results", tmp_path / "out")
    before = (tmp_path / "out" / f"{GPU_A.signature}.json").read_text()
    report = reduce_results(tmp_path / "results", tmp_path / "out")
    w = next(s.write for s in report.signatures if s.signature == GPU_A.signature)
    assert (w.added, w.replaced, w.entries) == (0, 2, 2)
    after = json.loads((tmp_path / "out" / f"{GPU_A.signature}.json").read_text())
    assert len(after["engine_overrides"]) == len(json.loads(before)["engine_overrides"])


def test_corrupt_results_file_is_skipped_and_named(tmp_path):
    synthetic(tmp_path / "results")
    folder = next((tmp_path / "results").glob("device_signature=*/op=matmul"))
    (folder / "part-bad-000001.parquet").write_bytes(b"PAR1 truncated")
    report = reduce_results(tmp_path / "results", tmp_path / "out")
    assert [os.path.basename(p) for p, _ in report.skipped_files] == ["part-bad-000001.parquet"]
    assert sum(s.entries for s in report.signatures) == 3


def test_tunableop_csv(tmp_path):
    synthetic(tmp_path / "results")
    report = reduce_results(tmp_path / "results", tmp_path / "out", tunableop_csv=True)
    path = next(s.csv_path for s in report.signatures if s.signature == GPU_A.signature)
    rows = list(csv.reader(open(path)))
    validators = {r[1]: r[2] for r in rows if r[0] == "Validator"}
    assert validators["DEVICE_SIGNATURE"] == GPU_A.signature and validators["TORCH_VERSION"] == "2.11.0"
    assert validators["ARCH"] == "sm_90" and "FARM_VERSION" in validators
    results = [r for r in rows if r[0] != "Validator"]
    assert len(results) == 2 and all(len(r) == 4 for r in results)
    fast = next(r for r in results if r[2].startswith("fast"))
    # the runtime tuner's own GEMM line: A 16 x 5 row-major, B 5 x 6, no bias, the device's ordinal
    assert fast[:3] == ["GemmTunableOp_Float32", "taN_m16_n6_k5_bias0_dev0", "fast[tile=128]"]
    assert validators["CUDA_DEVICE"] == "9.0:" + GPU_A.name
    assert float(fast[3]) == pytest.approx(1.0)


@pytest.mark.slow
def test_farm_tune_out_then_resume_then_reduce_cli(tmp_path, repo_root):
    duckdb = pytest.importorskip("duckdb")
    env = dict(os.environ, PYTHONPATH=repo_root, COLUMNS="200")

    def farm(*args):
        return subprocess.run([sys.executable, "-m", "farm", *args], cwd=repo_root, env=env, capture_output=True,
                              text=True, timeout=300)

    out = tmp_path / "run"
    first = farm("tune", "examples/cpu-quick.yaml", "--out", str(out), "--json")  # on the embedded Ray
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["executor"] == "ray"
    rows = data["rows_written"]
    (sig,) = data["signatures"]
    problems = data["signatures"][sig]
    # every row is a candidate's main measurement, its place in a confirmation stage, or one side of farm verify's
    # check of a decision (farm.ops and the direct call)
    stages = [c for p in problems for c in p["confirmation"]]
    assert stages and all(c["call"] == "eager" and c["rounds"] >= 8 for c in stages)
    checks = [v for v in data["verified"] if v["delivered"] is not None]
    assert len(checks) == len(problems)
    assert rows == sum(len(p["results"]) for p in problems) + sum(len(c["results"]) for c in stages) + 2 * len(checks)
    files = list((out / "overrides").glob("*.json"))
    assert len(files) == 1 and files[0].name == f"{sig}.json"
    assert len(load_overrides(files[0]).entries) == len(problems)
    # the README's one-liner
    count = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/results/**/*.parquet', hive_partitioning=true)").fetchall()[0][0]
    assert count == rows
    job = json.loads((out / "job.json").read_text())
    assert job["job_id"] == data["job_id"] and job["runs"][0]["state"] == "finished"
    # resume (in-process this time: the same folder works with either executor): nothing left, same job
    second = farm("tune", "examples/cpu-quick.yaml", "--out", str(out), "--json", "--in-process")
    again = json.loads(second.stdout)
    assert again["rows_written"] == 0 and again["job_id"] == data["job_id"]
    assert all(p["skipped"] == len(prev["results"]) for p, prev in zip(again["signatures"][sig], problems))
    assert len(json.loads((out / "job.json").read_text())["runs"]) == 2
    # farm reduce on the same results, human and JSON output, with a corrupt file beside them
    part = next((out / "results").rglob("*.parquet"))
    (part.parent / "part-broken-000001.parquet").write_bytes(b"garbage")
    red = farm("reduce", str(out / "results"), "--out", str(tmp_path / "ovr"), "--tunableop-csv")
    assert red.returncode == 0, red.stderr
    assert "part-broken-000001.parquet" in red.stderr and "Traceback" not in red.stderr
    assert "Override files" in red.stdout
    red_json = json.loads(farm("reduce", str(out / "results"), "--out", str(tmp_path / "ovr"), "--json").stdout)
    assert red_json["signatures"][0]["entries"] == len(problems)
    assert red_json["skipped_files"][0]["path"].endswith("part-broken-000001.parquet")


def test_reduce_cli_errors(tmp_path, repo_root):
    env = dict(os.environ, PYTHONPATH=repo_root)
    proc = subprocess.run([sys.executable, "-m", "farm", "reduce", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
                          cwd=repo_root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "results folder not found" in proc.stderr and "Traceback" not in proc.stderr




def test_metadata_says_whether_exhaustive_applies_and_stamps_whole_seconds(tmp_path):
    """RFC metadata: supports_exhaustive, exhaustive_not_run_reason (empty unless EXHAUSTIVE did not prime),
    timestamps as ISO 8601 seconds."""
    import re

    synthetic(tmp_path / "results")
    reduce_results(tmp_path / "results", tmp_path / "out")
    meta = load_overrides(tmp_path / "out" / f"{GPU_A.signature}.json").match(P2).metadata
    assert meta["supports_exhaustive"] is False and meta["exhaustive_not_run_reason"] == ""
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["timestamp"]), meta["timestamp"]
    from farm.store.overrides.files import autotune_metadata

    exhaustive = dict(rank=0, min_ms=1.0, avg_ms=1.0, stddev_ms=0.0, workspace=0, mode="exhaustive", strategy="single_shot",
                      iterations=1, converged=True, device="sm_90", timestamp="2026-04-21T10:30:00.123+00:00")
    assert autotune_metadata(**exhaustive, ran_exhaustive=True, supports_exhaustive=True)["exhaustive_not_run_reason"] == ""
    unprimed = autotune_metadata(**exhaustive, ran_exhaustive=False, supports_exhaustive=True)
    assert "did not run" in unprimed["exhaustive_not_run_reason"] and unprimed["timestamp"] == "2026-04-21T10:30:00Z"
    assert "does not support" in autotune_metadata(**exhaustive, ran_exhaustive=False)["exhaustive_not_run_reason"]


def test_the_tuners_reason_for_not_priming_reaches_the_override_file(tmp_path):
    """BENCHMARK_UNPRIMED and a priming workspace skip record why in the row; the reducer writes that reason."""
    from farm.store.overrides.files import autotune_metadata

    exhaustive = dict(rank=0, min_ms=1.0, avg_ms=1.0, stddev_ms=0.0, workspace=0, mode="exhaustive", strategy="single_shot",
                      iterations=1, converged=True, device="sm_90", timestamp="2026-04-21T10:30:00Z")
    reason = "priming skipped: workspace 4096 B over the limit 1024 B"
    meta = autotune_metadata(**exhaustive, ran_exhaustive=False, supports_exhaustive=True, not_run_reason=reason)
    assert meta["exhaustive_not_run_reason"] == reason
    standard = autotune_metadata(**{**exhaustive, "mode": "standard"}, ran_exhaustive=False, not_run_reason=reason)
    assert standard["exhaustive_not_run_reason"] == ""  # empty unless EXHAUSTIVE did not prime
