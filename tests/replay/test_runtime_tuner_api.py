"""The runtime tuner's API as its design document lists it, at module level in farm.ops, and its environment
variables beside ours (ours win when both are set)."""

import numpy as np
import pytest

import farm.ops as ops
from farm.replay.tunable_settings import TunableSettings

API = ["enable", "disable", "is_enabled", "tuning_enable", "tuning_disable", "tuning_is_enabled",
       "record_untuned_enable", "record_untuned_disable", "record_untuned_is_enabled", "set_verbose",
       "set_max_tuning_duration", "get_max_tuning_duration", "set_max_tuning_samples", "get_max_tuning_samples",
       "set_filename", "get_filename", "read_file", "write_file", "get_results"]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith(("FARM_TUNABLE_", "TP_TUNABLEOP_", "FARM_HEUR_", "HIPDNN_HEUR_")):
            monkeypatch.delenv(name)
    ops.reset()
    yield
    ops.reset()


def test_every_call_of_the_documents_table_exists_at_module_level():
    missing = [name for name in API if not callable(getattr(ops, name, None))]
    assert missing == []


def test_switches_and_budgets_read_back_what_was_set():
    assert not ops.is_enabled() and ops.tuning_is_enabled() and not ops.record_untuned_is_enabled()
    ops.enable()
    ops.tuning_disable()
    ops.record_untuned_enable()
    ops.set_max_tuning_duration(12.5)
    ops.set_max_tuning_samples(7)
    assert ops.is_enabled() and not ops.tuning_is_enabled() and ops.record_untuned_is_enabled()
    assert ops.get_max_tuning_duration() == 12.5 and ops.get_max_tuning_samples() == 7
    assert ops.get_max_tuning_iterations() == 7  # PyTorch TunableOp's name of the same setting
    ops.disable()
    ops.record_untuned_disable()
    assert not ops.is_enabled() and not ops.record_untuned_is_enabled()
    with pytest.raises(ValueError):
        ops.set_max_tuning_samples(-1)


def test_results_round_trip_through_the_files_as_op_params_kernel_time_tuples(tmp_path):
    path = str(tmp_path / "results.json")
    ops.enable()
    ops.set_filename(path)
    ops.set_max_tuning_duration(2)
    ops.set_max_tuning_samples(3)
    a, b = np.ones((32, 16), np.float32), np.ones((16, 8), np.float32)
    ops.matmul(a, b)
    results = ops.get_results()
    assert len(results) == 1
    op, params, kernel, time_ms = results[0]
    # a GEMM is named as the runtime tuner names it (GemmTunableOp_<dtype>, params "taN_m.._n.._k.._bias0_dev0")
    assert op == "GemmTunableOp_Float32" and kernel.startswith("cpu.matmul.") and time_ms > 0
    assert params == "taN_m32_n8_k16_bias0_dev0"
    ops.write_file()
    assert ops.get_filename().startswith(str(tmp_path / "results"))
    ops.reset()
    ops.enable()
    assert ops.read_file(str(tmp_path / "results0.json"))  # the device ordinal goes before the extension
    assert ops.get_results() == results


def test_the_documents_variables_are_read_and_ours_win(monkeypatch):
    monkeypatch.setenv("TP_TUNABLEOP_ENABLED", "1")
    monkeypatch.setenv("TP_TUNABLEOP_MAX_TUNING_SAMPLES", "9")
    monkeypatch.setenv("TP_TUNABLEOP_FILENAME", "doc.json")
    s = TunableSettings.from_env()
    assert s.enabled and s.max_tuning_samples == 9 and s.filename == "doc.json"
    monkeypatch.setenv("FARM_TUNABLE_MAX_TUNING_SAMPLES", "4")
    monkeypatch.setenv("FARM_TUNABLE_ENABLED", "0")
    s = TunableSettings.from_env()
    assert not s.enabled and s.max_tuning_samples == 4 and s.filename == "doc.json"
    monkeypatch.setenv("TP_TUNABLEOP_MAX_TUNING_DURATION_MS", "-3")  # a bad value: warned about, default kept
    assert TunableSettings.from_env().max_tuning_duration_ms == 30.0


def test_the_documents_variables_bring_its_default_results_file(monkeypatch, tmp_path):
    assert TunableSettings.from_env().filename == "farm_tunable_results.json"  # ours, when ours configure it
    monkeypatch.setenv("TP_TUNABLEOP_ENABLED", "1")
    assert TunableSettings.from_env().filename == "tunableop_results.csv"  # the document's, in its CSV format
    monkeypatch.chdir(tmp_path)
    ops.reset()
    ops.set_max_tuning_duration(2)
    ops.set_max_tuning_samples(3)
    ops.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
    assert (tmp_path / "tunableop_results0.csv").read_text().startswith("Validator,TP_TUNABLEOP_FORMAT,1")


def test_layernorm_and_rmsnorm_replay_through_farm_ops():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    scale, bias = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    y = ops.layernorm(x, scale, bias)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    assert np.allclose(y, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, atol=1e-4)
    r = ops.rmsnorm(x, scale)
    assert np.allclose(r, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * scale, atol=1e-4)
    ops_seen = {c["problem"].split("(")[0].split()[0] for c in ops.choices()}
    assert any("layernorm" in c["problem"] for c in ops.choices()) and any("rmsnorm" in c["problem"]
                                                                          for c in ops.choices()), ops_seen


def test_a_published_norm_winner_is_what_farm_ops_runs(tmp_path, monkeypatch):
    from farm.devices.device import cpu_device
    from farm.model.problem import Problem
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    device = cpu_device()
    p = Problem.create("rmsnorm", {"X": [8, 64], "scale": [64]})
    path = tmp_path / "o.json"
    write_overrides(path, [OverrideEntry.for_problem(p, "cpu.rmsnorm.einsum", (), {"rank": 0})],
                    device={"signature": device.signature, "properties": device.properties.to_dict()}, mode="new")
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(path))
    ops.reset()
    ops.rmsnorm(np.ones((8, 64), np.float32), np.ones(64, np.float32))
    [choice] = ops.choices()
    assert choice["engine"] == "cpu.rmsnorm.einsum" and choice["source"] == "SelectionHeuristic::Config"


def test_the_documents_csv_round_trips_and_another_devices_file_is_refused_with_the_reason(tmp_path, caplog):
    import logging

    path = tmp_path / "tunableop_results0.csv"
    ops.enable()
    ops.set_filename(str(tmp_path / "tunableop_results.csv"))
    ops.set_max_tuning_duration(2)
    ops.set_max_tuning_samples(3)
    ops.matmul(np.ones((24, 16), np.float32), np.ones((16, 8), np.float32))
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == "Validator,TP_TUNABLEOP_FORMAT,1" and lines[1].startswith("Validator,")
    result = [line for line in lines if not line.startswith("Validator")]
    assert len(result) == 1 and len(result[0].split(",")) == 4  # op,params,kernel,avg_time
    before = ops.get_results()
    ops.reset()
    ops.enable()
    assert ops.read_file(str(path)) and ops.get_results() == before  # the round trip

    arch = next(line for line in lines if line.startswith("Validator,ARCH,"))
    foreign = tmp_path / "other.csv"
    foreign.write_text(text.replace(arch, "Validator,ARCH,gfx942"))
    ops.reset()
    ops.enable()
    ops.set_verbose(True)
    with caplog.at_level(logging.WARNING, logger="farm"):
        assert not ops.read_file(str(foreign))
    assert "ARCH gfx942 vs" in caplog.text and foreign.exists()  # the reason, and the file left as it is
    assert ops.get_results() == []
    unknown = tmp_path / "v2.csv"
    unknown.write_text(text.replace("TP_TUNABLEOP_FORMAT,1", "TP_TUNABLEOP_FORMAT,2"))
    with caplog.at_level(logging.WARNING, logger="farm"):
        assert not ops.read_file(str(unknown))
    assert "TP_TUNABLEOP_FORMAT 2" in caplog.text
