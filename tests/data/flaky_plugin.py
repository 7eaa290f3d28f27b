"""A plugin engine for simulated devices that behaves for its first runs and then fails (tests/end_to_end/test_stage_failures.py).

Installed by the tests as the package ``flaky_engines`` with an entry point in ``farm.engines``, so a farm worker
finds it as it would a user's plugin. ``FLAKY`` (environment, JSON) maps a problem's first dimension of A to
``"MODE@N:WHO"``: from the N-th run of a plan on, the plans of WHO (``default``: the default knobs, ``fast``: the
fastest variant, 2 % faster than the default) fail with MODE:

``FLAKY_FAST`` (environment, a number): the fast variant's speed instead of 0.98 (0.9955: a gain under the
confirmation stage's 0.5 % margin, faster at its confidence yet not beyond the margin: an undecided stage).

``FLAKY_JITTER`` (environment, a number): each run's time is also scaled by exp(JITTER x N(0, 1)) drawn from one
generator of the process, whatever the plan: noise a confirmation stage's paired rounds cannot cancel (a
stage that cannot decide, tests/cli/test_output_at_a_glance.py).

  abort (a native crash), exit (SystemExit(3)), exit0 (SystemExit(0)), kbint (KeyboardInterrupt raised by the
  engine), hang (forever), nan / neg (the sample's time is NaN / negative), mark (touches FLAKY_MARK, then sleeps:
  a test interrupts the process)

The main round runs a plan fewer than ten times, so N = 11 fails it only in the confirmation stage.
"""

import json
import math
import os
import random
import time

from engines.sim import SimEngine, SimPlan
from farm.plugin import Knob

SPEEDS = {0: 1.0, 1: 1.3, 2: 1.2, 3: 0.98}  # variant 3 is the real winner, 2 % faster than the default
_JITTER = random.Random(0)  # one sequence for the process: deterministic in a single-threaded run


class FlakyPlan(SimPlan):
    def __init__(self, *args, fault: str = "", speed: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.base_ms *= speed
        self.mode, _, first = fault.partition("@")
        self.first = int(first or 0)
        self.runs = 0

    def run(self, tensors, workspace, stream):
        self.runs += 1
        if self.mode and self.runs >= self.first:
            self._fail()
            if self.mode in ("nan", "neg"):
                return
        super().run(tensors, workspace, stream)
        sigma = float(os.environ.get("FLAKY_JITTER") or 0)
        if sigma:
            self.runtime.clock_ms += self.base_ms * (math.exp(sigma * _JITTER.gauss(0.0, 1.0)) - 1.0)

    def _fail(self):
        if self.mode == "abort":
            os.abort()
        if self.mode in ("exit", "exit0"):
            raise SystemExit(3 if self.mode == "exit" else 0)
        if self.mode == "kbint":
            raise KeyboardInterrupt
        if self.mode in ("hang", "mark"):
            if self.mode == "mark":
                open(os.environ["FLAKY_MARK"], "w").close()
            while True:
                time.sleep(3600)
        if self.mode in ("nan", "neg"):
            self._bad_sample(math.nan if self.mode == "nan" else -1e6)

    def _bad_sample(self, offset):
        """The sample this run is in ends ``offset`` ms off (NaN, or far before it began); the clock then goes on
        as before (no later sample is touched)."""
        rt = self.runtime
        if "record_event" in vars(rt):
            return  # this sample is bad already
        clock = rt.clock_ms

        def record_event(event, stream):
            del rt.record_event
            event.t = clock + offset
            rt.clock_ms = clock + 0.001

        rt.record_event = record_event


class Flaky:
    name = "flaky.gemm"
    ops = frozenset({"matmul"})
    priority = 5  # the default engine of the problems it serves
    knobs = (Knob.int("variant", 0, choices=(0, 1, 2, 3)),)
    supports_exhaustive = False

    applicable = SimEngine.applicable
    estimate_workspace = staticmethod(lambda problem, knobs: 0)

    def compile(self, problem, knobs, device):
        spec = json.loads(os.environ.get("FLAKY", "{}")).get(str(problem.tensor("A").dims[0]), "")
        fault, _, who = spec.partition(":")
        variant = knobs.get("variant", 0)
        hit = (who or "default") == ("default" if variant == 0 else "fast" if variant == 3 else "-")
        return FlakyPlan(self.name, problem, {"variant": 0}, device, 0, fault=fault if hit else "",
                         speed=float(os.environ.get("FLAKY_FAST") or SPEEDS[3]) if variant == 3 else SPEEDS[variant])


ENGINES = [Flaky()]
