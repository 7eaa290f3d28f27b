"""Masked decode attention per call in a CUDA graph: triton.decode_attention (split-KV, reading transformers' mask)
against torch's SDPA (its own dispatch) on the same tensors, on a CUDA GPU (issue 70).

    python benchmarks/masked_decode_attention.py                    # Llama-3-8B's heads, M = 1 and 8, KV 1k-8k
    python benchmarks/masked_decode_attention.py --batches 1 --kv 4096 --heads 28 4 --head-dim 128

Each case: a decode step's attention over a static KV cache (query 1 token, bf16), the mask as transformers builds
it for ``StaticCache`` (bool, [B, 1, 1, KV], the cache's unfilled slots masked), in the form transformers passes it
to SDPA (``--forms``): ``packed`` in eager (transformers' pack_gqa: the query heads of a key/value head as its query
rows, Q [B, KV heads, group, D]), ``repeated`` under torch.compile (repeat_kv: K and V copied out to every query
head) and ``gqa`` (enable_gqa, what a mask-free call takes). Both sides are timed as a CUDA graph of 20 calls
replayed (the time a graph call takes; launch cost out), best of 5 replays; every plan the engine lists is tried
and the fastest kept. The output is checked against torch's math backend in fp32.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.gpu.triton_decode_attention import TritonDecodeAttention  # noqa: E402
from farm.devices.open import open_device  # noqa: E402
from farm.dispatch.calls import problem_for  # noqa: E402
from farm.nn.torch_calls import layout, mask_layout  # noqa: E402
from tests.gpu.conftest import captured  # noqa: E402

F = torch.nn.functional
CALLS = 20


def graph_us(fn) -> float:
    """us a call of ``fn``: CALLS calls in one CUDA graph, the best of five replays."""
    g, _ = captured(lambda: [fn() for _ in range(CALLS)])
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / CALLS)
    return best


def tensors(form: str, batch: int, kv: int, hq: int, hkv: int, d: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Q, K, V and SDPA's keyword arguments as transformers passes them in ``form``."""
    torch.manual_seed(0)
    group = hq // hkv
    q = torch.randn(batch, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, hkv, kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    mask = (torch.arange(kv, device="cuda") < kv - 8)[None, None, None].expand(batch, 1, 1, kv)  # unfilled slots
    if form == "packed":
        return q.reshape(batch, hkv, group, d), k, v, {"attn_mask": mask}
    if form == "repeated":
        rep = lambda x: x[:, :, None].expand(batch, hkv, group, kv, d).reshape(batch, hq, kv, d)  # noqa: E731
        return q, rep(k), rep(v), {"attn_mask": mask}
    return q, k, v, {"attn_mask": mask, "enable_gqa": True}


def case(form: str, batch: int, kv: int, hq: int, hkv: int, d: int, engine: TritonDecodeAttention,
         device) -> list[str]:
    q, k, v, kwargs = tensors(form, batch, kv, hq, hkv, d)
    mask = kwargs["attn_mask"]
    problem = problem_for("sdpa_fwd", {"Q": layout(q), "K": layout(k), "V": layout(v), "mask": mask_layout(mask)},
                          (("causal", 0),), None, torch_layouts=True)
    m = mask.as_strided(problem.tensor("mask").dims, mask.stride())
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs)
    torch_us = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs))
    best = (float("inf"), None, float("nan"))
    o = torch.empty_like(q)
    for knobs in engine.list_plans(problem, device):
        t = {"Q": q, "K": k, "V": v, "mask": m, "O": o}
        engine.run_jit(problem, knobs, t)
        err = float((o.float() - ref).abs().max())
        us = graph_us(lambda: engine.run_jit(problem, knobs, t))
        if us < best[0]:
            best = (us, knobs, err)
    us, knobs, err = best
    shown = ",".join(f"{k}={v}" for k, v in (knobs or {}).items() if k in ("SPLITS", "BLOCK_N", "num_warps"))
    return [form, str(batch), str(kv), f"{torch_us:.2f}", f"{us:.2f}", f"{torch_us / us:.2f}x", shown, f"{err:.1e}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--kv", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("QUERY", "KV"))
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--forms", nargs="+", default=["packed", "repeated", "gqa"], choices=["packed", "repeated", "gqa"])
    a = p.parse_args()
    device = open_device("cuda", 0)
    engine = TritonDecodeAttention()
    t = Table(title=f"masked decode attention, a call in a CUDA graph, {torch.cuda.get_device_name()} "
                    f"({a.heads[0]}/{a.heads[1]} heads of {a.head_dim}, bf16)")
    for col in ("form", "M", "KV", "torch SDPA us", "triton.decode_attention us", "speed-up", "plan", "max err vs fp32"):
        t.add_column(col)
    for form in a.forms:
        for batch in a.batches:
            for kv in a.kv:
                t.add_row(*case(form, batch, kv, a.heads[0], a.heads[1], a.head_dim, engine, device))
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
