"""The cost model's metrics on CPU shape families: train, leave-a-family-out, and a pruned tune beside an exhaustive one.

    python benchmarks/costmodel_cpu.py [--out runs/costmodel-cpu] [--top-k 2] [--explore 0.1]

1. writes the CPU families' workloads (benchmarks/costmodel_workloads.py --target cpu);
2. tunes the training families exhaustively, in-process (an existing run folder is resumed, not redone);
3. ``farm model eval --holdout family`` on them: measurements and regret per held-out problem;
4. trains a model on them and tunes the held-out families (qwen2-7b, resnet18) exhaustively, with ``--prune``,
   and with ``--history`` from a root the training run was published to (``farm publish --history``), one after
   the other; then publishes the exhaustive held-out run there too and tunes the same workload again from the
   root (every problem decided: only checked); prints each tune's wall time and compares each with the
   exhaustive one (benchmarks/costmodel_compare.py).

The CPU engines give a problem 3 to 10 candidates, so the CPU shows the mechanics and the same metrics as the
H200 run, at a smaller scale: pruning pays where candidates are many (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def farm(*args: str, quiet: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "farm", *args], cwd=ROOT, check=True, text=True,
                          capture_output=quiet, env={**os.environ, **(env or {})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/costmodel-cpu", type=Path)
    ap.add_argument("--top-k", default="2")
    ap.add_argument("--explore", default="0.1")
    args = ap.parse_args()
    out = args.out if args.out.is_absolute() else ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "costmodel_workloads.py"), "--target", "cpu", "--out",
                    str(out / "workloads")], check=True)
    t0 = time.perf_counter()
    farm("tune", str(out / "workloads" / "cm-cpu-train.yaml"), "--in-process", "--devices", "cpu", "--out",
         str(out / "train"), "--allow-partial")
    print(f"training families tuned in {time.perf_counter() - t0:.0f} s", flush=True)
    ev = json.loads(farm("model", "eval", str(out / "train"), "--holdout", "family", "--top-k", args.top_k,
                         "--explore", args.explore, "--json").stdout)
    print("\nleave-a-family-out (farm model eval --holdout family):")
    print(f"{'family':12s} {'problems':>8s} {'cands':>6s} {'meas':>5s} {'<=1.02':>7s} {'geomean':>8s}")
    groups: dict[str, list] = {}
    for p in ev["problems"]:
        groups.setdefault(p["group"], []).append(p)
    for g, ps in sorted(groups.items()):
        import math

        geo = math.exp(sum(math.log(p["regret"]) for p in ps) / len(ps))
        print(f"{g:12s} {len(ps):8d} {sum(p['candidates'] for p in ps):6d} {sum(p['measured'] for p in ps):5d} "
              f"{sum(p['regret'] <= 1.02 for p in ps) / len(ps):7.0%} {geo:8.4f}")
    s = ev["summary"]
    print(f"all          {s['problems']:8d} {s['candidates']:6d} {s['measured']:5d} {s['within_1_02']:7.0%} "
          f"{s['geomean_regret']:8.4f}   ({s['fewer']}x fewer)")
    farm("model", "train", str(out / "train"), "--out", str(out / "model.json"))
    # the fleet's flow: the training run published with its results; a new workload tuned from that root
    root = out / "published"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(out / "history-cache", ignore_errors=True)
    farm("publish", str(out / "train" / "overrides"), "--to", str(root), "--history")
    pruning = ["--prune-top-k", args.top_k, "--prune-explore", args.explore]
    walls: dict[str, float] = {}
    for name, extra in (("heldout-exhaustive", []), ("heldout-pruned", ["--prune", str(out / "model.json"), *pruning]),
                        ("heldout-history", ["--history", str(root), *pruning])):
        shutil.rmtree(out / name, ignore_errors=True)  # all measured now, side by side
        t0 = time.perf_counter()
        farm("tune", str(out / "workloads" / "cm-cpu-heldout.yaml"), "--in-process", "--devices", "cpu", "--out",
             str(out / name), "--allow-partial", *extra, env={"FARM_HISTORY_CACHE": str(out / "history-cache")})
        walls[name] = time.perf_counter() - t0
    # once the held-out families are published too, the same workload again: every problem decided, only checked
    farm("publish", str(out / "heldout-exhaustive" / "overrides"), "--to", str(root), "--history")
    shutil.rmtree(out / "heldout-decided", ignore_errors=True)
    t0 = time.perf_counter()
    farm("tune", str(out / "workloads" / "cm-cpu-heldout.yaml"), "--in-process", "--devices", "cpu", "--out",
         str(out / "heldout-decided"), "--allow-partial", "--history", str(root), *pruning,
         env={"FARM_HISTORY_CACHE": str(out / "history-cache")})
    walls["heldout-decided"] = time.perf_counter() - t0
    print("\nheld-out families, each tune's wall time (farm tune, the process whole: training the history's model "
          "and its bound included):")
    for name, wall in walls.items():
        print(f"  {name:20s} {wall:7.1f} s")
    for name in ("heldout-pruned", "heldout-history", "heldout-decided"):
        print(f"\nheld-out families, exhaustive vs {name[8:]} (benchmarks/costmodel_compare.py):")
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "costmodel_compare.py"),
                        str(out / "heldout-exhaustive"), str(out / name)], check=True)


if __name__ == "__main__":
    main()
