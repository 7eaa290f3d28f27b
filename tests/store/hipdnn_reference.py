"""hipDNN's override-file matcher, ported line for line to check files the farm writes in hipDNN's spelling.

From ROCm/rocm-libraries projects/hipdnn: the reader and matcher are backend/src/heuristics/config/
EngineOverrideConfig.hpp (parseJson, OperationRule::matches, matchOperation: the first rule declared wins); the
query a graph makes is frontend/include/hipdnn_frontend/detail/GraphMatchKey.hpp (getAutotuneConfigMatchKeyForNode)
with the names of hipdnn_data_sdk/detail/AutotuneConfigNames.hpp. Written from those sources, not from the farm's
tables, so a test comparing the two can fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from farm.model.ids import engine_name_to_id
from farm.model.problem import Problem

NAMED_TENSOR_IDS = 2  # autotune_config::version


@dataclass(frozen=True)
class Pattern:
    tensor_id: str | None
    dim: tuple[int, ...]
    stride: tuple[int, ...]

    def matches(self, dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:  # TensorPattern::matches
        if len(self.dim) != len(dims) or any(d != -1 and d != a for d, a in zip(self.dim, dims)):
            return False
        if self.stride:
            if len(self.stride) != len(strides) or any(s != -1 and s != a for s, a in zip(self.stride, strides)):
                return False
        return True


@dataclass(frozen=True)
class Rule:
    op: str
    engine_id: int
    criteria: tuple[tuple[str, int], ...]  # sorted by key (normalizeRule)
    tensors: tuple[Pattern, ...]
    named: bool

    def matches(self, criteria: tuple[tuple[str, int], ...], inputs: list[tuple[str, tuple, tuple]]) -> bool:
        if len(self.criteria) != len(criteria) or len(self.tensors) != len(inputs):
            return False
        if self.criteria != criteria:
            return False
        if not self.named:  # matchesLegacyPositional
            return all(p.matches(dims, strides) for p, (_, dims, strides) in zip(self.tensors, inputs))
        used = [False] * len(inputs)
        for p in self.tensors:  # matchesNamed: each pattern takes the first unused input of its id that fits
            if p.tensor_id is None:
                return False
            for i, (tid, dims, strides) in enumerate(inputs):
                if not used[i] and tid == p.tensor_id and p.matches(dims, strides):
                    used[i] = True
                    break
            else:
                return False
        return True


def _int64(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):  # nlohmann's get<int64_t> throws on a bool or a string
        raise TypeError(f"not an integer: {v!r}")
    return v


def load(text: str) -> list[Rule] | None:
    """The rules of a file, or None where hipDNN's loader returns nullopt (any JSON or type error)."""
    try:
        doc = json.loads(text)
        named = _int64(doc.get("version", 1)) >= NAMED_TENSOR_IDS
        rules = []
        for entry in doc["engine_overrides"]:
            op, engine = entry["op"], entry["engine_name"]
            if not isinstance(op, str) or not isinstance(engine, str):
                raise TypeError("op and engine_name are strings")
            crit = entry.get("criteria", {})
            if not isinstance(crit, dict):
                raise TypeError("criteria must be an object")
            patterns = []
            for t in entry["tensors"]:
                tid = t.get("tensor_id")
                if tid is not None and not isinstance(tid, str):
                    raise TypeError("tensor_id is a string")
                patterns.append(Pattern(tid, tuple(_int64(d) for d in t["dim"]),
                                        tuple(_int64(s) for s in t.get("stride", []))))
            rules.append(Rule(op, engine_name_to_id(engine), tuple(sorted((k, _int64(v)) for k, v in crit.items())),
                              tuple(patterns), named))
        return rules
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def select(rules: list[Rule], op: str, criteria: list[tuple[str, int]], inputs: list[tuple[str, tuple, tuple]]
           ) -> int | None:
    """matchOperation: the engine id of the first rule declared that matches."""
    crit = tuple(sorted(criteria))
    for r in rules:
        if r.op == op and r.matches(crit, inputs):
            return r.engine_id
    return None


# -- the query a hipDNN graph of the same operation makes (GraphMatchKey.hpp) -----------------------------------
# hipDNN enum values: PointwiseMode ADD 2, MUL 30, RELU_FWD 34, GELU_FWD 21; ReductionMode ADD 1, MAX 4;
# ResampleMode NEAREST 5, BILINEAR 4; hipdnnNormFwdPhase_t INFERENCE 1; padding mode not set 0
_POINTWISE = {0: 2, 1: 30, 2: 34, 3: 21}
_REDUCTION = {0: 1, 1: 4}
_RESAMPLE = {0: 5, 1: 4}


def query(problem: Problem) -> tuple[str, list[tuple[str, int]], list[tuple[str, tuple, tuple]]]:
    """(op, criteria, named input views) hipDNN builds for a graph of ``problem``'s operation. A normalization's
    epsilon is a one-element value tensor; sdpa_bwd's stats are [b, h, s_q, 1] fp32, packed."""
    t = {x.id: (x.dims, x.strides) for x in problem.tensors}
    eps = ("epsilon_tensor_uid", (1,), (1,))

    def v(name: str, ours: str) -> tuple[str, tuple, tuple]:
        return (name, *t[ours])

    op, c = problem.op, problem.criteria_dict
    if op == "conv_fprop":
        return op, [], [v("x_tensor_uid", "X"), v("w_tensor_uid", "W")]
    if op == "conv_dgrad":
        return op, [], [v("dy_tensor_uid", "dY"), v("w_tensor_uid", "W")]
    if op == "conv_wgrad":
        return op, [], [v("x_tensor_uid", "X"), v("dy_tensor_uid", "dY")]
    if op == "sdpa_fwd":
        return op, [], [v("q_tensor_uid", "Q"), v("k_tensor_uid", "K"), v("v_tensor_uid", "V")]
    if op == "sdpa_bwd":
        b, h, s, _ = t["Q"][0]
        stats = ("stats_tensor_uid", (b, h, s, 1), (h * s, s, 1, 1))
        return op, [], [v("q_tensor_uid", "Q"), v("k_tensor_uid", "K"), v("v_tensor_uid", "V"),
                        v("o_tensor_uid", "O"), v("do_tensor_uid", "dO"), stats]
    if op == "matmul":
        return op, [], [v("a_tensor_uid", "A"), v("b_tensor_uid", "B")]
    if op == "batchnorm_inference":
        return op, [], [v("x_tensor_uid", "X"), v("mean_tensor_uid", "mean"), v("inv_variance_tensor_uid", "var"),
                         v("scale_tensor_uid", "scale"), v("bias_tensor_uid", "bias")]
    if op == "batchnorm_training":
        return op, [], [v("x_tensor_uid", "X"), v("scale_tensor_uid", "scale"), v("bias_tensor_uid", "bias"), eps]
    if op == "batchnorm_backward":
        return op, [], [v("dy_tensor_uid", "dY"), v("x_tensor_uid", "X"), v("scale_tensor_uid", "scale"),
                        v("mean_tensor_uid", "mean"), v("inv_variance_tensor_uid", "inv_variance")]
    if op == "layernorm":
        return op, [("norm_fwd_phase", 1)], [v("x_tensor_uid", "X"), v("scale_tensor_uid", "scale"),
                                             v("bias_tensor_uid", "bias"), eps]
    if op == "rmsnorm":
        return op, [("norm_fwd_phase", 1)], [v("x_tensor_uid", "X"), v("scale_tensor_uid", "scale"), eps]
    if op == "rmsnorm_backward":
        return op, [], [v("dy_tensor_uid", "dY"), v("x_tensor_uid", "X"), v("scale_tensor_uid", "scale"),
                        v("inv_rms_tensor_uid", "inv_rms")]
    if op == "reduction":
        return op, [("reduction_mode", _REDUCTION[c["mode"]])], [v("in_tensor_uid", "X")]
    if op == "resample":
        return "resample_fwd", [("resample_mode", _RESAMPLE[c["mode"]]), ("padding_mode", 0)], [v("x_tensor_uid", "X")]
    if op == "pointwise":
        views = [v("in_0_tensor_uid", "A")] + ([v("in_1_tensor_uid", "B")] if "B" in t else [])
        return op, [("pointwise_mode", _POINTWISE[c["mode"]])], views
    raise ValueError(f"no hipDNN query for {op}")
