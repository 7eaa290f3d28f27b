"""Where one farm task's wall time goes on this machine's device: a problem of a workload tuned in-process
as a worker tunes it, under cProfile (the measuring thread) with the phase clock beside it.

    python benchmarks/history/task_profile.py examples/h200-library-plans.yaml mm-16x14336x4096 [--top 30]

Prints the phase split (farm.tuner.phases) and the functions with the most cumulative time: what "setup" and
"compile" are made of, per task.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from farm.devices.open import open_device  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402
from farm.model.workload import load_workload  # noqa: E402
from farm.tuner.autotuner import Autotuner  # noqa: E402
from farm.tuner.phases import PHASES, SETUP, PhaseClock  # noqa: E402
from farm.tuner.problem_tuning import plan_specs_for  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--inline-compile", action="store_true",
                    help="compile on the measuring thread (so the profile sees the compiles' insides)")
    args = ap.parse_args()
    registry = default_engine_registry()
    wl = load_workload(args.workload, registry=registry)
    device = open_device(args.devices, 0)
    config = wl.autotune
    if args.inline_compile:
        config = dataclasses.replace(config, compile_workers=0)
    elif device.vendor in ("nvidia", "amd") and config.compile_workers == 0:
        config = dataclasses.replace(config, compile_workers=2)  # as a farm worker does
    registry.prepare([e.name for e in registry], "gpu" if device.vendor in ("nvidia", "amd") else device.vendor)
    for name in args.problems:
        wp = next(p for p in wl.problems if p.name == name)
        clock = PhaseClock()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        tuner = Autotuner(wp.problem, device, registry=registry)
        specs = plan_specs_for(wp, tuner)
        results = tuner.autotune(config=config, phases=clock)
        tuner.close()
        prof.disable()
        wall = time.perf_counter() - t0
        split = clock.take()
        clock.add(SETUP, wall - split.total)
        split = split + clock.take()
        print(f"== {name}: {len(specs)} candidates, {wall:.2f} s; "
              + ", ".join(f"{p} {split.get(p):.2f} s" for p in PHASES if split.get(p)))
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue()[-12000:])
        print(f"   winner {results[0].engine_name} {dict(results[0].knobs)} {results[0].median_ms:.4f} ms")


if __name__ == "__main__":
    main()
