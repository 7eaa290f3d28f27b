"""PyTorch TunableOp's CSV results file: read a TunableOp user's file, write ours in its format, replay from it."""

import csv
import json

import numpy as np
import pytest

import farm.ops as ops
from farm.devices.device import cpu_device
from farm.errors import InputError
from farm.model.problem import Problem
from farm.replay.tunable_runtime import TunableRuntime
from farm.replay.tunable_settings import TunableSettings
from farm.store.overrides.files import autotune_metadata
from farm.store.overrides.entries import OverrideEntry
from farm.store.overrides.tunableop_csv import (
    gemm_signature,
    load_tunableop_csv,
    parse_tunableop_csv,
    render_tunableop_csv,
    write_tunableop_csv,
)

# as PyTorch writes it (2.6+ with leading dimensions; an older line without them; ops we have no mapping for)
PYTORCH_FILE = """Validator,PT_VERSION,2.13.0
Validator,ROCM_VERSION,7.1.0.0-55-abc
Validator,HIPBLASLT_VERSION,1.1.0-abc
Validator,GCN_ARCH_NAME,gfx942:sramecc+:xnack-
GemmTunableOp_Half_NN,nn_4096_1024_512_ld_4096_512_4096,Gemm_Hipblaslt_1234,0.0421
GemmTunableOp_float_TN,tn_32_64_16,Default,0.0100
GemmStridedBatchedTunableOp_Half_NT,nt_128_128_64_ld_128_128_128_B_8,Gemm_Rocblas_77,0.0312
ScaledGemmTunableOp_f8_f8_BFloat16_TN,tn_4096_4096_4096_ld_4096_4096_4096,Gemm_Hipblaslt_5,0.2
"""

DEVICE = {"signature": "cpu-x86_64-test", "properties": {"name": "test", "arch": "x86_64", "libraries": {"torch": "2.13.0"}}}


def meta(t=0.5):
    return autotune_metadata(rank=0, min_ms=t, avg_ms=t, stddev_ms=0.0, workspace=0, mode="standard",
                             ran_exhaustive=False, strategy="fixed_average", iterations=3, converged=False,
                             device="x86_64", timestamp="2026-11-30T00:00:00Z", median_time_ms=t)


def test_a_pytorch_file_maps_its_gemms_onto_our_problems():
    f = parse_tunableop_csv(PYTORCH_FILE, source="tunableop_results0.csv")
    # nn_4096_1024_512: column-major C^T (4096 x 1024) = B^T A^T, so A is 1024 x 512 and B is 512 x 4096, row-major
    half = Problem.create("matmul", {"A": [1024, 512], "B": [512, 4096]}, dtype="fp16")
    assert f.match(half).engine_name == "Gemm_Hipblaslt_1234"
    # tn: the first operand (B) transposed, i.e. B column-major; no _ld_ part: dense leading dimensions
    b_col = Problem.create("matmul", {"A": [64, 16], "B": {"dims": [16, 32], "strides": [1, 16]}}, dtype="fp32")
    assert f.match(b_col).engine_name == "Default"
    assert f.match(Problem.create("matmul", {"A": [64, 16], "B": [16, 32]})) is None  # row-major B: another GEMM


def test_our_lines_round_trip_with_strides_knobs_and_other_ops(tmp_path):
    col_b = Problem.create("matmul", {"A": [16, 5], "B": {"dims": [5, 6], "strides": [1, 5]}})
    row_b = Problem.create("matmul", {"A": [16, 5], "B": [5, 6]})
    conv = Problem.create("conv_fprop", {"X": [1, 4, 8, 8], "W": [6, 4, 3, 3]}, criteria={"pad_h": 1, "pad_w": 1},
                          dtype="fp16")
    entries = [OverrideEntry.for_problem(col_b, "cpu.matmul.blas", (("order", "transposed"),), meta(0.25)),
               OverrideEntry.for_problem(row_b, "triton.gemm", (("BLOCK_M", 64), ("alpha", 0.5)), meta()),
               OverrideEntry.for_problem(conv, "cpu.conv.im2col", (), meta(1.5))]
    path = tmp_path / "r.csv"
    write_tunableop_csv(path, entries, device=DEVICE)
    rows = list(csv.reader(open(path)))
    assert ["Validator", "PT_VERSION", "2.13.0"] in rows and ["Validator", "DEVICE_SIGNATURE", DEVICE["signature"]] in rows
    lines = {r[0] + "," + r[1]: r for r in rows if r[0] != "Validator"}
    # a column-major B: the runtime tuner's line cannot say it, PyTorch's can (the strides decide the letters)
    assert lines["GemmTunableOp_float_TN,tn_6_16_5_ld_5_5_6"][2:] == ["cpu.matmul.blas[order=transposed]", "0.250000"]
    assert "GemmTunableOp_Float32,taN_m16_n6_k5_bias0_dev0" in lines  # the runtime tuner's own line
    assert all("," not in r[1] for r in rows)  # TunableOp splits lines on commas
    back = load_tunableop_csv(path)
    assert back.device_signature == DEVICE["signature"]
    assert back.match(col_b).knobs == (("order", "transposed"),) and back.match(row_b).engine_name == "triton.gemm"
    assert back.match(row_b).knobs == (("BLOCK_M", 64), ("alpha", 0.5))
    assert back.match(conv).engine_name == "cpu.conv.im2col"
    assert back.match(Problem.create("conv_fprop", {"X": [1, 4, 8, 8], "W": [6, 4, 3, 3]}, dtype="fp16")) is None


def test_a_tunableop_users_validators_and_other_lines_survive_our_append(tmp_path):
    path = tmp_path / "tunableop_results0.csv"
    path.write_text(PYTORCH_FILE)
    p = Problem.create("matmul", {"A": [8, 8], "B": [8, 8]})
    write_tunableop_csv(path, [OverrideEntry.for_problem(p, "cpu.matmul.blas", (), meta())], device=DEVICE)
    text = path.read_text()
    for line in PYTORCH_FILE.splitlines():
        assert line in text, line  # every validator and line PyTorch wrote, verbatim
    assert load_tunableop_csv(path).match(p).engine_name == "cpu.matmul.blas"
    assert render_tunableop_csv(load_tunableop_csv(path)) == text  # stable: reading and writing changes nothing


def test_no_gemm_line_for_what_a_blas_gemm_is_not():
    bias = Problem.create("matmul", {"A": [4, 4], "B": [4, 4], "bias": [4]})
    tf32 = Problem.create("matmul", {"A": [4, 4], "B": [4, 4]}, compute_dtype="tf32")
    assert gemm_signature(OverrideEntry.for_problem(bias, "e")) is None
    assert gemm_signature(OverrideEntry.for_problem(tf32, "e")) is None


def test_a_malformed_validator_names_the_line():
    with pytest.raises(InputError) as info:
        parse_tunableop_csv("Validator,PT_VERSION\n", source="bad.csv")
    assert info.value.field == "line 1" and "bad.csv" in str(info.value)


GOOD_LINE = "GemmTunableOp_float_NN,nn_4_4_4_ld_4_4_4,Default,0.0100\n"


@pytest.mark.parametrize("bad", ["GemmTunableOp_float_NN,nn_1_1_1", "oops", "GemmTunableOp_float_NN,nn_8_8_8_ld_8_8_8,Default,nan",
                                 "GemmTunableOp_float_NN,nn_8_8_8_ld_8_8_8,Default,inf"])
def test_one_bad_result_line_is_kept_as_it_is_and_the_others_replay(tmp_path, caplog, bad):
    # the seed invites hand edits: one line gone wrong (too few fields, a time that is no number) costs that line
    text = "Validator,PT_VERSION,2.13.0\n" + bad + "\n" + GOOD_LINE
    f = parse_tunableop_csv(text, source="edited.csv")
    assert [e.engine_name for e in f.entries] == ["Default"] and f.entries[0].problem() is not None
    path = tmp_path / "edited.csv"
    path.write_text(text)
    write_tunableop_csv(path, [], device=None)  # an append keeps it, file and bad line, nothing moved aside
    assert bad in path.read_text() and GOOD_LINE.strip() in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["edited.csv"]


def test_a_byte_order_mark_from_a_spreadsheet_save_is_read_past():
    f = parse_tunableop_csv("\ufeffValidator,PT_VERSION,2.13.0\n" + GOOD_LINE, source="saved.csv")
    assert len(f.entries) == 1 and f.extra["tunableop_validators"][0][1] == "PT_VERSION"


# -- the runtime, TunableOp-style, on a .csv file --------------------------------------------------
@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in ("FARM_TUNABLE_ENABLED", "FARM_TUNABLE_TUNING", "FARM_TUNABLE_FILENAME", "FARM_HEUR_CONFIG_PATH",
                 "HIPDNN_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER"):
        monkeypatch.delenv(name, raising=False)
    ops.reset()
    yield
    ops.reset()


def settings(tmp_path, **kw):
    return TunableSettings(**{**dict(enabled=True, tuning=True, max_tuning_duration_ms=2, max_tuning_samples=3,
                                     filename=str(tmp_path / "tunableop_results.csv")), **kw})


def test_the_runtime_records_and_replays_a_csv_file(tmp_path):
    p = Problem.create("matmul", {"A": [24, 24], "B": [24, 24]})
    rt = TunableRuntime(cpu_device(), settings=settings(tmp_path))
    tuned = rt.bind(p.key, p)
    assert tuned.source == "tuned" and rt.measurements == 1
    path = tmp_path / "tunableop_results0.csv"
    assert path.exists() and "GemmTunableOp_Float32,taN_m24_n24_k24_bias0_dev0," in path.read_text()
    again = TunableRuntime(cpu_device(), settings=settings(tmp_path, tuning=False))
    b = again.bind(p.key, p)
    assert (b.source, b.engine_name, b.knobs, again.measurements) == ("recorded", tuned.engine_name, tuned.knobs, 0)


def test_a_default_kernel_is_the_heuristic_choice_with_tuning_on(tmp_path):
    (tmp_path / "tunableop_results0.csv").write_text(
        "Validator,PT_VERSION,2.13.0\nGemmTunableOp_float_NN,nn_24_24_24_ld_24_24_24,Default,0.01\n")
    ops.enable()
    ops.set_filename(str(tmp_path / "tunableop_results.csv"))
    a = np.random.default_rng(0).standard_normal((24, 24)).astype(np.float32)
    np.testing.assert_allclose(ops.matmul(a, a), a @ a, rtol=1e-4, atol=1e-4)
    (choice,) = ops.choices()
    assert choice["source"] not in ("tuned", "recorded")  # a policy's answer: StaticOrdering here
    assert ops.runtime("cpu", 0).measurements == 0


def test_write_file_keeps_what_a_tunableop_file_held(tmp_path):
    src = tmp_path / "tunableop_results0.csv"
    cuda_less = "\n".join(line for line in PYTORCH_FILE.splitlines() if "GCN_ARCH_NAME" not in line) + "\n"
    src.write_text(cuda_less)  # PyTorch's lines without a device line: judged on PT_VERSION alone
    rt = TunableRuntime(cpu_device(), settings=settings(tmp_path, tuning=False))
    assert rt.read_file()
    out = tmp_path / "copy.csv"
    rt.write_file(str(out))
    assert all(line in out.read_text() for line in cuda_less.splitlines()[1:])
    assert json.dumps(rt.get_results()) and json.dumps(rt.results())  # the API's views of it serialise
