"""The GPU suite: tuned winners vs PyTorch's default path, Inductor max-autotune, and @triton.autotune.

    python benchmarks/gpu_suite.py all --out DIR       # everything below, in child processes; prints tables
    python benchmarks/gpu_suite.py suite --out DIR     # our tuner per shape: winner vs default, tuning time
    python benchmarks/gpu_suite.py inductor --out DIR  # torch.compile(max-autotune-no-cudagraphs) per GEMM
    python benchmarks/gpu_suite.py triton --contender ours|triton --out DIR   # same 48-config Triton space
    python benchmarks/gpu_suite.py report DIR          # tables from the JSON files

The shapes and the candidate space are examples/h200-suite.yaml's. Every speed
is measured the same way (``bench``): device events on one stream, L2 flushed
before each run and excluded, median of 100 runs, random inputs. Compile caches
are per contender and per state: "cold" runs start with empty Triton and
Inductor caches, "warm" runs reuse the cold run's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORKLOAD = ROOT / "examples" / "h200-suite.yaml"
TRITON_SHAPES = ("gemm-4k", "odd-fp16")


def _setup():
    import torch

    from farm.devices.device import gpu_device
    from farm.model.workload import load_workload

    return torch, gpu_device("cuda", 0), load_workload(WORKLOAD)


def bench(torch, dev, fn, n: int = 100) -> float:
    """Median ms of ``fn`` on the device stream, L2 flushed (outside the timing) before each run."""
    stream = torch.cuda.ExternalStream(int(dev.stream))

    def run():
        with torch.cuda.stream(stream):
            fn()

    for _ in range(5):
        run()
    dev.synchronize()
    samples = []
    for _ in range(n):
        dev.runtime.flush_l2(dev.stream)
        samples.append(dev.timer.measure(run))
    samples.sort()
    return samples[len(samples) // 2]


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12 if ms else 0.0


def _operands(torch, problem, dev):
    from farm.devices.arrays import make_tensors

    return make_tensors(problem, dev.arrays, seed=1)


# -- our tuner per shape --------------------------------------------------------------------
def _selected(wl, shapes: tuple[str, ...]):
    return [wp for wp in wl.problems if not shapes or wp.name in shapes]


def run_suite(out: Path, shapes: tuple[str, ...] = ()) -> None:
    import numpy as np

    from farm.tuner.autotuner import Autotuner
    from farm.tuner.problem_tuning import plan_specs_for

    torch, dev, wl = _setup()
    rows = []
    for wp in _selected(wl, shapes):
        p = wp.problem
        tuner = Autotuner(p, dev)
        if not plan_specs_for(wp, tuner):
            print(f"{wp.name}: no candidates on this device", flush=True)
            continue
        t0 = time.perf_counter()
        results = tuner.autotune(config=wl.autotune, seed=wl.seed)
        tune_s = time.perf_counter() - t0
        ok = [r for r in results if r.succeeded]  # ranked by the farm's winner rule (farm.tuner.judging.winner)
        winner, default = ok[0], min((r for r in ok if not r.knobs), key=lambda r: r.candidate)
        tensors = _operands(torch, p, dev)
        plans = {}
        for r in {winner.label: winner, default.label: default}.values():
            eng = tuner.registry.get(r.engine_id)
            from farm.model.engine import settings_to_resolved

            plans[r.label] = eng.compile(p, settings_to_resolved(eng, r.knobs), dev)
        ws = {k: dev.runtime.malloc(v.workspace_size) if v.workspace_size else None for k, v in plans.items()}
        ms = {k: bench(torch, dev, lambda k=k: plans[k].run(tensors, ws[k], dev.stream)) for k in plans}
        failed = [(r.label, r.disposition.value, r.error[:160]) for r in results if not r.succeeded]
        rows.append({
            "name": wp.name, "label": p.label(), "op": p.op, "flops": p.flops, "candidates": len(results),
            "failed": failed, "tune_s": tune_s, "winner": winner.label, "fastest_in_tuning": ok[f].label,
            "winner_engine": winner.engine_name, "winner_knobs": [list(kv) for kv in winner.knobs],
            "winner_ms": ms[winner.label], "default": default.label, "default_ms": ms[default.label],
            "winner_tflops": tflops(p.flops, ms[winner.label]), "default_tflops": tflops(p.flops, ms[default.label]),
            "speedup": ms[default.label] / ms[winner.label],
            # each engine's fastest candidate in tuning (median ms): what the winner beat
            "best_per_engine": {r.engine_name: [r.label, r.median_ms] for r in sorted(ok, key=lambda r: -r.median_ms)},
        })
        print(f"{wp.name:14s} {len(results):3d} cand {tune_s:6.1f} s  winner {winner.label:60s} "
              f"{ms[winner.label]:.4f} ms  default {ms[default.label]:.4f} ms  x{rows[-1]['speedup']:.3f}", flush=True)
        print("    best per engine (tuning median ms): " + ", ".join(
            f"{label} {m:.4f}" for label, m in sorted(rows[-1]["best_per_engine"].values(), key=lambda x: x[1])), flush=True)
        (out / "suite.json").write_text(json.dumps(rows, indent=1))  # after every shape: a timeout keeps the rest
        tuner.close()


# -- Inductor --------------------------------------------------------------------------------
def bench_pair(torch, dev, ours, theirs, rounds: int = 6, n: int = 50) -> tuple[float, float, float, float]:
    """Side by side: alternate rounds of ``bench`` on both. Returns (ours ms, theirs ms, lowest and
    highest per-round time ratio ours / theirs), the medians over all rounds."""
    a, b = [], []
    for _ in range(rounds):
        a.append(bench(torch, dev, ours, n))
        b.append(bench(torch, dev, theirs, n))
    ratios = sorted(x / y for x, y in zip(a, b))
    return sorted(a)[rounds // 2], sorted(b)[rounds // 2], ratios[0], ratios[-1]


def _inductor_sdpa(torch, p):
    """The same call our SDPA engine makes, for torch.compile: attention written into O."""
    causal = bool(p.criteria_dict.get("causal"))
    gqa = {"enable_gqa": True} if p.tensor("Q").dims[1] != p.tensor("K").dims[1] else {}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def attention(q, k, v, o):
        o.copy_(sdpa(q, k, v, is_causal=causal, **gqa))

    return attention, ("Q", "K", "V", "O")


def _inductor_variants(p, into_c: bool) -> list[tuple[str, bool, bool]]:
    """(label, force_shape_pad, into C) per Inductor compile of this problem. Odd GEMMs get Inductor's
    padding forced as well (its own choice, ``pad_mm``, is a timing race that goes either way), and
    every GEMM whose layout Inductor could choose differently also writes into the problem's C."""
    if p.op != "matmul":
        return [("sdpa into O", False, True)]
    m, k = p.tensor("A").dims[-2:]
    n = p.tensor("C").dims[-1]
    odd = any(v % 8 for v in (m, k, n))
    into = into_c or odd or not p.tensor("C").is_contiguous
    out = [("a @ b", False, False)] + ([("a @ b, pad forced", True, False)] if odd else [])
    if into:
        out += [("into C", False, True)] + ([("into C, pad forced", True, True)] if odd else [])
    return out


def run_inductor(out: Path, shapes: tuple[str, ...] = (), into_c: bool = False) -> None:
    """Inductor max-autotune per shape, first call timed, then side by side with our tuned winner
    (from suite.json when the suite ran; otherwise the default path). Each variant of
    ``_inductor_variants`` is compiled from scratch; an ``a @ b`` variant lets Inductor choose the
    output's strides, so the row records them and whether they are C's."""
    torch, dev, wl = _setup()
    import torch._dynamo
    from torch._inductor import config as inductor_config

    from farm.model.engine import default_engine_registry, settings_to_resolved

    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.automatic_dynamic_shapes = False
    suite = {r["name"]: r for r in (json.loads((out / "suite.json").read_text()) if (out / "suite.json").exists() else [])}
    registry = default_engine_registry()
    stream = torch.cuda.ExternalStream(int(dev.stream))
    rows = []
    for wp in _selected(wl, shapes):
        p = wp.problem
        if p.op not in ("matmul", "sdpa_fwd"):
            continue
        t = _operands(torch, p, dev)
        torch.backends.cuda.matmul.allow_tf32 = p.compute_dtype == "tf32"
        won = suite.get(wp.name)
        engine = registry.get(won["winner_engine"] if won else ("torch.matmul" if p.op == "matmul" else "torch.sdpa"))
        knobs = tuple(tuple(kv) for kv in won["winner_knobs"]) if won else ()
        plan = engine.compile(p, settings_to_resolved(engine, knobs), dev)
        ws = dev.runtime.malloc(plan.workspace_size) if plan.workspace_size else None
        label = won["winner"] if won else f"{engine.name}[default]"
        c_id = "C" if p.op == "matmul" else "O"
        variants = []
        for name, pad, into in _inductor_variants(p, into_c):
            torch._dynamo.reset()  # each variant tunes from scratch in this process (disk caches stay as they are)
            inductor_config.force_shape_pad = pad
            if p.op == "matmul":
                fn, ids = ((lambda a, b, c: c.copy_(a @ b)), ("A", "B", "C")) if into else ((lambda a, b: a @ b), ("A", "B"))
            else:
                fn, ids = _inductor_sdpa(torch, p)
            f = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            args = [t[i] for i in ids]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                result = f(*args)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            strides = tuple(result.stride()) if p.op == "matmul" else p.tensor(c_id).strides
            ours_ms, ms, lo, hi = bench_pair(torch, dev, lambda: plan.run(t, ws, dev.stream), lambda: f(*args))
            variants.append({"variant": name, "first_call_s": first, "ms": ms, "tflops": tflops(p.flops, ms),
                             "strides": list(strides), "same_layout": strides == p.tensor(c_id).strides,
                             "ours_ms": ours_ms, "ratio_lo": lo, "ratio_hi": hi})
            print(f"inductor {wp.name:14s} {name:20s} first call {first:6.1f} s  {ms:.4f} ms  "
                  f"{variants[-1]['tflops']:.0f} TFLOP/s  strides {strides} | ours {label} {ours_ms:.4f} ms  "
                  f"ours/inductor time {ours_ms / ms:.3f} (rounds {lo:.3f}-{hi:.3f})", flush=True)
        inductor_config.force_shape_pad = False
        rows.append({"name": wp.name, "ours": label, "c_strides": list(p.tensor(c_id).strides), "variants": variants})
        (out / "inductor.json").write_text(json.dumps(rows, indent=1))


# -- the same Triton config space: our tuner vs @triton.autotune -------------------------------
def _configs(wl):
    sweep = next(s for s in wl.problems[0].engines.sweeps if s.engine == "triton.gemm")
    import itertools

    names = list(sweep.axes)
    return [{**dict(zip(names, combo)), **dict(sweep.fixed)} for combo in itertools.product(*sweep.axes.values())]


def run_triton(out: Path, contender: str, tag: str) -> None:
    torch, dev, wl = _setup()
    import triton

    from farm.tuner.autotuner import Autotuner
    from farm.model.plans import EngineVariant

    configs = _configs(wl)
    rows = []
    for wp in (w for w in wl.problems if w.name in TRITON_SHAPES):
        p = wp.problem
        t = _operands(torch, p, dev)
        if contender == "ours":
            tuner = Autotuner(p, dev)
            tuner.add_engine_variants([EngineVariant("triton.gemm", c) for c in configs])
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            results = tuner.autotune(t, wl.autotune)
            torch.cuda.synchronize()
            tune_s = time.perf_counter() - t0
            best = results[0]
            stream_fn = lambda: tuner.execute(t)  # noqa: E731
            winner = best.label
            failed = sum(not r.succeeded for r in results)
        else:
            from engines.gpu.triton_gemm import GemmLayout, TritonGemm, _kernel

            lay = GemmLayout.of(p)
            # the constexprs our engine derives per configuration, derived by Triton's own heuristics here
            kernel = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0,
                                        "CONTIG_N": lambda a: lay.contig_n(a["BLOCK_N"])})(_kernel())
            tc = [triton.Config({k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
                                num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in configs]
            tuned = triton.autotune(configs=tc, key=["M", "N", "K"])(kernel)
            grid_meta, meta, scalars = TritonGemm()._call(p, {**configs[0]})
            fixed = {k: meta[k] for k in ("HAS_BIAS", "TF32")}
            batch = grid_meta[1]
            m, n = scalars[0], scalars[1]

            def call():
                tuned[lambda M: (triton.cdiv(m, M["BLOCK_M"]) * triton.cdiv(n, M["BLOCK_N"]), batch, 1)](
                    t["A"], t["B"], t["C"], t["C"], *scalars, **fixed)

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            tune_s = time.perf_counter() - t0
            winner = str(tuned.best_config)
            stream_fn = call
            failed = None
        ms = bench(torch, dev, stream_fn)
        rows.append({"name": wp.name, "contender": contender, "cache": tag, "tune_s": tune_s, "winner": winner,
                     "ms": ms, "tflops": tflops(p.flops, ms), "failed_configs": failed})
        print(f"{contender:6s} {tag:4s} {wp.name:12s} tune {tune_s:6.1f} s  {ms:.4f} ms  {winner}", flush=True)
        (out / f"triton-{contender}-{tag}.json").write_text(json.dumps(rows, indent=1))


# -- orchestration and report ------------------------------------------------------------------
def child(args: list[str], caches: Path, log: Path, timeout: float) -> None:
    env = dict(os.environ, TRITON_CACHE_DIR=str(caches / "triton"), TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(args)}  (caches {caches})\n")
        fh.flush()
        try:
            subprocess.run([sys.executable, __file__, *args], env=env, stdout=fh, stderr=subprocess.STDOUT,
                           timeout=timeout)
        except subprocess.TimeoutExpired:
            fh.write(f"\n!! timed out after {timeout:.0f} s\n")


def run_all(out: Path, parts: list[str], budget_s: float, contenders: tuple[str, ...] = ("triton", "ours"),
            shapes: tuple[str, ...] = (), into_c: bool = False) -> None:
    caches = Path(tempfile.mkdtemp(prefix="suite-caches-"))
    log = out / "suite.log"
    t0 = time.time()
    left = lambda: max(30.0, budget_s - (time.time() - t0))  # noqa: E731
    if "suite" in parts:
        child(["suite", "--out", str(out), "--shapes", ",".join(shapes)], caches / "suite", log, left())
    if "triton" in parts:
        for contender in contenders:
            for tag in ("cold", "warm"):  # warm reuses the cold run's caches
                child(["triton", "--contender", contender, "--tag", tag, "--out", str(out)], caches / contender, log,
                      left())
    if "inductor" in parts:
        child(["inductor", "--out", str(out), "--shapes", ",".join(shapes), *(["--into-c"] if into_c else [])],
              caches / "inductor", log, left())
    report(out)


def _best_same_layout(row):
    """The fastest Inductor variant whose output has the problem's own strides (None: not run)."""
    same = [v for v in (row or {}).get("variants", []) if v["same_layout"]]
    return min(same, key=lambda v: v["ms"]) if same else None


def report(out: Path) -> None:
    def load(name):
        path = out / name
        return json.loads(path.read_text()) if path.exists() else []

    suite = load("suite.json")
    ind = {r["name"]: r for r in load("inductor.json") if "variants" in r}
    if suite:
        print("\n| shape | problem | cand | tune s | winner | TFLOP/s | default TFLOP/s | speedup | Inductor first call s | "
              "Inductor TFLOP/s | winner / Inductor |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in suite:
            best = _best_same_layout(ind.get(r["name"]))
            inductor = "- | - | -"
            if best:  # side by side in one process: time ratio, and its spread over rounds
                inductor = (f"{best['first_call_s']:.1f} | {best['tflops']:.1f} | {best['ms'] / best['ours_ms']:.3f} "
                            f"({1 / best['ratio_hi']:.3f}-{1 / best['ratio_lo']:.3f})")
            print(f"| {r['name']} | {r['label']} | {r['candidates']} | {r['tune_s']:.1f} | {r['winner']} | "
                  f"{r['winner_tflops']:.1f} | {r['default_tflops']:.1f} | {r['speedup']:.3f} | {inductor} |")
        geo = math.exp(sum(math.log(r["speedup"]) for r in suite) / len(suite))
        print(f"\ngeometric-mean speedup over the default path: {geo:.3f} ({len(suite)} shapes); "
              f"worst {min(r['speedup'] for r in suite):.3f}")
        failures = [(r["name"], f) for r in suite for f in r["failed"]]
        if failures:
            print(f"failed candidates: {len(failures)}, e.g. {failures[:3]}")
    several = [r for r in ind.values() if len(r["variants"]) > 1]
    if several:
        print("\nInductor variants (the table above uses the fastest whose output has C's strides):\n")
        print("| shape | our winner | Inductor variant | output strides | C's strides? | first call s | TFLOP/s | "
              "winner / it |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in several:
            for v in r["variants"]:
                print(f"| {r['name']} | {r['ours']} | {v['variant']} | {tuple(v['strides'])} | "
                      f"{'yes' if v['same_layout'] else 'no'} | {v['first_call_s']:.1f} | {v['tflops']:.1f} | "
                      f"{v['ms'] / v['ours_ms']:.3f} ({1 / v['ratio_hi']:.3f}-{1 / v['ratio_lo']:.3f}) |")
    tri = [r for name in sorted(os.listdir(out)) if name.startswith("triton-") for r in load(name)]
    if tri:
        print("\n| shape | cache | Triton autotune s | ours s | time ratio (ours / Triton) | Triton winner ms | ours winner ms | ours / Triton |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for tag in ("cold", "warm"):
            for name in TRITON_SHAPES:
                a = next((r for r in tri if r["name"] == name and r["cache"] == tag and r["contender"] == "triton"), None)
                b = next((r for r in tri if r["name"] == name and r["cache"] == tag and r["contender"] == "ours"), None)
                if a and b:
                    print(f"| {name} | {tag} | {a['tune_s']:.1f} | {b['tune_s']:.1f} | {b['tune_s'] / a['tune_s']:.2f} | "
                          f"{a['ms']:.4f} | {b['ms']:.4f} | {b['ms'] / a['ms']:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("all", "suite", "inductor", "triton", "report"))
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--out", default=None)
    ap.add_argument("--contender", choices=("ours", "triton"), default="ours")
    ap.add_argument("--tag", default="cold")
    ap.add_argument("--parts", default="suite,inductor,triton")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for 'all' (children share it)")
    ap.add_argument("--contenders", default="triton,ours", help="Triton comparison contenders for 'all' (default both)")
    ap.add_argument("--shapes", default="", help="suite/inductor: only these shapes (comma-separated names)")
    ap.add_argument("--into-c", action="store_true",
                    help="inductor: also time aligned GEMMs compiled to write into C (odd ones always are)")
    args = ap.parse_args()
    out = Path(args.out or args.dir or "runs/gpu-suite")
    out.mkdir(parents=True, exist_ok=True)
    shapes = tuple(x for x in args.shapes.split(",") if x)
    if args.what == "all":
        run_all(out, args.parts.split(","), args.budget, tuple(args.contenders.split(",")), shapes, args.into_c)
    elif args.what == "suite":
        run_suite(out, shapes)
    elif args.what == "inductor":
        run_inductor(out, shapes, args.into_c)
    elif args.what == "triton":
        run_triton(out, args.contender, args.tag)
    else:
        report(out)


if __name__ == "__main__":
    main()
