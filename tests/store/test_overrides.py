"""Override files: the RFC §10.2 config-file tests and §17 matching rules."""

import json
import multiprocessing
import os

import pytest

from farm.errors import InputError
from farm.store.overrides.entries import OverrideEntry, TensorRule
from farm.store.overrides.files import render, autotune_metadata, write_overrides
from farm.store.overrides.parsing import load_overrides, parse_overrides
from farm.model.problem import Problem

DEVICE = {"signature": "nvidia-h200-sm90-132cu-abc", "properties": {"arch": "sm_90"}}


def meta(strategy="run_until_stable", **kw):
    return autotune_metadata(rank=0, min_ms=0.5, avg_ms=0.6, stddev_ms=0.01, workspace=1024, mode="exhaustive",
                             ran_exhaustive=True, strategy=strategy, iterations=12, converged=True, device="sm_90",
                             timestamp="2026-11-30T00:00:00Z", **kw)


def mm(m=64, n=32, k=16, dtype="fp32", **kw):
    return Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype=dtype, **kw)


def conv(**crit):
    return Problem.create("conv_fprop", {"X": [1, 4, 8, 8], "W": [6, 4, 3, 3]}, criteria=crit)


# -- writer: serialization and entry construction ------------------------------------------------
def test_knob_serialization_per_type(tmp_path):
    e = OverrideEntry.for_problem(mm(), "triton.gemm", (("BLOCK_M", 128), ("alpha", 0.5), ("layout", "nt")), meta())
    path = tmp_path / "o.json"
    write_overrides(path, [e], device=DEVICE)
    raw = json.loads(path.read_text())["engine_overrides"][0]
    assert "knobs" not in raw  # the RFC's place is the metadata: nothing hipDNN does not know beside it
    assert raw["autotune_metadata"]["knobs"] == [{"knob_id": "BLOCK_M", "type": "int", "value": 128},
                                                 {"knob_id": "alpha", "type": "double", "value": 0.5},
                                                 {"knob_id": "layout", "type": "string", "value": "nt"}]
    back = load_overrides(path).entries[0]
    assert back.knobs == (("BLOCK_M", 128), ("alpha", 0.5), ("layout", "nt"))
    assert isinstance(dict(back.knobs)["alpha"], float)


def test_entry_construction_conditional_fields(tmp_path):
    rus = OverrideEntry.for_problem(mm(), "e", (), meta("run_until_stable")).to_json()
    fixed = OverrideEntry.for_problem(mm(32), "e", (), meta("fixed_average")).to_json()
    assert "knobs" not in rus and "knobs" not in rus["autotune_metadata"]  # default-knob winner
    assert rus["autotune_metadata"]["converged"] is True
    assert "converged" not in fixed["autotune_metadata"]
    for m in (rus["autotune_metadata"], fixed["autotune_metadata"]):
        assert m["ran_exhaustive"] is True  # always present
        for key in ("rank", "min_time_ms", "avg_time_ms", "stddev_ms", "workspace_size", "mode", "strategy",
                    "iterations_run", "device", "timestamp"):
            assert key in m
    assert rus["tensors"][0] == {"tensor_id": "A", "dim": [64, 16], "stride": [16, 1], "data_type": "fp32"}
    assert rus["criteria"] == {} and rus["compute_data_type"] == "fp32"
    # a tensor rule with empty strides serialises as [] and matches any layout
    any_layout = OverrideEntry("matmul", "e", (TensorRule("A", (64, 16)), TensorRule("B", (16, 32)),
                                               TensorRule("C", (64, 32)))).to_json()
    assert any_layout["tensors"][0]["stride"] == []


# -- writer: modes -------------------------------------------------------------------------------
def test_three_write_modes(tmp_path):
    path = tmp_path / "o.json"
    a, b, c = (OverrideEntry.for_problem(mm(m), "e1", (), meta()) for m in (8, 16, 32))
    r = write_overrides(path, [a, b], device=DEVICE, mode="new")
    assert (r.added, r.replaced, r.entries) == (2, 0, 2)
    with pytest.raises(InputError, match="mode 'new'"):
        write_overrides(path, [c], device=DEVICE, mode="new")
    b2 = OverrideEntry.for_problem(mm(16), "e2", (("tile", 64),), meta())
    r = write_overrides(path, [b2, c], device=DEVICE, mode="append")
    assert (r.added, r.replaced, r.entries) == (1, 1, 3)
    f = load_overrides(path)
    assert [e.engine_name for e in f.entries] == ["e1", "e2", "e1"]  # replaced in place, new appended
    assert f.match(mm(16)).knobs == (("tile", 64),)
    r = write_overrides(path, [c], device=DEVICE, mode="replace")
    assert r.entries == 1 and load_overrides(path).match(mm(8)) is None
    with pytest.raises(InputError, match="write mode"):
        write_overrides(path, [c], device=DEVICE, mode="merge")


def test_replace_key_ignores_tensor_order(tmp_path):
    path = tmp_path / "o.json"
    e = OverrideEntry.for_problem(mm(), "old", (), meta())
    shuffled = OverrideEntry(e.op, "new", tuple(reversed(e.tensors)), e.criteria, (), e.compute_data_type, meta())
    write_overrides(path, [e], device=DEVICE)
    r = write_overrides(path, [shuffled], device=DEVICE)
    assert (r.replaced, r.entries) == (1, 1)
    assert load_overrides(path).match(mm()).engine_name == "new"


def test_round_trip_write_load_match_knobs(tmp_path):
    path = tmp_path / "o.json"
    problems = [mm(), mm(dtype="fp16"), conv(pad_h=1), conv()]
    entries = [OverrideEntry.for_problem(p, f"eng{i}", (("k", i),), meta()) for i, p in enumerate(problems)]
    write_overrides(path, entries, device=DEVICE)
    f = load_overrides(path)
    assert f.device_signature == DEVICE["signature"] and f.is_autotune_file and f.version == 2
    for i, p in enumerate(problems):
        hit = f.match(p)
        assert hit is not None and hit.engine_name == f"eng{i}" and hit.knobs == (("k", i),)
    assert f.match(mm(65)) is None
    assert f.match(mm(compute_dtype="tf32")) is None  # same shape, other compute type


def test_corrupt_file_is_moved_aside_never_over_an_earlier_one(tmp_path):
    path = tmp_path / "o.json"
    path.write_text("{ not json")
    e = OverrideEntry.for_problem(mm(), "e", (), meta())
    r1 = write_overrides(path, [e], device=DEVICE)
    assert r1.moved_aside and os.path.basename(r1.moved_aside).startswith("o.json.corrupt-")
    assert open(r1.moved_aside).read() == "{ not json"
    assert load_overrides(path).match(mm()).engine_name == "e"
    path.write_text("\xff not json either")
    r2 = write_overrides(path, [e], device=DEVICE)
    assert r2.moved_aside != r1.moved_aside and os.path.exists(r1.moved_aside) and os.path.exists(r2.moved_aside)


def test_valid_json_that_is_no_override_document_is_refused_and_left_alone(tmp_path):
    """Only a file that is not JSON is corrupt; someone's JSON of another shape is theirs: refused, untouched
    (hipDNN's writer refuses these too: not an object, no version)."""
    path = tmp_path / "o.json"
    for text, why in (("[1, 2, 3]", "not an override document"), ('{"results": []}', "version 1")):
        path.write_text(text)
        with pytest.raises(InputError, match=why):
            write_overrides(path, [OverrideEntry.for_problem(mm(), "e", (), meta())], device=DEVICE)
        assert path.read_text() == text
    assert not [p for p in os.listdir(tmp_path) if "corrupt" in p]


@pytest.mark.parametrize("content, fragment", [
    ({"engine_overrides": [{"op": "matmul", "engine_name": "x", "tensors": [{"dim": [1]}]}]}, "version 1"),
    ({"version": 3, "engine_overrides": []}, "version 3"),
    ({"version": 2, "device": {"signature": "other-device"}, "engine_overrides": []}, "file for device other-device"),
])
def test_append_refusals_write_nothing(tmp_path, content, fragment):
    path = tmp_path / "o.json"
    text = json.dumps(content)
    path.write_text(text)
    with pytest.raises(InputError, match=fragment):
        write_overrides(path, [OverrideEntry.for_problem(mm(), "e", (), meta())], device=DEVICE)
    assert path.read_text() == text
    assert not [p for p in os.listdir(tmp_path) if "corrupt" in p]


def _append_many(path, start, count):
    for i in range(start, start + count):
        write_overrides(path, [OverrideEntry.for_problem(mm(i + 1), f"e{i}", (), meta())], device=DEVICE)


def test_concurrent_appenders_lose_no_entry(tmp_path):
    path = str(tmp_path / "o.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, s, 40)) for s in (0, 40)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    f = load_overrides(path)
    assert len(f.entries) == 80
    assert {e.engine_name for e in f.entries} == {f"e{i}" for i in range(80)}


# -- reader ---------------------------------------------------------------------------------
def test_v1_positional_files_and_unknown_fields(tmp_path):
    text = json.dumps({
        "comment": "hand-written",
        "engine_overrides": [{"op": "matmul", "engine_name": "legacy", "note": "x",
                              "tensors": [{"dim": [64, 16]}, {"dim": [16, 32]}, {"dim": [64, 32]}]}]})
    f = parse_overrides(text)
    assert f.version == 1 and f.entries[0].positional
    assert f.match(mm()).engine_name == "legacy"
    assert f.match(mm(64, 32, 17)) is None
    assert f.entries[0].to_json()["note"] == "x" and f.to_json()["comment"] == "hand-written"


def test_missing_or_empty_knobs_are_default(tmp_path):
    doc = {"version": 2, "engine_overrides": [
        {"op": "matmul", "engine_name": "a", "tensors": [{"tensor_id": "A", "dim": [1, 1]}], "knobs": []},
        {"op": "matmul", "engine_name": "b", "tensors": [{"tensor_id": "A", "dim": [1, 1]}]}]}
    assert [e.knobs for e in parse_overrides(json.dumps(doc)).entries] == [(), ()]


def test_knob_type_aliases():
    doc = {"version": 2, "engine_overrides": [{"op": "matmul", "engine_name": "a", "tensors": [{"tensor_id": "A", "dim": [1]}],
                                               "knobs": [{"knob_id": "x", "type": "float", "value": 2},
                                                         {"knob_id": "y", "type": "integer", "value": 3},
                                                         {"knob_id": "z", "type": "str", "value": "v"}]}]}
    assert parse_overrides(json.dumps(doc)).entries[0].knobs == (("x", 2.0), ("y", 3), ("z", "v"))


def rule(engine, dims_a, dims_b, dims_c, strides=(None, None, None), **kw):
    tensors = []
    for tid, dims, stride in zip("ABC", (dims_a, dims_b, dims_c), strides):
        t = {"tensor_id": tid, "dim": dims}
        if stride is not None:
            t["stride"] = stride
        tensors.append(t)
    return {"op": kw.pop("op", "matmul"), "engine_name": engine, "tensors": tensors, **kw}


def test_wildcards_strides_and_order_rules():
    exact = OverrideEntry.for_problem(mm(), "exact", (), meta()).to_json()
    doc = {"version": 2, "engine_overrides": [
        rule("wild-m", [-1, 16], [16, 32], [-1, 32]),
        rule("wild-any", [-1, -1], [-1, -1], [-1, -1]),
        exact,  # declared after wildcards, still found first (exact bucket)
        rule("colmajor-b", [-1, -1], [-1, -1], [-1, -1], strides=(None, [1, -1], None)),
    ]}
    f = parse_overrides(json.dumps(doc))
    assert f.match(mm()).engine_name == "exact"
    assert f.match(mm(m=100)).engine_name == "wild-m"  # first wildcard in declaration order
    assert f.match(mm(m=100, k=8)).engine_name == "wild-any"
    colmajor = Problem.create("matmul", {"A": [4, 8], "B": {"dims": [8, 2], "strides": [1, 8]}})
    doc2 = {"version": 2, "engine_overrides": [doc["engine_overrides"][3], doc["engine_overrides"][1]]}
    f2 = parse_overrides(json.dumps(doc2))
    assert f2.match(colmajor).engine_name == "colmajor-b"  # stride pattern with a wildcard element
    assert f2.match(mm(4, 2, 8)).engine_name == "wild-any"  # row-major B fails [1, -1]
    exact_stride = {"version": 2, "engine_overrides": [rule("s", [64, 16], [16, 32], [64, 32], strides=([16, 1], [32, 1], [32, 1]))]}
    assert parse_overrides(json.dumps(exact_stride)).match(mm()).engine_name == "s"
    assert parse_overrides(json.dumps(exact_stride)).match(colmajor) is None


def test_the_match_key_is_the_rfcs_and_anything_we_add_is_optional():
    """Conv rules key on X and W, matmul on A and B: outputs, our conv criteria and dtypes constrain only
    when a rule states them."""
    doc = {"version": 2, "engine_overrides": [
        {"op": "conv_fprop", "engine_name": "padded", "criteria": {"pad_h": 1},
         "tensors": [{"tensor_id": t, "dim": [-1, -1, -1, -1]} for t in ("X", "W", "Y")]},
        {"op": "conv_fprop", "engine_name": "two-tensors", "tensors": [{"tensor_id": t, "dim": [-1, -1, -1, -1]} for t in ("X", "W")]},
        rule("mm", [-1, -1], [-1, -1], [-1, -1]),
    ]}
    f = parse_overrides(json.dumps(doc))
    assert f.match(conv(pad_h=1)).engine_name == "padded"
    assert f.match(conv()).engine_name == "two-tensors"  # no criteria, no Y: neither constrains
    assert f.match(mm()).engine_name == "mm"
    bias = Problem.create("matmul", {"A": [2, 2], "B": [2, 2], "bias": [2]})
    assert f.match(bias).engine_name == "mm"  # a bias the rule does not name is not constrained
    assert f.match(Problem.create("rmsnorm", {"X": [2, 2], "scale": [2]})) is None


def test_the_rfc_example_file_matches_our_problems_of_its_shapes():
    """RFC §6.5's example: a conv entry with X and W, a matmul entry with A and B only, no dtypes, v2."""
    example = {"version": 2, "engine_overrides": [
        {"op": "conv_fprop", "engine_name": "MIOPEN_ENGINE", "criteria": {},
         "tensors": [{"tensor_id": "X", "dim": [1, 64, 56, 56], "stride": [200704, 3136, 56, 1]},
                     {"tensor_id": "W", "dim": [64, 64, 3, 3], "stride": [576, 9, 3, 1]}],
         "autotune_metadata": {"rank": 0, "min_time_ms": 0.5, "timestamp": "2026-04-21T10:30:00Z"}},
        {"op": "matmul", "engine_name": "HIPBLASLT_ENGINE",
         "tensors": [{"tensor_id": "A", "dim": [1024, 512]}, {"tensor_id": "B", "dim": [512, 256]}]},
    ], "note": "written by hipDNN"}
    f = parse_overrides(json.dumps(example))
    c = Problem.create("conv_fprop", {"X": [1, 64, 56, 56], "W": [64, 64, 3, 3]}, criteria={"pad_h": 1, "pad_w": 1},
                       dtype="fp16")
    assert f.match(c).engine_name == "MIOPEN_ENGINE"
    assert f.match(Problem.create("matmul", {"A": [1024, 512], "B": [512, 256]}, dtype="bf16")).engine_name == \
        "HIPBLASLT_ENGINE"
    assert f.match(Problem.create("matmul", {"A": [1024, 512], "B": [512, 128]})) is None
    assert json.loads(render(f))["note"] == "written by hipDNN"  # foreign fields survive a rewrite


def test_pointwise_reduction_and_resample_rules_must_state_their_mode():
    def pw(mode, criteria):
        return {"op": "pointwise", "engine_name": f"e{mode}", **({"criteria": criteria} if criteria is not None else {}),
                "tensors": [{"tensor_id": "A", "dim": [4, 4]}, {"tensor_id": "B", "dim": [4, 4]}]}

    add = Problem.create("pointwise", {"A": [4, 4], "B": [4, 4]}, criteria={"mode": 0})
    mul = Problem.create("pointwise", {"A": [4, 4], "B": [4, 4]}, criteria={"mode": 1})
    f = parse_overrides(json.dumps({"version": 2, "engine_overrides": [pw("none", None), pw("empty", {}),
                                                                        pw("any", {"mode": -1}), pw(1, {"mode": 1})]}))
    assert f.match(add) is None  # no mode, {} and -1 (not a wildcard for criteria) match no ADD
    assert f.match(mul).engine_name == "e1"


def test_v1_files_match_by_position_and_later_versions_are_read():
    tensors = [{"tensor_id": "nonsense", "dim": [8, 8]}, {"tensor_id": "ids", "dim": [8, 8]}]
    v1 = parse_overrides(json.dumps({"engine_overrides": [{"op": "matmul", "engine_name": "pos", "tensors": tensors}]}))
    assert v1.match(mm(8, 8, 8)).engine_name == "pos"  # ids ignored: A then B by position
    v3 = parse_overrides(json.dumps({"version": 3, "engine_overrides": [
        {"op": "matmul", "engine_name": "named", "tensors": [{"tensor_id": "B", "dim": [8, 8]},
                                                              {"tensor_id": "A", "dim": [8, 8]}]}]}))
    assert v3.version == 3 and v3.match(mm(8, 8, 8)).engine_name == "named"


def test_exact_lookup_is_a_hash_lookup_not_a_scan(monkeypatch):
    entries = [OverrideEntry.for_problem(mm(m), "e", (), meta()).to_json() for m in range(1, 2001)]
    f = parse_overrides(json.dumps({"version": 2, "engine_overrides": entries}))
    calls = {"n": 0}
    real = OverrideEntry.matches

    def counting(self, problem):
        calls["n"] += 1
        return real(self, problem)

    monkeypatch.setattr(OverrideEntry, "matches", counting)
    probe = mm(1500)
    for _ in range(1000):
        assert f.match(probe) is not None
    assert calls["n"] == 0  # every lookup from the index: no rule compared (its time is benchmarks/selection_bench's)


@pytest.mark.parametrize("doc, path", [
    ({"version": 2, "engine_overrides": [rule("a", [1, 1], [1, 1], [1, "x"])]}, "engine_overrides[0].tensors[2].dim[1]"),
    ({"version": 2, "engine_overrides": [{"op": "matmul", "engine_name": "a", "tensors": [{"dim": [1]}]}]},
     "engine_overrides[0].tensors[0].tensor_id"),
    ({"version": 2, "engine_overrides": [{**rule("a", [1], [1], [1]), "knobs": [{"knob_id": "t", "type": "int", "value": 1.5}]}]},
     "engine_overrides[0].knobs[0].value"),
    ({"version": 2, "engine_overrides": [{**rule("a", [1], [1], [1]), "criteria": {"pad": "1"}}]},
     "engine_overrides[0].criteria.pad"),
    ({"version": 0, "engine_overrides": []}, "version"),  # any version >= 1 is read (a newer one as v2)
    ({"version": 2, "engine_overrides": {}}, "engine_overrides"),
    ({"version": 2, "engine_overrides": [rule("a", [1, 2], [1], [1], strides=([1], None, None))]},
     "engine_overrides[0].tensors[0].stride"),
])
def test_malformed_files_name_file_and_json_path(tmp_path, doc, path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError) as info:
        load_overrides(p)
    assert info.value.field == path
    assert str(p) in str(info.value)


def test_invalid_json_and_missing_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"version": 2,,}')
    with pytest.raises(InputError, match="not valid JSON.*line 1"):
        load_overrides(p)
    with pytest.raises(InputError, match="not found"):
        load_overrides(tmp_path / "none.json")


# -- interop with hipDNN's files (RFC §6.5) -------------------------------------------------------
RFC_EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "rfc_6_5_example.json")


def _foreign_fields(doc):
    """Every field of ``doc`` this build does not write itself, with where it sits."""
    out = {"top": {k: v for k, v in doc.items() if k not in ("version", "device", "engine_overrides")}}
    for i, e in enumerate(doc["engine_overrides"]):
        out[f"entry{i}"] = {k: v for k, v in e.items() if k not in ("op", "engine_name", "criteria", "tensors",
                                                                    "compute_data_type", "autotune_metadata")}
        out[f"entry{i}.meta"] = e.get("autotune_metadata")
        out[f"entry{i}.tensors"] = e["tensors"]
    return out


def test_the_rfc_example_file_round_trips_through_our_reader_and_writer(tmp_path):
    """Read: its conv and matmul rules match our problems of those shapes. Append: our entry joins it.
    Read back: every field hipDNN wrote (document, entry, tensor, metadata and knob level) is intact."""
    path = tmp_path / "hipdnn.json"
    path.write_text(open(RFC_EXAMPLE).read())
    original = json.loads(path.read_text())
    f = load_overrides(path)
    c = Problem.create("conv_fprop", {"X": [1, 64, 56, 56], "W": [64, 64, 3, 3]}, criteria={"pad_h": 1, "pad_w": 1},
                       dtype="fp16")
    hit = f.match(c)
    assert hit.engine_name == "MIOPEN_ENGINE"
    assert hit.knobs == (("KERNEL_NAME", "igemm_fwd_gtcx3"), ("SOLVER_ID", 86), ("SPLIT_K", 1.0))
    assert f.match(Problem.create("matmul", {"A": [1024, 512], "B": [512, 256]}, dtype="bf16")).engine_name == \
        "HIPBLASLT_ENGINE"
    assert f.match(Problem.create("matmul", {"A": [1024, 512], "B": [512, 128]})) is None

    ours = OverrideEntry.for_problem(mm(), "cpu.matmul.blas", (("order", "transposed"),), meta())
    report = write_overrides(path, [ours], device=DEVICE)
    assert (report.added, report.replaced, report.moved_aside) == (1, 0, "")
    back_doc = json.loads(path.read_text())
    # hipDNN's entries, field for field, as they were written
    assert back_doc["engine_overrides"][:2] == original["engine_overrides"]
    assert _foreign_fields(back_doc)["top"] == _foreign_fields(original)["top"]
    back = load_overrides(path)
    assert [e.engine_name for e in back.entries] == ["MIOPEN_ENGINE", "HIPBLASLT_ENGINE", "cpu.matmul.blas"]
    assert back.match(c).knobs == hit.knobs and back.match(mm()).knobs == (("order", "transposed"),)


def test_ours_carry_nothing_beside_the_rfc_fields_a_hipdnn_reader_looks_for():
    """Knobs in autotune_metadata.knobs with the RFC's types; no entry-level field the RFC does not define
    except our documented dtype additions."""
    e = OverrideEntry.for_problem(mm(), "triton.gemm", (("BLOCK_M", 128), ("use_tma", True)), meta()).to_json()
    assert set(e) == {"op", "engine_name", "criteria", "tensors", "compute_data_type", "autotune_metadata"}
    knobs = e["autotune_metadata"]["knobs"]
    assert all(set(k) == {"knob_id", "type", "value"} and k["type"] in ("int", "double", "string") for k in knobs)
    assert {"knob_id": "use_tma", "type": "int", "value": 1} in knobs  # a bool is written as the int it is


def test_knobs_beside_the_metadata_are_read_and_moved_into_it_on_rewrite(tmp_path):
    old_style = {**OverrideEntry.for_problem(mm(), "e", (), meta()).to_json(),
                 "knobs": [{"knob_id": "tile", "type": "int", "value": 64}]}
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 2, "device": DEVICE, "engine_overrides": [old_style]}))
    assert load_overrides(path).entries[0].knobs == (("tile", 64),)
    write_overrides(path, [OverrideEntry.for_problem(mm(8), "e", (), meta())], device=DEVICE)
    rewritten = json.loads(path.read_text())["engine_overrides"][0]
    assert "knobs" not in rewritten and rewritten["autotune_metadata"]["knobs"] == old_style["knobs"]


@pytest.mark.parametrize("beside, why", [
    ([{"knob_id": "tile", "type": "int", "value": "lots"}], "engine_overrides[0].knobs[0]"),  # a wrong type
    ([{"knob_id": "tile", "type": "int", "value": 32}], "disagree"),  # another value than the metadata's
])
def test_every_knob_list_of_an_entry_is_read_and_two_that_disagree_are_refused(tmp_path, beside, why):
    entry = {**OverrideEntry.for_problem(mm(), "e", (("tile", 64),), meta()).to_json(), "knobs": beside}
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 2, "device": DEVICE, "engine_overrides": [entry]}))
    with pytest.raises(InputError) as info:
        load_overrides(path)  # strict: what publish and diff read
    assert why in str(info.value)
    lenient = load_overrides(path, strict=False)  # production: that rule skipped (its knobs cannot be trusted)
    assert lenient.entries == [] and not lenient.invalid
    agree = {**entry, "knobs": [{"knob_id": "tile", "type": "int", "value": 64}]}
    path.write_text(json.dumps({"version": 2, "device": DEVICE, "engine_overrides": [agree]}))
    assert load_overrides(path).entries[0].knobs == (("tile", 64),)


@pytest.mark.parametrize("tensors, field", [
    ((TensorRule("A", (64, 16), (16, 1)), TensorRule("A", (16, 32), (32, 1))), "engine_overrides[0].tensors"),
    ((TensorRule(None, (64, 16)), TensorRule("B", (16, 32))), "engine_overrides[0].tensors[0].tensor_id"),
    ((TensorRule("A", (64, 16), (1,)), TensorRule("B", (16, 32))), "engine_overrides[0].tensors[0].stride"),
    ((TensorRule("A", (64, -2)), TensorRule("B", (16, 32))), "engine_overrides[0].tensors[0].dim[1]"),
])
def test_the_writer_never_writes_what_its_reader_refuses(tmp_path, tensors, field):
    path = tmp_path / "o.json"
    good = OverrideEntry.for_problem(mm(), "e", (), meta())
    write_overrides(path, [good], device=DEVICE)
    before = path.read_text()
    bad = OverrideEntry("matmul", "e", tensors, metadata=meta())
    with pytest.raises(InputError) as info:
        write_overrides(path, [bad], device=DEVICE)
    # appended after the good entry, so it is the file's second
    assert info.value.field == field.replace("[0]", "[1]", 1) and str(path) in str(info.value)
    assert "nothing written" in str(info.value)
    assert path.read_text() == before
    with pytest.raises(InputError) as info:
        write_overrides(tmp_path / "fresh.json", [bad], device=DEVICE)
    assert info.value.field == field
    assert not (tmp_path / "fresh.json").exists()


def test_a_files_own_dtype_spelling_matches_ours_and_is_written_back_as_it_was(tmp_path):
    """hipDNN may spell data types its own way (HALF, FLOAT, HIPDNN_DATA_TYPE_BFLOAT16): they match our fp16,
    fp32 and bf16 problems, and a rewrite keeps the file's spelling; an unknown name matches nothing."""
    def rule(engine, dtype, cdt=None):
        r = {"op": "matmul", "engine_name": engine,
             "tensors": [{"tensor_id": t, "dim": d, "data_type": dtype} for t, d in (("A", [64, 16]), ("B", [16, 32]))],
             "autotune_metadata": {"rank": 0}}
        if cdt:
            r["compute_data_type"] = cdt
        return r

    path = tmp_path / "hipdnn.json"
    path.write_text(json.dumps({"version": 2, "engine_overrides": [
        rule("half", "HALF", "FLOAT"), rule("bf", "HIPDNN_DATA_TYPE_BFLOAT16"), rule("odd", "FP8_E4M3")]}))
    f = load_overrides(path)
    assert f.match(mm(dtype="fp16")).engine_name == "half"
    assert f.match(mm(dtype="bf16")).engine_name == "bf"
    assert f.match(mm(dtype="fp32")) is None
    write_overrides(path, [OverrideEntry.for_problem(mm(8), "ours", (), meta())], device=DEVICE)
    back = json.loads(path.read_text())["engine_overrides"]
    assert [t["data_type"] for t in back[0]["tensors"]] == ["HALF", "HALF"] and back[0]["compute_data_type"] == "FLOAT"
    assert back[1]["tensors"][0]["data_type"] == "HIPDNN_DATA_TYPE_BFLOAT16"
    assert back[3]["tensors"][0]["data_type"] == "fp32" and not any("\x00" in k for e in back for k in e)


@pytest.mark.parametrize("knob", [{"knob_id": "tile", "type": "int", "value": "lots"},  # a wrong type
                                  {"knob_id": "tile", "type": "quantum", "value": 1}])  # a type no reader knows
@pytest.mark.parametrize("where", ["beside", "metadata"])
def test_an_append_beside_a_rule_whose_knobs_cannot_be_read_keeps_it_as_written(tmp_path, knob, where, caplog):
    """A rule production's readers skip (its knobs cannot be trusted) stays as it was written, in either place its
    knobs may be (beside the metadata: an older tunefarm's), and the new winners are written: never a traceback."""
    entry = OverrideEntry.for_problem(mm(), "e", (), meta()).to_json()
    if where == "beside":
        entry["knobs"] = [knob]
    else:
        entry["autotune_metadata"]["knobs"] = [knob]
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 2, "device": DEVICE, "engine_overrides": [entry]}))
    with caplog.at_level("WARNING"):
        write_overrides(path, [OverrideEntry.for_problem(mm(8), "e", (), meta())], device=DEVICE)
    written = json.loads(path.read_text())["engine_overrides"]
    assert written[0] == entry and len(written) == 2  # kept field for field, the new winner after it
    assert "kept as written" in caplog.text
