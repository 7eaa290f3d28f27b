"""Decisions forced on a model's captured problems, one engine kind after another (not tuned): what the serving
tests on a GPU and benchmarks/serving_gpu.py check farm.apply's correctness with."""

from __future__ import annotations

from typing import Any

from farm.devices.open import open_device
from farm.model.engine import default_engine_registry, settings_to_resolved
from farm.store.overrides.entries import OverrideEntry

# a decision of each kind, for the linear layers in turn: (engine, knobs)
LINEAR_KINDS = (("cudnn.graph", ()), ("triton.gemm_splitk", (("REDUCTION", "serial"), ("SPLIT_K", 8))),
                ("cublaslt", ()), ("triton.gemm_splitk", (("REDUCTION", "parallel"), ("SPLIT_K", 2))),
                ("triton.gemm", ()), ("triton.gemv", ()))


def runs(engine_name: str, knobs: tuple, problem: Any) -> bool:
    """The engine takes the problem on the first CUDA device with these knobs."""
    dev = open_device("cuda", 0)
    try:
        engine = default_engine_registry().get(engine_name)
    except Exception:
        return False
    if not engine.applicable(problem, dev):
        return False
    support = getattr(engine, "knob_support", None)
    return support is None or bool(support(problem, dev, settings_to_resolved(engine, knobs)))


def forced(problems: Any, backend: str = "efficient") -> tuple[list[OverrideEntry], list[str]]:
    """Every problem decided for an engine of another kind than its default, kinds in turn (attention: torch's
    ``backend``, else its math backend); -> the entries and the engines chosen."""
    entries, kinds, linear = [], [], 0
    for p in problems:
        if p.op == "sdpa_fwd":
            choices = [("torch.sdpa", (("backend", backend),)), ("torch.sdpa", (("backend", "math"),))]
        else:
            choices = list(LINEAR_KINDS[linear % len(LINEAR_KINDS):] + LINEAR_KINDS)
            linear += 1
        choice = next((c for c in choices if runs(c[0], c[1], p)), None)
        if choice is not None:
            entries.append(OverrideEntry.for_problem(p, *choice))
            kinds.append(choice[0])
    return entries, kinds
