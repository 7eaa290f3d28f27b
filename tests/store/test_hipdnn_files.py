"""hipDNN's own override files select here: engines matched by id, its spellings of ops, tensor ids and criteria,
the key-tensor rule, and exact rules before wildcard rules (heuristics RFC §5.3.5, §17)."""

import json
import logging

import pytest

from farm.devices.device import cpu_device
from farm.devices.fb import encode_device_properties
from farm.model.ids import engine_name_to_id
from farm.model.problem import Problem
from farm.replay.selection import Selector
from farm.store.overrides.parsing import parse_overrides
from farm.store.overrides.files import render
from policies.config import ConfigPolicy

MIOPEN, HIPBLASLT = engine_name_to_id("MIOPEN_ENGINE"), engine_name_to_id("HIPBLASLT_ENGINE")
BLAS = engine_name_to_id("cpu.matmul.blas")


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in ("FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER",
                 "HIPDNN_HEUR_POLICY_ORDER"):
        monkeypatch.delenv(name, raising=False)


def conv():
    return Problem.create("conv_fprop", {"X": [8, 64, 28, 28], "W": [128, 64, 3, 3]}, dtype="fp16",
                          criteria={"pad_h": 1, "pad_w": 1})


def mm(m=64, k=32, n=16, dtype="fp32"):
    return Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype=dtype)


def t(tid, dims, strides=None):
    out = {"tensor_id": tid, "dim": dims}
    if strides is not None:
        out["stride"] = strides
    return out


HIPDNN_FILE = {
    "version": 2,
    "engine_overrides": [
        {"op": "conv_fprop", "engine_name": "MIOPEN_ENGINE", "criteria": {},
         "tensors": [t("x_tensor_uid", [8, 64, 28, 28]), t("w_tensor_uid", [128, 64, 3, 3])]},
        {"op": "matmul", "engine_name": "HIPBLASLT_ENGINE",
         "tensors": [t("a_tensor_uid", [-1, 32]), t("b_tensor_uid", [32, 16])]},
    ],
}


def test_a_hipdnn_file_selects_its_own_engines_by_id_through_the_selector(tmp_path, monkeypatch):
    path = tmp_path / "hipdnn.json"
    path.write_text(json.dumps(HIPDNN_FILE))
    monkeypatch.setenv("HIPDNN_HEUR_CONFIG_PATH", str(path))
    sel = Selector(cpu_device().properties, order=["SelectionHeuristic::Config"])
    got = sel.select(conv(), [BLAS, MIOPEN, HIPBLASLT])
    assert got.order == (MIOPEN, BLAS, HIPBLASLT) and got.policy == "SelectionHeuristic::Config"
    assert sel.select(mm(m=100), [BLAS, HIPBLASLT]).order == (HIPBLASLT, BLAS)


@pytest.mark.parametrize("spell", [lambda i: hex(i & (2**64 - 1)), lambda i: hex(i & (2**64 - 1)).upper().replace("X", "x"),
                                   str], ids=["hex", "HEX", "decimal"])
def test_an_engine_named_by_its_id_selects_that_engine(tmp_path, monkeypatch, spell):
    """hipDNN's writer spells an engine it has no name for as its id (hex): read as that id, not hashed as a
    name (which would match nothing)."""
    doc = {"version": 2, "engine_overrides": [
        {"op": "matmul", "engine_name": spell(HIPBLASLT), "tensors": [t("a_tensor_uid", [64, 32]),
                                                                        t("b_tensor_uid", [32, 16])]}]}
    path = tmp_path / "hipdnn.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("HIPDNN_HEUR_CONFIG_PATH", str(path))
    sel = Selector(cpu_device().properties, order=["SelectionHeuristic::Config"])
    assert sel.select(mm(), [BLAS, HIPBLASLT]).order == (HIPBLASLT, BLAS)
    assert engine_name_to_id(spell(BLAS)) == BLAS and engine_name_to_id("cpu.matmul.blas") == BLAS


def test_an_unknown_engines_knobs_pass_through_to_its_owner(tmp_path, monkeypatch, caplog):
    doc = {"version": 2, "engine_overrides": [
        {"op": "matmul", "engine_name": "HIPBLASLT_ENGINE", "tensors": [t("A", [64, 32]), t("B", [32, 16])],
         "autotune_metadata": {"knobs": [{"knob_id": "solution_index", "type": "int", "value": 1234}]}}]}
    path = tmp_path / "o.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(path))
    session = ConfigPolicy().session(encode_device_properties(cpu_device().properties))
    from farm.devices.fb import encode_problem

    with caplog.at_level(logging.INFO, logger="farm"):
        choice = session.order((BLAS, HIPBLASLT), encode_problem(mm()))
    assert choice.order == (HIPBLASLT, BLAS) and dict(choice.knobs[HIPBLASLT]) == {"solution_index": 1234}
    assert "does not know that engine" in caplog.text
    # a known engine's knobs are still checked: a bad one declines
    doc["engine_overrides"][0]["engine_name"] = "cpu.matmul.blas"
    path.write_text(json.dumps(doc))
    # a knob the engine does not have is ignored (hipDNN records knobs as information) ...
    assert ConfigPolicy().session(encode_device_properties(cpu_device().properties)).order(
        (BLAS,), encode_problem(mm())).knobs[BLAS] == ()
    # ... a bad value of one it has declines
    doc["engine_overrides"][0]["autotune_metadata"]["knobs"] = [{"knob_id": "order", "type": "string", "value": "x"}]
    path.write_text(json.dumps(doc))
    assert ConfigPolicy().session(encode_device_properties(cpu_device().properties)).order(
        (BLAS,), encode_problem(mm())) is None


@pytest.mark.parametrize("rule, problem", [
    ({"op": "conv_dgrad", "tensors": [t("dy_tensor_uid", [8, 128, 28, 28]), t("w_tensor_uid", [128, 64, 3, 3])],
      "criteria": {"pad_h": 1, "pad_w": 1}},
     Problem.create("conv_dgrad", {"dY": [8, 128, 28, 28], "W": [128, 64, 3, 3], "dX": [8, 64, 28, 28]},
                    criteria={"pad_h": 1, "pad_w": 1})),
    ({"op": "sdpa_fwd", "tensors": [t("q_tensor_uid", [1, 8, 128, 64]), t("k_tensor_uid", [1, 8, 128, 64]),
                                    t("v_tensor_uid", [1, 8, 128, 64])]},
     Problem.create("sdpa_fwd", {"Q": [1, 8, 128, 64], "K": [1, 8, 128, 64], "V": [1, 8, 128, 64]})),
    # criteria values are hipDNN's enums: BILINEAR is 4 there (our resample mode 1), ADD 2 (our 0), MAX 4 (our 1)
    ({"op": "resample_fwd", "criteria": {"resample_mode": 4}, "tensors": [t("x_tensor_uid", [1, 3, 8, 8])]},
     Problem.create("resample", {"X": [1, 3, 8, 8], "Y": [1, 3, 16, 16]}, criteria={"mode": 1})),
    ({"op": "pointwise", "criteria": {"pointwise_mode": 2},
      "tensors": [t("in_0_tensor_uid", [4, 4]), t("in_1_tensor_uid", [4, 4])]},
     Problem.create("pointwise", {"A": [4, 4], "B": [4, 4]}, criteria={"mode": 0})),
    ({"op": "reduction", "criteria": {"reduction_mode": 4}, "tensors": [t("in_tensor_uid", [4, 6])]},
     Problem.create("reduction", {"X": [4, 6], "Y": [4, 1]}, criteria={"mode": 1})),
    ({"op": "batchnorm_inference_variance_ext",
      "tensors": [t("x_tensor_uid", [2, 4, 3, 3]), t("mean_tensor_uid", [4]), t("variance_tensor_uid", [4]),
                  t("scale_tensor_uid", [4]), t("bias_tensor_uid", [4])]},
     Problem.create("batchnorm_inference", {"X": [2, 4, 3, 3], "scale": [4], "bias": [4], "mean": [4], "var": [4]})),
    ({"op": "rmsnorm", "tensors": [t("x_tensor_uid", [4, 64]), t("scale_tensor_uid", [64])]},
     Problem.create("rmsnorm", {"X": [4, 64], "scale": [64]})),
])
def test_hipdnn_spellings_of_ops_tensor_ids_and_criteria_are_read_as_ours(rule, problem):
    f = parse_overrides(json.dumps({"version": 2, "engine_overrides": [{"engine_name": "MIOPEN_ENGINE", **rule}]}))
    assert f.match(problem) is not None, problem.label()
    # and written back as the file spelled them
    again = json.loads(render(f))["engine_overrides"][0]
    assert again["op"] == rule["op"] and [x["tensor_id"] for x in again["tensors"]] == \
        [x["tensor_id"] for x in rule["tensors"]] and again.get("criteria", {}) == rule.get("criteria", {})


def test_ops_hipdnn_has_and_we_do_not_are_read_and_match_nothing():
    f = parse_overrides(json.dumps({"version": 2, "engine_overrides": [
        {"op": "rmsnorm_backward", "engine_name": "MIOPEN_ENGINE",
         "tensors": [t("dy_tensor_uid", [4, 64]), t("x_tensor_uid", [4, 64]), t("scale_tensor_uid", [64])]}]}))
    assert f.entries[0].op == "rmsnorm_backward" and f.match(Problem.create("rmsnorm", {"X": [4, 64], "scale": [64]})) \
        is None


def test_a_criterion_under_both_names_is_refused_with_its_field():
    from farm.errors import InputError

    with pytest.raises(InputError) as err:
        parse_overrides(json.dumps({"version": 2, "engine_overrides": [
            {"op": "pointwise", "engine_name": "e", "criteria": {"mode": 0, "pointwise_mode": 1},
             "tensors": [t("A", [4, 4])]}]}))
    assert err.value.field == "engine_overrides[0].criteria.pointwise_mode"


def test_a_rule_must_name_every_key_tensor_of_its_op():
    only_a = {"op": "matmul", "engine_name": "only-a", "tensors": [t("A", [64, 32])]}
    a_and_b = {"op": "matmul", "engine_name": "a-b", "tensors": [t("A", [64, 32]), t("B", [32, -1])]}
    with_c = {"op": "matmul", "engine_name": "a-b-c",
              "tensors": [t("A", [64, 32]), t("B", [32, 16]), t("C", [64, 16])]}  # an output: optional, allowed
    f = parse_overrides(json.dumps({"version": 2, "engine_overrides": [only_a, a_and_b]}))
    assert f.match(mm()).engine_name == "a-b" and f.match(mm(n=99)).engine_name == "a-b"
    assert parse_overrides(json.dumps({"version": 2, "engine_overrides": [only_a]})).match(mm()) is None
    assert not f.entries[0].matches(mm())
    assert parse_overrides(json.dumps({"version": 2, "engine_overrides": [with_c]})).match(mm()).engine_name == "a-b-c"
    conv_x_only = {"op": "conv_fprop", "engine_name": "x", "tensors": [t("X", [8, 64, 28, 28])],
                   "criteria": {"pad_h": 1, "pad_w": 1}}
    assert parse_overrides(json.dumps({"version": 2, "engine_overrides": [conv_x_only]})).match(conv()) is None


def test_an_exact_rule_wins_over_a_wildcard_rule_declared_before_it():
    wildcard = {"op": "matmul", "engine_name": "wild", "tensors": [t("A", [-1, 32]), t("B", [32, 16])]}
    concrete = {"op": "matmul", "engine_name": "concrete", "tensors": [t("A", [64, 32]), t("B", [32, 16])]}
    concrete2 = {"op": "matmul", "engine_name": "concrete-later", "tensors": [t("A", [64, 32]), t("B", [32, 16])]}
    wildcard2 = {"op": "matmul", "engine_name": "wild-later", "tensors": [t("A", [-1, -1]), t("B", [32, 16])]}
    strided_wild = {"op": "matmul", "engine_name": "wild-stride",
                    "tensors": [t("A", [64, 32], [-1, 1]), t("B", [32, 16])]}
    f = parse_overrides(json.dumps({"version": 2, "engine_overrides": [wildcard, strided_wild, concrete, concrete2,
                                                                        wildcard2]}))
    assert f.match(mm()).engine_name == "concrete"  # the exact bucket first; in it, declaration order
    assert f.match(mm(m=7)).engine_name == "wild"  # no exact rule matches: the first wildcard rule
    assert [e.exact for e in f.entries] == [False, False, True, True, False]


def test_hipdnns_policy_order_variable_is_read_when_ours_says_nothing(monkeypatch):
    from farm.replay.selection import resolve_order
    from farm.replay.selection import default_policy_registry

    registry = default_policy_registry()
    monkeypatch.setenv("HIPDNN_HEUR_POLICY_ORDER", "SelectionHeuristic::StaticOrdering")
    assert [p.name for p in resolve_order(registry)] == ["SelectionHeuristic::StaticOrdering"]
    monkeypatch.setenv("FARM_HEUR_POLICY_ORDER", " , ")  # blank: says nothing, hipDNN's answers
    assert [p.name for p in resolve_order(registry, ["SelectionHeuristic::Config"])] == \
        ["SelectionHeuristic::StaticOrdering"]
    monkeypatch.setenv("FARM_HEUR_POLICY_ORDER", "SelectionHeuristic::Config")  # ours first
    assert [p.name for p in resolve_order(registry)] == ["SelectionHeuristic::Config"]
