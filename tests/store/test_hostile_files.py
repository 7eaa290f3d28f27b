"""Hostile files of every format: not UTF-8, UTF-16, nested too deeply, a 5000-digit integer, a FIFO.

Production (farm.ops) declines such a replay or override file with a warning and answers anyway;
farm reduce moves such an override file aside; farm diff and farm publish give one line naming the
file; a workload or simulation config is a one-line error before any device time. Nothing blocks
(a FIFO is never opened) and nothing is overwritten.
"""

import json
import logging
import os
import signal

import numpy as np
import pytest

import farm.ops as ops
from farm.cli import main as farm_main
from farm.devices.device import cpu_device
from farm.model.problem import Problem
from farm.replay.tunable_runtime import TunableRuntime
from farm.replay.tunable_settings import TunableSettings

PROBLEM = Problem.create("matmul", {"A": [24, 20], "B": [20, 12]}, dtype="fp32")


def _valid_override_json():
    dev = cpu_device()
    return json.dumps({"version": 2, "device": {"signature": dev.signature, "properties": dev.properties.to_dict()},
                       "engine_overrides": [{"op": "matmul", "engine_name": "cpu.matmul.blas",
                                             "tensors": [{"tensor_id": "A", "dim": [24, 20]},
                                                         {"tensor_id": "B", "dim": [20, 12]}]}]})


BAD_JSON = {
    "latin-1": "{\"engine_overrides\": [], \"note\": \"caf\u00e9\"}".encode("latin-1"),
    "utf-16": _valid_override_json().encode("utf-16"),
    "nested too deeply": b"[" * 200_000 + b"]" * 200_000,
    "5000-digit integer": _valid_override_json().replace("[24, 20]", "[24, " + "9" * 5000 + "]").encode(),
    "4000-digit integer": _valid_override_json().replace("[24, 20]", "[24, " + "9" * 4000 + "]").encode(),
}
KINDS = sorted(BAD_JSON) + ["fifo", "folder"]


def _make(path, kind):
    if kind == "fifo":
        os.mkfifo(path)  # opening it to read would block until a writer comes
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(BAD_JSON[kind])
    return path


@pytest.fixture(autouse=True)
def _guard(replay_env):
    def blocked(*_):
        raise AssertionError("blocked for 20 s (a FIFO opened?)")

    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _matmul_answers():
    rng = np.random.default_rng(1)
    a, b = rng.random((24, 20), dtype=np.float32), rng.random((20, 12), dtype=np.float32)
    np.testing.assert_allclose(ops.matmul(a, b), a @ b, rtol=1e-5)
    return ops.choices()[0]


@pytest.mark.parametrize("kind", KINDS)
def test_farm_ops_declines_a_hostile_config_file_and_answers(tmp_path, monkeypatch, caplog, kind):
    path = _make(tmp_path / "ovr.json", kind)
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(path))
    with caplog.at_level(logging.WARNING):
        choice = _matmul_answers()
    assert choice["source"] == "SelectionHeuristic::StaticOrdering"
    assert any(str(path) in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING), caplog.text


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_replay_results_file_is_declined_and_a_regular_one_moved_aside(tmp_path, caplog, kind):
    path = _make(tmp_path / "results0.json", kind)  # the file of device 0
    before = BAD_JSON.get(kind)
    settings = TunableSettings(enabled=True, tuning=False, filename=str(tmp_path / "results.json"))
    rt = TunableRuntime(cpu_device(), settings=settings)
    with caplog.at_level(logging.WARNING, logger="farm.replay.tunable_runtime"):
        bound = rt.bind(PROBLEM.key, PROBLEM)
    assert bound.source != "recorded"
    if kind == "4000-digit integer":  # valid JSON with one unusable rule: that rule is skipped, the file stays
        assert "that rule is skipped" in caplog.text and path.read_bytes() == before
    elif before is not None:  # unreadable: kept for a person to look at, never overwritten
        assert "results file" in caplog.text
        [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("results0.json.corrupt-")]
        assert aside.read_bytes() == before and not path.exists()
    else:
        assert "results file" in caplog.text


@pytest.mark.parametrize("kind", sorted(BAD_JSON))
def test_an_untuned_file_that_is_not_a_workload_is_moved_aside(tmp_path, kind):
    untuned = tmp_path / "untuned0.yaml"
    untuned.write_bytes(BAD_JSON[kind])
    settings = TunableSettings(enabled=True, tuning=False, record_untuned=True, filename=str(tmp_path / "results.json"))
    TunableRuntime(cpu_device(), settings=settings).bind(PROBLEM.key, PROBLEM)
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("untuned0.yaml.corrupt-")]
    assert aside.read_bytes() == BAD_JSON[kind]
    assert PROBLEM.key in untuned.read_text()


@pytest.mark.parametrize("text", ["[1, 2, 3]\n", "problems: {a: 1}\n", "name: x\n", "problems: [1, 2]\n"])
def test_an_untuned_file_of_the_wrong_shape_is_moved_aside_not_overwritten(tmp_path, text):
    untuned = tmp_path / "untuned0.yaml"
    untuned.write_text(text)
    settings = TunableSettings(enabled=True, tuning=False, record_untuned=True, filename=str(tmp_path / "results.json"))
    TunableRuntime(cpu_device(), settings=settings).bind(PROBLEM.key, PROBLEM)
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("untuned0.yaml.corrupt-")]
    assert aside.read_text() == text and PROBLEM.key in untuned.read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_diff_and_publish_give_one_line_naming_the_file(tmp_path, capsys, kind):
    good = tmp_path / "good.json"
    good.write_text(_valid_override_json())
    bad = _make(tmp_path / "bad.json", kind)
    assert farm_main(["diff", str(good), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.json" in err, err
    folder = tmp_path / "to-publish"
    folder.mkdir()
    _make(folder / f"{cpu_device().signature}.json", kind)
    assert farm_main(["publish", str(folder), "--to", str(tmp_path / "root")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{cpu_device().signature}.json" in err, err
    assert not (tmp_path / "root" / "index.json").exists()


@pytest.mark.parametrize("kind", sorted(BAD_JSON))
def test_reduce_moves_a_hostile_override_file_aside(tmp_path, capsys, kind):
    wl = tmp_path / "w.yaml"
    wl.write_text("name: h\nautotune: {strategy: single_shot}\nengines: {include: [cpu.matmul.blas]}\n"
                  "problems: [{name: mm, op: matmul, tensors: {A: [24, 20], B: [20, 12]}, dtype: fp32}]\n")
    assert farm_main(["tune", str(wl), "--in-process", "--out", str(tmp_path / "job"), "--no-reduce"]) == 0
    target = tmp_path / "job" / "overrides" / f"{cpu_device().signature}.json"
    target.parent.mkdir(parents=True)
    target.write_bytes(BAD_JSON[kind])
    capsys.readouterr()
    rc = farm_main(["reduce", str(tmp_path / "job" / "results"), "--out", str(target.parent)])
    if kind == "4000-digit integer":  # valid JSON, a rule readers skip (it can match nothing): written beside it
        assert rc == 0 and not [p for p in target.parent.iterdir() if ".corrupt-" in p.name or ".unreadable-" in p.name]
        rules = json.loads(target.read_text())["engine_overrides"]
        assert rules[0] == json.loads(BAD_JSON[kind])["engine_overrides"][0]  # kept as written
        assert [r["engine_name"] for r in rules[1:]] == ["cpu.matmul.blas"]
        return
    assert rc == 0
    [aside] = [p for p in target.parent.iterdir() if ".corrupt-" in p.name]
    assert aside.read_bytes() == BAD_JSON[kind]
    assert json.loads(target.read_text())["engine_overrides"][0]["engine_name"] == "cpu.matmul.blas"


WORKLOADS = {
    "latin-1": "name: caf\u00e9\nproblems: []\n".encode("latin-1"),
    "utf-16": "name: w\nproblems: []\n".encode("utf-16"),
    "alias bomb": ("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                   + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                             for p, c in zip("abcdefgh", "bcdefghi"))
                   + "name: w\ndescription: *i\nproblems: []\n").encode(),
    "nested too deeply": b"name: w\nproblems: " + b"[" * 50_000 + b"]" * 50_000 + b"\n",
    "nested 100 levels": b"name: w\nproblems: " + b"[" * 100 + b"]" * 100 + b"\n",
}


@pytest.mark.parametrize("kind", sorted(WORKLOADS) + ["fifo", "folder"])
def test_a_hostile_workload_is_a_one_line_error(tmp_path, capsys, kind):
    path = tmp_path / "w.yaml"
    if kind in WORKLOADS:
        path.write_bytes(WORKLOADS[kind])
    else:
        _make(path, kind)
    assert farm_main(["tune", str(path), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "w.yaml" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text,field", [
    ("devices: [{name: A, compute_units: lots}]\n", "compute_units"),
    ("devices: {name: A}\n", "devices"),
    ("devices: [{name: A, speed: .inf}]\n", "speed"),
    ("faults: [{kind: crash, engine: sim.gemm, knobs: [1, 2]}]\n", "faults[0]"),
    ("noise: true\n", "noise"),
])
def test_a_malformed_sim_file_is_a_one_line_error(tmp_path, capsys, text, field):
    (tmp_path / "sim.yaml").write_text(text)
    assert farm_main(["tune", "examples/cpu-quick.yaml", "--devices", f"sim:{tmp_path / 'sim.yaml'}", "--dry-run",
                      "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and "sim.yaml" in err, err


@pytest.mark.parametrize("kind", ["folder", "fifo", "utf-16"])
def test_devices_sim_of_something_that_is_not_a_sim_file(tmp_path, capsys, kind):
    path = _make(tmp_path / "sim.yaml", kind) if kind != "utf-16" else tmp_path / "sim.yaml"
    if kind == "utf-16":
        path.write_bytes("devices: []\n".encode("utf-16"))
    assert farm_main(["tune", "examples/cpu-quick.yaml", "--devices", f"sim:{path}", "--dry-run",
                      "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sim.yaml" in err, err


def test_an_append_beside_a_rule_readers_skip_keeps_it_and_says_what_is_true(tmp_path, caplog):
    """A rule with a negative dim can match nothing: farm.ops and hipDNN's reader skip it and read the rest, so an
    append writes beside it (the rule kept as written) instead of refusing the file as unreadable (issue 64)."""
    from farm.store.overrides.parsing import load_overrides
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    cpu = cpu_device()
    dev = {"signature": cpu.signature, "properties": cpu.properties.to_dict()}
    path = tmp_path / "o.json"
    write_overrides(path, [OverrideEntry.for_problem(Problem.create("matmul", {"A": [4, 4], "B": [4, 4]}),
                                                     "cpu.matmul.blas")], device=dev, mode="replace")
    doc = json.loads(path.read_text())
    bad = json.loads(json.dumps(doc["engine_overrides"][0]))
    bad["tensors"][0]["dim"] = [-5, 4]
    doc["engine_overrides"].append(bad)
    path.write_text(json.dumps(doc))
    assert len(load_overrides(path, strict=False).entries) == 1  # what production reads: the rest
    with caplog.at_level(logging.WARNING):
        report = write_overrides(path, [OverrideEntry.for_problem(
            Problem.create("matmul", {"A": [8, 8], "B": [8, 8]}), "cpu.matmul.einsum")], device=dev)
    assert report.added == 1 and not report.moved_aside
    written = json.loads(path.read_text())["engine_overrides"]
    assert len(written) == 3 and written[1] == bad  # the skipped rule as it was
    assert len(load_overrides(path, strict=False).entries) == 2  # the winner written now is read
    assert "can match nothing" in caplog.text and "skip it and read the others" in caplog.text
