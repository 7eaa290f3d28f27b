"""Replay overhead: farm.ops replaying a published winner vs the same library call made directly.

    python benchmarks/replay_overhead.py cpu [--rounds 5]
    python benchmarks/replay_overhead.py engines [--shapes 1x4096x4096,16x4096x14336]   # each library engine
    python benchmarks/replay_overhead.py gpu --workload examples/h200-replay.yaml --published ROOT \
        [--results RUN/results] [--rounds 5] [--json OUT.json]

One process, alternating rounds (direct, replay, replay, direct, ...), the median of the rounds.

cpu: numpy matmuls from 8x8 to 512x512 (fp32), replayed with nothing tuned (StaticOrdering's
     default: np.matmul). Reports the per-call time of np.matmul(a, b) and of farm.ops.matmul(a, b)
     and their difference in microseconds. Target: at most 3 us per call.
gpu: every matmul, sdpa_fwd and conv_fprop problem of the workload, replayed through
     FARM_HEUR_CONFIG_PATH=ROOT (a farm publish root) and timed with triton.testing.do_bench beside
     the eager call (a @ b, F.scaled_dot_product_attention, F.conv2d). Reports direct/replay (1.0 is
     parity; replay/direct time is its inverse), the replayed engine, whether it equals the published
     entry and (with --results) the winner `farm report` names, and for tuned problems the replayed
     speed-up over eager beside the speed-up the farm measured over its default, and the host time
     one call takes to issue (a call whose host time nears its device time is host-bound). Targets: replay time
     within 1 % of eager (direct/replay >= 0.99) where the winner is the default engine; for tuned
     problems the replayed speed-up within 2 % of the measured one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _alternate(fns: dict[str, Callable[[], float]], rounds: int, spread: dict[str, float] | None = None) -> dict[str, float]:
    """Median over rounds of each timing function, the order flipped every round (``spread``: max - min)."""
    got: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            got[name].append(fns[name]())
    if spread is not None:
        spread.update({k: max(v) - min(v) for k, v in got.items()})
    return {k: statistics.median(v) for k, v in got.items()}


# -- CPU -------------------------------------------------------------------------------------
def run_cpu(rounds: int) -> list[dict[str, Any]]:
    import numpy as np

    import farm.ops as ops

    rows = []
    for n in (8, 32, 64, 128, 256, 512):
        rng = np.random.default_rng(n)
        a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
        ops.matmul(a, b)  # the first call chooses and compiles
        calls = max(20, int(2e6 / (n ** 2.5)))

        def per_call(fn: Callable[[], Any], k: int = calls) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            return (time.perf_counter() - t0) / k * 1e6

        spread: dict[str, float] = {}
        t = _alternate({"direct": lambda: per_call(lambda: np.matmul(a, b)),
                        "replay": lambda: per_call(lambda: ops.matmul(a, b))}, rounds, spread)
        engine = ops.choices()[-1]
        rows.append({"shape": f"{n}x{n}x{n} fp32", "engine": f"{engine['engine']}{engine['knobs'] or ''}",
                     "direct_us": t["direct"], "replay_us": t["replay"], "overhead_us": t["replay"] - t["direct"],
                     "direct_spread_us": spread["direct"], "calls_per_round": calls})
    return rows


def table_head(columns: list[str], left: str) -> None:
    """A Markdown table's header: ``left`` gives the first columns' alignment (l: left, c: centred), the rest right."""
    marks = {"l": "---", "c": ":---:"}
    print("| " + " | ".join(columns) + " |")
    print("| " + " | ".join(marks[left[i]] if i < len(left) else "---:" for i in range(len(columns))) + " |")


def print_cpu(rows: list[dict[str, Any]]) -> None:
    table_head(["shape", "replayed engine", "np.matmul us", "farm.ops.matmul us", "overhead us",
                "np.matmul spread over rounds us"], "ll")
    for r in rows:
        print(f"| {r['shape']} | {r['engine']} | {r['direct_us']:.2f} | {r['replay_us']:.2f} | {r['overhead_us']:+.2f} "
              f"| {r['direct_spread_us']:.2f} |")
    # where the library call's own spread is larger than the target, the difference is that call's noise
    measurable = [r for r in rows if r["direct_spread_us"] < 3.0] or rows
    worst = max(measurable, key=lambda r: r["overhead_us"])
    print(f"\nper-call overhead: median {statistics.median(r['overhead_us'] for r in rows):.2f} us; worst "
          f"{worst['overhead_us']:.2f} us ({worst['shape']}) where np.matmul itself varies < 3 us (target <= 3 us)")


# -- GPU -------------------------------------------------------------------------------------
def _gpu_problem_calls(problem: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(direct eager call, farm.ops replay) on fresh random tensors of the problem's layout."""
    import torch
    import torch.nn.functional as F

    import farm.ops as ops
    from engines.gpu._common import torch_dtype

    def make(tid: str) -> Any:
        d = problem.tensor(tid)
        base = torch.randn(d.dims, device="cuda", dtype=torch.float32).to(torch_dtype(d.dtype))
        return torch.empty_strided(d.dims, d.strides, dtype=base.dtype, device="cuda").copy_(base)

    t = {tid: make(tid) for tid in problem.input_ids}
    c = problem.criteria_dict
    if problem.op == "matmul":
        a, b = t["A"], t["B"]
        cd = problem.tensor("C")
        contiguous = cd.strides == tuple(torch.empty(cd.dims, device="meta").stride())
        out = None if contiguous else torch.empty_strided(cd.dims, cd.strides, dtype=a.dtype, device="cuda")
        tf32 = problem.compute_dtype == "tf32"

        def direct() -> Any:
            torch.backends.cuda.matmul.allow_tf32 = tf32  # the caller's own setting for this GEMM
            return torch.matmul(a, b, out=out) if out is not None else a @ b

        def replay() -> Any:
            return ops.matmul(a, b, out=out, compute_dtype=problem.compute_dtype)

        return direct, replay
    if problem.op == "sdpa_fwd":
        q, k, v = t["Q"], t["K"], t["V"]
        causal = bool(c["causal"])
        extra = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra),
                lambda: ops.sdpa(q, k, v, causal=causal))
    x, w = t["X"], t["W"]
    stride, pad = (c["stride_h"], c["stride_w"]), (c["pad_h"], c["pad_w"])
    dil, groups = (c["dilation_h"], c["dilation_w"]), c["groups"]
    return (lambda: F.conv2d(x, w, None, stride, pad, dil, groups),
            lambda: ops.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=groups))


def _host_us(fn: Callable[[], Any], calls: int = 20, rounds: int = 5) -> float:
    """Host time to issue one call (no synchronisation inside the loop): the CPU side of its cost."""
    import torch

    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def run_gpu(workload_path: str, published: str, results: str | None, rounds: int) -> list[dict[str, Any]]:
    os.environ["FARM_HEUR_CONFIG_PATH"] = published
    import torch
    import triton.testing

    import farm.ops as ops
    from farm.devices.device import gpu_device
    from farm.model.engine import default_engine_registry
    from farm.store.overrides.parsing import load_overrides
    from farm.store.publish.published import find_published
    from farm.model.knobs import candidate_label
    from farm.model.workload import load_workload

    wl = load_workload(workload_path, default_engine_registry())
    props = gpu_device("cuda", 0).properties
    hit = find_published(published, props)
    entries = load_overrides(hit[0]) if hit else None
    winners = {}
    if results:
        from farm.store.deciding.rule import decide_folder

        winners = {key: w for (sig, key), w in decide_folder(results).winners.items() if sig == props.signature}
    rows = []
    for wp in wl.problems:
        p = wp.problem
        if p.op not in ("matmul", "sdpa_fwd", "conv_fprop"):
            continue
        direct, replay = _gpu_problem_calls(p)
        replay()  # choose and compile
        torch.cuda.synchronize()
        choice = next(ch for ch in ops.choices() if ch["problem_key"] == p.key)
        replayed = candidate_label(choice["engine"], tuple(sorted(choice["knobs"].items())))
        entry = entries.match(p) if entries else None
        published_label = candidate_label(entry.engine_name, entry.knobs) if entry else None
        w = winners.get(p.key)

        def bench(fn: Callable[[], Any]) -> Callable[[], float]:
            return lambda: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

        t = _alternate({"direct": bench(direct), "replay": bench(replay)}, rounds)
        host = {k: _host_us(fn) for k, fn in (("direct", direct), ("replay", replay))}
        meta = (entry.metadata or {}) if entry else {}
        sel = meta.get("selection") or {}
        default = (sel.get("default") or {}).get("label")
        tuned = entry is not None and default is not None and published_label != default
        measured = (sel.get("default") or {}).get("median_time_ms")
        measured_speedup = measured / meta["median_time_ms"] if measured and meta.get("median_time_ms") else None
        rows.append({
            "problem": wp.name, "op": p.op, "direct_ms": t["direct"], "replay_ms": t["replay"],
            "direct_host_us": host["direct"], "replay_host_us": host["replay"],
            "direct_over_replay": t["direct"] / t["replay"], "replayed": replayed, "published": published_label,
            "report_winner": w.label if w else None, "source": choice["source"], "tuned": tuned,
            "replay_speedup": t["direct"] / t["replay"] if tuned else None,
            "measured_speedup": measured_speedup if tuned else None,
        })
    return rows


def print_gpu(rows: list[dict[str, Any]]) -> None:
    table_head(["problem", "replayed engine", "= published", "= report", "eager ms", "replay ms", "eager/replay",
                "host us eager / replay", "tuned: replay speed-up", "farm measured", "ratio"], "llcc")
    for r in rows:
        same_pub = "yes" if r["replayed"] == r["published"] else "NO"
        same_rep = "-" if r["report_winner"] is None else ("yes" if r["replayed"] == r["report_winner"] else "NO")
        tuned = (f"{r['replay_speedup']:.3f}x | {r['measured_speedup']:.3f}x | "
                 f"{r['replay_speedup'] / r['measured_speedup']:.3f}") if r["tuned"] and r["measured_speedup"] else "- | - | -"
        print(f"| {r['problem']} | {r['replayed']} | {same_pub} | {same_rep} | {r['direct_ms']:.4f} | "
              f"{r['replay_ms']:.4f} | {r['direct_over_replay']:.3f} | "
              f"{r['direct_host_us']:.1f} / {r['replay_host_us']:.1f} | {tuned} |")
    default_rows = [r for r in rows if not r["tuned"]]
    if default_rows:
        worst = min(default_rows, key=lambda r: r["direct_over_replay"])
        print(f"\nwinner = default engine: worst eager/replay {worst['direct_over_replay']:.3f} ({worst['problem']}), "
              f"geomean {statistics.geometric_mean([r['direct_over_replay'] for r in default_rows]):.3f} (target >= 0.99)")
    tuned_rows = [r for r in rows if r["tuned"] and r["measured_speedup"]]
    if tuned_rows:
        off = max(tuned_rows, key=lambda r: abs(r["replay_speedup"] / r["measured_speedup"] - 1))
        print(f"tuned: largest gap between replayed and measured speed-up {100 * (off['replay_speedup'] / off['measured_speedup'] - 1):+.1f} % "
              f"({off['problem']}; target within 2 %)")
    print(f"replayed = published entry on {sum(r['replayed'] == r['published'] for r in rows)} of {len(rows)} problems")


# -- GPU: each library engine's host cost per call ------------------------------------------------------
LIBRARY_ENGINES = ("torch.matmul", "cudnn.graph", "cublaslt", "cuda.decode_gemm", "triton.gemm_splitk")


def run_engines(shapes: list[tuple[int, int, int]], rounds: int, calls: int = 400,
                profile: bool = False) -> list[dict[str, Any]]:
    """Per decode shape and library engine: farm.ops replaying that engine (an override file naming it, read by
    the Config policy) beside torch.matmul: host time to issue a call, and the per-call time of back-to-back
    calls (device events around ``calls`` calls, nothing queued ahead: launch cost included)."""
    import tempfile

    import torch

    import farm.ops as ops
    from farm.devices.device import gpu_device
    from farm.model.engine import default_engine_registry
    from farm.model.problem import Problem
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    device = gpu_device("cuda", 0)
    registry = default_engine_registry()
    folder = Path(tempfile.mkdtemp(prefix="replay-engines-"))

    def per_call_us(fn: Callable[[], Any]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls * 1e3

    rows = []
    for m, k, n in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        problem = Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype="bf16")
        base = {"host": lambda: _host_us(lambda: a @ b, calls=calls, rounds=rounds),
                "eager": lambda: per_call_us(lambda: a @ b)}
        for name in LIBRARY_ENGINES:
            engine = registry.get(name)
            support = registry.config_for(engine, problem, device)
            if not support.applicable:
                rows.append({"shape": f"{m}x{k}x{n}", "engine": name, "skipped": support.reason})
                continue
            path = folder / f"{name}-{m}x{k}x{n}.json"
            write_overrides(path, [OverrideEntry.for_problem(problem, name)],
                            device={"signature": device.signature, "properties": device.properties.to_dict()},
                            mode="replace")
            os.environ["FARM_HEUR_CONFIG_PATH"] = str(path)
            ops.reset()
            ops.matmul(a, b)
            torch.cuda.synchronize()
            chosen = next(ch for ch in ops.choices() if ch["problem_key"] == problem.key)
            timed = {"host": lambda: _host_us(lambda: ops.matmul(a, b), calls=calls, rounds=rounds),
                     "eager": lambda: per_call_us(lambda: ops.matmul(a, b))}
            got = _alternate({**{f"torch {k}": v for k, v in base.items()}, **{f"replay {k}": v for k, v in timed.items()}},
                             rounds)
            if profile:  # where a replayed call's host time goes (Python functions; C calls as builtins)
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.runcall(lambda: [ops.matmul(a, b) for _ in range(2000)])
                torch.cuda.synchronize()
                print(f"-- {name} {m}x{k}x{n}: 2000 calls")
                pstats.Stats(prof).sort_stats("tottime").print_stats(8)
            rows.append({"shape": f"{m}x{k}x{n}", "engine": name, "replayed": chosen["engine"],
                         "source": chosen["source"], "torch_host_us": got["torch host"],
                         "replay_host_us": got["replay host"], "host_over_torch_us": got["replay host"] - got["torch host"],
                         "torch_eager_us": got["torch eager"], "replay_eager_us": got["replay eager"]})
    os.environ.pop("FARM_HEUR_CONFIG_PATH", None)
    ops.reset()
    return rows


def print_engines(rows: list[dict[str, Any]]) -> None:
    table_head(["shape (bf16)", "engine replayed by farm.ops", "host us / call", "torch.matmul host us",
                "over torch us", "eager us / call", "torch.matmul eager us"], "ll")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['shape']} | {r['engine']} | - | - | - | - | - |  (not applicable: {r['skipped']})")
            continue
        print(f"| {r['shape']} | {r['replayed']} | {r['replay_host_us']:.2f} | {r['torch_host_us']:.2f} | "
              f"{r['host_over_torch_us']:+.2f} | {r['replay_eager_us']:.2f} | {r['torch_eager_us']:.2f} |")
    done = [r for r in rows if "skipped" not in r and r["engine"] != "torch.matmul"]
    if done:
        worst = max(done, key=lambda r: r["host_over_torch_us"])
        print(f"\nlibrary engines through farm.ops: worst host cost over torch.matmul {worst['host_over_torch_us']:+.2f} us "
              f"({worst['engine']}, {worst['shape']}; target <= 2 us)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("where", choices=("cpu", "gpu", "engines"))
    parser.add_argument("--shapes", default="1x4096x4096,16x4096x14336",
                        help="engines: decode GEMM shapes MxKxN (bf16), comma-separated")
    parser.add_argument("--profile", action="store_true", help="engines: print where each replayed call's host time goes")
    parser.add_argument("--workload", default="examples/h200-replay.yaml")
    parser.add_argument("--published", help="farm publish root (gpu)")
    parser.add_argument("--results", help="the tuning run's results folder: compare with farm report's winners")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if args.where == "cpu":
        rows = run_cpu(args.rounds)
        print_cpu(rows)
    elif args.where == "engines":
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        rows = run_engines(shapes, args.rounds, profile=args.profile)  # type: ignore[arg-type]
        print_engines(rows)
    else:
        if not args.published:
            parser.error("gpu needs --published ROOT")
        rows = run_gpu(args.workload, args.published, args.results, args.rounds)
        print_gpu(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
