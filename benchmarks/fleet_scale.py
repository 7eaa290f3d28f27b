"""The driver at fleet scale: its memory and throughput as the candidate count grows, results on a local
folder or on S3 (moto's server on this machine), 64 simulated devices over 4 signatures.

    python benchmarks/fleet_scale.py                           # 50,000 and 200,000 candidates, local and S3
    python benchmarks/fleet_scale.py --candidates 20000 --store s3 --devices 16

Each run is a fresh process (its peak RSS is its own). A simulated candidate costs no wall time, so the
run measures the farm itself: scheduling, the workers' streams, Parquet. With a local folder the driver
writes every row; with a URI (S3, or file:// for a shared mount: --store shared) the workers write their
own parts and the driver gets what scheduling needs. Printed per run: candidates, rows in the dataset, the driver's peak RSS while tuning (sampled at
every progress tick) and over the whole run (the in-process reduce included), tuning time, rows/s and
ms of farm time per candidate. Targets (issue 20): driver RSS under 1 GB at 200,000 candidates and flat
in the candidate count; per-candidate overhead no worse than 0.27 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes import SIM_GEMM_SWEEP as SWEEP  # noqa: E402  (100 configs, the tests' own)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def one(candidates: int, devices: int, signatures: int, out: str) -> dict:
    from farm.devices.sim import SimConfig
    from farm.fleet.options import DeviceRequest, FarmOptions
    from farm.fleet.on_ray.cluster import run_farm
    from farm.model.engine import default_engine_registry
    from farm.model.workload import parse_workload
    from farm.store.dataset import ResultsDataset
    from farm.store.location import Location

    problems = max(1, candidates // (100 * signatures))
    wl = parse_workload({
        "name": "fleet-scale",
        "autotune": {"strategy": "single_shot", "warmup_iterations": 0, "check": "off"},
        "engines": {"include": ["sim.gemm"], "sweep": {"sim.gemm": SWEEP}},
        "problems": [{"name": f"p{i}", "op": "matmul", "tensors": {"A": [8, 8 + i], "B": [8 + i, 8]}}
                     for i in range(problems)],
    }, registry=default_engine_registry())
    per = devices // signatures
    sim = SimConfig.parse({"devices": [{"name": f"Sim {chr(65 + s)}", "count": per, "speed": 1 + s}
                                       for s in range(signatures)], "noise": 0.0, "sleep": 0.0})
    peak = [rss_mb()]

    def progress(status) -> None:
        peak.append(rss_mb())

    t0 = time.perf_counter()
    report = run_farm(wl, out, devices=DeviceRequest("sim", per * signatures, sim),
                      options=FarmOptions(shard_size=1000, progress_interval_s=0.5), progress=progress)
    wall = time.perf_counter() - t0
    rounds = ResultsDataset(Location.of(out).join("results")).table(["round"])["round"].to_pylist()
    rows = sum(r != "confirm" for r in rounds)  # a row per candidate; the confirmation stages' rows apart
    return {"candidates": report.total, "rows": rows, "confirm_rows": len(rounds) - rows,
            "rows_written": report.rows_written, "wall_s": wall,
            "tuning_s": report.tuning_s, "tuning_peak_rss_mb": max(peak), "start_rss_mb": peak[0],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "ms_per_candidate": report.tuning_s / report.total * 1e3, "rows_per_s": rows / report.tuning_s}


def moto() -> tuple[subprocess.Popen, str]:
    """moto's S3 server (tests/servers.py, the tests' own) with this benchmark's bucket; (process, URI query)."""
    import pyarrow.fs as pafs

    from tests.servers import s3_query, start_moto

    proc, endpoint = start_moto()
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1", allow_bucket_creation=True)
    fs.create_dir("fleet")
    return proc, s3_query(endpoint)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, nargs="+", default=[50_000, 200_000])
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--signatures", type=int, default=4)
    ap.add_argument("--store", choices=("local", "shared", "s3", "both"), default="both",
                    help="local: a path (the driver writes); shared: a file:// URI (the workers write, no S3 server); "
                         "s3: moto's S3 server (the workers write); both: local and s3")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration into this --out
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.candidates[0], args.devices, args.signatures, args.one)))
        return 0
    env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    server, query = moto() if args.store in ("s3", "both") else (None, "")
    rows = []
    try:
        for n in args.candidates:
            for store in (("local", "s3") if args.store == "both" else (args.store,)):
                folder = Path(tempfile.mkdtemp(prefix="fleet-scale-")) / "run"
                out = {"local": str(folder), "shared": f"file://{folder}",
                       "s3": f"s3://fleet/run-{n}-{int(time.time())}?{query}"}[store]
                proc = subprocess.run([sys.executable, __file__, "--one", out, "--candidates", str(n),
                                       "--devices", str(args.devices), "--signatures", str(args.signatures)],
                                      capture_output=True, text=True, env=env)
                if proc.returncode:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return 1
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append({"store": store, **result})
                print(f"{store:>5} {result['candidates']:>8,} candidates: {result['tuning_s']:.1f} s tuning, "
                      f"driver {result['tuning_peak_rss_mb']:.0f} MB while tuning", flush=True)
    finally:
        if server is not None:
            server.terminate()
    print()
    print(f"{args.devices} simulated devices over {args.signatures} signatures")
    print("| store | candidates | rows | driver peak RSS while tuning MB | driver peak RSS (with reduce) MB "
          "| tuning s | rows/s | ms per candidate |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['store']} | {r['candidates']:,} | {r['rows']:,} | {r['tuning_peak_rss_mb']:.0f} | "
              f"{r['peak_rss_mb']:.0f} | {r['tuning_s']:.1f} | {r['rows_per_s']:,.0f} | {r['ms_per_candidate']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
