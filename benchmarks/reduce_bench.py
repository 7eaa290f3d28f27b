"""Reducer throughput: reduce N synthetic result rows; report wall time and peak memory.

    python benchmarks/reduce_bench.py                  # 1,000,000 rows, 4 signatures, 10,000 problems
    python benchmarks/reduce_bench.py --rows 100000    # smaller
    python benchmarks/reduce_bench.py --rows 5000000 --signatures 8 --problems 20000 --ray   # also on Ray

The rows are written in the real schema and layout (hive partitions, 40 files per
signature, 5 samples per row, a third of candidates with knobs, 2 % failures).
The reduce runs in a fresh subprocess, so its peak RSS is the reducer's own.
Target on a 2-core machine: under 10 s and under 2 GB for 1,000,000 rows.
With ``--ray`` the same data is also reduced by ``farm.fleet.on_ray.distributed_reduce`` on a local Ray
instance (one task per signature, as many at a time as there are cores), in a fresh process: its wall
time, each task's peak RSS (every task in a fresh worker process), and whether the override files and
winners tables are byte for byte the single process's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.devices.properties import DeviceProperties  # noqa: E402
from farm.model.ids import engine_name_to_id  # noqa: E402
from farm.model.problem import Problem  # noqa: E402
from farm.store.results import FILE_SCHEMA, KNOB_TYPE, NAMED_INT, NAMED_STR, TENSOR_TYPE  # noqa: E402
from farm.model.plans import candidate_key  # noqa: E402

ENGINES = ["blas", "cublaslt", "triton.gemm", "einsum", "blocked"]


def devices(n: int) -> list[DeviceProperties]:
    names = [("NVIDIA H200", "sm_90", 132), ("NVIDIA H100", "sm_90", 132), ("AMD Instinct MI300X", "gfx942", 304),
             ("NVIDIA A100", "sm_80", 108)]
    out = []
    for i in range(n):  # beyond four: the same kinds under other drivers (other signatures)
        nm, arch, cu = names[i % len(names)]
        out.append(DeviceProperties("nvidia" if "NVIDIA" in nm else "amd", nm, arch, cu, 80 * 2**30, 50 * 2**20, 1800,
                                    32, "580.1", "13.0", (("torch", f"2.{11 + i // len(names)}.0"),)))
    return out


def problems(n: int) -> list[Problem]:
    out = []
    sizes = [64 * i for i in range(1, 200)]
    i = 0
    while len(out) < n:
        m, k, nn = sizes[i % 199], sizes[(i * 7) % 199], sizes[(i * 13) % 199]
        out.append(Problem.create("matmul", {"A": [m + i // 199, k], "B": [k, nn]}))
        i += 1
    return out


def list_array(values: np.ndarray, per_row: int, n: int, typ: pa.DataType) -> pa.Array:
    offsets = pa.array(np.arange(0, (n + 1) * per_row, per_row, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values, type=typ))


def write_signature(root: Path, dev: DeviceProperties, probs: list[Problem], cands: int, files: int, rng) -> int:
    n_prob = len(probs)
    n = n_prob * cands
    p_idx = np.repeat(np.arange(n_prob), cands)
    c_idx = np.tile(np.arange(cands), n_prob)
    base = rng.uniform(0.05, 5.0, size=n_prob)[p_idx] * rng.uniform(0.7, 1.6, size=n)
    samples = base[:, None] * rng.normal(1.0, 0.02, size=(n, 5))
    failed = rng.random(n) < 0.02
    med = np.median(samples, axis=1)
    mad = np.median(np.abs(samples - med[:, None]), axis=1)
    engine = np.array(ENGINES)[c_idx % len(ENGINES)]
    has_knob = c_idx >= len(ENGINES)
    knob_val = (c_idx // len(ENGINES)) * 32
    ckeys = [candidate_key(engine_name_to_id(e), (("BLOCK_M", int(v)),) if h else ())
             for e, v, h in zip(engine, knob_val, has_knob)]
    knob_lists = [[{"id": "BLOCK_M", "type": "int", "value": str(int(v))}] if h else [] for v, h in zip(knob_val, has_knob)]
    pj = [p.canonical_json() for p in probs]
    tensors = [[t.canonical() for t in p.tensors] for p in probs]
    now = np.datetime64("2026-11-30T00:00:00", "ms")
    cols = {
        "schema_version": pa.array(np.ones(n, np.int16)),
        "job_id": pa.array(["bench"] * n),
        "run_id": pa.array(["run"] * n),
        "session_id": pa.array([f"s{i}" for i in p_idx]),
        "round": pa.array(["main"] * n),
        "call": pa.array([""] * n),
        "session_size": pa.array([None] * n, type=pa.int32()),
        "run_started_at": pa.array(np.full(n, now), type=pa.timestamp("ms", tz="UTC")),
        "measured_at": pa.array(now + c_idx.astype("timedelta64[ms]"), type=pa.timestamp("ms", tz="UTC")),
        "host": pa.array(["host"] * n), "actor_id": pa.array([""] * n),
        "device_index": pa.array(np.zeros(n, np.int32)),
        "vendor": pa.array([dev.vendor] * n), "arch": pa.array([dev.arch] * n), "device_name": pa.array([dev.name] * n),
        "device_json": pa.array([json.dumps(dev.to_dict())] * n),
        "driver_version": pa.array([dev.driver_version] * n), "runtime_version": pa.array([dev.runtime_version] * n),
        "library_versions": pa.array([[{"name": "torch", "version": "2.11.0"}]] * n, type=pa.list_(NAMED_STR)),
        "farm_version": pa.array(["bench"] * n), "workload_name": pa.array(["bench"] * n),
        "workload_digest": pa.array(["x"] * n),
        "problem_name": pa.array([f"p{i}" for i in p_idx]),
        "problem_key": pa.array([probs[i].key for i in p_idx]),
        "problem_json": pa.array([pj[i] for i in p_idx]),
        "problem_label": pa.array([probs[i].label() for i in p_idx]) if n_prob < 50 else pa.array(["matmul"] * n),
        "op_category": pa.array(["matmul"] * n), "dtype": pa.array(["fp32"] * n), "compute_dtype": pa.array(["fp32"] * n),
        "tensors": pa.array([tensors[i] for i in p_idx], type=pa.list_(TENSOR_TYPE)),
        "criteria": pa.array([[]] * n, type=pa.list_(NAMED_INT)),
        "flops": pa.array(np.full(n, 1e9)),
        "engine_id": pa.array([engine_name_to_id(e) for e in engine], type=pa.int64()),
        "engine_name": pa.array(engine),
        "knobs": pa.array(knob_lists, type=pa.list_(KNOB_TYPE)),
        "candidate_key": pa.array(ckeys),
        "candidate_index": pa.array(c_idx.astype(np.int32)),
        "mode": pa.array(["standard"] * n), "strategy": pa.array(["run_until_stable"] * n),
        "succeeded": pa.array(~failed),
        "disposition": pa.array(np.where(failed, "failed_run", "succeeded")),
        "error": pa.array(np.where(failed, "boom", "")),
        "rank": pa.array(np.where(failed, -1, 0).astype(np.int32)),
        "min_ms": pa.array(np.where(failed, np.nan, samples.min(axis=1)), from_pandas=True),
        "avg_ms": pa.array(np.where(failed, np.nan, samples.mean(axis=1)), from_pandas=True),
        "stddev_ms": pa.array(np.where(failed, np.nan, samples.std(axis=1)), from_pandas=True),
        "median_ms": pa.array(np.where(failed, np.nan, med), from_pandas=True),
        "mad_ms": pa.array(np.where(failed, np.nan, mad), from_pandas=True),
        "samples_ms": list_array(samples.ravel(), 5, n, pa.float64()),
        "iterations": pa.array(np.full(n, 5, np.int32)), "warmups": pa.array(np.ones(n, np.int32)),
        "converged": pa.array(~failed),
        "workspace_bytes": pa.array(np.zeros(n, np.int64)), "estimated_workspace_bytes": pa.array(np.zeros(n, np.int64)),
        "ran_exhaustive": pa.array(np.zeros(n, bool)), "supports_exhaustive": pa.array(np.zeros(n, bool)),
        "exhaustive_not_run_reason": pa.array([None] * n, type=pa.string()),
        "max_rel_error": pa.array(np.full(n, 1e-6)), "compile_ms": pa.array(np.ones(n)), "tuning_ms": pa.array(np.ones(n)),
    }
    # columns this script does not fill (added to the schema since) are null, as in older parts
    table = pa.table([cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in FILE_SCHEMA], schema=FILE_SCHEMA)
    folder = root / f"device_signature={dev.signature}" / "op=matmul"
    folder.mkdir(parents=True)
    step = -(-n // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), folder / f"part-bench-{i:06d}.parquet", compression="zstd")
    return n


def ray_child(work: Path) -> None:
    """Reduce ``work/results`` on a local Ray instance; compare with ``work/overrides``; print JSON."""
    t0 = time.perf_counter()
    import ray

    from farm.fleet.on_ray.distributed_reduce import reduce_on_ray, reduce_signature
    from farm.store.dataset import partition_signatures

    ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    start_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    reduce_on_ray(work / "results", work / "ray-overrides")
    wall = time.perf_counter() - t1

    @ray.remote(num_cpus=1, max_calls=1)  # a fresh worker process per task: its peak RSS is that task's
    def measured(results: str, sig: str) -> float:
        reduce_signature(results, sig, None, 3, "append", False, None)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    sigs = partition_signatures(work / "results")
    rss = ray.get([measured.remote(str(work / "results"), s) for s in sigs])
    names = sorted(p.name for p in (work / "overrides").iterdir() if not p.name.startswith("."))
    same = names == sorted(p.name for p in (work / "ray-overrides").iterdir() if not p.name.startswith(".")) and all(
        (work / "overrides" / n).read_bytes() == (work / "ray-overrides" / n).read_bytes() for n in names)
    print(json.dumps({"wall_s": wall, "start_s": start_s, "task_rss_mb": rss, "identical": same, "files": len(names),
                      "cpus": int(ray.cluster_resources().get("CPU", 0))}))
    ray.shutdown()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--ray-child":
        ray_child(Path(sys.argv[2]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--signatures", type=int, default=4)
    ap.add_argument("--problems", type=int, default=10_000)
    ap.add_argument("--keep", action="store_true", help="keep the generated dataset")
    ap.add_argument("--ray", action="store_true", help="also reduce on a local Ray instance, a task per signature")
    args = ap.parse_args()
    cands = max(1, args.rows // (args.signatures * args.problems))
    work = Path(tempfile.mkdtemp(prefix="reduce-bench-"))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    probs = problems(args.problems)
    rows = sum(write_signature(work / "results", d, probs, cands, 40, rng) for d in devices(args.signatures))
    gen_s = time.perf_counter() - t0
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from farm.store.reduce import reduce_results; "
            "t = time.perf_counter(); r = reduce_results(sys.argv[2], sys.argv[3]); "
            "print(time.perf_counter() - t, sum(s.entries for s in r.signatures))")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT), str(work / "results"), str(work / "overrides")],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    inner_s, entries = proc.stdout.split()
    size_mb = sum(f.stat().st_size for f in (work / "results").rglob("*.parquet")) / 2**20
    print(f"{'rows':>10} {'signatures':>10} {'problems':>9} {'entries':>8} {'data MB':>8} {'reduce s':>9} "
          f"{'process s':>10} {'peak RSS MB':>12} {'target':>18}")
    print(f"{rows:>10,} {args.signatures:>10} {args.problems:>9,} {int(entries):>8,} {size_mb:>8.0f} "
          f"{float(inner_s):>9.2f} {wall:>10.2f} {peak_mb:>12.0f} {'< 10 s, < 2048 MB':>18}")
    print(f"(dataset generated in {gen_s:.1f} s; peak RSS includes the Python interpreter and imports; "
          f"before={before / 1024:.0f} MB)")
    if args.ray:
        proc = subprocess.run([sys.executable, __file__, "--ray-child", str(work)], capture_output=True, text=True)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(1)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print()
        print(f"{'reducer':>22} {'wall s':>8} {'peak RSS MB':>12} {'identical files':>16}")
        print(f"{'single process':>22} {wall:>8.2f} {peak_mb:>12.0f} {'-':>16}")
        print(f"{'Ray, a task/signature':>22} {r['wall_s']:>8.2f} {max(r['task_rss_mb']):>12.0f} "
              f"{str(r['identical']) + ' (' + str(r['files']) + ')':>16}")
        print(f"(Ray: {r['cpus']} CPUs, {len(r['task_rss_mb'])} tasks, peak RSS per task "
              f"{min(r['task_rss_mb']):.0f}-{max(r['task_rss_mb']):.0f} MB; Ray's own start, not in the wall time: {r['start_s']:.1f} s)")
    if not args.keep:
        import shutil

        shutil.rmtree(work)
    else:
        print("kept", work)


if __name__ == "__main__":
    main()
