"""The results dataset: schema, small atomic files, readable by pyarrow, pandas and DuckDB, resumable."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq

import pytest

from fakes import fake_props, fake_result, matmul_problem, write_results
from farm.model.records import Disposition
from farm.store.results import (
    COLUMNS, FILE_SCHEMA, SCHEMA_VERSION, MeasurementContext, ResultWriter, RunContext, knobs_from_structs,
    knobs_to_structs, result_row, schema_markdown
)
from farm.model.plans import candidate_key, spec_of
from farm.store.dataset import ResultsDataset

P1 = matmul_problem(8, 6, 5)
P2 = matmul_problem(16, 6, 5)


def sample_rows(tmp_path):
    gpu = fake_props()
    results = [
        fake_result(P1, "a", (1.0, 1.1, 1.0), candidate=0),
        fake_result(P1, "b", (2.0, 2.0, 2.1), knobs=(("tile", 64), ("mode", "x"), ("alpha", 0.5)), candidate=1),
        fake_result(P1, "c", candidate=2, disposition=Disposition.FAILED_COMPILE),
    ]
    write_results(tmp_path, {gpu: [(P1, "mm1", results), (P2, "mm2", [fake_result(P2, "a")])]})
    return gpu


def test_schema_has_every_column_the_issue_names_and_docs_match(repo_root):
    names = {n for n, _, _ in COLUMNS}
    required = {"job_id", "run_started_at", "host", "device_index", "arch", "device_name", "problem_key", "op",
                "problem_json", "dtype", "engine_id", "engine_name", "knobs", "mode", "strategy", "min_ms", "avg_ms",
                "stddev_ms", "median_ms", "iterations", "converged", "samples_ms", "workspace_bytes",
                "estimated_workspace_bytes", "rank", "succeeded", "disposition", "error", "ran_exhaustive",
                "supports_exhaustive", "library_versions"}
    assert required - {"op"} <= names
    assert "device_signature" not in names and "op" not in names  # partition columns live in the paths
    assert FILE_SCHEMA.metadata[b"tunefarm.schema_version"] == str(SCHEMA_VERSION).encode()
    with open(f"{repo_root}/docs/results.md") as fh:
        assert schema_markdown() in fh.read(), "docs/results.md is out of date: paste farm.store.results.schema_markdown()"


def test_rows_round_trip_with_pyarrow(tmp_path):
    gpu = sample_rows(tmp_path)
    t = ds.dataset(tmp_path, partitioning="hive").to_table()
    assert t.num_rows == 4
    rows = {(r["problem_name"], r["engine_name"]): r for r in t.to_pylist()}
    b = rows[("mm1", "b")]
    assert b["device_signature"] == gpu.signature and b["op"] == "matmul"
    assert knobs_from_structs(b["knobs"]) == (("alpha", 0.5), ("mode", "x"), ("tile", 64))
    assert {k["type"] for k in b["knobs"]} == {"double", "string", "int"}
    assert b["samples_ms"] == [2.0, 2.0, 2.1] and b["median_ms"] == 2.0 and b["succeeded"]
    assert spec_of(b["candidate_key"]).knobs == knobs_from_structs(b["knobs"])
    c = rows[("mm1", "c")]
    assert c["disposition"] == "failed_compile" and c["min_ms"] is None and c["samples_ms"] == [] and c["rank"] == -1
    assert rows[("mm1", "a")]["rank"] is None  # streamed before its session was ranked
    assert {t["id"] for t in b["tensors"]} == {"A", "B", "C"}
    assert b["library_versions"] == [{"name": "torch", "version": "2.11.0"}]


def test_pandas_and_duckdb_read_it_in_one_line(tmp_path):
    pd = pytest.importorskip("pandas")
    duckdb = pytest.importorskip("duckdb")
    sample_rows(tmp_path)
    df = pd.read_parquet(tmp_path)
    assert len(df) == 4 and set(df["op"]) == {"matmul"}
    best = duckdb.sql(f"SELECT problem_name, min(min_ms) AS best FROM read_parquet('{tmp_path}/**/*.parquet', "
                      f"hive_partitioning=true) WHERE succeeded GROUP BY problem_name ORDER BY 1").fetchall()
    assert best == [("mm1", 1.0), ("mm2", 1.0)]
    sig = duckdb.sql(f"SELECT DISTINCT device_signature FROM read_parquet('{tmp_path}/**/*.parquet', "
                     f"hive_partitioning=true)").fetchall()
    assert sig[0][0].startswith("nvidia-fake-gpu-sm90")


def test_small_files_per_flush_and_hive_layout(tmp_path):
    run = RunContext(job_id="j")
    where = MeasurementContext(fake_props())
    with ResultWriter(tmp_path, run.run_id, flush_rows=2, flush_seconds=3600) as w:
        for i in range(5):
            w.append([result_row(fake_result(P1, f"e{i}"), P1, "mm", run, where)])
    assert w.rows_written == 5 and len(w.files_written) == 3  # 2 + 2 + 1
    for f in map(Path, w.files_written):
        assert f.parent.name == "op=matmul" and f.parent.parent.name.startswith("device_signature=")
        assert pq.read_metadata(f).num_rows <= 2


def test_set_ranks_fills_buffered_rows(tmp_path):
    run = RunContext(job_id="j")
    where = MeasurementContext(fake_props())
    r = fake_result(P1, "a")
    with ResultWriter(tmp_path, run.run_id, flush_rows=100, flush_seconds=3600) as w:
        w.append([result_row(r, P1, "mm", run, where)])
        assert w.set_ranks(where.session_id, {candidate_key(r.engine_id, r.knobs): 0}) == 1
    assert ds.dataset(tmp_path, partitioning="hive").to_table().column("rank").to_pylist() == [0]


def test_corrupt_and_truncated_files_are_reported_and_skipped(tmp_path):
    sample_rows(tmp_path)
    good = ResultsDataset(tmp_path)
    assert len(good.files) == 1 and not good.skipped
    folder = os.path.dirname(good.files[0])
    data = open(good.files[0], "rb").read()
    with open(os.path.join(folder, "part-zzz-000001.parquet"), "wb") as fh:
        fh.write(data[: len(data) // 2])  # truncated
    with open(os.path.join(folder, "part-zzz-000002.parquet"), "w") as fh:
        fh.write("not parquet at all")
    with open(os.path.join(folder, ".part-zzz-000003.parquet.tmp"), "w") as fh:
        fh.write("a writer in progress")  # hidden temp files are not even looked at
    bad = ResultsDataset(tmp_path)
    assert len(bad.files) == 1
    assert sorted(os.path.basename(s.path) for s in bad.skipped) == ["part-zzz-000001.parquet", "part-zzz-000002.parquet"]
    assert all("not a readable Parquet file" in s.reason for s in bad.skipped)
    assert bad.table().num_rows == 4


def test_resume_set_per_signature(tmp_path):
    gpu = sample_rows(tmp_path)
    other = fake_props(name="Other GPU")
    write_results(tmp_path, {other: [(P1, "mm1", [fake_result(P1, "z")])]})
    data = ResultsDataset(tmp_path)
    done = data.done_candidates(gpu.signature)
    assert set(done) == {P1.key, P2.key} and len(done[P1.key]) == 3  # failures count as measured
    assert len(data.done_candidates(other.signature)[P1.key]) == 1
    assert data.signatures() == sorted([gpu.signature, other.signature])


def test_a_killed_writer_leaves_only_complete_files(tmp_path, repo_root):
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{repo_root!r}, {repo_root + '/tests'!r}]
        from fakes import fake_props, fake_result, matmul_problem
        from farm.store.results import MeasurementContext, ResultWriter, RunContext, result_row
        p = matmul_problem()
        run, where = RunContext(job_id="j"), MeasurementContext(fake_props())
        w = ResultWriter({str(tmp_path)!r}, run.run_id, flush_rows=50, flush_seconds=3600)
        print("ready", flush=True)
        while True:
            w.append([result_row(fake_result(p, "e"), p, "mm", run, where) for _ in range(50)])
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    # killed while it writes: once its first parts are on disk (60 s at most on a loaded machine), then a moment on
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(tmp_path.rglob("part-*.parquet"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    data = ResultsDataset(tmp_path)
    assert data.files and not data.skipped
    assert data.table().num_rows % 50 == 0
