"""The runtime tuner's results file on this GPU (issue 45): the document's validators written with this device's
values, its GEMM lines (a cuBLASLt algorithm as ``lt_id.._tile..``) written, replayed by a fresh runtime without
measuring, and the same file refused once it names another GPU."""

import pytest

from .conftest import cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
pytest.importorskip("nvmath", reason="cuBLASLt's algorithms are planned with nvmath-python")

from farm.devices.device import gpu_device  # noqa: E402
from farm.model.engine import EngineRegistry, default_engine_registry  # noqa: E402
from farm.model.problem import Problem  # noqa: E402
from farm.replay.tunable_runtime import TunableRuntime  # noqa: E402
from farm.replay.tunable_settings import TunableSettings  # noqa: E402


def test_a_cublaslt_winner_is_written_as_the_document_writes_it_and_replayed(tmp_path, capsys):
    dev = gpu_device("cuda", 0)
    registry = EngineRegistry([default_engine_registry().get("cublaslt")])  # the winner is one of its algorithms
    p = Problem.create("matmul", {"A": [512, 256], "B": [256, 1024]})
    settings = TunableSettings(enabled=True, tuning=True, max_tuning_duration_ms=5, max_tuning_samples=5,
                               filename=str(tmp_path / "tunableop_results.csv"))
    tuned = TunableRuntime(dev, settings=settings, registry=registry).bind(p.key, p)
    path = tmp_path / f"tunableop_results{dev.properties.index}.csv"
    text = path.read_text()
    with capsys.disabled():
        print("\n" + text)  # the record of what this GPU wrote
    rows = [line.split(",") for line in text.splitlines()]
    validators = {r[1]: r[2] for r in rows if r[0] == "Validator"}
    major, minor = dev.properties.arch[3:-1], dev.properties.arch[-1]
    assert validators["TP_TUNABLEOP_FORMAT"] == "1"
    assert validators["CUDA_DEVICE"] == f"{int(major)}.{minor}:{dev.properties.name}"
    assert validators["CUBLASLT_VERSION"].isdigit()
    import torch

    from farm.devices.runtimes.cuda import loaded_cublaslt_version

    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # torch's cuBLASLt loaded
    assert validators["CUBLASLT_VERSION"] == loaded_cublaslt_version()  # the loaded library's, not a wheel's
    assert int(loaded_cublaslt_version()) // 10000 == int(torch.version.cuda.split(".")[0])
    [line] = [r for r in rows if r[0] != "Validator"]
    assert line[:2] == ["GemmTunableOp_Float32", f"taN_m512_n1024_k256_bias0_dev{dev.properties.index}"]
    if len(tuned.knobs) == 9:  # one of the algorithms cuBLASLt listed: the document's lt_ name
        assert line[2].startswith("lt_id") and "_tile" in line[2] and "_cluster" in line[2]
    else:  # cuBLASLt's own first choice (no algorithm fixed)
        assert line[2].startswith("cublaslt")
    again = TunableRuntime(dev, settings=TunableSettings(enabled=True, tuning=False, filename=settings.filename),
                           registry=registry)
    bound = again.bind(p.key, p)
    assert (bound.source, bound.engine_name, bound.knobs, again.measurements) == \
        ("recorded", "cublaslt", tuned.knobs, 0)
    # the same lines under another GPU's CUDA_DEVICE: refused, renamed nothing
    path.write_text(text.replace(validators["CUDA_DEVICE"], "8.9:NVIDIA GeForce RTX 4090"))
    other = TunableRuntime(dev, settings=TunableSettings(enabled=True, tuning=False, filename=settings.filename),
                           registry=registry)
    assert not other.read_file() and path.exists()
