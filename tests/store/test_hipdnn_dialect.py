"""farm publish --dialect hipdnn: the file selects under hipDNN's matcher (tests/store/hipdnn_reference.py, ported from
its sources) as the farm's own file selects under farm.ops, for every op both know; farm.ops reads it the same."""

import json

import pytest

from farm.cli import main
from farm.model.ids import engine_name_to_id
from farm.model.problem import Problem
from farm.store.overrides.parsing import load_overrides, parse_overrides
from farm.store.overrides.files import write_overrides
from farm.store.overrides.entries import OverrideEntry
from tests.fakes import fake_props
from tests.store import hipdnn_reference as hipdnn

CONV = {"pad_h": 1, "pad_w": 1}
PROBLEMS = {
    "conv": Problem.create("conv_fprop", {"X": [2, 16, 14, 14], "W": [32, 16, 3, 3]}, criteria=CONV),
    "dgrad": Problem.create("conv_dgrad", {"dY": [2, 32, 14, 14], "W": [32, 16, 3, 3], "dX": [2, 16, 14, 14]},
                            criteria=CONV),
    "wgrad": Problem.create("conv_wgrad", {"X": [2, 16, 14, 14], "dY": [2, 32, 14, 14], "dW": [32, 16, 3, 3]},
                            criteria=CONV),
    "sdpa": Problem.create("sdpa_fwd", {"Q": [1, 8, 128, 64], "K": [1, 2, 128, 64], "V": [1, 2, 128, 64]}),
    "sdpa-bwd": Problem.create("sdpa_bwd", {t: [1, 4, 64, 32] for t in ("Q", "K", "V", "O", "dO")}),
    "gemm": Problem.create("matmul", {"A": [64, 128], "B": [128, 32]}),
    "gemm-bias": Problem.create("matmul", {"A": [64, 256], "B": [256, 32], "bias": [32]}),
    "bn": Problem.create("batchnorm_inference", {"X": [4, 8, 5, 5], **{t: [8] for t in ("scale", "bias", "mean", "var")}}),
    "bn-train": Problem.create("batchnorm_training", {"X": [4, 8, 5, 5], "scale": [8], "bias": [8]}),
    "bn-bwd": Problem.create("batchnorm_backward", {"X": [4, 8, 5, 5], "dY": [4, 8, 5, 5],
                                                    **{t: [8] for t in ("scale", "mean", "inv_variance")}}),
    "ln": Problem.create("layernorm", {"X": [32, 768], "scale": [768], "bias": [768]}),
    "rms": Problem.create("rmsnorm", {"X": [16, 4096], "scale": [4096]}),
    "rms-bwd": Problem.create("rmsnorm_backward", {"X": [16, 512], "dY": [16, 512], "scale": [512], "inv_rms": [16]}),
    "sum": Problem.create("reduction", {"X": [64, 100], "Y": [64, 1]}, criteria={"mode": 0}),
    "max": Problem.create("reduction", {"X": [64, 100], "Y": [64, 1]}, criteria={"mode": 1}),
    "resize": Problem.create("resample", {"X": [1, 3, 16, 16], "Y": [1, 3, 32, 32]}, criteria={"mode": 1}),
    "add": Problem.create("pointwise", {"A": [64, 128], "B": [64, 128]}, criteria={"mode": 0}),
    "relu": Problem.create("pointwise", {"A": [64, 128]}, criteria={"mode": 2}),
}
ENGINES = {name: f"engine.{i}" for i, name in enumerate(PROBLEMS)}


def entry(problem, engine, name, ms=1.0):
    return OverrideEntry.for_problem(problem, engine, (), {"rank": 0, "min_time_ms": ms, "median_time_ms": ms,
                                                            "problem_name": name, "problem_key": problem.key})


def farm_file(folder, entries):
    props = fake_props()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{props.signature}.json"
    write_overrides(path, entries, device={"signature": props.signature, "properties": props.to_dict()}, mode="replace")
    return path


def publish(src, root, *extra):
    assert main(["publish", str(src), "--to", str(root), "--dialect", "hipdnn", *extra]) == 0
    return next(root.glob("*/*.json"))


def test_a_hipdnn_dialect_file_selects_each_problems_winner_under_hipdnns_matcher_and_farm_ops(tmp_path):
    src = farm_file(tmp_path / "run", [entry(p, ENGINES[n], n) for n, p in PROBLEMS.items()])
    published = publish(src.parent, tmp_path / "root")
    text = published.read_text()
    rules = hipdnn.load(text)
    assert rules is not None and len(rules) == len(PROBLEMS)
    theirs, ours = load_overrides(published, strict=False), load_overrides(src, strict=False)
    for name, problem in PROBLEMS.items():
        assert hipdnn.select(rules, *hipdnn.query(problem)) == engine_name_to_id(ENGINES[name]), name
        assert theirs.match(problem).engine_name == ours.match(problem).engine_name == ENGINES[name], name
    # the farm's own spelling selects nothing there: hipDNN's reader looks for x_tensor_uid, not X
    farm_rules = hipdnn.load(src.read_text())
    assert all(hipdnn.select(farm_rules, *hipdnn.query(p)) is None for p in PROBLEMS.values())


def test_the_file_is_written_in_hipdnns_words(tmp_path):
    src = farm_file(tmp_path / "run", [entry(PROBLEMS[n], ENGINES[n], n) for n in ("ln", "add", "resize", "gemm-bias")])
    doc = json.loads(publish(src.parent, tmp_path / "root").read_text())
    assert doc["version"] == 2
    by_op = {e["op"]: e for e in doc["engine_overrides"]}
    assert set(by_op) == {"layernorm", "pointwise", "resample_fwd", "matmul"}
    ln = by_op["layernorm"]
    assert ln["criteria"] == {"norm_fwd_phase": 1}
    assert [t["tensor_id"] for t in ln["tensors"]] == ["x_tensor_uid", "scale_tensor_uid", "bias_tensor_uid",
                                                       "epsilon_tensor_uid"]
    assert by_op["pointwise"]["criteria"] == {"pointwise_mode": 2}  # hipDNN's ADD
    assert by_op["resample_fwd"]["criteria"] == {"resample_mode": 4, "padding_mode": 0}  # BILINEAR
    # no output, no bias: hipDNN's key is exactly the op's inputs (a matmul's A and B)
    assert [t["tensor_id"] for t in by_op["matmul"]["tensors"]] == ["a_tensor_uid", "b_tensor_uid"]
    index = json.loads((tmp_path / "root" / "index.json").read_text())
    assert next(iter(index["files"].values()))["dialect"] == "hipdnn"


def test_entries_hipdnn_cannot_tell_apart_are_said_and_the_dead_one_left_out(tmp_path, capsys):
    conv_pad0 = Problem.create("conv_fprop", {"X": [2, 16, 14, 14], "W": [32, 16, 3, 3]})
    gemm16 = Problem.create("matmul", {"A": [64, 128], "B": [128, 32]}, dtype="fp16")
    src = farm_file(tmp_path / "run", [entry(PROBLEMS["conv"], "engine.a", "conv-pad1"),
                                       entry(conv_pad0, "engine.b", "conv-pad0"),
                                       entry(PROBLEMS["gemm"], "engine.c", "gemm-fp32"),
                                       entry(gemm16, "engine.d", "gemm-fp16")])
    capsys.readouterr()
    assert main(["publish", str(src.parent), "--to", str(tmp_path / "root"), "--dialect", "hipdnn", "--json"]) == 0
    notes = {n["entry"]: n for n in json.loads(capsys.readouterr().out)["files"][0]["dialect_notes"]}
    assert notes["conv-pad0"]["kind"] == "left_out" and "pad_h=0" in notes["conv-pad0"]["why"]
    assert notes["gemm-fp16"]["kind"] == "shadowed" and "gemm-fp32" in notes["gemm-fp16"]["why"]
    published = next((tmp_path / "root").glob("*/*.json"))
    rules = hipdnn.load(published.read_text())
    assert len(rules) == 3
    assert hipdnn.select(rules, *hipdnn.query(conv_pad0)) == engine_name_to_id("engine.a")  # as hipDNN would
    assert hipdnn.select(rules, *hipdnn.query(gemm16)) == engine_name_to_id("engine.c")
    f = load_overrides(published, strict=False)
    assert f.match(gemm16).engine_name == "engine.d"  # farm.ops still tells dtypes apart


def test_an_exact_rule_still_wins_over_a_wildcard_declared_before_it(tmp_path):
    wild = OverrideEntry(op="matmul", engine_name="engine.any", metadata={"rank": 0, "problem_name": "any-gemm"},
                         tensors=(parse_overrides(json.dumps({"version": 2, "engine_overrides": [
                             {"op": "matmul", "engine_name": "x", "tensors": [
                                 {"tensor_id": "A", "dim": [-1, 128]}, {"tensor_id": "B", "dim": [128, -1]}]}]}))
                                  .entries[0].tensors))
    src = farm_file(tmp_path / "run", [wild, entry(PROBLEMS["gemm"], "engine.exact", "gemm")])
    rules = hipdnn.load(publish(src.parent, tmp_path / "root").read_text())
    assert hipdnn.select(rules, *hipdnn.query(PROBLEMS["gemm"])) == engine_name_to_id("engine.exact")
    other = Problem.create("matmul", {"A": [8, 128], "B": [128, 8]})
    assert hipdnn.select(rules, *hipdnn.query(other)) == engine_name_to_id("engine.any")


def test_publishing_again_in_either_spelling_replaces_the_rules_in_place(tmp_path, capsys):
    src = farm_file(tmp_path / "run", [entry(PROBLEMS[n], ENGINES[n], n) for n in ("ln", "conv", "add")])
    root = tmp_path / "root"
    first = publish(src.parent, root).read_text()
    capsys.readouterr()
    assert main(["publish", str(src.parent), "--to", str(root), "--dialect", "hipdnn", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["files"][0]
    assert (report["added"], report["changed"], report["unchanged"]) == ([], [], 3)
    newer = farm_file(tmp_path / "run2", [entry(PROBLEMS["ln"], "engine.new", "ln", ms=0.5)])
    rules = hipdnn.load(publish(newer.parent, root).read_text())
    assert len(rules) == 3 and hipdnn.select(rules, *hipdnn.query(PROBLEMS["ln"])) == engine_name_to_id("engine.new")
    assert len(hipdnn.load(first)) == 3


def test_farm_ops_reads_hipdnns_own_norm_rules_and_refuses_a_training_phase_one(tmp_path):
    """hipDNN's key for a norm names its phase and epsilon; ours are inference norms without an epsilon tensor."""
    ln = PROBLEMS["ln"]

    def rule(phase, engine):
        return {"op": "layernorm", "engine_name": engine, "criteria": {"norm_fwd_phase": phase}, "tensors": [
            {"tensor_id": "x_tensor_uid", "dim": [32, 768], "stride": [768, 1]},
            {"tensor_id": "scale_tensor_uid", "dim": [768]}, {"tensor_id": "bias_tensor_uid", "dim": [768]},
            {"tensor_id": "epsilon_tensor_uid", "dim": [1], "stride": [1]}]}

    training = parse_overrides(json.dumps({"version": 2, "engine_overrides": [rule(2, "engine.train")]}))
    assert training.match(ln) is None
    both = parse_overrides(json.dumps({"version": 2, "engine_overrides": [rule(2, "engine.train"),
                                                                          rule(1, "engine.infer")]}))
    assert both.match(ln).engine_name == "engine.infer"
    # written back as read: the phase and the epsilon stay
    assert both.entries[1].to_json()["criteria"] == {"norm_fwd_phase": 1}
    assert both.entries[1].to_json()["tensors"][-1] == {"tensor_id": "epsilon_tensor_uid", "dim": [1], "stride": [1]}


def test_an_unknown_dialect_is_an_error_naming_it(tmp_path, capsys):
    src = farm_file(tmp_path / "run", [entry(PROBLEMS["gemm"], "engine.a", "gemm")])
    with pytest.raises(SystemExit):
        main(["publish", str(src.parent), "--to", str(tmp_path / "root"), "--dialect", "cudnn"])
    assert "cudnn" in capsys.readouterr().err


def test_the_rfcs_example_conv_rule_matches_nothing_in_either_reader():
    """The autotuning RFC's example names criteria {"pointwise_mode": 1} on a conv rule: no conv query has it."""
    rule = {"op": "conv_fprop", "engine_name": "MIOPEN_ENGINE_DETERMINISTIC", "criteria": {"pointwise_mode": 1},
            "tensors": [{"tensor_id": "X", "dim": [2, 16, 14, 14]}, {"tensor_id": "W", "dim": [32, 16, 3, 3]}]}
    text = json.dumps({"version": 2, "engine_overrides": [rule]})
    conv = PROBLEMS["conv"]
    assert parse_overrides(text).match(conv) is None
    hip = json.loads(text)
    hip["engine_overrides"][0]["tensors"][0]["tensor_id"] = "x_tensor_uid"
    hip["engine_overrides"][0]["tensors"][1]["tensor_id"] = "w_tensor_uid"
    assert hipdnn.select(hipdnn.load(json.dumps(hip)), *hipdnn.query(conv)) is None
    del hip["engine_overrides"][0]["criteria"]  # without it, hipDNN's own conv rule selects
    assert hipdnn.select(hipdnn.load(json.dumps(hip)), *hipdnn.query(conv)) == engine_name_to_id(rule["engine_name"])
    assert parse_overrides(json.dumps(hip)).match(conv).engine_name == rule["engine_name"]


def test_farm_diff_of_a_file_and_its_hipdnn_spelling_pairs_every_rule(tmp_path, capsys):
    names = ("ln", "conv", "gemm-bias", "add")
    src = farm_file(tmp_path / "run", [entry(PROBLEMS[n], ENGINES[n], n) for n in names])
    root = tmp_path / "root"
    publish(src.parent, root)
    capsys.readouterr()
    assert main(["diff", str(src.parent), str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sorted((r["problem"], r["status"]) for r in rows) == sorted((n, "same winner") for n in names)
    newer = farm_file(tmp_path / "run2", [entry(PROBLEMS["ln"], "engine.new", "ln", ms=0.5)])
    publish(newer.parent, root)
    capsys.readouterr()
    assert main(["diff", str(src.parent), str(root), "--json"]) == 0
    rows = {r["problem"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["ln"]["status"] == "winner changed" and rows["ln"]["new_winner"] == "engine.new[default]"
    assert {r["status"] for n, r in rows.items() if n != "ln"} == {"same winner"}


def test_a_farm_spelled_publish_onto_a_hipdnn_spelled_file_replaces_its_rules_in_hipdnns_words(tmp_path, capsys):
    names = ("ln", "gemm-bias")
    src = farm_file(tmp_path / "run", [entry(PROBLEMS[n], ENGINES[n], n) for n in names])
    root = tmp_path / "root"
    publish(src.parent, root)
    newer = farm_file(tmp_path / "run2", [entry(PROBLEMS["gemm-bias"], "engine.new", "gemm-bias", ms=0.5)])
    capsys.readouterr()
    assert main(["publish", str(newer.parent), "--to", str(root), "--json"]) == 0  # the default spelling
    report = json.loads(capsys.readouterr().out)["files"][0]
    assert [c["problem"] for c in report["changed"]] == ["gemm-bias"] and report["added"] == []
    text = next(root.glob("*/*.json")).read_text()
    rules = hipdnn.load(text)
    assert len(rules) == 2  # replaced, not a second rule beside the first
    assert hipdnn.select(rules, *hipdnn.query(PROBLEMS["gemm-bias"])) == engine_name_to_id("engine.new")
    assert load_overrides(next(root.glob("*/*.json")), strict=False).match(PROBLEMS["gemm-bias"]).engine_name \
        == "engine.new"
