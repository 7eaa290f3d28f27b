"""Run ``farm`` as a driver that is killed (SIGKILL to its whole process group) at a chosen phase.

    python tests/kill_driver.py PHASE farm-args...

PHASE is one of:
  start     the job record is written and the workers are up; no row yet
  mid-run   after the first 40 main-round rows reached disk
  finalist  after the first finalist-round row reached disk (the rest of the round never did)
  confirm   after the first confirmation-stage row reached disk (the rest of the stage never did)
  reduce    after the first override file was written

Nothing in farm/ knows about this: the wrappers below patch the driver's own functions, then
kill the process group the way an OOM killer or a lost node would (no cleanup, no flush).
The test starts this script with ``start_new_session=True``, so the local Ray dies with it.
"""

from __future__ import annotations

import os
import signal
import sys


def die() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import farm.fleet.job
    import farm.store.reduce
    from farm.cli import main as farm_main

    phase, argv = sys.argv[1], sys.argv[2:]
    original_write, original_table = farm.fleet.job.JobRun.write, farm.store.reduce.write_winners_table
    seen = {"main": 0, "finalist": 0, "confirm": 0}

    def write(self, rows):
        rows = list(rows)
        if phase == "start":
            die()
        for i, (_, _, where) in enumerate(rows):
            seen[where.round] = seen.get(where.round, 0) + 1
            if (phase == "mid-run" and seen["main"] >= 40) or (phase in ("finalist", "confirm") and seen[phase] >= 1):
                original_write(self, rows[:i + 1])  # a batch cut short: the rest was still in memory
                self.writer.flush()
                die()
        original_write(self, rows)

    def winners_table(*args, **kwargs):
        path = original_table(*args, **kwargs)
        if phase == "reduce":
            die()
        return path

    if phase not in ("start", "mid-run", "finalist", "confirm", "reduce"):
        raise SystemExit(f"unknown phase {phase!r}")
    farm.fleet.job.JobRun.write = write
    farm.store.reduce.write_winners_table = winners_table
    return farm_main(argv)


if __name__ == "__main__":
    sys.exit(main())
