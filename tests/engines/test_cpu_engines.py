"""Every CPU engine, every knob value, several shapes: output matches the float64 reference."""

import numpy as np
import pytest

from farm.model import dtypes
from farm.devices.arrays import host_inputs, make_tensors, relative_error
from farm.model.engine import default_engine_registry, engine_knobs, settings_to_resolved, user_knobs
from farm.model.problem import Problem
from farm.tuner.reference import reference

PROBLEMS = {
    "matmul": [
        Problem.create("matmul", {"A": [64, 48], "B": [48, 40]}),
        Problem.create("matmul", {"A": [3, 17, 33], "B": [3, 33, 9]}),
        Problem.create("matmul", {"A": [3, 17, 33], "B": [33, 9]}),  # B broadcast over the batch
        Problem.create("matmul", {"A": [20, 300], "B": {"dims": [300, 24], "strides": [1, 300]}}),
        Problem.create("matmul", {"A": [2, 16, 70], "B": [2, 70, 12], "bias": [12]}, dtype="fp16"),
        Problem.create("matmul", {"A": [9, 11], "B": [11, 5]}, dtype="fp64"),
    ],
    "conv_fprop": [
        Problem.create("conv_fprop", {"X": [2, 6, 11, 9], "W": [5, 6, 3, 3]}, criteria={"pad_h": 1, "pad_w": 1}),
        Problem.create("conv_fprop", {"X": [3, 4, 13, 12], "W": [8, 4, 3, 2]},
                       criteria={"stride_h": 2, "stride_w": 3, "pad_h": 2}),
        Problem.create("conv_fprop", {"X": [2, 8, 10, 10], "W": [6, 4, 3, 3]},
                       criteria={"groups": 2, "dilation_h": 2, "dilation_w": 2, "pad_w": 1}),
        Problem.create("conv_fprop", {"X": {"dims": [2, 4, 7, 7], "strides": [196, 1, 28, 4]}, "W": [3, 4, 1, 1]}),
        Problem.create("conv_fprop", {"X": [1, 3, 8, 8], "W": [4, 3, 5, 5]}, criteria={"pad_h": 2, "pad_w": 2}, dtype="fp16"),
    ],
    "sdpa_fwd": [
        Problem.create("sdpa_fwd", {"Q": [2, 4, 33, 16], "K": [2, 4, 33, 16], "V": [2, 4, 33, 16]}),
        Problem.create("sdpa_fwd", {"Q": [1, 8, 40, 16], "K": [1, 2, 70, 16], "V": [1, 2, 70, 24]}, criteria={"causal": 1}),
        Problem.create("sdpa_fwd", {"Q": [2, 6, 1, 32], "K": [2, 3, 90, 32], "V": [2, 3, 90, 32]}),  # decode
        Problem.create("sdpa_fwd", {"Q": [1, 2, 50, 8], "K": [1, 2, 20, 8], "V": [1, 2, 20, 8]}, criteria={"causal": 1}),
        Problem.create("sdpa_fwd", {"Q": [1, 2, 64, 16], "K": [1, 2, 64, 16], "V": [1, 2, 64, 16]},
                       criteria={"causal": 1}, dtype="fp16"),
    ],
    "layernorm": [
        Problem.create("layernorm", {"X": [37, 64], "scale": [64], "bias": [64]}),
        Problem.create("layernorm", {"X": [3, 19, 40], "scale": [40], "bias": [40]}, dtype="fp16"),
        Problem.create("layernorm", {"X": {"dims": [16, 24], "strides": [1, 16]}, "scale": [24], "bias": [24]}),
        # BERT's eps (1e-12) and a large one, which moves every output: the engine must use the problem's
        Problem.create("layernorm", {"X": [8, 32], "scale": [32], "bias": [32]}, criteria={"eps_e12": 1}),
        Problem.create("layernorm", {"X": [8, 32], "scale": [32], "bias": [32]}, criteria={"eps_e12": 10**12}),
    ],
    "rmsnorm": [
        Problem.create("rmsnorm", {"X": [50, 128], "scale": [128]}),
        Problem.create("rmsnorm", {"X": [2, 33, 48], "scale": [48]}, dtype="fp16"),
        Problem.create("rmsnorm", {"X": {"dims": [10, 12], "strides": [1, 10]}, "scale": [12]}),
        Problem.create("rmsnorm", {"X": [8, 32], "scale": [32]}, criteria={"eps_e12": 10**6}),  # Qwen2's 1e-6
        Problem.create("rmsnorm", {"X": [8, 32], "scale": [32]}, criteria={"eps_e12": 10**12}),
    ],
}


def _variants(engine):
    """Default knobs plus each value of each knob on its own (threads: 1 and 2)."""
    out = [{}]
    for knob in user_knobs(engine):
        values = knob.choices if knob.choices else (1, 2)
        out += [{knob.name: v} for v in values if v != knob.default]
    return out


CASES = [
    pytest.param(engine, variant, id=f"{engine.name}[{','.join(f'{k}={v}' for k, v in variant.items()) or 'default'}]")
    for engine in default_engine_registry()
    if engine.name.startswith("cpu.")
    for variant in _variants(engine)
]


def _run_and_check(engine, knobs, problem, device, seed):
    support = engine.applicable(problem, device)
    if not support:
        return None
    plan = engine.compile(problem, settings_to_resolved(engine, tuple(sorted(knobs.items()))), device)
    assert plan.workspace_size >= 0
    assert plan.workspace_size == engine.estimate_workspace(problem, settings_to_resolved(engine, tuple(sorted(knobs.items()))))
    tensors = make_tensors(problem, device.arrays, seed)  # outputs poisoned with NaN
    ws = device.runtime.malloc(plan.workspace_size)
    plan.run(tensors, ws, None)
    ref = reference(problem, host_inputs(tensors, problem, device.arrays))
    tol = max(dtypes.RELATIVE_TOLERANCE[problem.compute_dtype], dtypes.RELATIVE_TOLERANCE[problem.dtype])
    for out in problem.output_ids:
        got = device.arrays.to_numpy(tensors[out])
        err = relative_error(got, ref[out])
        assert err <= tol, f"{engine.name} {knobs} on {problem.label()}: output {out} rel err {err:.3g} > {tol}"
    # run again on fresh inputs: a plan must not keep data from the previous call
    tensors2 = make_tensors(problem, device.arrays, seed + 1)
    plan.run(tensors2, ws, None)
    ref2 = reference(problem, host_inputs(tensors2, problem, device.arrays))
    for out in problem.output_ids:
        assert relative_error(device.arrays.to_numpy(tensors2[out]), ref2[out]) <= tol
    return True


@pytest.mark.parametrize("engine, knobs", CASES)
def test_engine_matches_float64_reference(engine, knobs, cpu):
    ran = [
        _run_and_check(engine, knobs, problem, cpu, seed)
        for op in sorted(engine.ops)
        for seed, problem in enumerate(PROBLEMS[op])
    ]
    assert any(ran), f"{engine.name} applied to none of the test shapes"


def test_every_cpu_engine_is_covered_and_declares_its_contract(registry):
    cpu_engines = [e for e in registry if e.name.startswith("cpu.")]
    assert len(cpu_engines) >= 12
    ops = {op for e in cpu_engines for op in e.ops}
    assert {"matmul", "conv_fprop", "sdpa_fwd", "layernorm", "rmsnorm"} <= ops
    for e in cpu_engines:
        assert e.ops <= set(PROBLEMS), e.name
        assert all(k.name != "global.benchmarking" for k in e.knobs)
        if e.supports_exhaustive:
            assert any(k.name == "global.benchmarking" for k in engine_knobs(e))


def test_not_applicable_cases_say_why(cpu, registry):
    fft = registry.get("cpu.conv.fft")
    grouped = PROBLEMS["conv_fprop"][2]
    assert not fft.applicable(grouped, cpu)
    assert "grouped" in fft.applicable(grouped, cpu).reason
    bf16 = Problem.create("matmul", {"A": [4, 4], "B": [4, 4]}, dtype="bf16")
    reason = registry.get("cpu.matmul.blas").applicable(bf16, cpu).reason
    assert "bf16" in reason
    tf32 = Problem.create("matmul", {"A": [4, 4], "B": [4, 4]}, compute_dtype="tf32")
    assert "tf32" in registry.get("cpu.matmul.blas").applicable(tf32, cpu).reason
    assert registry.discover(bf16, cpu) == []
    explained = registry.explain(bf16, cpu)
    assert explained and all(not c.applicable and c.reason for c in explained)


def test_einsum_priming_caches_the_contraction_path(cpu, registry):
    engine = registry.get("cpu.matmul.einsum")
    problem = PROBLEMS["matmul"][0]
    knobs = settings_to_resolved(engine, (("optimize", "optimal"),), benchmarking=True)
    primer = engine.compile(problem, knobs, cpu)
    tensors = make_tensors(problem, cpu.arrays)
    primer.run(tensors, cpu.runtime.malloc(primer.workspace_size), None)
    assert (problem.key, "optimal") in engine.path_cache
    assert np.isnan(tensors["C"]).all()  # priming computes the path, not the product
