"""Replay is a library call: a lookup plus the library call, no copies, no processes or threads it was not asked for."""

import os
import subprocess
import sys
import textwrap

import numpy as np

import farm.ops as ops
from engines.cpu._base import FunctionPlan, blas_threads
from engines.cpu.matmul import BlasMatmul
from farm.devices.device import cpu_device
from farm.model.problem import Problem


def test_default_cpu_plan_hands_back_numpys_own_output_and_enters_no_context():
    problem = Problem.create("matmul", {"A": [32, 16], "B": [16, 8]}, dtype="fp32")
    plan = BlasMatmul().compile(problem, {"threads": 0, "order": "direct"}, cpu_device())
    assert plan.context is None and blas_threads(0) is None
    a, b = np.ones((32, 16), np.float32), np.ones((16, 8), np.float32)
    out = plan.produce({"A": a, "B": b})
    assert np.array_equal(out, a @ b)
    # a thread-count variant keeps its limit, and so runs into the given output (no produce)
    limited = BlasMatmul().compile(problem, {"threads": 1, "order": "direct"}, cpu_device())
    assert limited.context is not None and getattr(limited, "produce", None) is None
    assert getattr(FunctionPlan(lambda t, w: None, 16, None, lambda t: 0), "produce", None) is None  # workspace


def test_replay_returns_what_the_library_returns(monkeypatch):
    for name in ("FARM_TUNABLE_ENABLED", "FARM_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER"):
        monkeypatch.delenv(name, raising=False)
    ops.reset()
    a = np.random.default_rng(0).random((64, 48), dtype=np.float32)
    b = np.random.default_rng(1).random((48, 40), dtype=np.float32)
    calls = []
    real = np.matmul

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    c = ops.matmul(a, b)
    monkeypatch.setattr(np, "matmul", spy)
    c2 = ops.matmul(a, b)
    assert np.array_equal(c, c2) and calls == [{}]  # one library call, no out= buffer of ours
    ops.reset()


def test_replay_binds_each_layout_apart_and_keeps_no_callers_array_alive(monkeypatch):
    import gc
    import weakref

    for name in ("FARM_TUNABLE_ENABLED", "FARM_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER"):
        monkeypatch.delenv(name, raising=False)
    ops.reset()
    rng = np.random.default_rng(2)
    a = rng.random((24, 24), dtype=np.float32)
    b = rng.random((24, 24), dtype=np.float32)
    assert np.allclose(ops.matmul(a, b), a @ b)
    assert np.allclose(ops.matmul(a.T, b), a.T @ b)  # same shape, other strides: a choice of its own
    assert np.allclose(ops.matmul(a.astype(np.float64), b.astype(np.float64)), a.astype(np.float64) @ b)
    assert len({id(b) for b in ops.CALLS.bindings.values()}) == 3
    first = rng.random((8, 24), dtype=np.float32)
    ref = weakref.ref(first)
    ops.matmul(first, b)  # binds a new shape: the cache must not keep ``first`` alive to allocate later outputs
    del first
    gc.collect()
    assert ref() is None
    ops.reset()


def test_a_replay_process_starts_no_thread_or_process(tmp_path, repo_root):
    script = textwrap.dedent("""
        import os, threading, numpy as np
        def threads(): return len(os.listdir('/proc/self/task'))
        def children():
            me, n = str(os.getpid()), 0
            for pid in filter(str.isdigit, os.listdir('/proc')):
                try:
                    fields = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
                except OSError:
                    continue
                n += fields[1] == me
            return n
        a = np.ones((64, 64), np.float32); np.matmul(a, a)   # BLAS's own threads, as a direct call has them
        before = (threads(), threading.active_count(), children())
        import farm.ops as ops
        for _ in range(3):
            ops.matmul(a, a)
            ops.sdpa(np.ones((1, 2, 16, 8), np.float32), np.ones((1, 2, 16, 8), np.float32),
                     np.ones((1, 2, 16, 8), np.float32), causal=True)
            ops.conv2d(np.ones((1, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32), padding=1)
        after = (threads(), threading.active_count(), children())
        print(before, after)
        assert before == after, (before, after)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(PYTHONPATH=repo_root, FARM_HEUR_CONFIG_PATH=str(tmp_path / "missing.json"))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_triton_compile_pool_starts_only_where_a_process_opted_in(monkeypatch):
    from engines.gpu.triton_gemm import POOL_OPT_IN_ENV, CompilePool

    started = []
    pool = CompilePool()
    monkeypatch.setattr(pool, "start", lambda: started.append(1))
    monkeypatch.delenv(POOL_OPT_IN_ENV, raising=False)
    pool.saw_compile(5.0)  # a cold compile in a replay process
    assert started == []
    monkeypatch.setenv(POOL_OPT_IN_ENV, "1")
    pool.saw_compile(5.0)
    assert started == [1]
