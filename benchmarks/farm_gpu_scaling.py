"""Farm scaling on one host: the same workload tuned through the Ray farm with 1, 2, ... GPUs.

    python benchmarks/farm_gpu_scaling.py --gpus 1,2 --out DIR [--workload examples/h200-suite.yaml]

Each run is a fresh `farm tune --devices gpu` process that sees only the first N
GPUs (CUDA_VISIBLE_DEVICES) and starts with empty Triton caches, so every run
compiles the same kernels. Reported per run: wall time (the whole command) and
tuning time (workers ready to last result), candidates per second, scaling
efficiency against 1 GPU (time(1) / (N * time(N))), each GPU's busy fraction,
and whether the override files agree with the 1-GPU run (same winner, or a
winner whose recorded time is within 3 % of the other's); then each worker's device
time by phase (discovery, setup, compiles waited for, measurement, confirmation, lost,
idle): where a second GPU's time goes.
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

from farm.tuner.phases import PHASES  # noqa: E402


def run(n: int, workload: str, out: Path, log: Path, devices: str = "gpu") -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(n)), PYTHONUNBUFFERED="1",
               TRITON_CACHE_DIR=tempfile.mkdtemp(prefix=f"triton-{n}gpu-"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        proc = subprocess.run([sys.executable, "-m", "farm", "tune", workload, "--devices", devices.format(n=n), "--out",
                               str(out), "--json"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=fh, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{n} GPU run failed (exit {proc.returncode}); see {log}")
    data = json.loads(proc.stdout)
    data["command_wall_s"] = wall
    (out / "report.json").write_text(json.dumps(data, indent=1))
    return data


def agree(a: Path, b: Path) -> tuple[int, int, list[str]]:
    from farm.store.overrides.parsing import load_overrides

    fa, fb = load_overrides(next(a.glob("*.json"))), load_overrides(next(b.glob("*.json")))
    same = close = 0
    notes = []
    for ea in fa.entries:
        eb = next((e for e in fb.entries if e.match_key() == ea.match_key()), None)
        if eb is None:
            notes.append(f"{ea.metadata.get('problem_name')}: missing")
            continue
        if (ea.engine_name, ea.knobs) == (eb.engine_name, eb.knobs):
            same += 1
            continue
        ta, tb = ea.metadata["median_time_ms"], eb.metadata["median_time_ms"]
        if abs(ta - tb) <= 0.03 * min(ta, tb):
            close += 1
        notes.append(f"{ea.metadata.get('problem_name')}: {ea.engine_name}{dict(ea.knobs)} {ta:.4f} ms vs "
                     f"{eb.engine_name}{dict(eb.knobs)} {tb:.4f} ms")
    return same, close, notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--workload", default="examples/h200-suite.yaml")
    ap.add_argument("--out", default="runs/scaling")
    ap.add_argument("--devices", default="gpu", help="farm tune --devices value; {n} is the count (sim:{n} tests the script)")
    args = ap.parse_args()
    base = Path(args.out)
    base.mkdir(parents=True, exist_ok=True)
    counts = [int(x) for x in args.gpus.split(",")]
    reports = {n: run(n, args.workload, base / f"{n}gpu", base / "scaling.log", args.devices) for n in counts}
    first = min(counts)  # the baseline (runs may come in any order: --gpus 2,1 measures the larger count first)
    one = reports[first]
    print("| GPUs | wall s | tuning s | candidates | candidates/s | speed-up | efficiency | busy per GPU | winners vs 1 GPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, r in sorted(reports.items()):
        tuning = r["tuning_s"]
        busy = ", ".join(f"{w['name']} {100 * w['busy_s'] / tuning:.0f} %" for w in r["workers"])
        speed = one["tuning_s"] / tuning
        eff = speed / (n / first)
        same, close, notes = agree(base / f"{first}gpu" / "overrides", base / f"{n}gpu" / "overrides")
        total = same + len(notes)
        print(f"| {n} | {r['command_wall_s']:.1f} | {tuning:.1f} | {r['candidates']} | {r['candidates'] / tuning:.1f} | "
              f"{speed:.2f} | {eff:.2f} | {busy} | {same}/{total} same, {close} within 3 % |")
        for note in notes:
            print(f"    {n} GPUs: {note}")
        sigs = {w["signature"] for w in r["workers"]}
        gpus = sorted((w["host"], tuple(w["gpu_ids"]), w["properties"]["uuid"]) for w in r["workers"])
        print(f"    {n} GPUs: workers {len(r['workers'])}, signatures {sorted(sigs)}, gpus {gpus}")
    print()
    print("Device time by phase (farm.tuner.phases; s, and share of the worker's tuning window):")
    print("| GPUs | worker | " + " | ".join(PHASES) + " |")
    print("| --- | --- |" + " --- |" * len(PHASES))
    for n, r in sorted(reports.items()):
        rows = [(w["name"], w.get("phases") or {}) for w in r["workers"]]
        rows.append(("total", (r.get("phases") or {}).get("total") or {}))
        for name, split in rows:
            whole = sum(split.get(p, 0.0) for p in PHASES) or 1.0
            print(f"| {n} | {name} | " + " | ".join(f"{split.get(p, 0.0):.1f} ({100 * split.get(p, 0.0) / whole:.0f} %)"
                                                  for p in PHASES) + " |")


if __name__ == "__main__":
    main()
