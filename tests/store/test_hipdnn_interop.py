"""A hipDNN file means the same here as in hipDNN (issue 45): its mode criteria are hipDNN's enum integers, a rule
its reader cannot read invalidates the file, the knobs it records are information, and its writer's appends are
ours. The files are laid out as hipDNN's AutotuneFileWriter writes them (nlohmann's dump(2): keys sorted, two
spaces), with the fields it writes (hipdnn_frontend/autotune/AutotuneFileWriter.hpp in ROCm/rocm-libraries)."""

import json
import logging
import os

import pytest

from farm.devices.device import cpu_device
from farm.devices.fb import encode_device_properties, encode_problem
from farm.errors import InputError
from farm.model.ids import engine_name_to_id
from farm.model.problem import Problem
from farm.replay.tunable_runtime import TunableRuntime
from farm.replay.tunable_settings import TunableSettings
from farm.store.overrides.hipdnn_names import POINTWISE_MODES, REDUCTION_MODES, RESAMPLE_MODES
from farm.store.overrides.parsing import load_overrides, parse_overrides
from farm.store.overrides.files import merge_entries, render, write_overrides
from farm.store.overrides.entries import OverrideEntry
from policies.config import ConfigPolicy

MIOPEN = engine_name_to_id("MIOPEN_ENGINE")
BLAS = engine_name_to_id("cpu.matmul.blas")
EINSUM = engine_name_to_id("cpu.matmul.einsum")


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in ("FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER",
                 "HIPDNN_HEUR_POLICY_ORDER", "FARM_HEUR_CONFIG_INVALID_RULE"):
        monkeypatch.delenv(name, raising=False)


def hipdnn_metadata(**extra):
    """autotune_metadata as hipDNN's buildOverrideEntry writes it."""
    meta = {"min_time_ms": 0.041, "avg_time_ms": 0.043, "stddev_ms": 0.001, "iterations_run": 37, "mode": "exhaustive",
            "strategy": "run_until_stable", "rank": 0, "workspace_size": 16777216, "timestamp": "2026-04-21T10:30:00Z",
            "supports_exhaustive": True, "ran_exhaustive": True, "exhaustive_not_run_reason": "", "converged": True}
    meta.update(extra)
    return meta


def hipdnn_text(entries, version=2):
    """The file as nlohmann::json::dump(2) writes it: keys sorted, two-space indent."""
    doc = {"engine_overrides": entries}
    if version is not None:
        doc["version"] = version
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def tensor(tid, dim, stride=None):
    out = {"dim": dim, "tensor_id": tid}
    if stride is not None:
        out["stride"] = stride
    return out


def session():
    return ConfigPolicy().session(encode_device_properties(cpu_device().properties))


def ask(problem, candidates=(BLAS, EINSUM, MIOPEN)):
    return session().order(candidates, encode_problem(problem))


def use(tmp_path, monkeypatch, text):
    path = tmp_path / "hipdnn_autotune.json"
    path.write_text(text)
    monkeypatch.setenv("HIPDNN_HEUR_CONFIG_PATH", str(path))
    return path


# -- criteria values are hipDNN's enums --------------------------------------------------------------------
def pointwise(mode):
    return Problem.create("pointwise", {"A": [64, 128], "B": [64, 128]}, criteria={"mode": mode})


def reduction(mode):
    return Problem.create("reduction", {"X": [64, 128], "Y": [64, 1]}, criteria={"mode": mode})


def resample(mode):
    return Problem.create("resample", {"X": [1, 8, 16, 16], "Y": [1, 8, 32, 32]}, criteria={"mode": mode})


POINTWISE_RULE = {"op": "pointwise", "tensors": [tensor("in_0_tensor_uid", [64, 128]), tensor("in_1_tensor_uid", [64, 128])]}
REDUCTION_RULE = {"op": "reduction", "tensors": [tensor("in_tensor_uid", [64, 128])]}
RESAMPLE_RULE = {"op": "resample_fwd", "tensors": [tensor("x_tensor_uid", [1, 8, 16, 16])]}

# (rule, hipDNN's criterion, hipDNN's value and name, our mode, our problems of that op by mode)
MODES = [
    (POINTWISE_RULE, "pointwise_mode", 2, "ADD", 0, pointwise, 4),
    (POINTWISE_RULE, "pointwise_mode", 30, "MUL", 1, pointwise, 4),
    (POINTWISE_RULE, "pointwise_mode", 34, "RELU_FWD", 2, pointwise, 4),
    (POINTWISE_RULE, "pointwise_mode", 21, "GELU_FWD", 3, pointwise, 4),
    (REDUCTION_RULE, "reduction_mode", 1, "ADD", 0, reduction, 2),
    (REDUCTION_RULE, "reduction_mode", 4, "MAX", 1, reduction, 2),
    (RESAMPLE_RULE, "resample_mode", 5, "NEAREST", 0, resample, 2),
    (RESAMPLE_RULE, "resample_mode", 4, "BILINEAR", 1, resample, 2),
]


@pytest.mark.parametrize("rule, name, theirs, label, ours, make, count", MODES,
                         ids=[f"{m[1]}={m[2]}({m[3]})" for m in MODES])
def test_a_hipdnn_mode_selects_the_problem_of_that_mode_and_no_other(tmp_path, monkeypatch, rule, name, theirs, label,
                                                                     ours, make, count):
    table = {"pointwise_mode": POINTWISE_MODES, "reduction_mode": REDUCTION_MODES, "resample_mode": RESAMPLE_MODES}
    assert table[name][theirs] == label  # the table is hipDNN's
    use(tmp_path, monkeypatch, hipdnn_text([{**rule, "criteria": {name: theirs}, "engine_name": "MIOPEN_ENGINE",
                                             "autotune_metadata": hipdnn_metadata()}]))
    for mode in range(count):
        choice = ask(make(mode))
        if mode == ours:
            assert choice is not None and choice.order[0] == MIOPEN, (label, mode)
        else:  # hipDNN's ADD (2) is not our relu (2): the same integer means another mode here
            assert choice is None, (label, mode)


@pytest.mark.parametrize("rule, name, theirs, label", [
    (POINTWISE_RULE, "pointwise_mode", 42, "SUB"), (POINTWISE_RULE, "pointwise_mode", 0, "NOT_SET"),
    (REDUCTION_RULE, "reduction_mode", 5, "AMAX"), (RESAMPLE_RULE, "resample_mode", 1, "MAXPOOL"),
])
def test_a_hipdnn_mode_no_op_here_runs_matches_nothing_and_is_written_back(rule, name, theirs, label):
    text = hipdnn_text([{**rule, "criteria": {name: theirs}, "engine_name": "MIOPEN_ENGINE"}])
    f = parse_overrides(text)
    make = {"pointwise_mode": pointwise, "reduction_mode": reduction, "resample_mode": resample}[name]
    for mode in range(4 if name == "pointwise_mode" else 2):
        assert f.match(make(mode)) is None
        assert label in " ".join(f.entries[0].differences(make(mode)))
    assert json.loads(render(f))["engine_overrides"][0]["criteria"] == {name: theirs}


def test_modes_are_written_back_as_hipdnns_integers_and_a_replaced_rule_keeps_its_spelling():
    p = pointwise(1)  # our mul
    full = {"op": "pointwise", "engine_name": "MIOPEN_ENGINE", "criteria": {"pointwise_mode": 30},  # hipDNN's MUL
            "compute_data_type": "FLOAT",
            "tensors": [{**tensor(f"{n}_tensor_uid", [64, 128], [128, 1]), "data_type": "FLOAT"}
                        for n in ("in_0", "in_1", "out_0")]}
    [old] = parse_overrides(hipdnn_text([full])).entries
    assert old.matches(p)
    ours = OverrideEntry.for_problem(p, "cpu.pointwise", ())
    merged, replaced, added = merge_entries([old], [ours])
    assert (replaced, added) == (1, 0)
    again = merged[0].to_json()
    assert again["op"] == "pointwise" and again["criteria"] == {"pointwise_mode": 30}
    assert [t["tensor_id"] for t in again["tensors"]] == ["in_0_tensor_uid", "in_1_tensor_uid", "out_0_tensor_uid"]
    assert again["engine_name"] == "cpu.pointwise"


# -- a rule hipDNN cannot read invalidates the whole file ------------------------------------------------
GOOD = {"op": "matmul", "engine_name": "cpu.matmul.einsum", "autotune_metadata": hipdnn_metadata(),
        "tensors": [tensor("a_tensor_uid", [48, 40]), tensor("b_tensor_uid", [40, 24])]}


def mm():
    return Problem.create("matmul", {"A": [48, 40], "B": [40, 24]})


@pytest.mark.parametrize("bad, field", [
    ({"op": "matmul", "engine_name": "cpu.matmul.blas", "tensors": [{"stride": [40, 1], "tensor_id": "A"},
                                                                    tensor("B", [40, 24])]}, "tensors[0].dim"),
    ({"op": "matmul", "engine_name": "cpu.matmul.blas", "tensors": [{"dim": [48, 40]}, tensor("B", [40, 24])]},
     "tensors[0].tensor_id"),
    ({"op": "matmul", "engine_name": "cpu.matmul.blas", "tensors": [tensor("A", [48, 40]), tensor("A", [40, 24])]},
     "tensors"),
], ids=["no dim", "v2 tensor without tensor_id", "two tensors with one id"])
def test_a_structurally_invalid_rule_invalidates_the_file_as_in_hipdnn(tmp_path, monkeypatch, caplog, bad, field):
    path = use(tmp_path, monkeypatch, hipdnn_text([GOOD, bad]))  # the bad rule after a good one
    s = session()
    with caplog.at_level(logging.WARNING):
        for problem in (mm(), mm(), Problem.create("matmul", {"A": [48, 40], "B": [40, 7]})):
            assert s.order((BLAS, EINSUM), encode_problem(problem)) is None  # every query declined
    lines = [r.getMessage() for r in caplog.records if "the whole file is invalid" in r.getMessage()]
    assert len(lines) == 1 and str(path) in lines[0] and "rule 1" in lines[0] and field in lines[0], caplog.text
    assert session().status()["detail"].startswith("invalid at engine_overrides[1]." + field)
    # strict tools still refuse it with the path; the setting restores skipping the rule alone
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_overrides(path)
    monkeypatch.setenv("FARM_HEUR_CONFIG_INVALID_RULE", "skip")
    assert ask(mm()).order[0] == EINSUM


def test_a_rule_hipdnn_reads_but_cannot_match_leaves_the_others_selecting(tmp_path, monkeypatch):
    never = {"op": "matmul", "engine_name": "cpu.matmul.blas", "tensors": [tensor("A", [48, -2]), tensor("B", [40, 24])]}
    use(tmp_path, monkeypatch, hipdnn_text([never, GOOD]))
    assert ask(mm()).order[0] == EINSUM


# -- knobs hipDNN records are information -------------------------------------------------------------------
KNOBS = [{"knob_id": "SPLIT_K", "type": "int", "value": 2},
         {"knob_id": "global.workspace_size_limit", "type": "int", "value": 67108864},
         {"knob_id": "order", "type": "string", "value": "transposed"}]


def test_unknown_knobs_are_ignored_with_one_warning_per_file_and_the_known_ones_applied(tmp_path, monkeypatch, caplog):
    rules = [{"op": "matmul", "engine_name": "cpu.matmul.blas", "autotune_metadata": hipdnn_metadata(knobs=KNOBS),
              "tensors": [tensor("a_tensor_uid", [m, 40]), tensor("b_tensor_uid", [40, 24])]} for m in (48, 96)]
    use(tmp_path, monkeypatch, hipdnn_text(rules))
    s = session()
    with caplog.at_level(logging.WARNING):
        for m in (48, 96):
            choice = s.order((EINSUM, BLAS), encode_problem(Problem.create("matmul", {"A": [m, 40], "B": [40, 24]})))
            assert choice.order[0] == BLAS and dict(choice.knobs[BLAS]) == {"order": "transposed"}
    warned = [r for r in caplog.records if "SPLIT_K" in r.getMessage()]
    assert len(warned) == 1 and "global.workspace_size_limit" in warned[0].getMessage()


def test_the_replay_runtime_applies_the_known_knobs_of_a_hipdnn_file(tmp_path, caplog):
    path = tmp_path / "results0.json"
    path.write_text(hipdnn_text([{"op": "matmul", "engine_name": "cpu.matmul.blas",
                                  "autotune_metadata": hipdnn_metadata(knobs=KNOBS),
                                  "tensors": [tensor("A", [48, 40]), tensor("B", [40, 24])]}]))
    rt = TunableRuntime(cpu_device(), settings=TunableSettings(enabled=True, tuning=False,
                                                               filename=str(tmp_path / "results.json")))
    with caplog.at_level(logging.WARNING):
        bound = rt.bind(mm().key, mm())
    assert (bound.source, bound.engine_name, dict(bound.knobs)) == ("recorded", "cpu.matmul.blas", {"order": "transposed"})
    assert "SPLIT_K" in caplog.text


# -- the writer appends where hipDNN's writer appends -------------------------------------------------------------
def ours():
    from farm.store.overrides.files import autotune_metadata

    meta = autotune_metadata(rank=0, min_ms=0.5, avg_ms=0.5, stddev_ms=0.0, workspace=0, mode="standard",
                             ran_exhaustive=False, strategy="fixed_average", iterations=3, converged=False,
                             device="x86_64", timestamp="2026-12-02T00:00:00Z")
    return OverrideEntry.for_problem(mm(), "cpu.matmul.blas", (), meta)


UNREADABLE = [
    {"engine_name": "MIOPEN_ENGINE", "tensors": [tensor("x_tensor_uid", [1, 3, 224, 224])]},  # no op
    {"engine_name": "MIOPEN_ENGINE", "op": "conv_fprop"},  # no tensors
    {"engine_name": "MIOPEN_ENGINE", "op": "conv_fprop",  # a v1-style tensor without tensor_id
     "tensors": [{"dim": [1, 3, 224, 224]}, {"dim": [64, 3, 7, 7]}], "autotune_metadata": hipdnn_metadata()},
]


def test_a_file_with_entries_no_reader_can_read_is_refused_or_they_are_set_aside(tmp_path, caplog):
    """hipDNN's writer keeps such entries and its reader then refuses the whole file, the winners just written
    included: our writer refuses (nothing written, the entry named, what to do said), or with set_aside leaves them
    out, the file as it was copied beside byte for byte."""
    from farm.store.overrides.parsing import load_overrides

    path = tmp_path / "hipdnn_autotune.json"
    text = hipdnn_text(UNREADABLE + [GOOD])
    path.write_text(text)
    with pytest.raises(InputError) as err:
        write_overrides(path, [ours()], device=None)
    assert path.read_text() == text and [p for p in os.listdir(tmp_path) if not p.startswith(".")] == [path.name]
    msg = str(err.value)
    assert "engine_overrides[0] (and 2 more) cannot be read" in msg and "--set-aside-unreadable" in msg
    assert "Nothing written" in msg
    report = write_overrides(path, [ours()], device=None, unreadable="set_aside")
    rules = json.loads(path.read_text())["engine_overrides"]
    assert rules[0] == GOOD and rules[1]["engine_name"] == "cpu.matmul.blas" and len(rules) == 2
    assert (report.set_aside, report.added, report.entries) == (3, 1, 2)
    [copy] = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert copy.read_text() == text and report.moved_aside == str(copy)  # byte for byte
    assert not load_overrides(path, strict=False).invalid  # production reads every entry now


def test_a_version_2_file_without_a_list_gets_one(tmp_path):
    path = tmp_path / "o.json"
    path.write_text('{"version": 2, "comment": "hand-made"}')
    write_overrides(path, [ours()], device=None)
    doc = json.loads(path.read_text())
    assert doc["comment"] == "hand-made" and len(doc["engine_overrides"]) == 1
    path.write_text('{"version": 2, "engine_overrides": {"op": "matmul"}}')  # hipDNN replaces it: a copy is kept
    write_overrides(path, [ours()], device=None)
    [copy] = [p for p in tmp_path.iterdir() if ".replaced-" in p.name]
    assert json.loads(copy.read_text())["engine_overrides"] == {"op": "matmul"}
    assert len(json.loads(path.read_text())["engine_overrides"]) == 1


@pytest.mark.parametrize("text, why", [
    (hipdnn_text([GOOD], version=None), "version 1"),  # hipDNN: "refusing to update legacy autotune config file"
    (hipdnn_text([GOOD], version=3), "version 3"),  # "refusing to update non-current autotune config file"
    (hipdnn_text([GOOD], version="2"), "not an integer"),  # "existing config version is not an integer"
    ("[1, 2]", "not an override document"),  # "existing config file is not a versioned object"
])
def test_the_writer_refuses_what_hipdnns_writer_refuses(tmp_path, text, why):
    path = tmp_path / "o.json"
    path.write_text(text)
    with pytest.raises(InputError, match=why):
        write_overrides(path, [ours()], device=None)
    assert path.read_text() == text and [p for p in os.listdir(tmp_path) if not p.startswith(".")] == ["o.json"]


# -- ops the RFC lists, read and written by name ----------------------------------------------------------
def test_batchnorm_training_batchnorm_backward_and_rmsnorm_backward_are_ops_by_name(tmp_path):
    problems = [
        Problem.create("batchnorm_training", {"X": [16, 64, 56, 56], "scale": [64], "bias": [64]}, dtype="fp16"),
        Problem.create("batchnorm_backward", {"dY": [16, 64, 8, 8], "X": [16, 64, 8, 8], "scale": [64], "mean": [64],
                                              "inv_variance": [64]}),
        Problem.create("rmsnorm_backward", {"dY": [4, 64], "X": [4, 64], "scale": [64], "inv_rms": [4]}),
    ]
    rules = [{"op": "batchnorm_training", "engine_name": "MIOPEN_ENGINE",
              "tensors": [tensor("x_tensor_uid", [16, 64, 56, 56]), tensor("scale_tensor_uid", [64]),
                          tensor("bias_tensor_uid", [64])]},
             {"op": "batchnorm_backward", "engine_name": "MIOPEN_ENGINE",
              "tensors": [tensor(f"{n}_tensor_uid", d) for n, d in (("dy", [16, 64, 8, 8]), ("x", [16, 64, 8, 8]),
                                                                     ("scale", [64]), ("mean", [64]),
                                                                     ("inv_variance", [64]))]},
             {"op": "rmsnorm_backward", "engine_name": "MIOPEN_ENGINE",
              "tensors": [tensor(f"{n}_tensor_uid", d) for n, d in (("dy", [4, 64]), ("x", [4, 64]), ("scale", [64]),
                                                                     ("inv_rms", [4]))]}]
    f = parse_overrides(hipdnn_text(rules))
    assert [f.match(p).op for p in problems] == ["batchnorm_training", "batchnorm_backward", "rmsnorm_backward"]
    assert json.loads(render(f))["engine_overrides"] == [dict(r, criteria={}, tensors=[{**t, "stride": []}
                                                                                      for t in r["tensors"]])
                                                         for r in rules]
    path = tmp_path / "o.json"
    write_overrides(path, [OverrideEntry.for_problem(p, "MIOPEN_ENGINE") for p in problems], device=None)
    back = load_overrides(path)
    assert [e.op for e in back.entries] == [p.op for p in problems] and all(back.match(p) for p in problems)
