"""cudnn.graph, cublaslt and triton.conv: the listed plans are candidates, right, and replay by their knobs."""

import pytest

from .conftest import cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
torch = pytest.importorskip("torch", reason="the GPU engines need torch")

from farm import AutotuneConfig, Autotuner, Problem  # noqa: E402
from farm.errors import AutotuneError  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402

from .test_gpu_engines import FAST, assert_winner_correct  # noqa: E402

CONV = {"pad_h": 1, "pad_w": 1}


def nhwc(n, c, h, w):
    return {"dims": [n, c, h, w], "strides": [c * h * w, 1, w * c, c]}


CUDNN = [
    Problem.create("conv_fprop", {"X": nhwc(8, 64, 28, 28), "W": nhwc(64, 64, 3, 3)}, dtype="fp16", criteria=CONV),
    Problem.create("conv_fprop", {"X": [4, 32, 30, 30], "W": [48, 32, 1, 1]}, dtype="bf16",
                   criteria={"stride_h": 2, "stride_w": 2}),
    Problem.create("conv_dgrad", {"dY": nhwc(8, 64, 14, 14), "W": nhwc(64, 32, 3, 3), "dX": nhwc(8, 32, 14, 14)},
                   dtype="fp16", criteria=CONV),
    Problem.create("conv_wgrad", {"X": nhwc(8, 32, 14, 14), "dY": nhwc(8, 64, 14, 14), "dW": nhwc(64, 32, 3, 3)},
                   dtype="fp16", criteria=CONV),
    Problem.create("matmul", {"A": [16, 1024], "B": [1024, 2048]}, dtype="bf16"),
    Problem.create("matmul", {"A": [4, 128, 256], "B": [4, 256, 192]}, dtype="fp16"),
    Problem.create("sdpa_fwd", {"Q": [2, 8, 256, 64], "K": [2, 2, 256, 64], "V": [2, 2, 256, 64]}, dtype="bf16",
                   criteria={"causal": 1}),
]
TRITON_CONV = [
    Problem.create("conv_fprop", {"X": nhwc(4, 3, 64, 64), "W": nhwc(32, 3, 7, 7)}, dtype="fp16",
                   criteria={"stride_h": 2, "stride_w": 2, "pad_h": 3, "pad_w": 3}),  # an RGB stem: the flat walk
    Problem.create("conv_fprop", {"X": nhwc(4, 64, 20, 20), "W": nhwc(96, 64, 3, 3)}, dtype="bf16", criteria=CONV),
    Problem.create("conv_fprop", {"X": [2, 40, 15, 17], "W": [24, 40, 3, 3]}, dtype="fp16",  # NCHW, odd C, dilated
                   criteria={"stride_h": 2, "stride_w": 2, "pad_h": 1, "pad_w": 1, "dilation_h": 2, "dilation_w": 2}),
    Problem.create("conv_fprop", {"X": nhwc(4, 128, 14, 14), "W": nhwc(200, 128, 1, 1)}, dtype="fp16",
                   criteria={"stride_h": 2, "stride_w": 2}),  # 1x1 stride 2, K not a power of two
    Problem.create("conv_fprop", {"X": nhwc(2, 24, 9, 9), "W": nhwc(16, 24, 5, 5)}, compute_dtype="tf32",
                   criteria={"pad_h": 2, "pad_w": 2}),  # fp32 data in tf32; both walks listed (C < 32)
    Problem.create("conv_fprop", {"X": [2, 8, 20, 20], "W": [16, 8, 3, 3]}, dtype="fp16",
                   criteria=CONV),  # NCHW, 8 channels: the flat walk as stored and on padded channels-last copies
]
CUBLASLT = [
    Problem.create("matmul", {"A": [1, 4096], "B": [4096, 4096]}, dtype="bf16"),
    Problem.create("matmul", {"A": [64, 4096], "B": [4096, 1024]}, dtype="fp16"),
    Problem.create("matmul", {"A": [3, 96, 160], "B": [3, 160, 72]}, dtype="bf16"),
    Problem.create("matmul", {"A": [200, 300], "B": {"dims": [300, 160], "strides": [1, 300]}}, compute_dtype="tf32"),
    Problem.create("matmul", {"A": [128, 256], "B": [256, 64]}),  # strict fp32
    Problem.create("matmul", {"A": [300, 129], "B": [129, 200], "C": {"dims": [300, 200], "strides": [208, 1]}},
                   dtype="bf16"),
]


CUDA_DECODE = [
    Problem.create("matmul", {"A": [1, 4096], "B": [4096, 1024]}, dtype="bf16"),  # decode, one token
    Problem.create("matmul", {"A": [3, 1000], "B": [1000, 392], "bias": [392]}, dtype="fp16"),  # ragged K, N; bias
    Problem.create("matmul", {"A": [5, 1001], "B": [1001, 136]}, dtype="bf16"),  # odd K: A read an element at a time
    Problem.create("matmul", {"A": {"dims": [16, 2048], "strides": [2056, 1]}, "B": {"dims": [2048, 264],
                              "strides": [272, 1]}, "C": {"dims": [16, 264], "strides": [1, 16]}},
                   dtype="bf16"),  # padded rows of A and B, a column-major C
    Problem.create("matmul", {"A": [9, 3000], "B": [3000, 520], "bias": [520]}, dtype="bf16"),  # 520: a part strip
    Problem.create("matmul", {"A": [16, 14336], "B": [14336, 4096]}, dtype="fp16"),  # K over several steps
]


@pytest.fixture(scope="module")
def dev():
    from farm.devices.device import gpu_device

    return gpu_device("cuda", 0)


def listed_and_tuned(dev, problem, engine):
    reg = default_engine_registry()
    support = reg.config_for(reg.get(engine), problem, dev)
    if not support.applicable and "not installed" in support.reason:
        pytest.skip(support.reason)
    assert support.applicable, support.reason
    t = Autotuner(problem, dev)
    t.add_engine_configs([c for c in t.engine_configs() if c.engine_name == engine])
    results = t.autotune(config=AutotuneConfig(check="reference", **FAST))
    return t, [r for r in results if r.engine_name == engine]


@pytest.mark.parametrize("engine,problem", [("cudnn.graph", p) for p in CUDNN] + [("cublaslt", p) for p in CUBLASLT]
                         + [("triton.conv", p) for p in TRITON_CONV],
                         ids=lambda x: x if isinstance(x, str) else x.label())
def test_each_listed_plan_is_a_checked_candidate_and_the_winner_rebuilds_from_its_knobs(dev, engine, problem):
    t, rows = listed_and_tuned(dev, problem, engine)
    listed = [r for r in rows if r.knobs]
    assert len(listed) >= 2, [(r.label, r.error) for r in rows]  # the library offers choices
    ok = [r for r in rows if r.succeeded]
    assert len(ok) >= max(2, len(rows) // 2), [(r.label, r.error) for r in rows if not r.succeeded]
    assert all(r.max_rel_error is not None for r in ok)  # each checked against the float64 reference
    best = min(ok, key=lambda r: r.median_ms)
    again = Autotuner(problem, dev)  # a fresh tuner: the plan rebuilt from the recorded knobs alone
    again.add_engine(engine, dict(best.knobs))
    again.autotune(config=AutotuneConfig(check="reference", **FAST))
    assert_winner_correct(dev, again, problem)


ROWS_WALK = [
    TRITON_CONV[0],  # the stem: 7 taps read as a span of 8, stride 2
    Problem.create("conv_fprop", {"X": nhwc(2, 3, 21, 24), "W": nhwc(16, 3, 5, 5)}, dtype="fp16",
                   criteria={"pad_h": 2, "pad_w": 2}),  # stride 1, a copy 31 pixels wide: rows 8-byte aligned only
]


@pytest.mark.parametrize("problem", ROWS_WALK, ids=lambda p: p.label())
def test_the_rows_walk_is_right_and_its_extra_taps_keep_infinities_where_they_belong(dev, problem):
    """Every listed rows-walk tile is right; an inf that only a span's zero-weight extra tap reads for some
    outputs leaves those outputs finite (0 * inf would be NaN), as in the float64 reference."""
    import numpy as np

    from farm.devices.arrays import make_tensors
    from farm.tuner.reference import reference

    t, rows = listed_and_tuned(dev, problem, "triton.conv")
    walked = [r for r in rows if dict(r.knobs).get("K_LOOP") == "rows"]
    assert walked and all(r.succeeded for r in walked), [(r.label, r.error) for r in walked if not r.succeeded]
    best = min(walked, key=lambda r: r.median_ms)
    again = Autotuner(problem, dev)
    again.add_engine("triton.conv", dict(best.knobs))
    again.autotune(config=AutotuneConfig(check="reference", **FAST))
    taps, pad_w = problem.tensor("W").dims[3], problem.criteria_dict["pad_w"]
    tensors = make_tensors(problem, dev.arrays, seed=11)
    tensors["X"][:, 1, 3, taps - pad_w] = float("inf")  # padded column S: output 0's first extra tap
    again.execute(tensors)
    dev.synchronize()
    out = dev.arrays.to_numpy(tensors["Y"]).astype(np.float64)
    ref = reference(problem, {x: dev.arrays.to_numpy(tensors[x]) for x in problem.input_ids})["Y"]
    assert np.isinf(ref).any() and np.isfinite(ref[..., 0]).all()
    assert np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(np.isinf(out), np.isinf(ref))
    finite = np.isfinite(ref)
    assert np.abs(out[finite] - ref[finite]).max() <= 2e-2 * np.abs(ref[finite]).max()


@pytest.mark.parametrize("problem", [CUDNN[0], CUBLASLT[1]], ids=lambda p: p.label())
def test_plans_build_while_another_is_captured_into_a_graph(dev, problem):
    """Compile threads build candidates while the measuring thread captures one into a CUDA graph (graph
    timing, in-process): no build fails on the capture. (In a farm worker some still do: RESULTS.md.)"""
    t = Autotuner(problem, dev)
    configs = [c for c in t.engine_configs() if c.engine_name in ("cudnn.graph", "cublaslt")]
    if not configs:  # cudnn.graph needs nvidia-cudnn-frontend (the cuda-libs extra)
        why = [f"{c.engine_name}: {c.reason}" for c in t.registry.explain(problem, dev)
               if c.engine_name in ("cudnn.graph", "cublaslt")]
        pytest.skip(f"no library engine applies to {problem.label()} here ({'; '.join(why)})")
    t.add_engine_configs(configs)
    results = t.autotune(config=AutotuneConfig(check="reference", compile_workers=4, graph_repeats=16, **FAST))
    bad = [(r.label, r.error) for r in results if not r.succeeded and "captur" in r.error]
    assert not bad, bad
    assert sum(r.succeeded for r in results) >= len(results) // 2


def test_a_plan_cudnn_does_not_list_fails_with_the_reason(dev):
    pytest.importorskip("cudnn", reason="cuDNN's plan list needs nvidia-cudnn-frontend (the cuda-libs extra)")
    problem = CUDNN[0]
    t = Autotuner(problem, dev)
    t.add_engine("cudnn.graph", {"engine": 9999, "TILE_SIZE": 1})
    with pytest.raises(AutotuneError) as info:
        t.autotune(config=AutotuneConfig(check="reference", **FAST))
    assert "cuDNN lists no plan engine=9999,TILE_SIZE=1" in info.value.results[0].error


def test_library_engines_say_why_they_do_not_apply(dev):
    pytest.importorskip("cudnn", reason="cudnn.graph's reasons need nvidia-cudnn-frontend (the cuda-libs extra)")
    reg = default_engine_registry()
    biased = Problem.create("matmul", {"A": [16, 64], "B": [64, 32], "bias": [32]}, dtype="bf16")
    odd_head = Problem.create("sdpa_fwd", {"Q": [1, 2, 64, 100], "K": [1, 2, 64, 100], "V": [1, 2, 64, 100]},
                              dtype="fp16")
    fp32_conv = Problem.create("conv_fprop", {"X": [2, 8, 16, 16], "W": [8, 8, 3, 3]}, criteria=CONV)
    grouped = Problem.create("conv_fprop", {"X": [2, 8, 16, 16], "W": [8, 4, 3, 3]}, dtype="fp16",
                             criteria={**CONV, "groups": 2})
    why = {(e, p.label()): reg.config_for(reg.get(e), p, dev).reason
           for e, p in (("cublaslt", biased), ("cudnn.graph", biased), ("cudnn.graph", odd_head),
                        ("cudnn.graph", fp32_conv), ("triton.conv", fp32_conv), ("triton.conv", grouped))}
    assert all(why.values()), why
    assert "groups=2" in why[("triton.conv", grouped.label())] and "TF32" in why[("triton.conv", fp32_conv.label())]
    assert "bias" in why[("cublaslt", biased.label())] and "head dim 100" in why[("cudnn.graph", odd_head.label())]


@pytest.mark.parametrize("engine", ["cudnn.graph", "triton.conv"])
def test_farm_ops_replays_a_listed_conv_plan_from_an_override_file(dev, tmp_path, monkeypatch, engine):
    """The published winner replays through farm.ops: the plan is built once and each call runs it."""
    import farm.ops as ops
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    problem = Problem.create("conv_fprop", {"X": nhwc(4, 16, 32, 32), "W": nhwc(32, 16, 3, 3),
                                            "Y": nhwc(4, 32, 32, 32)}, dtype="fp16", criteria=CONV)
    t, rows = listed_and_tuned(dev, problem, engine)
    best = min((r for r in rows if r.succeeded and r.knobs), key=lambda r: r.median_ms)
    path = tmp_path / "overrides.json"
    props = dev.properties
    write_overrides(path, [OverrideEntry.for_problem(problem, engine, best.knobs, {"rank": 0})],
                    device={"signature": props.signature, "properties": props.to_dict()}, mode="replace")
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(path))
    ops.reset()
    try:
        cl = torch.channels_last  # channels-last in, channels-last out: the problem that was tuned
        x = torch.randn(4, 16, 32, 32, device="cuda", dtype=torch.float16).to(memory_format=cl)
        w = torch.randn(32, 16, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=cl)
        for _ in range(3):
            y = ops.conv2d(x, w, padding=1)
        chosen = ops.choices()[0]
        assert chosen["engine"] == engine and dict(chosen["knobs"]) == dict(best.knobs), chosen
        ref = torch.nn.functional.conv2d(x, w, padding=1)
        assert y.is_contiguous(memory_format=cl)
        assert (y.float() - ref.float()).norm() / ref.float().norm() < 1e-2
        given = torch.empty(ref.shape, device="cuda", dtype=torch.float16)  # an NCHW out: written right too
        assert ops.conv2d(x, w, padding=1, out=given) is given
        assert (given.float() - ref.float()).norm() / ref.float().norm() < 1e-2
    finally:
        ops.reset()


STREAMS = [  # engines whose plans copy the inputs into buffers of their own before the kernel
    ("triton.conv", {"K_LOOP": "rows", "PAD_C": 4, "BLOCK_K": 32, "num_stages": 1},
     Problem.create("conv_fprop", {"X": nhwc(16, 3, 224, 224), "W": nhwc(64, 3, 7, 7), "Y": nhwc(16, 64, 112, 112)},
                    dtype="fp16", criteria={"stride_h": 2, "stride_w": 2, "pad_h": 3, "pad_w": 3})),
    ("triton.conv", {"K_LOOP": "flat", "PAD_C": 8, "BLOCK_K": 32},
     Problem.create("conv_fprop", {"X": nhwc(16, 5, 112, 112), "W": nhwc(32, 5, 3, 3), "Y": nhwc(16, 32, 112, 112)},
                    dtype="fp16", criteria=CONV)),
    ("triton.gemm_padded", {}, Problem.create("matmul", {"A": [1000, 4000], "B": [4000, 4001]}, dtype="bf16")),
    ("torch.matmul_padded", {"output": "padded", "multiple": 64},
     Problem.create("matmul", {"A": [1000, 4000], "B": [4000, 4001]}, dtype="bf16")),
    ("torch.matmul_padded", {"output": "split", "multiple": 16},
     Problem.create("matmul", {"A": [1000, 4001], "B": [4001, 4008]}, dtype="bf16")),
    ("cuda.decode_gemm", {"KS": 2, "WARPS": 8, "CL": 8},  # no buffers: sums in a cluster's shared memory
     Problem.create("matmul", {"A": [16, 4096], "B": [4096, 4096]}, dtype="bf16")),
    # library plans with a workspace: one per stream (cuBLASLt's was one per plan)
    ("cublaslt", {}, Problem.create("matmul", {"A": [8, 4096], "B": [4096, 14336]}, dtype="bf16")),
    ("cudnn.graph", {}, Problem.create("matmul", {"A": [8, 4096], "B": [4096, 14336]}, dtype="bf16")),
]


@pytest.mark.parametrize("engine,knobs,problem", STREAMS, ids=lambda x: x if isinstance(x, str) else "")
def test_a_plan_called_on_two_streams_at_once_keeps_a_set_of_copies_per_stream(dev, tmp_path, monkeypatch, engine,
                                                                                 knobs, problem):
    """Replayed through farm.ops on two streams at once (a server's two request streams): neither call reads
    the other's copies of its inputs (they were one set per plan: a race, wrong answers)."""
    import farm.ops as ops
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    props = dev.properties
    path = tmp_path / "overrides.json"
    write_overrides(path, [OverrideEntry.for_problem(problem, engine, tuple(knobs.items()), {"rank": 0})],
                    device={"signature": props.signature, "properties": props.to_dict()}, mode="replace")
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(path))
    ops.reset()
    try:
        gen = torch.Generator(device="cuda").manual_seed(3)
        conv = problem.op == "conv_fprop"
        ins = ("X", "W") if conv else ("A", "B")

        def tensor(tid):
            t = problem.tensor(tid)
            out = torch.empty_strided(t.dims, t.strides, device="cuda", dtype=getattr(torch, {"fp16": "float16",
                                      "bf16": "bfloat16"}[t.dtype]))
            return out.copy_(torch.randn(t.dims, device="cuda", generator=gen))

        sets = [[tensor(t) for t in ins] for _ in range(2)]
        crit = problem.criteria_dict
        if conv:
            call = lambda x, w: ops.conv2d(x, w, stride=crit["stride_h"], padding=crit["pad_h"])  # noqa: E731
            ref = [torch.nn.functional.conv2d(x.float(), w.float(), None, crit["stride_h"], crit["pad_h"])
                   for x, w in sets]
        else:
            call = ops.matmul
            ref = [a.float() @ b.float() for a, b in sets]
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        for s, args in zip(streams, sets):  # each stream's first call: its copies made
            with torch.cuda.stream(s):
                call(*args)
        torch.cuda.synchronize()
        assert ops.choices()[0]["engine"] == engine
        outs = [[], []]
        for _ in range(10):  # issued alternately: the two streams' copies and kernels overlap
            for i, (s, args) in enumerate(zip(streams, sets)):
                with torch.cuda.stream(s):
                    outs[i].append(call(*args))
        torch.cuda.synchronize()
        for i in range(2):
            for y in outs[i]:
                assert (y.float() - ref[i]).norm() / ref[i].norm() < 1e-2, (engine, i)
    finally:
        ops.reset()


@pytest.mark.parametrize("problem", CUDA_DECODE, ids=lambda p: p.label())
def test_every_listed_cuda_decode_gemm_plan_is_right(dev, problem, monkeypatch):
    monkeypatch.setenv("FARM_LIBRARY_PLANS", "100")
    t, rows = listed_and_tuned(dev, problem, "cuda.decode_gemm")
    assert len(rows) >= 4, [(r.label, r.error) for r in rows]
    bad = [(r.label, r.error) for r in rows if not r.succeeded]
    assert not bad, bad
    assert all(r.max_rel_error is not None for r in rows)  # each checked against the float64 reference
    best = min(rows, key=lambda r: r.median_ms)
    again = Autotuner(problem, dev)
    again.add_engine("cuda.decode_gemm", dict(best.knobs))
    again.autotune(config=AutotuneConfig(check="reference", **FAST))
    assert_winner_correct(dev, again, problem)


def test_cuda_decode_gemm_sums_the_same_on_two_streams_at_once_and_in_graph_replays(dev):
    # The cluster's blocks sum each other's shared memory in rank order: the same bits every call and stream
    engine = default_engine_registry().get("cuda.decode_gemm")
    problem = Problem.create("matmul", {"A": [4, 4096], "B": [4096, 1000], "bias": [1000]}, dtype="bf16")
    plan = engine.compile(problem, {"KS": 2, "WARPS": 4, "CL": 4}, dev)
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(4096, 1000, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(1000, device="cuda", dtype=torch.bfloat16, generator=g)

    def call(a=a, b=b):
        c = torch.empty(a.shape[0], 1000, device="cuda", dtype=torch.bfloat16)
        plan.fn({"A": a, "B": b, "C": c, "bias": bias})
        return c

    expected = call()
    torch.cuda.synchronize()
    ref = a.float() @ b.float() + bias.float()
    assert ((expected.float() - ref).norm() / ref.norm()).item() < 1e-2
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for _ in range(25):
        for s in streams:
            with torch.cuda.stream(s):
                outs.append(call())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed = [call() for _ in range(3)]
    replays = []
    for _ in range(4):
        graph.replay()
        replays.extend(c.clone() for c in graphed)
    torch.cuda.synchronize()
    bad = [i for i, c in enumerate(outs + replays) if not torch.equal(c, expected)]
    assert not bad, f"{len(bad)} of {len(outs) + len(replays)} results differ, e.g. call {bad[0]}"
    # B viewed from an odd element (16-byte loads would fault), A from an odd one (4-byte pairs would):
    # the plan falls back to torch.matmul
    flat = torch.randn(4096 * 1000 + 8, device="cuda", dtype=torch.bfloat16, generator=g)
    odd_b = flat[1:1 + 4096 * 1000].view(4096, 1000)
    odd_a = torch.randn(4 * 4096 + 1, device="cuda", dtype=torch.bfloat16, generator=g)[1:].view(4, 4096)
    for x, y in ((a, odd_b), (odd_a, b)):
        out = call(x, y)
        torch.cuda.synchronize()
        ref = x.float() @ y.float() + bias.float()
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
