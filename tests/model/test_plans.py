import logging

import pytest

from fakes import EXTRA, MODE, SPLIT, TILE, FakeEngine, fake_device, matmul_problem, registry_of
from farm.model.engine import engine_id
from farm.errors import InputError, UsageError
from farm.model.knobs import BENCHMARKING_KNOB
from farm.model.plans import (EngineSweep, EngineVariant, PlanSpec, PlanSpecCollection, SWEEP_ERROR_LIMIT,
                        cartesian_product)


@pytest.fixture
def setup():
    a = FakeEngine("fake.a", knobs=(TILE, SPLIT, MODE, EXTRA), exhaustive=True, estimate=1000)
    b = FakeEngine("fake.b", knobs=(TILE,), estimate=50)
    reg = registry_of(a, b)
    col = PlanSpecCollection(matmul_problem(), fake_device(), reg)
    return col, a, b


def test_plan_spec_equality_ignores_knob_order_and_defaults(setup):
    col, a, _ = setup
    s1 = col.add_engine("fake.a", {"tile": 32, "split_k": 4})
    s2 = col.add_engine("fake.a", {"split_k": 4, "tile": 32, "mode": "fast"})  # mode=fast is the default
    assert s1 == s2 and hash(s1) == hash(s2)
    assert len(col) == 1
    assert s1 == PlanSpec(engine_id(a), (("split_k", 4), ("tile", 32)))
    assert col.add_engine("fake.a", {}) == col.add_engine("fake.a") == PlanSpec(engine_id(a), ())
    assert len(col) == 2


def test_additive_dedup_across_calls(setup):
    col, a, b = setup
    col.add_all_engines()
    col.add_engine_variants([EngineVariant("fake.a", {}), EngineVariant("fake.a", {"tile": 128})])
    col.add_engine_sweep([EngineSweep("fake.a", {"tile": [64, 128]})])
    assert [s.describe(col.registry) for s in col.specs] == [
        "fake.a[default]", "fake.b[default]", "fake.a[tile=128]"]


def test_single_calls_raise(setup):
    col, *_ = setup
    with pytest.raises(InputError, match="unknown engine"):
        col.add_engine("nope")
    with pytest.raises(InputError, match="unknown knob"):
        col.add_engine("fake.a", {"tiles": 3})
    with pytest.raises(InputError) as info:
        col.add_engine("fake.a", {"split_k": 99})
    assert "fake.a" in str(info.value) and "split_k" in str(info.value) and "99" in str(info.value)
    with pytest.raises(InputError, match="no engines given"):
        col.add_engines([])
    with pytest.raises(InputError):
        col.add_engine_configs([])
    with pytest.raises(InputError):
        col.add_engine_variants([])
    with pytest.raises(InputError):
        col.add_engine_sweep([])


def test_engine_that_does_not_serve_the_op_is_refused():
    conv_only = FakeEngine("fake.conv")
    conv_only.ops = frozenset({"conv_fprop"})
    col = PlanSpecCollection(matmul_problem(), fake_device(), registry_of(conv_only))
    with pytest.raises(InputError, match="does not implement matmul"):
        col.add_engine("fake.conv")


def test_the_first_bad_variant_is_an_error_and_the_earlier_ones_are_kept(setup, caplog):
    col, *_ = setup
    # an engine that is not available is skipped with a warning (autotuning RFC §6.2.7); the rest go on
    with caplog.at_level(logging.WARNING, logger="farm.model.plans"):
        assert col.add_engine_variants([EngineVariant("fake.a", {"tile": 32}), EngineVariant("ghost", {}),
                                        EngineVariant("fake.b", {"tile": 128})]) == 2
    assert "variants[1].engine: engine 'ghost' skipped" in caplog.text and ("ghost[*]", col.dropped[-1][1]) in col.dropped
    assert [s.knobs for s in col.specs] == [(("tile", 32),), (("tile", 128),)]
    with pytest.raises(InputError, match=r"variants\[0\].*tile.*33"):
        col.add_engine_variants([EngineVariant("fake.a", {"tile": 33})])
    with pytest.raises(InputError, match=r"variants\[0\].*nope"):
        col.add_engine_variants([EngineVariant("fake.a", {"nope": 1})])


def test_a_sweep_value_out_of_range_is_an_error_naming_the_entry(setup):
    col, *_ = setup
    with pytest.raises(InputError, match=r"sweeps\[0\] entry \{'split_k': 99\}.*99"):
        col.add_engine_sweep([EngineSweep("fake.a", {"split_k": [1, 2, 99]})])
    assert col.add_engine_sweep([EngineSweep("ghost", {"x": [1]})]) == 0  # not available: skipped, warned


def test_an_empty_axis_is_dropped_and_the_benchmarking_knob_stripped_before_the_product(setup, caplog):
    col, *_ = setup
    with caplog.at_level(logging.WARNING, logger="farm.model.plans"):
        n = col.add_engine_sweep([EngineSweep("fake.a", {"split_k": [1, 2], "tile": [], BENCHMARKING_KNOB: [0, 1]})])
    assert n == 2  # split_k 1 and 2: the empty axis does not empty the sweep
    warnings = [r.message for r in caplog.records]
    assert sum("no values; dropped" in m for m in warnings) == 1
    assert sum(BENCHMARKING_KNOB in m and "stripped" in m for m in warnings) == 1  # once, not per combination


def test_estimated_max_workspace_needs_plan_specs(setup):
    col, *_ = setup
    with pytest.raises(UsageError):
        col.estimated_max_workspace()


def test_benchmarking_knob_is_stripped_with_a_warning(setup, caplog):
    col, *_ = setup
    with caplog.at_level(logging.WARNING, logger="farm.model.plans"):
        spec = col.add_engine("fake.a", {BENCHMARKING_KNOB: 1, "tile": 32})
    assert spec.knobs == (("tile", 32),)
    assert any(BENCHMARKING_KNOB in r.message and "stripped" in r.message for r in caplog.records)


@pytest.mark.parametrize("axes, expected", [
    ({}, [{}]),
    ({"a": [1, 2, 3]}, [{"a": 1}, {"a": 2}, {"a": 3}]),
    ({"a": [1, 2], "b": ["x", "y"]}, [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]),
    ({"a": [1], "b": [2], "c": [3, 4]}, [{"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2, "c": 4}]),
])
def test_cartesian_product(axes, expected):
    assert cartesian_product(axes) == expected


def test_cartesian_product_limit():
    axes = {"a": list(range(100)), "b": list(range(101))}
    with pytest.raises(InputError, match="10100 plan specs, above the limit of 10000"):
        cartesian_product(axes)
    assert len(cartesian_product({"a": list(range(100)), "b": list(range(100))})) == SWEEP_ERROR_LIMIT
    with pytest.raises(InputError, match="list of values"):
        cartesian_product({"a": 3})


def test_sweep_merges_fixed_settings_and_warns_above_1000(setup, caplog):
    col, *_ = setup
    n = col.add_engine_sweep([EngineSweep("fake.a", {"tile": [32, 128], "split_k": [2, 4]}, {"mode": "exact"})])
    assert n == 4
    assert all(dict(s.knobs)["mode"] == "exact" for s in col.specs)
    with caplog.at_level(logging.WARNING, logger="farm.model.plans"):
        n = col.add_engine_sweep([EngineSweep("fake.a", {"extra": list(range(1100))})])
    assert n == 1100
    assert any("1100 plan specs" in r.message for r in caplog.records)
    with pytest.raises(InputError):
        col.add_engine_sweep([EngineSweep("fake.a", {"extra": list(range(10_001))})])


def test_deselect_engines_accumulates_and_workspace_ceiling_last_write_wins(setup):
    col, a, b = setup
    col.add_all_engines()
    col.add_engine("fake.a", {"extra": 5000})
    specs = col.specs
    col.deselect_engines(["fake.b"])
    col.deselect_engines([engine_id(a) + 1])  # unknown ids are ignored
    assert col.barred_reason(specs[1]) == "engine deselected"
    assert col.barred_reason(specs[0]) is None
    col.deselect_workspace_greater_than(10)
    assert col.barred_reason(specs[0]) is None  # the ceiling is for compiled plans: estimates decide nothing
    assert col.ceiling_reason(11) == "workspace 11 B exceeds the deselect ceiling 10 B"
    col.deselect_workspace_greater_than(2000)  # last write wins
    assert col.ceiling_reason(11) is None and "6000 B" in col.ceiling_reason(6000)
    assert col.barred_reason(specs[1]) == "engine deselected"  # engine bars stay
    assert col.estimated_max_workspace() == 6000
    with pytest.raises(InputError):
        col.deselect_workspace_greater_than(-1)


def test_estimated_max_workspace_over_all_candidates(setup):
    col, *_ = setup
    with pytest.raises(UsageError):  # nothing to estimate yet (RFC: an error, not 0)
        col.estimated_max_workspace()
    col.add_all_engines()
    col.add_engine("fake.a", {"extra": 24})
    assert col.estimated_max_workspace() == 1024


def test_batch_additions_skip_engines_that_do_not_apply(caplog):
    ok, nope = FakeEngine("fake.ok", knobs=(TILE,)), FakeEngine("fake.nope", knobs=(TILE,), applicable=False)
    col = PlanSpecCollection(matmul_problem(), fake_device(), registry_of(ok, nope))
    with caplog.at_level(logging.WARNING, logger="farm.model.plans"):
        n = col.add_engine_sweep([EngineSweep("fake.nope", {"tile": [32, 128]}), EngineSweep("fake.ok", {"tile": [32]})])
    assert n == 1 and col.dropped == [("fake.nope[*]", "fake says no")]
    assert sum("does not apply" in r.message for r in caplog.records) == 1  # once per engine
    assert col.add_engine_variants([EngineVariant("fake.nope", {})]) == 0
    col.add_engine("fake.nope")  # a single, explicit addition is kept (and fails at compile with the reason)
    assert len(col) == 2
