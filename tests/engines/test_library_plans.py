"""Engines over a library's plan list (cudnn.graph, cublaslt): what runs without a GPU.

The GPU side (plans listed, built, checked, replayed) is tests/gpu/test_library_engines.py.
"""

import threading

import pytest

from fakes import TILE, FakeEngine, fake_device, fake_props, matmul_problem, registry_of
from farm import AutotuneConfig, Autotuner
from farm.devices.device import Device
from farm.errors import InputError
from farm.model.problem import Problem


class ListingEngine(FakeEngine):
    """A fake whose "library" lists plans for each problem."""

    def __init__(self, name, listed=(), fail=None, **kw):
        super().__init__(name, knobs=(TILE,), **kw)
        self.listed, self.fail, self.asked = list(listed), fail, 0

    def list_plans(self, problem, device):
        self.asked += 1
        if self.fail:
            raise RuntimeError(self.fail)
        return self.listed


CONFIG = AutotuneConfig(strategy="fixed_average", timed_iterations=2, warmup_iterations=0)


def test_each_listed_plan_is_a_candidate_beside_the_default():
    engine = ListingEngine("lib", listed=[{"tile": 32}, {"tile": 128}, {"tile": 32}])
    t = Autotuner(matmul_problem(), fake_device(), registry=registry_of(engine))
    t.add_all_engines()
    results = t.autotune(config=CONFIG)
    assert sorted(str(dict(r.knobs).get("tile", "default")) for r in results) == ["128", "32", "default"]  # a repeat once
    assert all(r.succeeded for r in results) and engine.asked == 1


def test_a_listing_that_fails_costs_only_the_listed_plans(caplog):
    engine = ListingEngine("lib", fail="CUDNN_STATUS_NOT_SUPPORTED")
    t = Autotuner(matmul_problem(), fake_device(), registry=registry_of(engine))
    t.add_all_engines()
    results = t.autotune(config=CONFIG)
    assert [r.knobs for r in results] == [()]  # the default still runs
    assert any("lists no plans here" in m and "CUDNN_STATUS_NOT_SUPPORTED" in m for m in caplog.messages)


def test_a_listed_plan_with_an_unknown_knob_is_an_error_naming_it():
    engine = ListingEngine("lib", listed=[{"tiles": 32}])
    t = Autotuner(matmul_problem(), fake_device(), registry=registry_of(engine))
    with pytest.raises(InputError, match="tiles"):
        t.add_all_engines()


def test_cudnn_plan_names_become_knobs_and_unknown_numbers_are_not_listed():
    from engines.gpu.cudnn_graph import CUDNN_KNOBS, CudnnGraph, _Graph, parse_plan_name

    assert parse_plan_name("eng62_k2=5_k13=1_k18=0_k27=8") == {"engine": 62, "TILE_SIZE": 5, "TILEK": 1,
                                                               "IDX_MODE": 0, "TILE_CGA_M": 8}
    assert parse_plan_name("eng45_k2=4_k5=3_k14=3") == {"engine": 45, "TILE_SIZE": 4, "KBLOCK": 3, "STAGES": 3}
    assert parse_plan_name("eng0") == {"engine": 0}
    assert parse_plan_name(f"eng1_k{len(CUDNN_KNOBS)}=1") is None  # a knob newer than this table: not replayable
    assert parse_plan_name("eng1#dup3") is None and parse_plan_name("cutlass_sm90") is None
    assert {k.name for k in CudnnGraph.knobs} == {"engine", *CUDNN_KNOBS}

    g = _Graph(None, {}, ["eng62_k2=5_k13=1", "eng45_k2=4_k5=3", "eng0"])
    unset = {k.name: -1 for k in CudnnGraph.knobs}
    assert g.index_of(unset) == 0  # engine -1: cuDNN's first choice
    assert g.index_of({**unset, "engine": 45, "TILE_SIZE": 4, "KBLOCK": 3}) == 1
    assert g.index_of({**unset, "engine": 0}) == 2
    with pytest.raises(RuntimeError, match="cuDNN lists no plan engine=45,TILE_SIZE=5"):
        g.index_of({**unset, "engine": 45, "TILE_SIZE": 5})


def test_cublaslt_algorithms_are_found_by_their_configuration():
    from engines.gpu.cublaslt import ALGO_FIELDS, _Planned

    class Config:
        def __init__(self, **values):
            self.__dict__.update(values)

    class Algo:
        def __init__(self, **values):
            self.config_ifc = Config(**{ALGO_FIELDS[k]: v for k, v in values.items()})

    algos = [Algo(algo=21, tile=18, stages=8, split_k=1), Algo(algo=21, tile=18, stages=8, split_k=4),
             Algo(algo=66, tile=20, stages=0, split_k=1)]
    p = _Planned(None, algos, ())
    assert p.settings[1] == {"algo": 21, "tile": 18, "stages": 8, "split_k": 4}
    assert p.index_of({"algo": -1, "tile": -1}) == 0
    assert p.index_of({"algo": 21, "split_k": 4, "tile": -1}) == 1
    assert p.index_of({"algo": 66}) == 2
    with pytest.raises(RuntimeError, match="cuBLASLt lists no algorithm algo=66,split_k=4"):
        p.index_of({"algo": 66, "split_k": 4})


def gpu_like_device():
    """A device that says it is an NVIDIA GPU (its arrays are numpy: only discovery is asked of it)."""
    cpu = fake_device()
    return Device(cpu.runtime, 0, fake_props(), cpu.arrays, cpu.timer)


@pytest.mark.parametrize("name", ["cudnn.graph", "cublaslt"])
def test_without_the_library_discovery_names_the_package(monkeypatch, name):
    import engines.gpu._common as common
    from farm.model.engine import default_engine_registry

    monkeypatch.setattr(common, "torch_or_reason", lambda: (object(), ""))
    module = {"cudnn.graph": "engines.gpu.cudnn_graph", "cublaslt": "engines.gpu.cublaslt"}[name]
    package = {"cudnn.graph": "nvidia-cudnn-frontend", "cublaslt": "nvmath-python"}[name]
    import importlib

    mod = importlib.import_module(module)
    getter = {"cudnn.graph": "cudnn_or_reason", "cublaslt": "nvmath_or_reason"}[name]
    monkeypatch.setattr(mod, getter, lambda: (None, f"{package} is not installed (pip install 'tunefarm[cuda-libs]')"))
    reg = default_engine_registry()
    problem = Problem.create("matmul", {"A": [16, 64], "B": [64, 32]}, dtype="bf16")
    cfg = reg.config_for(reg.get(name), problem, gpu_like_device())
    assert not cfg.applicable and package in cfg.reason
    cpu = reg.config_for(reg.get(name), problem, fake_device())
    assert not cpu.applicable and "NVIDIA or AMD" in cpu.reason


def test_what_the_library_engines_take_is_said_before_any_library_is_asked(monkeypatch):
    import engines.gpu._common as common
    import engines.gpu.cublaslt as lt
    import engines.gpu.cudnn_graph as dnn
    from farm.model.engine import default_engine_registry

    monkeypatch.setattr(common, "torch_or_reason", lambda: (object(), ""))
    monkeypatch.setattr(dnn, "cudnn_or_reason", lambda: (object(), ""))
    monkeypatch.setattr(lt, "nvmath_or_reason", lambda: (object(), ""))
    reg = default_engine_registry()
    dev = gpu_like_device()

    def reason(name, problem):
        return reg.config_for(reg.get(name), problem, dev).reason

    biased = Problem.create("matmul", {"A": [16, 64], "B": [64, 32], "bias": [32]}, dtype="bf16")
    assert "bias" in reason("cublaslt", biased) and "bias" in reason("cudnn.graph", biased)
    assert "fp32" in reason("cudnn.graph", Problem.create("matmul", {"A": [16, 64], "B": [64, 32]}))
    head = Problem.create("sdpa_fwd", {"Q": [1, 2, 64, 100], "K": [1, 2, 64, 100], "V": [1, 2, 64, 100]}, dtype="fp16")
    assert "head dim 100" in reason("cudnn.graph", head)
    four = Problem.create("matmul", {"A": [2, 3, 16, 64], "B": [2, 3, 64, 32]}, dtype="bf16")
    assert reason("cudnn.graph", four) == "" and "at most one batch" in reason("cublaslt", four)
    conv = Problem.create("conv_fprop", {"X": [2, 8, 16, 16], "W": [8, 8, 3, 3]}, dtype="fp16")
    assert reason("cudnn.graph", conv) == ""


def test_plan_limit_comes_from_the_environment(monkeypatch):
    from engines.gpu.library_plans import DEFAULT_PLANS, PLANS_ENV, plan_limit

    monkeypatch.delenv(PLANS_ENV, raising=False)
    assert plan_limit() == DEFAULT_PLANS
    monkeypatch.setenv(PLANS_ENV, "4")
    assert plan_limit() == 4
    for bad in ("many", "0"):
        monkeypatch.setenv(PLANS_ENV, bad)
        with pytest.raises(InputError) as info:
            plan_limit()
        assert info.value.field == PLANS_ENV and info.value.value == bad


def test_plans_are_built_once_when_threads_ask_together():
    from engines.gpu.library_plans import PlanCache

    cache, made, gate = PlanCache(), [], threading.Barrier(8)

    def make():
        made.append(1)
        return object()

    got = []

    def ask():
        gate.wait()
        got.append(cache.get("key", make))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(made) == 1 and len({id(g) for g in got}) == 1 and len(cache) == 1


def test_an_empty_triton_hook_chain_is_no_hook():
    """Triton 3.6 keeps an empty HookChain as the launch hook: launches must still go straight to the kernel."""
    from engines.gpu.triton_gemm import _hook_set

    class Chain:
        def __init__(self, calls):
            self.calls = calls

        def __call__(self, *a):
            pass

    assert not _hook_set(None) and not _hook_set(Chain([]))
    assert _hook_set(Chain([print])) and _hook_set(print)
