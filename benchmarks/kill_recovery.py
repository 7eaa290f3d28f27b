"""What a dead worker costs: one workload tuned twice, the second time with a worker SIGKILLed part way.

    python benchmarks/kill_recovery.py WORKLOAD --devices gpu [--at 0.4] [--out DIR]
    python benchmarks/kill_recovery.py WORKLOAD --devices sim:SIM.yaml --at 0.4     # no GPU needed
    python benchmarks/kill_recovery.py WORKLOAD --devices gpu --uninterrupted RUN --uninterrupted-s 150
                                                   # an uninterrupted run already made (its folder, wall time)

Each run is a fresh `farm tune --json` process into a fresh folder, with a Triton cache of its own (each
compiles from nothing, as the first run on a machine does). The first is left alone (its wall
time T); during the second, at ``--at`` x T, one `ray::DeviceWorkerImpl` process of that run is killed
with SIGKILL (as the OOM killer or a segfault would). Printed: both wall times and their ratio (target
<= 1.3 at 0.4), the candidates and rows of each, whether the killed run's `job.json` counts (rows and
rows per disposition) equal the rows its run id has in the dataset, whether `--json`'s stdout parsed as
JSON alone, and whether the two runs publish the same winners (or confirmed ties).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def workers() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "ray::DeviceWorkerImpl"], capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def tune(workload: str, devices: str, out: Path, kill_after: float | None) -> dict:
    before = workers()
    killed: list[int] = []

    def killer() -> None:
        time.sleep(kill_after)
        mine = sorted(workers() - before)
        if mine:
            os.kill(mine[0], signal.SIGKILL)
            killed.append(mine[0])

    # each run compiles from nothing (a fresh Triton cache): the second run must not find the first's kernels
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="kill-recovery-triton-"))
    t0 = time.perf_counter()
    if kill_after is not None:
        threading.Thread(target=killer, daemon=True).start()
    proc = subprocess.run([sys.executable, "-m", "farm", "tune", workload, "--devices", devices, "--out", str(out),
                           "--json"], env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    try:
        data = json.loads(proc.stdout)
        clean = True
    except ValueError:
        data, clean = {}, False
    if proc.returncode not in (0, 3):
        raise SystemExit(f"farm tune failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return {"wall_s": wall, "json_alone": clean, "killed": killed, "data": data, "stderr": proc.stderr}


def counts(out: Path) -> dict:
    import pyarrow.dataset as ds

    job = json.loads((out / "job.json").read_text())
    run = job["runs"][-1]
    t = ds.dataset(out / "results", partitioning="hive").to_table(columns=["run_id", "disposition", "round",
                                                                         "candidate_key", "problem_key"])
    mine = [r for r in t.to_pylist() if r["run_id"] == run["run_id"]]
    by = dict(collections.Counter(r["disposition"] for r in mine))
    main = [r for r in mine if r["round"] == "main"]
    return {"job_rows": run.get("rows_written"), "job_counts": run.get("counts"), "dataset_rows": len(mine),
            "dataset_counts": by, "exact": run.get("rows_written") == len(mine) and run.get("counts") == by,
            "main_rows": len(main), "candidates": len({(r["problem_key"], r["candidate_key"]) for r in main})}


def winners(out: Path) -> dict:
    from farm.store.deciding.rule import decide_folder

    return {k: (w.label, w.confirmed.ties if w.confirmed else ()) for k, w in decide_folder(out / "results").winners.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--devices", default="auto")
    ap.add_argument("--at", type=float, default=0.4, help="kill at this fraction of the uninterrupted wall time")
    ap.add_argument("--out", help="folder for the two runs (default: a temporary one)")
    ap.add_argument("--uninterrupted", help="an uninterrupted run of the workload already made (its --out folder)")
    ap.add_argument("--uninterrupted-s", type=float, help="that run's wall time in seconds")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="kill-recovery-"))
    if args.uninterrupted:
        if not args.uninterrupted_s:
            ap.error("--uninterrupted needs --uninterrupted-s")
        base = Path(args.uninterrupted)
        plain = {"wall_s": args.uninterrupted_s, "json_alone": True, "killed": []}
    else:
        base = root / "uninterrupted"
        plain = tune(args.workload, args.devices, base, None)
    hit = tune(args.workload, args.devices, root / "killed", args.at * plain["wall_s"])
    a, b = counts(base), counts(root / "killed")
    wa, wb = winners(base), winners(root / "killed")
    same = sum(1 for k in wa if k in wb and (wa[k][0] == wb[k][0] or wb[k][0] in wa[k][1] or wa[k][0] in wb[k][1]))
    rows = [("uninterrupted", plain, a), (f"killed at {args.at:.0%}", hit, b)]
    print("| run | wall s | ratio | candidates | rows (this run) | job.json = dataset | --json alone | killed pid |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r, c in rows:
        print(f"| {name} | {r['wall_s']:.1f} | {r['wall_s'] / plain['wall_s']:.2f} | {c['candidates']} | "
              f"{c['dataset_rows']} | {'yes' if c['exact'] else 'NO: ' + json.dumps([c['job_rows'], c['job_counts']])} "
              f"| {'yes' if r['json_alone'] else 'NO'} | {r['killed'][0] if r['killed'] else '-'} |")
    print(f"winners: {same} of {len(wa)} the same or a confirmed tie")
    if not hit["killed"]:
        print("note: no worker of the second run was found to kill (the run ended first?)")
    if args.json:
        Path(args.json).write_text(json.dumps({"uninterrupted": {**a, "wall_s": plain["wall_s"]},
                                               "killed": {**b, "wall_s": hit["wall_s"], "pid": hit["killed"]},
                                               "ratio": hit["wall_s"] / plain["wall_s"], "same_winners": same,
                                               "problems": len(wa), "json_alone": hit["json_alone"]}, indent=1))


if __name__ == "__main__":
    main()
