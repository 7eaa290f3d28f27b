"""The numerical check of a candidate's outputs, before it is timed.

Small problems are compared with the float64 reference (farm.tuner.reference); larger
ones, and ops without a reference, with the first candidate that ran (as TunableOp
compares with the default). Against the reference the outputs come to the host;
against the first candidate they stay on the device when the array backend can compare
there (``clone``/``relative_error``), so large GPU outputs are not copied.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from farm.devices.arrays import relative_error
from farm.devices.device import Device
from farm.model import dtypes
from farm.model.problem import Problem
from farm.model.records import ResultCheck
from farm.tuner.reference import has_reference, reference

# Above this many flops (or elements, for ops without a flop count) the float64
# reference costs more than the tuning; "auto" checking then compares with the
# first candidate that ran instead.
REFERENCE_FLOP_LIMIT = 2e8
REFERENCE_ELEMENT_LIMIT = 1 << 22


class OutputCheck:
    """Compares the outputs a candidate left in ``tensors`` with the baseline (``compare``)."""

    def __init__(self, problem: Problem, device: Device, tensors: Mapping[str, Any], mode: ResultCheck) -> None:
        self.problem, self.device, self.tensors = problem, device, tensors
        self.tolerance = max(dtypes.RELATIVE_TOLERANCE.get(problem.compute_dtype, 1e-2),
                             max(dtypes.RELATIVE_TOLERANCE.get(problem.tensor(o).dtype, 1e-2)
                                 for o in problem.output_ids))
        self.baseline: dict[str, Any] | None = None
        self.source = ""
        self.from_reference = False
        small = (problem.flops <= REFERENCE_FLOP_LIMIT if problem.flops else
                 sum(t.numel for t in problem.tensors) <= REFERENCE_ELEMENT_LIMIT)
        if mode is ResultCheck.REFERENCE or (mode is ResultCheck.AUTO and small and has_reference(problem.op)):
            arrays = device.arrays
            inputs = {tid: arrays.to_numpy(tensors[tid]) for tid in problem.input_ids}
            self.baseline, self.source, self.from_reference = reference(problem, inputs), "the float64 reference", True

    def compare(self, candidate: str) -> tuple[float | None, str]:
        """(max relative error, description of a mismatch or ''); the first candidate checked becomes the
        baseline when there is no reference (``candidate`` names it)."""
        p, arrays = self.problem, self.device.arrays
        on_device = not self.from_reference and hasattr(arrays, "relative_error")
        if self.baseline is None:
            if on_device:
                outputs = {o: arrays.clone(self.tensors[o]) for o in p.output_ids}
                bad = [o for o, v in outputs.items() if arrays.relative_error(v, v) == float("inf")]
            else:
                outputs = {o: arrays.to_numpy(self.tensors[o]) for o in p.output_ids}
                bad = [o for o, v in outputs.items() if not np.isfinite(v).all()]
            if bad:
                return None, f"output {bad[0]} has NaN or unwritten elements"
            self.baseline, self.source = outputs, f"{candidate} (first candidate)"
            return None, ""
        worst, worst_out = 0.0, ""
        for o in p.output_ids:
            if on_device:
                e = arrays.relative_error(self.tensors[o], self.baseline[o])
            else:
                e = relative_error(arrays.to_numpy(self.tensors[o]), self.baseline[o])
            if e > worst or not worst_out:
                worst, worst_out = e, o
        if worst > self.tolerance:
            return worst, (f"wrong result: output {worst_out} differs from {self.source} by "
                           f"{worst:.3g} (relative norm) > tolerance {self.tolerance:g}")
        return worst, ""
