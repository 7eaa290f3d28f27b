"""The runtime tuner's results file as its design document writes it (issue 45): its validators written and
compared (a file of another GPU refused), its own GEMM lines read, replayed and written."""

import csv
import io
import logging

import pytest

from farm.devices.device import cpu_device
from farm.model.problem import Problem
from farm.replay.tunable_runtime import TunableRuntime
from farm.replay.tunable_settings import TunableSettings
from farm.store.overrides.entries import OverrideEntry
from farm.store.overrides.tunableop_csv import (
    device_validators,
    load_tunableop_csv,
    parse_tunableop_csv,
    render_tunableop_csv,
    result_line,
    validator_mismatch,
    write_tunableop_csv,
)

# the document's own example file, line for line
SEED_FILE = """Validator,TP_TUNABLEOP_FORMAT,1
Validator,CUDA_DEVICE,8.9:NVIDIA GeForce RTX 4090
Validator,CUBLASLT_VERSION,120300
GemmTunableOp_Float32,taN_m512_n1024_k256_bias0_dev0,lt_id7_tile12_stages3_splitk0_red0_swizzle0_custom0_inner1_cluster1,0.033
GemmTunableOp_Tf32,taT_m4096_n4096_k4096_bias0_dev0,Default,1.262
"""


def nvidia(name="NVIDIA GeForce RTX 4090", arch="sm_89", cublas="12.3.0.1", index=0):
    return {"signature": f"nvidia-{arch}-test", "properties": {"vendor": "nvidia", "name": name, "arch": arch,
                                                               "index": index, "libraries": {"cublas": cublas}}}


def test_the_documents_file_is_for_the_gpu_and_cublaslt_it_names():
    f = parse_tunableop_csv(SEED_FILE)
    assert validator_mismatch(f, nvidia()) == ""
    other_gpu = validator_mismatch(f, nvidia("NVIDIA H200", "sm_90", "12.8.4.1"))
    assert "CUDA_DEVICE 8.9:NVIDIA GeForce RTX 4090 vs 9.0:NVIDIA H200" in other_gpu
    assert "CUBLASLT_VERSION 120300 vs 120804" in other_gpu
    assert "CUBLASLT_VERSION" in validator_mismatch(f, nvidia(cublas="12.4.5.8"))  # same GPU, another cuBLASLt


def test_our_validators_are_the_documents_and_a_rewrite_keeps_one_device():
    rows = device_validators(nvidia("NVIDIA H200", "sm_90", "12.8.4.1"))
    assert ["Validator", "TP_TUNABLEOP_FORMAT", "1"] == rows[0]
    assert ["Validator", "CUDA_DEVICE", "9.0:NVIDIA H200"] in rows and ["Validator", "CUBLASLT_VERSION", "120804"] in rows
    amd = {"signature": "amd-mi300x", "properties": {"vendor": "amd", "name": "AMD Instinct MI300X", "arch": "gfx942"}}
    assert ["Validator", "GCN_ARCH_NAME", "gfx942"] in device_validators(amd)
    f = parse_tunableop_csv(SEED_FILE)
    text = render_tunableop_csv(f.__class__(f.version, f.entries, nvidia(), f.extra, f.source))
    assert text.count("Validator,CUDA_DEVICE,") == 1 and text.count("Validator,CUBLASLT_VERSION,") == 1


def test_the_documents_gemm_lines_map_onto_our_problems_and_back():
    f = parse_tunableop_csv(SEED_FILE)
    fp32 = Problem.create("matmul", {"A": [512, 256], "B": [256, 1024]})
    hit = f.match(fp32)
    assert hit.engine_name == "cublaslt" and dict(hit.knobs) == {
        "algo": 7, "tile": 12, "stages": 3, "split_k": 0, "reduction": 0, "swizzle": 0, "custom": 0, "inner_shape": 1,
        "cluster": 1}
    # taT: A given transposed (column-major); Tf32: fp32 data computed in tf32
    tf32 = Problem.create("matmul", {"A": {"dims": [4096, 4096], "strides": [1, 4096]}, "B": [4096, 4096]},
                          compute_dtype="tf32")
    assert f.match(tf32).engine_name == "Default"
    assert f.match(Problem.create("matmul", {"A": [4096, 4096], "B": [4096, 4096]}, compute_dtype="tf32")) is None
    # written as the document writes it
    fresh = OverrideEntry.for_problem(fp32, "cublaslt", hit.knobs)
    assert result_line(fresh)[:3] == ["GemmTunableOp_Float32", "taN_m512_n1024_k256_bias0_dev0",
                                      "lt_id7_tile12_stages3_splitk0_red0_swizzle0_custom0_inner1_cluster1"]
    bias = Problem.create("matmul", {"A": [64, 32], "B": [32, 16], "bias": [16]}, dtype="fp16")
    assert result_line(OverrideEntry.for_problem(bias, "cublaslt"), ordinal=1)[:2] == [
        "GemmTunableOp_Float16", "taN_m64_n16_k32_bias1_dev1"]
    assert parse_tunableop_csv("Validator,TP_TUNABLEOP_FORMAT,1\nGemmTunableOp_Float16,taN_m64_n16_k32_bias1_dev1,"
                               "cublaslt,0.1\n").match(bias) is not None


def test_a_line_of_another_device_ordinal_is_kept_not_replayed():
    text = SEED_FILE.replace("bias0_dev0,lt_", "bias0_dev1,lt_")
    f = parse_tunableop_csv(text, ordinal=0)
    assert f.match(Problem.create("matmul", {"A": [512, 256], "B": [256, 1024]})) is None
    assert "taN_m512_n1024_k256_bias0_dev1" in render_tunableop_csv(f)
    assert parse_tunableop_csv(text, ordinal=1).match(Problem.create("matmul", {"A": [512, 256], "B": [256, 1024]}))


def settings(tmp_path, **kw):
    return TunableSettings(**{**dict(enabled=True, tuning=False, verbose=True,
                                     filename=str(tmp_path / "tunableop_results.csv")), **kw})


def test_read_file_refuses_the_documents_file_on_another_device_and_says_why(tmp_path, caplog):
    path = tmp_path / "tunableop_results0.csv"
    path.write_text(SEED_FILE)
    rt = TunableRuntime(cpu_device(), settings=settings(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert not rt.read_file()
    assert "CUDA_DEVICE 8.9:NVIDIA GeForce RTX 4090" in caplog.text and path.read_text() == SEED_FILE
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("Validator,SOME_OTHER_KEY,1\n")  # the document's test: nothing it knows: refused
    assert not rt.read_file(str(unknown)) and "SOME_OTHER_KEY" in caplog.text
    bad_format = tmp_path / "bad.csv"
    bad_format.write_text("Validator,TP_TUNABLEOP_FORMAT,999\nGemmTunableOp_Float32,taN_m1_n1_k1_bias0_dev0,Default,0\n")
    assert not rt.read_file(str(bad_format))


def test_the_documents_lines_are_replayed_on_the_device_they_were_written_for(tmp_path):
    dev = cpu_device()
    obj = {"signature": dev.signature, "properties": dev.properties.to_dict()}
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(device_validators(obj))
    buf.write("GemmTunableOp_Float32,taN_m24_n24_k24_bias0_dev0,cpu.matmul.blas[order=transposed],0.01\n")
    (tmp_path / "tunableop_results0.csv").write_text(buf.getvalue())
    rt = TunableRuntime(dev, settings=settings(tmp_path))
    p = Problem.create("matmul", {"A": [24, 24], "B": [24, 24]})
    bound = rt.bind(p.key, p)
    assert (bound.source, bound.engine_name, dict(bound.knobs), rt.measurements) == \
        ("recorded", "cpu.matmul.blas", {"order": "transposed"}, 0)
    assert rt.get_results() == [("GemmTunableOp_Float32", "taN_m24_n24_k24_bias0_dev0",
                                 "cpu.matmul.blas[order=transposed]", 0.01)]


def test_tuning_writes_the_documents_lines_and_validators(tmp_path):
    rt = TunableRuntime(cpu_device(), settings=settings(tmp_path, tuning=True, max_tuning_duration_ms=2,
                                                        max_tuning_samples=3))
    p = Problem.create("matmul", {"A": [16, 8], "B": [8, 12]})
    assert rt.bind(p.key, p).source == "tuned"
    text = (tmp_path / "tunableop_results0.csv").read_text()
    assert text.startswith("Validator,TP_TUNABLEOP_FORMAT,1\n") and ",taN_m16_n12_k8_bias0_dev0," in text
    back = load_tunableop_csv(tmp_path / "tunableop_results0.csv", ordinal=0)
    assert back.match(p) is not None


@pytest.mark.parametrize("cublas, code", [("12.3.0.1", "120300"), ("12.8.4.1", "120804"), ("13.0.0.19", "130000")])
def test_cublaslt_version_is_the_libraries_number(cublas, code):
    rows = dict((r[1], r[2]) for r in device_validators(nvidia(cublas=cublas)))
    assert rows["CUBLASLT_VERSION"] == code


def test_a_file_written_with_our_validators_round_trips(tmp_path):
    p = Problem.create("matmul", {"A": [16, 8], "B": [8, 12]})
    path = tmp_path / "r.csv"
    write_tunableop_csv(path, [OverrideEntry.for_problem(p, "cublaslt", (("algo", 3),))], device=nvidia())
    f = load_tunableop_csv(path)
    assert validator_mismatch(f, nvidia()) == "" and f.match(p).knobs == (("algo", 3),)


def test_a_results_file_of_another_gpu_is_never_written_into_and_this_devices_results_live_beside_it(tmp_path):
    """The seed's own file of an RTX 4090 where this process's results file is named: refused, then a tuned shape
    is recorded beside it (never with this device's validators over the 4090's lines), and the next process on
    this device replays it from there while the 4090's file stays byte for byte."""
    path = tmp_path / "tunableop_results0.csv"
    path.write_text(SEED_FILE)
    dev = cpu_device()
    tune = settings(tmp_path, tuning=True, max_tuning_duration_ms=2, max_tuning_samples=3)
    rt = TunableRuntime(dev, settings=tune)
    p = Problem.create("matmul", {"A": [16, 8], "B": [8, 12]})
    assert rt.bind(p.key, p).source == "tuned"
    assert path.read_text() == SEED_FILE  # the other GPU's file as it was
    own = tmp_path / f"tunableop_results0.{dev.signature}.csv"
    assert rt.own_file(str(path)) == str(own) and own.exists()
    assert validator_mismatch(load_tunableop_csv(own), {"signature": dev.signature,
                                                         "properties": dev.properties.to_dict()}) == ""
    again = TunableRuntime(dev, settings=settings(tmp_path))
    assert again.bind(p.key, p).source == "recorded" and again.measurements == 0
    rt.write_file()  # an explicit write goes to this device's file too
    assert path.read_text() == SEED_FILE


def test_cublaslt_validator_is_the_loaded_librarys_number_where_known():
    """The runtime tuner gives the loaded cuBLASLt's cublasLtGetVersion() (farm.devices.runtimes.cuda): it wins over
    the pip wheel's release, and without the wheel a file claiming another cuBLASLt is still refused."""
    f = parse_tunableop_csv(SEED_FILE.replace("120300", "110000"))
    loaded = {**nvidia(cublas="12.3.0.1"), "cublaslt_version": "120300"}
    assert ["Validator", "CUBLASLT_VERSION", "120300"] in device_validators(loaded)
    no_wheel = nvidia()
    no_wheel["properties"]["libraries"] = {}
    assert "CUBLASLT_VERSION 110000 vs 120300" in validator_mismatch(f, {**no_wheel, "cublaslt_version": "120300"})
    assert validator_mismatch(f, no_wheel) == ""  # nothing known here to compare with: judged on the rest
