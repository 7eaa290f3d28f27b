"""Broken Parquet parts in a results folder: skipped and named by every reader, never fatal, never a wrong winner.

One small in-process tune makes a real results folder; each case adds one bad part beside its good
parts (under the same device signature and op, so every reader has to open it), then runs farm reduce,
report, diff and a resume of the job.
"""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm.cli import main as farm_main
from farm.store.overrides.parsing import load_overrides
from farm.model.problem import Problem
from farm.store.results import FILE_SCHEMA, SCHEMA_VERSION

WORKLOAD = """\
name: broken
autotune: {strategy: fixed_average, timed_iterations: 2, warmup_iterations: 1}
engines: {include: [cpu.matmul.blas, cpu.matmul.blocked, cpu.matmul.einsum]}
problems:
  - {name: mm, op: matmul, tensors: {A: [32, 48], B: [48, 16]}, dtype: fp32}
"""


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    d = tmp_path_factory.mktemp("broken")
    (d / "w.yaml").write_text(WORKLOAD)
    assert farm_main(["tune", str(d / "w.yaml"), "--in-process", "--out", str(d / "good"), "--json"]) == 0
    return d


def _a_part(root):
    return sorted((root / "results").rglob("part-*.parquet"))[0]


def _corrupt_page(path):
    """The footer stays intact; the bytes of the first data pages do not."""
    data = bytearray(path.read_bytes())
    for i in range(8, min(len(data) - 2000, 600)):
        data[i] = 0xA5
    path.write_bytes(bytes(data))


def _with_values(path, **values):
    t = pq.read_table(path)
    for name, v in values.items():
        t = t.set_column(t.schema.get_field_index(name), name, pa.array([v] * t.num_rows, type=t.schema.field(name).type))
    pq.write_table(t, path)


def _garbage_version(path):
    t = pq.read_table(path)
    pq.write_table(t.replace_schema_metadata({b"tunefarm.schema_version": b"\xff\x00garbage"}), path)


def _foreign_schema(path):
    t = pa.table({"median_ms": pa.array(["fast"] * 3), "candidate_key": pa.array([1, 2, 3])},
                 metadata={b"tunefarm.schema_version": str(SCHEMA_VERSION).encode()})
    pq.write_table(t, path)


CASES = {
    "corrupt data page": lambda p: _corrupt_page(p),
    "garbage schema version": _garbage_version,
    "foreign schema": _foreign_schema,
    "bad candidate key": lambda p: _with_values(p, candidate_key="not a key"),
    "bad problem json": lambda p: _with_values(p, problem_json="{"),
    "bad device json": lambda p: _with_values(p, device_json="[1, 2"),
    # a valid problem, but not the one the row's problem_key names: its winner would match other shapes
    "problem json of another shape": lambda p: _with_values(p, problem_json=Problem.create(
        "matmul", {"A": [64, 48], "B": [48, 16]}, dtype="fp32").canonical_json()),
    "null iterations and time": lambda p: _with_values(p, iterations=None, measured_at=None, candidate_index=None),
    "huge median": lambda p: _with_values(p, median_ms=-0.0, min_ms=float("inf")),
}


@pytest.fixture(params=sorted(CASES) + ["part at the dataset root"])
def broken(request, tuned, tmp_path):
    out = tmp_path / "job"
    shutil.copytree(tuned / "good", out)
    good = _a_part(out)
    if request.param == "part at the dataset root":
        bad = out / "results" / "part-stray.parquet"
        shutil.copy(good, bad)
    else:
        bad = good.with_name("part-zz-broken.parquet")
        shutil.copy(good, bad)
        CASES[request.param](bad)
    return request.param, out, bad


def _winners(out):
    return {e.engine_name + json.dumps(e.knobs) for f in (out / "overrides").glob("*.json") for e in load_overrides(f).entries}


@pytest.mark.slow
def test_every_reader_skips_and_names_a_broken_part(broken, tuned, capsys):
    case, out, bad = broken
    expected = _winners(tuned / "good")
    shutil.rmtree(out / "overrides")
    assert farm_main(["reduce", str(out / "results"), "--out", str(out / "overrides")]) == 0, case
    err = capsys.readouterr().err
    assert bad.name in err and "Traceback" not in err, (case, err)
    assert _winners(out) == expected, case
    assert farm_main(["report", str(out / "results"), "--json"]) == 0, case
    report = json.loads(capsys.readouterr().out)
    assert any(bad.name in s["path"] for s in report["skipped_files"]), (case, report["skipped_files"])
    assert farm_main(["diff", str(tuned / "good" / "results"), str(out / "results"), "--json"]) == 0, case
    diff = json.loads(capsys.readouterr().out)
    assert diff["counts"]["same winner"] == len(expected) and len(diff["rows"]) == len(expected), (case, diff)
    # resume: the job runs again over its folder, measures nothing new, and finishes
    assert farm_main(["tune", str(tuned / "w.yaml"), "--in-process", "--out", str(out), "--json"]) == 0, case
    assert json.loads(capsys.readouterr().out)["rows_written"] == 0, case
    assert bad.exists()  # skipped, never deleted or rewritten
