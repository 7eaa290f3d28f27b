"""Do published decisions hold for the caller? Tune on a busy machine, then re-check every winner against
the default in a fresh process, paired and interleaved, the way production calls it.

    python benchmarks/history/decisions_hold.py [--workloads examples/cpu-quick.yaml examples/cpu-matmuls.yaml]
                                        [--busy 1] [--rounds 40] [--json OUT.json]

For each workload: a fresh `farm tune` (the Ray executor, as the Quick start runs it) into a temporary
folder while ``--busy`` cores spin in processes this script starts (a load generator; the machine is
busy during the tune and the re-check alike). Then, per problem, a fresh Python process loads the
published override file (FARM_HEUR_CONFIG_PATH, the Config policy: replay as production runs it) and
the default engine (what runs with nothing tuned: the winners table's ``default``) and times them in
``--rounds`` rounds of random order, each sample back-to-back calls of at least 10 ms, and reports the
paired speed-up of the winner over the default with its 99 % interval.

Checks, per problem whose published winner is not the default:
  * not slower: the re-check does not find the winner slower than the default (its speed-up's 99 %
    interval is not wholly below 1; the point estimate is shown beside it);
  * within its interval: the re-check's speed-up lies inside the interval the farm published.
A problem where the default was published is shown as such (nothing to re-check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this probe lives in benchmarks/history)
sys.path.insert(0, str(ROOT))

from benchmarks.busy import busy_cores  # noqa: E402

RECHECK = r'''
import json, math, os, random, sys, time
sys.path.insert(0, sys.argv[1])
from farm.devices.device import cpu_device
from farm.devices.arrays import make_tensors
from farm.model.engine import default_engine_registry, settings_to_resolved
from farm.model.problem import Problem
from farm.replay.tunable_runtime import TunableRuntime
from farm.tuner.callers import eager_call
from farm.tuner.judging.paired import paired_ratio

problem = Problem.from_canonical(json.loads(sys.argv[2]))
default_engine, rounds = sys.argv[3], int(sys.argv[4])
device = cpu_device()
registry = default_engine_registry()
bound = TunableRuntime(device).bind(problem.key, problem)  # FARM_HEUR_CONFIG_PATH: the published winner
engine = registry.get(default_engine)
plan = engine.compile(problem, settings_to_resolved(engine, ()), device)
workspace = device.runtime.malloc(plan.workspace_size) if plan.workspace_size else None
calls = {"winner": eager_call(problem, device, bound.plan, bound.workspace),
         "default": eager_call(problem, device, plan, workspace)}
tensors = make_tensors(problem, device.arrays, 1)
def once(f):
    t0 = time.perf_counter()
    f(tensors)
    return time.perf_counter() - t0

one = min(once(f) for f in calls.values() for _ in range(3))  # the first of each warms it up
n = max(1, int(math.ceil(10e-3 / max(one, 1e-7))))  # 10 ms samples, as the stage takes on a CPU
samples = {k: [] for k in calls}
rng = random.Random(7)
for _ in range(rounds):
    order = list(calls)
    rng.shuffle(order)
    for k in order:
        f = calls[k]
        t0 = time.perf_counter()
        for _ in range(n):
            f(tensors)
        samples[k].append((time.perf_counter() - t0) / n * 1e3)
r = paired_ratio(samples["winner"], samples["default"])
print(json.dumps({"engine": bound.engine_name, "knobs": dict(bound.knobs), "source": bound.source,
                  "speedup": r.speedup, "low": r.speedup_low, "high": r.speedup_high, "calls": n,
                  "winner_ms": sorted(samples["winner"])[rounds // 2], "default_ms": sorted(samples["default"])[rounds // 2]}))
'''


def tune(workload: str, out: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "farm", "tune", workload, "--out", str(out), "--json"], env=env,
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"farm tune {workload} failed: {proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def recheck(out: Path, rounds: int) -> list[dict]:
    import pyarrow.parquet as pq

    (overrides,) = list((out / "overrides").glob("*.json"))
    (table,) = list((out / "overrides").glob("*.winners.parquet"))
    from farm.store.overrides.parsing import load_overrides

    entries = {(e.metadata or {}).get("problem_key"): e for e in load_overrides(overrides).entries}
    env = dict(os.environ, FARM_HEUR_CONFIG_PATH=str(overrides),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    for w in pq.read_table(table).to_pylist():
        if not w["primary"] or w["problem_key"] not in entries:
            continue
        problem = _problem_of(out, w["problem_key"])
        default_engine = (w["default"] or "").split("[")[0]
        is_default = w["engine_name"] == default_engine and not w["knobs"]
        row = {"problem": w["problem_name"], "winner": f"{w['engine_name']}{_knobs(w['knobs'])}", "default": w["default"],
               "published": w["speedup_over_default"], "low": w["speedup_low"], "high": w["speedup_high"],
               "rule": w["rule"], "trusted": w["trusted"], "is_default": is_default}
        if not is_default:
            proc = subprocess.run([sys.executable, "-c", RECHECK, str(ROOT), problem, default_engine, str(rounds)],
                                  env=env, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"re-check of {w['problem_name']} failed: {proc.stderr[-2000:]}")
            row["recheck"] = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
    return rows


def _knobs(structs: list) -> str:
    return "[" + (",".join(f"{k['id']}={k['value']}" for k in structs) or "default") + "]"


def _problem_of(out: Path, key: str) -> str:
    import pyarrow.dataset as ds

    t = ds.dataset(out / "results", partitioning="hive").to_table(columns=["problem_key", "problem_json"],
                                                                 filter=ds.field("problem_key") == key)
    return t["problem_json"][0].as_py()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", nargs="+", default=["examples/cpu-quick.yaml", "examples/cpu-matmuls.yaml"])
    ap.add_argument("--busy", type=int, default=1, help="cores the load generator keeps busy (default 1)")
    ap.add_argument("--rounds", type=int, default=40, help="paired rounds of the re-check (default 40)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    results = {}
    with busy_cores(args.busy):
        for wl in args.workloads:
            out = Path(tempfile.mkdtemp(prefix="decisions-hold-")) / "run"
            took = tune(wl, out)
            results[wl] = {"tune_s": took, "problems": recheck(out, args.rounds)}
    slower = outside = checked = 0
    print(f"load generator: {args.busy} busy core(s) of {os.cpu_count()}; re-check: {args.rounds} paired rounds, "
          "a fresh process per problem")
    print("| workload | problem | published winner | published speed-up (99 % interval) | re-check speed-up (99 % interval) | not slower | within its interval |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for wl, res in results.items():
        for p in res["problems"]:
            if p["is_default"]:
                print(f"| {Path(wl).stem} | {p['problem']} | {p['winner']} (the default) | 1.00x | - | - | - |")
                continue
            r = p["recheck"]
            checked += 1
            ok_slow = r["high"] >= 1.0  # not wholly below 1
            ok_in = p["low"] is not None and p["low"] <= r["speedup"] <= p["high"]
            slower += not ok_slow
            outside += not ok_in
            interval = f" ({p['low']:.3f}-{p['high']:.3f})" if p["low"] is not None else ""
            print(f"| {Path(wl).stem} | {p['problem']} | {p['winner']} | {p['published']:.3f}x{interval} | "
                  f"{r['speedup']:.3f}x ({r['low']:.3f}-{r['high']:.3f}) | {'yes' if ok_slow else 'NO'} | "
                  f"{'yes' if ok_in else 'NO'} |")
    print(f"{checked} tuned winner(s) re-checked: {slower} slower than the default, {outside} outside their interval; "
          + ", ".join(f"{Path(w).stem} tuned in {r['tune_s']:.1f} s" for w, r in results.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
