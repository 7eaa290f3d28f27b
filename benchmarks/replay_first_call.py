"""First-call cost of farm.ops: tuning vs replaying a recorded winner vs the selection policies.

    python benchmarks/replay_first_call.py --workload examples/cpu-quick.yaml --device cpu --out DIR
    python benchmarks/replay_first_call.py --workload examples/h200-farm.yaml --device cuda --out DIR \
        [--published ROOT]

Each phase is a fresh Python process calling farm.ops on every matmul, sdpa_fwd
and conv_fprop problem of the workload:

  static   nothing recorded, no override file: StaticOrdering chooses
  tune     FARM_TUNABLE_ENABLED=1, FARM_TUNABLE_TUNING=1, empty results file: measured on first use, recorded
  replay   FARM_TUNABLE_ENABLED=1, FARM_TUNABLE_TUNING=0, the file the tune phase wrote: no measurement
  config   FARM_HEUR_CONFIG_PATH=ROOT (a `farm publish` root), tunable off: the Config policy picks the
           published winner (only with --published)

Reported per problem: the first call's wall time (choice + compile + run, synchronised),
the steady-state time per call, the engine each phase ran and where the choice came from,
and whether the replay measured anything (it must not) and chose the tune phase's engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OPS = ("matmul", "sdpa_fwd", "conv_fprop")


def _tensors(problem, device: str):
    """Random inputs for ``problem``: numpy on the CPU, torch tensors on the GPU."""
    from farm.devices.arrays import NumpyArrays, input_data

    if device == "cpu":
        arrays = NumpyArrays()
        return {k: arrays.from_numpy(v, problem.tensor(k)) for k, v in input_data(problem).items()}
    import torch

    from engines.gpu._common import torch_dtype

    return {t: torch.randn(problem.tensor(t).dims, device="cuda").to(torch_dtype(problem.tensor(t).dtype))
            for t in problem.input_ids}


def _call(ops, problem, t):
    c = problem.criteria_dict
    if problem.op == "matmul":
        return ops.matmul(t["A"], t["B"], t.get("bias"), compute_dtype=problem.compute_dtype)
    if problem.op == "sdpa_fwd":
        return ops.sdpa(t["Q"], t["K"], t["V"], causal=bool(c["causal"]))
    return ops.conv2d(t["X"], t["W"], stride=(c["stride_h"], c["stride_w"]), padding=(c["pad_h"], c["pad_w"]),
                      dilation=(c["dilation_h"], c["dilation_w"]), groups=c["groups"])


def phase(args: argparse.Namespace) -> None:
    import farm.ops as ops
    from farm.model.workload import load_workload

    sync = (lambda: None)
    if args.device != "cpu":
        import torch

        torch.cuda.init()
        sync = torch.cuda.synchronize
    workload = load_workload(args.workload)
    problems = [wp for wp in workload.problems if wp.problem.op in OPS]
    t0 = time.perf_counter()
    rt = ops.runtime(args.device, 0)
    rt.get_results()  # reads the results file (when enabled) outside the per-problem timings
    setup_ms = (time.perf_counter() - t0) * 1e3
    rows = []
    for wp in problems:
        t = _tensors(wp.problem, args.device)
        sync()
        before = rt.measurements
        t0 = time.perf_counter()
        _call(ops, wp.problem, t)
        sync()
        first_ms = (time.perf_counter() - t0) * 1e3
        measured = rt.measurements - before
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            _call(ops, wp.problem, t)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        choice = next((c for c in ops.choices() if c["problem_key"] == wp.problem.key), None)
        rows.append({"name": wp.name, "label": wp.problem.label(), "problem_key": wp.problem.key,
                     "first_call_ms": first_ms, "steady_ms": statistics.median(times), "measured": measured,
                     "engine": choice["engine"] if choice else None, "knobs": choice["knobs"] if choice else None,
                     "source": choice["source"] if choice else "problem key differs from the workload's"})
    Path(args.json_out).write_text(json.dumps({"phase": args.phase, "setup_ms": setup_ms,
                                               "device": rt.device.signature, "rows": rows}, indent=1))


def _run_phase(name: str, args: argparse.Namespace, out: Path, env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_TUNABLE_", "FARM_HEUR_", "HIPDNN_HEUR_"))}
    env.update(env_extra, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    target = out / f"{name}.json"
    cmd = [sys.executable, __file__, "--phase", name, "--workload", args.workload, "--device", args.device,
           "--repeats", str(args.repeats), "--json-out", str(target)]
    t0 = time.perf_counter()
    with open(out / "phases.log", "a") as log:
        log.write(f"== {name}: {' '.join(f'{k}={v}' for k, v in env_extra.items())}\n")
        log.flush()
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=log)
    if proc.returncode:
        raise SystemExit(f"phase {name} failed (exit {proc.returncode}); see {out / 'phases.log'}")
    data = json.loads(target.read_text())
    data["process_s"] = time.perf_counter() - t0
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="examples/cpu-quick.yaml")
    ap.add_argument("--device", choices=("cpu", "cuda", "hip"), default="cpu")
    ap.add_argument("--out", default="runs/replay-first-call")
    ap.add_argument("--published", help="a farm publish root: adds the config phase")
    ap.add_argument("--repeats", type=int, default=20, help="steady-state calls per problem (default 20)")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        phase(args)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_file = out / "tunable_results{ordinal}.json"
    for old in out.glob("tunable_results*.json"):
        old.unlink()
    tunable = {"FARM_TUNABLE_ENABLED": "1", "FARM_TUNABLE_FILENAME": str(results_file)}
    phases = {"static": _run_phase("static", args, out, {}),
              "tune": _run_phase("tune", args, out, {**tunable, "FARM_TUNABLE_TUNING": "1"}),
              "replay": _run_phase("replay", args, out, {**tunable, "FARM_TUNABLE_TUNING": "0"})}
    if args.published:
        phases["config"] = _run_phase("config", args, out, {"FARM_HEUR_CONFIG_PATH": str(Path(args.published).resolve())})
    report(phases, args)
    (out / "report.json").write_text(json.dumps(phases, indent=1))


def report(phases: dict, args: argparse.Namespace) -> None:
    names = list(phases)
    print(f"device {phases['tune']['device']}; workload {args.workload}; steady state = median of {args.repeats} calls")
    print("setup (runtime + results file): " + ", ".join(f"{n} {phases[n]['setup_ms']:.1f} ms" for n in names))
    print()
    head = ["problem"] + [f"first call {n} ms" for n in names] + ["tune / replay", "steady replay ms", "replay engine",
                                                                  "same as tuned", "measured in replay"]
    if "config" in phases:
        head += ["config engine (source)"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    ratios, all_same, none_measured = [], True, True
    for i, row in enumerate(phases["tune"]["rows"]):
        by = {n: phases[n]["rows"][i] for n in names}
        rp, tn = by["replay"], by["tune"]
        same = (rp["engine"], rp["knobs"]) == (tn["engine"], tn["knobs"]) and rp["source"] == "recorded"
        all_same &= same
        none_measured &= rp["measured"] == 0
        ratios.append(tn["first_call_ms"] / rp["first_call_ms"])
        cells = [row["name"]] + [f"{by[n]['first_call_ms']:.1f}" for n in names]
        cells += [f"{ratios[-1]:.0f}x", f"{rp['steady_ms']:.4f}", f"{rp['engine']}{_knobs(rp['knobs'])}",
                  "yes" if same else f"NO (tuned {tn['engine']}{_knobs(tn['knobs'])}, source {rp['source']})",
                  str(rp["measured"])]
        if "config" in by:
            cells.append(f"{by['config']['engine']}{_knobs(by['config']['knobs'])} ({by['config']['source']})")
        print("| " + " | ".join(cells) + " |")
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    print()
    print(f"first call, tuning / replaying: geomean {geo:.0f}x over {len(ratios)} problems; replay chose the tuned "
          f"engine everywhere: {'yes' if all_same else 'NO'}; replay measured nothing: {'yes' if none_measured else 'NO'}")


def _knobs(knobs: dict | None) -> str:
    return f"[{','.join(f'{k}={v}' for k, v in knobs.items())}]" if knobs else ""


if __name__ == "__main__":
    main()
