"""The cost model's metrics on CPU shape families: train, leave-a-family-out, and a pruned tune beside an exhaustive one.

    python benchmarks/costmodel_cpu.py [--out runs/costmodel-cpu] [--top-k 2] [--explore 0.1]

1. writes the CPU families' workloads (benchmarks/costmodel_workloads.py --target cpu);
2. tunes the training families exhaustively, in-process (an existing run folder is resumed, not redone);
3. ``farm model eval --holdout family`` on them: measurements and regret per held-out problem;
4. trains a model on them and tunes the held-out families (qwen2-7b, resnet18) twice, exhaustively and with
   ``--prune``, one after the other, then compares them (benchmarks/costmodel_compare.py).

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


def farm(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "farm", *args], cwd=ROOT, check=True, text=True,
                          capture_output=quiet)


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
    for name, extra in (("heldout-exhaustive", []), ("heldout-pruned", ["--prune", str(out / "model.json"),
                                                                        "--prune-top-k", args.top_k,
                                                                        "--prune-explore", args.explore])):
        shutil.rmtree(out / name, ignore_errors=True)  # both measured now, side by side
        farm("tune", str(out / "workloads" / "cm-cpu-heldout.yaml"), "--in-process", "--devices", "cpu", "--out",
             str(out / name), "--allow-partial", *extra)
    print("\nheld-out families, exhaustive vs pruned (benchmarks/costmodel_compare.py):")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "costmodel_compare.py"), str(out / "heldout-exhaustive"),
                    str(out / "heldout-pruned")], check=True)


if __name__ == "__main__":
    main()
