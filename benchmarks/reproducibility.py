"""Does tuning the same workload twice publish the same winners? Where it does not, could it tell them apart?

    python benchmarks/reproducibility.py WORKLOAD [WORKLOAD...] [--devices auto] [--busy 0] [--out DIR] [--json OUT.json]
    python benchmarks/reproducibility.py --compare RUN1 RUN2      # two farm tune --out folders already there

Each workload is tuned twice, each time a fresh `farm tune` into a fresh folder (``--busy N``: a load
generator keeps N cores busy meanwhile). Per problem and calling mode the two published winners are
compared:
  * same winner;
  * confirmed tie: they differ, and a confirmation stage measured both in paired rounds and its 99 %
    interval of their time ratio includes 1 (the override metadata's ``selection.confirmation.ties``, of
    either run): the two could not be told apart, so either is a right answer;
  * changed: they differ and nothing says they tie.
Printed: a row per problem, and "same winner, or a confirmed tie" as a fraction (target >= 95 %).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.busy import busy_cores  # noqa: E402


def tune(workload: str, out: Path, devices: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "farm", "tune", workload, "--devices", devices, "--out", str(out),
                           "--json"], env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"farm tune {workload} failed: {proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def decisions(out: Path) -> dict:
    """(signature, problem key, call) -> (problem name, winner label, its ties, its speed-up)."""
    from farm.store.deciding.rule import decide_folder

    found = {}
    for (sig, key), w in decide_folder(out / "results").winners.items():
        for d in (w, *w.others):
            ties = d.confirmed.ties if d.confirmed is not None else ()
            # the primary decision is compared with the primary one (with or without a stage behind it)
            found[(sig, key, "primary" if d is w else d.call)] = (d.problem_name, d.label, ties, d.speedup_over_default)
    return found


def compare(a: dict, b: dict) -> list[dict]:
    rows = []
    for k in sorted(set(a) | set(b), key=lambda k: (a.get(k) or b.get(k))[0]):
        if k not in a or k not in b:
            rows.append({"problem": (a.get(k) or b.get(k))[0], "call": k[2], "status": "missing in one run"})
            continue
        (name, wa, ta, sa), (_, wb, tb, sb) = a[k], b[k]
        status = "same winner" if wa == wb else "confirmed tie" if (wb in ta or wa in tb) else "changed"
        rows.append({"problem": name, "call": k[2], "status": status, "first": wa, "second": wb,
                     "first_speedup": sa, "second_speedup": sb})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*")
    ap.add_argument("--devices", default="auto")
    ap.add_argument("--busy", type=int, default=0, help="cores a load generator keeps busy during the tunes")
    ap.add_argument("--out", help="keep the runs here (OUT/<workload>/run1, run2; default: a temporary folder)")
    ap.add_argument("--compare", nargs=2, metavar="RUN", help="compare two farm tune --out folders; tune nothing")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    every: list[dict] = []
    took: list[float] = []
    if args.compare:
        every = [{"workload": Path(args.compare[0]).name, **r}
                 for r in compare(*(decisions(Path(d)) for d in args.compare))]
    elif not args.workloads:
        ap.error("name a workload, or --compare RUN1 RUN2")
    with busy_cores(args.busy if not args.compare else 0):
        for wl in args.workloads:
            root = Path(args.out) / Path(wl).stem if args.out else Path(tempfile.mkdtemp(prefix="reproducibility-"))
            runs = []
            for i in (1, 2):
                took.append(tune(wl, root / f"run{i}", args.devices))
                runs.append(decisions(root / f"run{i}"))
            every += [{"workload": Path(wl).stem, **r} for r in compare(*runs)]
    print("| workload | problem | call | first run | second run | result |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in every:
        second = r.get("second", "-") if r.get("second") != r.get("first") else "(same)"
        print(f"| {r['workload']} | {r['problem']} | {r['call']} | {r.get('first', '-')} | {second} | {r['status']} |")
    good = sum(r["status"] in ("same winner", "confirmed tie") for r in every)
    same = sum(r["status"] == "same winner" for r in every)
    print(f"same winner, or a confirmed tie: {good}/{len(every)} = {good / max(len(every), 1):.1%} "
          f"({same} same, {good - same} confirmed ties)"
          + (f"; tunes took {', '.join(f'{t:.0f}' for t in took)} s" if took else "")
          + (f"; {args.busy} core(s) kept busy" if args.busy else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": every, "fraction": good / max(len(every), 1),
                                               "tune_s": took}, indent=1, default=str))


if __name__ == "__main__":
    main()
