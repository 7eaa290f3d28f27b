"""Triton kernels checked against torch on the CPU, under Triton's interpreter (``TRITON_INTERPRET=1``): CI has no
GPU, so the kernels' arithmetic (masks, broadcast, rows masked whole, grouped heads) is checked here and their
speed on a GPU (tests/gpu, benchmarks/). Each case runs in a child process: the interpreter is chosen when
Triton's kernels are made, once a process. fp16 only: the interpreter reads bf16 tensors wrong (its outputs are
off by orders of magnitude with no mask at all), so bf16 is checked on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the Triton kernel tests need torch (pip install torch==2.14.1, as .ci/run does)")
pytest.importorskip("triton", reason="the Triton kernel tests need triton (torch's CUDA build brings it)")

ROOT = Path(__file__).resolve().parents[2]

DECODE_ATTENTION = textwrap.dedent('''
    import json, sys
    import torch
    from engines.gpu.triton_decode_attention import TritonDecodeAttention
    from farm.dispatch.calls import problem_for
    from farm.nn.torch_calls import layout, mask_layout

    F = torch.nn.functional
    engine = TritonDecodeAttention()
    out = []
    torch.manual_seed(0)
    for case in json.loads(sys.argv[1]):
        b, hq, hkv, sq, skv, d = case["shape"]
        dt = getattr(torch, case["dtype"])
        q = torch.randn(b, hq, sq, d, dtype=dt)
        k, v = torch.randn(b, hkv, skv, d, dtype=dt), torch.randn(b, hkv, skv, d, dtype=dt)
        pos = torch.arange(skv)
        filled = skv - case.get("unfilled", 0)  # a static cache: its last slots not written yet
        qpos = filled - sq + torch.arange(sq)  # the query tokens are the cache's last filled positions
        keep = (pos[None, :] <= qpos[:, None]) & (pos[None, :] < filled)
        if case.get("window"):
            keep &= qpos[:, None] - pos[None, :] < case["window"]
        keep = keep[None, None].repeat(b, 1, 1, 1)
        if case.get("padded"):  # a left-padded sequence; its first query row sees nothing at all
            keep[-1, :, :, : filled - sq + 1] = False
        if case.get("per_head"):
            keep = keep.repeat(1, hq, 1, 1)
            keep[:, 1] = True
        mask = None
        if case["mask"] == "bool":
            mask = keep
        elif case["mask"] == "additive":
            mask = torch.zeros(keep.shape, dtype=dt).masked_fill(~keep, float("-inf"))
        if mask is not None and case.get("expanded"):
            mask = mask[:1].expand(b, *mask.shape[1:])
        kwargs = {"enable_gqa": hq != hkv, **({"attn_mask": mask} if mask is not None else {})}
        described = {"Q": layout(q), "K": layout(k), "V": layout(v), **({"mask": mask_layout(mask)} if mask is not
                                                                        None else {})}
        problem = problem_for("sdpa_fwd", described, (("causal", 0),), None, torch_layouts=True)
        support = engine.supports(problem, None)
        o = torch.empty_like(q)
        t = {"Q": q, "K": k, "V": v, "O": o}
        if mask is not None:
            dims = problem.tensor("mask").dims
            t["mask"] = mask.as_strided(dims, mask.stride())
        engine.run_jit(problem, case["knobs"], t)
        ref_mask = mask if mask is None or mask.dtype == torch.bool else mask.float()
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **{**kwargs, **(
            {"attn_mask": ref_mask} if mask is not None else {})})
        whole = ~keep.any(-1) if mask is not None else torch.zeros(b, 1, sq, dtype=torch.bool)
        out.append({"supported": bool(support), "why": getattr(support, "reason", ""),
                    "err": float((o.float() - ref).abs().max()), "nan": bool(o.isnan().any()),
                    "masked_rows": int(whole.sum()),
                    "zeros_there": bool((o.float().masked_select(whole.expand(b, hq, sq)[..., None]) == 0).all())})
    print(json.dumps(out))
''')

CASES = [
    {"name": "no mask, GQA 4", "shape": [2, 8, 2, 1, 300, 64], "dtype": "float16", "mask": None,
     "knobs": {"SPLITS": 4, "BLOCK_N": 32}},
    {"name": "bool, static cache half filled", "shape": [2, 8, 2, 1, 256, 64], "dtype": "float16", "mask": "bool",
     "unfilled": 100, "knobs": {"SPLITS": 8, "BLOCK_N": 32}},
    {"name": "additive, static cache", "shape": [1, 4, 4, 1, 200, 128], "dtype": "float16", "mask": "additive",
     "unfilled": 37, "knobs": {"SPLITS": 4, "BLOCK_N": 64}},
    {"name": "bool, 4 query tokens (causal among them), left padding", "shape": [3, 8, 2, 4, 160, 64],
     "dtype": "float16", "mask": "bool", "padded": True, "unfilled": 20, "knobs": {"SPLITS": 2, "BLOCK_N": 32}},
    {"name": "sliding window, additive", "shape": [2, 8, 2, 2, 320, 64], "dtype": "float16", "mask": "additive",
     "window": 64, "knobs": {"SPLITS": 4, "BLOCK_N": 32}},
    {"name": "expanded (stride 0) mask, per query head", "shape": [2, 4, 2, 1, 128, 32], "dtype": "float16",
     "mask": "bool", "per_head": True, "expanded": True, "knobs": {"SPLITS": 2, "BLOCK_N": 32}},
]


def _interpreted(code: str, cases: list[dict]) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_decode_attention_with_transformers_masks_matches_torch_under_the_interpreter():
    results = _interpreted(DECODE_ATTENTION, CASES)
    for case, got in zip(CASES, results):
        assert got["supported"], (case["name"], got["why"])
        assert not got["nan"], case["name"]
        assert got["err"] < 4e-3, (case["name"], got["err"])
        assert got["zeros_there"], case["name"]  # a row masked whole gives 0, as torch's math backend
    assert any(r["masked_rows"] for r in results)  # the padded case has a row masked whole


RMSNORM = textwrap.dedent('''
    import json, sys
    import torch
    from engines.gpu.norms import TritonRmsNorm
    from farm.model.hand_norms import module_rmsnorm
    from farm.model.problem import Problem

    engine = TritonRmsNorm()
    out = []
    torch.manual_seed(0)
    for case in json.loads(sys.argv[1]):
        dims, offset, e12 = case["dims"], case["offset"], case["eps_e12"]
        x = torch.randn(dims, dtype=torch.float16) * 3
        w = torch.randn(dims[-1], dtype=torch.float16)
        problem = Problem.create("rmsnorm", {"X": dims, "scale": [dims[-1]]}, dtype="fp16",
                                 criteria={"eps_e12": e12, "scale_offset": offset}, library="module")
        y = torch.empty_like(x)
        engine.run_jit(problem, case["knobs"], {"X": x, "scale": w, "Y": y})
        ref = module_rmsnorm(torch, x, w, e12 * 1e-12, offset)  # the hand-written module's own output
        diff = (y.float() - ref.float()).abs()
        out.append({"supported": bool(engine.supports(problem, None)), "max": float(diff.max()),
                    "ulps": float((diff / ref.float().abs().clamp_min(1e-3)).max())})
    print(json.dumps(out))
''')

NORM_CASES = [
    {"dims": [1, 4096], "offset": 0, "eps_e12": 10**7, "knobs": {"ROWS_PER": 1, "num_warps": 8}},  # decode, Llama's
    {"dims": [3, 5, 96], "offset": 0, "eps_e12": 10**6, "knobs": {"ROWS_PER": 4, "num_warps": 4}},  # a tail block
    {"dims": [8, 200], "offset": 1, "eps_e12": 10**6, "knobs": {"ROWS_PER": 2, "num_warps": 2}},  # Gemma's 1 + w
]


def test_the_fused_rmsnorm_kernel_gives_the_hand_written_modules_output_under_the_interpreter():
    for case, got in zip(NORM_CASES, _interpreted(RMSNORM, NORM_CASES)):
        assert got["supported"], case
        assert got["ulps"] < 2e-3, (case, got)  # fp16's own rounding: the row's sum in another order at most
