"""Workload files: the example loads; every mistake names file, line, field and value."""

import textwrap

import pytest

from farm.model.records import TuneMode
from farm.errors import InputError
from farm.model.measurement import Strategy
from farm.model.workload import load_workload, parse_size

GOOD = """\
name: t
autotune:
  mode: exhaustive
  strategy: fixed_average
  timed_iterations: 4
  workspace_limit: 64MiB
engines:
  exclude: [cpu.matmul.einsum]
  sweep:
    cpu.matmul.blocked: {block_k: [128, 512], threads: 1}
    cpu.conv.im2col: {batch_chunk: [1, 2]}
problems:
  - name: mm
    op: matmul
    tensors:
      A: {dims: [32, 16]}
      B: {dims: [16, 8], strides: [1, 16]}
  - op: layernorm
    dtype: fp16
    tensors: {X: {dims: [4, 8]}, scale: {dims: [8]}, bias: {dims: [8]}}
    engines: {include: [cpu.layernorm.twopass], sweep: {cpu.layernorm.twopass: {row_block: [16]}}}
"""


def write(tmp_path, text, name="w.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_example_workload_loads(repo_root, registry):
    wl = load_workload(f"{repo_root}/examples/cpu-quick.yaml", registry)
    assert wl.name == "cpu-quick" and wl.problem_count >= 8
    assert {p.problem.op for p in wl.problems} >= {"matmul", "conv_fprop", "sdpa_fwd", "layernorm", "rmsnorm"}
    assert wl.autotune.workspace_limit == 256 * 2**20


def test_good_workload_parses_everything(tmp_path, registry):
    wl = load_workload(write(tmp_path, GOOD), registry)
    assert wl.autotune.mode is TuneMode.EXHAUSTIVE and wl.autotune.strategy is Strategy.FIXED_AVERAGE
    assert wl.autotune.timed_iterations == 4 and wl.autotune.workspace_limit == 64 * 2**20
    mm, ln = wl.problems
    assert mm.name == "mm" and mm.problem.tensor("B").strides == (1, 16)
    assert not mm.engines.selects("cpu.matmul.einsum") and mm.engines.selects("cpu.matmul.blas")
    blocked = [s for s in mm.engines.sweeps if s.engine == "cpu.matmul.blocked"][0]
    assert blocked.axes == {"block_k": [128, 512]} and blocked.fixed == {"threads": 1}
    assert ln.name.startswith("layernorm-") and ln.problem.dtype == "fp16"
    assert ln.engines.include == ("cpu.layernorm.twopass",)
    assert ln.engines.exclude == ("cpu.matmul.einsum",)  # inherited
    assert len(wl.digest) == 16


@pytest.mark.parametrize(
    "replace, expect_field, expect_line, fragment",
    [
        (("op: matmul", "op: gemm"), "problems[0].op", 14, "unknown op 'gemm'"),
        (("A: {dims: [32, 16]}", "A: {dims: [32, 0]}"), "problems[0].tensors.A.dims", 16, "positive integers"),
        (("B: {dims: [16, 8], strides: [1, 16]}", "B: {dims: [16, 8], strides: [1]}"), "problems[0].tensors.B.strides", 17, "one entry per dim"),
        (("B: {dims: [16, 8], strides: [1, 16]}", "B: {dims: [15, 8]}"), "problems[0].tensors.B.dims", 17, "must equal A's columns"),
        (("{block_k: [128, 512], threads: 1}", "{block_k: [128, 500]}"), "engines.sweep[cpu.matmul.blocked].block_k", 10, "one of"),
        (("{block_k: [128, 512], threads: 1}", "{tile: [1]}"), "engines.sweep[cpu.matmul.blocked].tile", 10, "unknown knob"),
        (("cpu.conv.im2col: {batch_chunk: [1, 2]}", "cpu.conv.nope: {batch_chunk: [1, 2]}"), "engines.sweep[cpu.conv.nope]", 11, "unknown engine"),
        (("exclude: [cpu.matmul.einsum]", "exclude: [cpu.matmul.einsun]"), "engines.exclude[0]", 8, "unknown engine"),
        (("timed_iterations: 4", "timed_iterations: 0"), "autotune.timed_iterations", 5, "must be >= 1"),
        (("strategy: fixed_average", "strategy: fastest"), "autotune.strategy", 4, "expected one of"),
        (("timed_iterations: 4", "window: 1"), "autotune.window", None, "must be >= 2"),
        (("workspace_limit: 64MiB", "workspace_limit: lots"), "autotune.workspace_limit", 6, "size in bytes"),
        (("timed_iterations: 4", "timed_iteration: 4"), "autotune.timed_iteration", 5, "unknown field"),
        (("name: mm", "nmae: mm"), "problems[0].nmae", 13, "unknown field"),
        (("row_block: [16]", "row_block: [17]"), "problems[1].engines.sweep[cpu.layernorm.twopass].row_block", 21, "one of"),
    ],
)
def test_errors_name_file_line_field_and_value(tmp_path, registry, replace, expect_field, expect_line, fragment):
    text = GOOD.replace(*replace)
    if "window: 1" in text:
        text = text.replace("strategy: fixed_average", "strategy: run_until_stable")
    assert text != GOOD
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_workload(path, registry)
    err = info.value
    assert err.field == expect_field
    assert fragment in str(err)
    assert str(path) in str(err)
    if expect_line is not None:
        assert err.source == f"{path}:{expect_line}", str(err)


def test_sweep_on_a_problem_whose_op_the_engine_does_not_serve(tmp_path, registry):
    text = GOOD.replace("{include: [cpu.layernorm.twopass], sweep: {cpu.layernorm.twopass: {row_block: [16]}}}",
                        "{sweep: {cpu.matmul.blas: {threads: [1]}}}")
    with pytest.raises(InputError, match="does not implement layernorm"):
        load_workload(write(tmp_path, text), registry)


@pytest.mark.parametrize("text, fragment", [
    ("problems: []", "non-empty list of problems"),
    ("- 1\n- 2", "a workload is a mapping"),
    ("problems: [{op: matmul}]", "tensors"),
    ("problems:\n  - {op: matmul, tensors: {A: [2, 2], B: [2, 2]}}\n  - {op: matmul, tensors: {A: [2, 2], B: [2, 2]}, name: matmul-x}\nversion: 3", "unsupported workload version"),
    ("problems: [{op: matmul, tensors: {A: [2,2], B: [2,2]}, name: a}, {op: matmul, tensors: {A: [3,3], B: [3,3]}, name: a}]", "unique"),
    ("problems: [{op: matmul, tensors: {A: [2, 2], B: [2, 2]}}]\nseed: -1", "seed"),
    ("problems: [{op: matmul, tensors: {A: [2, 2], B: [2, 2]}]", "not valid YAML"),
])
def test_structural_mistakes(tmp_path, registry, text, fragment):
    with pytest.raises(InputError, match=fragment):
        load_workload(write(tmp_path, text), registry)


@pytest.mark.parametrize("engines, field", [
    ("{include: []}", "problems[0].engines.include"),
    ("{defaults: false}", "problems[0].engines.defaults"),
])
def test_empty_candidate_sets_are_rejected(tmp_path, registry, engines, field):
    text = f"problems:\n  - op: matmul\n    tensors: {{A: [2, 2], B: [2, 2]}}\n    engines: {engines}\n"
    with pytest.raises(InputError, match="no candidates") as info:
        load_workload(write(tmp_path, text), registry)
    assert info.value.field == field


def test_inherited_sweep_of_another_op_does_not_count_as_a_candidate(tmp_path, registry):
    text = ("engines: {defaults: false, sweep: {cpu.conv.im2col: {batch_chunk: [1]}}}\n"
            "problems:\n  - op: matmul\n    tensors: {A: [2, 2], B: [2, 2]}\n")
    with pytest.raises(InputError, match="no candidates"):
        load_workload(write(tmp_path, text), registry)


def test_missing_file(tmp_path, registry):
    with pytest.raises(InputError, match="not found") as info:
        load_workload(tmp_path / "nope.yaml", registry)
    assert "nope.yaml" in str(info.value)


def test_parse_size():
    assert parse_size(1024, field="x") == 1024
    assert parse_size("256MiB", field="x") == 256 * 2**20
    assert parse_size("1.5 GB", field="x") == 1_500_000_000
    assert parse_size("64k", field="x") == 65536
    for bad in ("-3", "many", True, 1.5, -1):
        with pytest.raises(InputError):
            parse_size(bad, field="x")


@pytest.mark.parametrize("spelled", ["off", "'off'", "OFF", "no"])
def test_check_off_reads_as_written_unquoted_too(tmp_path, registry, spelled):
    from farm.model.records import ResultCheck

    # YAML 1.1 reads a bare off / no as false: docs/workload.md writes `check: off` bare
    text = GOOD.replace("  workspace_limit: 64MiB\n", f"  workspace_limit: 64MiB\n  check: {spelled}\n")
    assert load_workload(write(tmp_path, text), registry).autotune.check is ResultCheck.OFF


def test_check_true_is_refused_with_the_choices(tmp_path, registry):
    text = GOOD.replace("  workspace_limit: 64MiB\n", "  workspace_limit: 64MiB\n  check: on\n")
    with pytest.raises(InputError) as err:
        load_workload(write(tmp_path, text), registry)
    assert "check" in str(err.value) and "reference" in str(err.value)


def test_the_simulated_fleet_example_loads_and_its_faults_name_real_knobs(repo_root, registry):
    from farm.devices.sim import SimConfig

    cfg = SimConfig.load(f"{repo_root}/examples/sim-fleet.yaml")
    assert cfg.device_count == 4 and [g.name for g in cfg.groups] == ["Sim A100", "Sim H200"]
    for fault in cfg.faults:  # a fault whose knobs no candidate has would never fire
        knobs = {k.name: k for k in registry.get(fault.engine).knobs}
        assert all(name in knobs and value in knobs[name].choices for name, value in fault.knobs), fault
