"""Do the published decisions hold for both ways production calls a GEMM? farm.ops against torch.matmul,
called eagerly and inside a captured CUDA graph, on a tuned run's matmul problems (GPU).

    python benchmarks/call_modes.py RUN [--rounds 7] [--calls 64] [--json OUT.json]

RUN is a `farm tune --out` folder of a workload with `call: [eager, graph]` (examples/h200-decode.yaml);
its override file is replayed through FARM_HEUR_CONFIG_PATH (the Config policy), in this fresh process.
Per problem, rounds alternate the two callers on 8 input sets taken in turn (weights from HBM):

* eager: device events around ``--calls`` back-to-back calls, nothing queued ahead (the per-call time an
  eager caller sees, launch cost included). farm.ops / torch.matmul time as a speed-up: >= 0.99 wanted.
* graph: a CUDA graph of ``--calls`` calls captured for each (farm.ops runs the graph decision while the
  stream captures), its replays timed. The speed-up beside the one the farm published for the graph
  decision (its paired speed-up over the default): the ratio >= 0.99 wanted where the decision is not the
  default (torch.matmul), and the replay >= 0.99 of torch.matmul where it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a farm tune --out folder")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    run = Path(args.run)
    (overrides,) = [p for p in (run / "overrides").glob("*.json")]
    os.environ["FARM_HEUR_CONFIG_PATH"] = str(overrides)

    import torch

    import farm.ops as ops
    from farm.model.problem import Problem
    from farm.store.deciding.rule import decide_folder

    decisions = decide_folder(run / "results")
    rows = []
    for (sig, key), w in sorted(decisions.winners.items(), key=lambda kv: kv[1].problem_name):
        problem = Problem.from_canonical(json.loads(decisions.table["problem_json"][w.row].as_py()))
        if problem.op != "matmul":
            continue
        a0 = problem.tensor("A")
        sets = [(torch.randn(a0.dims, device="cuda").to(torch.bfloat16 if a0.dtype == "bf16" else torch.float16),
                 torch.randn(problem.tensor("B").dims, device="cuda").to(torch.bfloat16 if a0.dtype == "bf16"
                                                                          else torch.float16)) for _ in range(8)]
        ops.reset()

        def farm_call(i: int) -> Any:
            a, b = sets[i % 8]
            return ops.matmul(a, b)

        def torch_call(i: int) -> Any:
            a, b = sets[i % 8]
            return a @ b

        farm_call(0)  # bind (eager decision)
        eager = {"farm": _eager(farm_call, args.calls), "torch": _eager(torch_call, args.calls)}
        graphs = {"farm": _graph(farm_call, args.calls), "torch": _graph(torch_call, args.calls)}
        times: dict[str, list[float]] = {f"{m} {c}": [] for m in ("eager", "graph") for c in ("farm", "torch")}
        for r in range(args.rounds):
            for c in (("farm", "torch") if r % 2 == 0 else ("torch", "farm")):
                times[f"eager {c}"].append(eager[c]())
                times[f"graph {c}"].append(graphs[c]())
        med = {k: statistics.median(v) for k, v in times.items()}
        chosen = {ch["source"]: ch["engine"] + str(ch["knobs"] or "") for ch in ops.choices() if ch["problem_key"] == key}
        g = w.for_call("graph")
        rows.append({
            "problem": w.problem_name, "eager_winner": w.for_call("eager").label if w.for_call("eager") else w.label,
            "graph_winner": g.label if g else None, "replayed": chosen,
            "eager_farm_us": med["eager farm"], "eager_torch_us": med["eager torch"],
            "eager_speedup": med["eager torch"] / med["eager farm"],
            "graph_farm_us": med["graph farm"], "graph_torch_us": med["graph torch"],
            "graph_speedup": med["graph torch"] / med["graph farm"],
            "graph_published": g.speedup_over_default if g else None,
            "graph_published_interval": list(g.speedup_interval) if g and g.speedup_interval else None,
            "graph_is_default": bool(g and g.label == g.default),
        })
    print("| problem | eager decision | farm.ops / torch eager | graph decision | farm.ops / torch in a graph "
          "| published (graph) | replayed / published |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        pub = r["graph_published"]
        ratio = r["graph_speedup"] / pub if pub else None
        print(f"| {r['problem']} | {r['eager_winner']} | {r['eager_speedup']:.3f} ({r['eager_farm_us']:.2f} vs "
              f"{r['eager_torch_us']:.2f} us) | {r['graph_winner']} | {r['graph_speedup']:.3f} | "
              f"{pub:.3f} | {ratio:.3f} |" if pub else
              f"| {r['problem']} | {r['eager_winner']} | {r['eager_speedup']:.3f} | {r['graph_winner']} | "
              f"{r['graph_speedup']:.3f} | - | - |")
    if rows:
        worst_eager = min(rows, key=lambda r: r["eager_speedup"])
        tuned = [r for r in rows if r["graph_published"] and not r["graph_is_default"]]
        print(f"\neager: worst farm.ops / torch.matmul {worst_eager['eager_speedup']:.3f} ({worst_eager['problem']}); "
              f"geomean {statistics.geometric_mean([r['eager_speedup'] for r in rows]):.3f} (target each >= 0.99)")
        if tuned:
            worst = min(tuned, key=lambda r: r["graph_speedup"] / r["graph_published"])
            print(f"graph: worst replayed / published speed-up {worst['graph_speedup'] / worst['graph_published']:.3f} "
                  f"({worst['problem']}; target >= 0.99) over {len(tuned)} tuned graph decisions")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _eager(call: Callable[[int], Any], calls: int) -> Callable[[], float]:
    """us per call of ``calls`` back-to-back calls, device events around them, nothing queued ahead."""
    import torch

    def measure() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(calls):
            call(i)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls * 1e3

    measure()
    return measure


def _graph(call: Callable[[int], Any], calls: int) -> Callable[[], float]:
    """us per call of a captured CUDA graph of ``calls`` calls, replayed."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on the side stream (torch's rule before a capture)
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)

    def measure() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls * 1e3

    measure()
    return measure


if __name__ == "__main__":
    sys.exit(main())
