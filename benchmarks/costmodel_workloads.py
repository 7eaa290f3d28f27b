"""Shape families for training and evaluating a cost model (docs/costmodel.md), written as workload files.

    python benchmarks/costmodel_workloads.py --target gpu --out runs/cm-workloads   # H200: bf16 GEMMs, fp16 convs
    python benchmarks/costmodel_workloads.py --target cpu --out runs/cm-workloads   # CPU engines: fp32, small

A family is one model's shapes; its problems are named ``<family>/<layer>/<size>`` so that ``farm model eval
--holdout family`` holds a whole model out. GEMMs are the projections of public LLM configurations (hidden
size, attention heads and KV heads, MLP width) at M = 1 ... 8192 tokens; convolutions are the layers of public
CNNs, channels-last, batch 32. Each ``--group`` of families becomes one workload file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

# hidden, q heads x head dim + 2 x kv heads x head dim (the fused QKV), MLP width (gate and up fused)
LLMS = {
    "llama3-8b": (4096, 4096 + 2 * 1024, 14336),
    "llama3-70b": (8192, 8192 + 2 * 1024, 28672),
    "phi3-mini": (3072, 3 * 3072, 8192),
    "gemma2-9b": (3584, 4096 + 2 * 2048, 14336),
    "gpt2-xl": (1600, 3 * 1600, 6400),
    "qwen2-7b": (3584, 3584 + 2 * 512, 18944),
    "falcon-7b": (4544, 4544 + 2 * 64, 18176),
}
GPU_TOKENS = (1, 16, 128, 1024, 8192)

# (name, C, K, H=W of the input, R=S, stride)
CNNS = {
    "resnet50": [("conv1", 3, 64, 224, 7, 2), ("l1-1x1a", 64, 64, 56, 1, 1), ("l1-3x3", 64, 64, 56, 3, 1),
                 ("l1-1x1b", 256, 64, 56, 1, 1), ("l2-3x3", 128, 128, 28, 3, 1), ("l3-3x3", 256, 256, 14, 3, 1),
                 ("l4-3x3", 512, 512, 7, 3, 1), ("l4-down", 1024, 2048, 14, 1, 2), ("l2-1x1", 512, 128, 28, 1, 1)],
    "vgg16": [("c1-2", 64, 64, 224, 3, 1), ("c2-1", 64, 128, 112, 3, 1), ("c2-2", 128, 128, 112, 3, 1),
              ("c3-1", 128, 256, 56, 3, 1), ("c3-2", 256, 256, 56, 3, 1), ("c4-1", 256, 512, 28, 3, 1),
              ("c4-2", 512, 512, 28, 3, 1), ("c5", 512, 512, 14, 3, 1)],
    "mobilenetv2": [("pw-16-96", 16, 96, 112, 1, 1), ("pw-96-24", 96, 24, 56, 1, 1), ("pw-24-144", 24, 144, 56, 1, 1),
                    ("pw-144-32", 144, 32, 28, 1, 1), ("pw-192-64", 192, 64, 14, 1, 1), ("pw-384-96", 384, 96, 14, 1, 1),
                    ("pw-576-160", 576, 160, 7, 1, 1), ("pw-960-320", 960, 320, 7, 1, 1), ("pw-320-1280", 320, 1280, 7, 1, 1)],
    "resnet18": [("conv1", 3, 64, 224, 7, 2), ("l1-3x3", 64, 64, 56, 3, 1), ("l2-3x3s2", 64, 128, 56, 3, 2),
                 ("l2-3x3", 128, 128, 28, 3, 1), ("l3-3x3", 256, 256, 14, 3, 1), ("l4-3x3", 512, 512, 7, 3, 1)],
}

GROUPS = {
    # the order is the order of tuning: a run cut short loses the last families, not a share of each
    "gpu": {"train": ["llama3-8b", "resnet50", "phi3-mini", "vgg16", "gpt2-xl", "mobilenetv2", "llama3-70b"],
            "heldout": ["qwen2-7b", "resnet18"], "extra": ["gemma2-9b", "falcon-7b"]},
    "cpu": {"train": ["llama3-8b", "phi3-mini", "gpt2-xl", "gemma2-9b", "resnet50", "vgg16"],
            "heldout": ["qwen2-7b", "resnet18"]},
}

GPU_AUTOTUNE = {"strategy": "run_until_stable", "max_tuning_duration_ms": 60, "graph_repeats": 16,
                "rotating_buffers": 3, "check": "auto", "confirm": False}
GPU_ENGINES = {"sweep": {"triton.gemm_splitk": {"SPLIT_K": [2, 4, 8, 16], "BLOCK_N": [32, 64, 128], "BLOCK_M": [16, 64],
                                                "REDUCTION": "serial", "BLOCK_K": 128, "num_warps": 4,
                                                "num_stages": 4}}}
CPU_AUTOTUNE = {"strategy": "run_until_stable", "max_iterations": 15, "max_tuning_duration_ms": 60,
                "check": "off", "confirm": False}
CPU_ENGINES = {"include": ["cpu.matmul.blas", "cpu.matmul.blocked", "cpu.matmul.einsum", "cpu.conv.im2col",
                           "cpu.conv.fft", "cpu.conv.direct"],
               "sweep": {"cpu.matmul.blas": {"order": ["direct", "transposed"], "threads": [1, 2]},
                         "cpu.matmul.blocked": {"block_k": [64, 128, 512]},
                         "cpu.conv.im2col": {"batch_chunk": [1, 4]},
                         "cpu.conv.fft": {"fft_size": ["exact", "pow2"]}}}


def gemm_problems(family: str, target: str) -> list[dict]:
    hidden, qkv, mlp = LLMS[family]
    layers = {"qkv": (hidden, qkv), "o": (hidden, hidden), "up": (hidden, 2 * mlp), "down": (mlp, hidden)}
    if target == "cpu":  # the same proportions at a size a 2-core machine measures in seconds
        scale, tokens, dtype = 8, (1, 16, 64, 256), "fp32"
    else:
        scale, tokens, dtype = 1, GPU_TOKENS, "bf16"
    out = []
    for layer, (k, n) in layers.items():
        k, n = max(8, k // scale), max(8, n // scale)
        for m in tokens:
            out.append({"name": f"{family}/{layer}/m{m}", "op": "matmul", "dtype": dtype,
                        "tensors": {"A": [m, k], "B": [k, n]}})
    return out


def conv_problems(family: str, target: str) -> list[dict]:
    out = []
    batch, dtype, shrink = (32, "fp16", 1) if target == "gpu" else (2, "fp32", 4)
    for name, c, k, hw, r, stride in CNNS[family]:
        hw = max(7, hw // shrink)
        pad = r // 2
        p = (hw + 2 * pad - r) // stride + 1
        x = {"dims": [batch, c, hw, hw], "strides": [c * hw * hw, 1, hw * c, c]}
        w = {"dims": [k, c, r, r], "strides": [c * r * r, 1, r * c, c]}
        y = {"dims": [batch, k, p, p], "strides": [k * p * p, 1, p * k, k]}
        if target == "cpu":  # the CPU engines read packed NCHW
            x, w, y = ({"dims": t["dims"]} for t in (x, w, y))
        out.append({"name": f"{family}/{name}", "op": "conv_fprop", "dtype": dtype,
                    "criteria": {"stride_h": stride, "stride_w": stride, "pad_h": pad, "pad_w": pad},
                    "tensors": {"X": x, "W": w, "Y": y}})
    return out


def workload(name: str, families: list[str], target: str) -> dict:
    problems = []
    for f in families:
        problems += gemm_problems(f, target) if f in LLMS else conv_problems(f, target)
    return {"name": name, "description": f"cost-model families ({target}): {', '.join(families)}",
            "autotune": GPU_AUTOTUNE if target == "gpu" else CPU_AUTOTUNE,
            "engines": GPU_ENGINES if target == "gpu" else CPU_ENGINES, "problems": problems}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--out", required=True, help="folder for the workload files")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for group, families in GROUPS[args.target].items():
        path = out / f"cm-{args.target}-{group}.yaml"
        w = workload(f"cm-{args.target}-{group}", families, args.target)
        path.write_text(yaml.safe_dump(w, sort_keys=False, width=140))
        print(f"{path}: {len(w['problems'])} problems ({', '.join(families)})")


if __name__ == "__main__":
    main()
