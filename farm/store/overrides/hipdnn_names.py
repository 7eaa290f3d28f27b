"""hipDNN's own spellings in override files, read as ours and written back as the file spelled them.

Ops (``resample_fwd``), tensor ids (``x_tensor_uid``), criterion names (``pointwise_mode``) and the
values of the mode criteria, which are hipDNN's enum integers, not ours. The enum tables are hipDNN's:
``PointwiseMode`` (sdk/schemas/pointwise_attributes.fbs; MOD, POW and COS from hipdnn_frontend/Types.hpp),
``ReductionMode`` (data_sdk/schemas/reduction_attributes.fbs) and ``ResampleMode`` (hipdnn_frontend/Types.hpp),
in ROCm/rocm-libraries projects/hipdnn. A hipDNN mode no op of ours runs translates to ``None``: the rule
matches none of our problems, and is written back with hipDNN's integer.

hipDNN's match key per op (``HIPDNN_KEY``: hipdnn_frontend/detail/GraphMatchKey.hpp and the names of
hipdnn_data_sdk/detail/AutotuneConfigNames.hpp) names exactly an op's input tensors, in hipDNN's words, and some
criteria. Parts of it our problems imply without carrying them: the epsilon of a normalization (a value tensor of
one element), the softmax statistics an sdpa_bwd reads, the forward phase of a norm (ours are inference) and the
padding mode of a resample (ours pad with nothing). A rule naming them with those values matches our problem; with
another value (a training-phase norm) it matches none of ours.
"""

from __future__ import annotations

from farm.model.op_catalog import OPS

HIPDNN_OPS = {"resample_fwd": "resample", "batchnorm_inference_variance_ext": "batchnorm_inference"}
HIPDNN_CRITERIA = {"pointwise": {"pointwise_mode": "mode"}, "resample": {"resample_mode": "mode"},
                   "reduction": {"reduction_mode": "mode"}}
# hipDNN tensor ids (``<name>_tensor_uid``) whose name is not ours in another case (x -> X, dy -> dY, scale -> scale)
_TENSOR_NAMES = {"reduction": {"in": "X", "out": "Y"}, "pointwise": {"in_0": "A", "in_1": "B", "out_0": "C"},
                 "batchnorm_inference": {"variance": "var", "inv_variance": "var"}, "sdpa_bwd": {"do": "dO"}}

# op -> hipDNN's key tensors in its order: (hipDNN's tensor id, ours; None where our problem implies it)
HIPDNN_KEY: dict[str, tuple[tuple[str, str | None], ...]] = {
    "conv_fprop": (("x_tensor_uid", "X"), ("w_tensor_uid", "W")),
    "conv_dgrad": (("dy_tensor_uid", "dY"), ("w_tensor_uid", "W")),
    "conv_wgrad": (("x_tensor_uid", "X"), ("dy_tensor_uid", "dY")),
    "sdpa_fwd": (("q_tensor_uid", "Q"), ("k_tensor_uid", "K"), ("v_tensor_uid", "V")),
    "sdpa_bwd": (("q_tensor_uid", "Q"), ("k_tensor_uid", "K"), ("v_tensor_uid", "V"), ("o_tensor_uid", "O"),
                 ("do_tensor_uid", "dO"), ("stats_tensor_uid", None)),
    "matmul": (("a_tensor_uid", "A"), ("b_tensor_uid", "B")),
    "batchnorm_inference": (("x_tensor_uid", "X"), ("mean_tensor_uid", "mean"), ("inv_variance_tensor_uid", "var"),
                            ("scale_tensor_uid", "scale"), ("bias_tensor_uid", "bias")),
    "batchnorm_training": (("x_tensor_uid", "X"), ("scale_tensor_uid", "scale"), ("bias_tensor_uid", "bias"),
                           ("epsilon_tensor_uid", None)),
    "batchnorm_backward": (("dy_tensor_uid", "dY"), ("x_tensor_uid", "X"), ("scale_tensor_uid", "scale"),
                           ("mean_tensor_uid", "mean"), ("inv_variance_tensor_uid", "inv_variance")),
    "layernorm": (("x_tensor_uid", "X"), ("scale_tensor_uid", "scale"), ("bias_tensor_uid", "bias"),
                  ("epsilon_tensor_uid", None)),
    "rmsnorm": (("x_tensor_uid", "X"), ("scale_tensor_uid", "scale"), ("epsilon_tensor_uid", None)),
    "rmsnorm_backward": (("dy_tensor_uid", "dY"), ("x_tensor_uid", "X"), ("scale_tensor_uid", "scale"),
                         ("inv_rms_tensor_uid", "inv_rms")),
    "reduction": (("in_tensor_uid", "X"),),
    "resample": (("x_tensor_uid", "X"),),
    "pointwise": (("in_0_tensor_uid", "A"), ("in_1_tensor_uid", "B")),  # in_1 when the problem has B
}
HIPDNN_OP_NAMES = {"resample": "resample_fwd"}  # our op -> hipDNN's, where they differ
# criteria hipDNN's key states for an op whose value our problems imply (norms: HIPDNN_NORM_FWD_INFERENCE = 1;
# resample: padding mode NOT_SET = 0), and tensors it names our problems imply
IMPLIED_CRITERIA: dict[str, dict[str, int]] = {"layernorm": {"norm_fwd_phase": 1}, "rmsnorm": {"norm_fwd_phase": 1},
                                                "resample": {"padding_mode": 0}}
IMPLIED_TENSORS: dict[str, frozenset[str]] = {op: frozenset(theirs for theirs, ours in key if ours is None)
                                               for op, key in HIPDNN_KEY.items()}

POINTWISE_MODES = {
    0: "NOT_SET", 1: "ABS", 2: "ADD", 3: "ADD_SQUARE", 4: "BINARY_SELECT", 5: "CEIL", 6: "CMP_EQ", 7: "CMP_GE",
    8: "CMP_GT", 9: "CMP_LE", 10: "CMP_LT", 11: "CMP_NEQ", 12: "DIV", 13: "ELU_BWD", 14: "ELU_FWD", 15: "ERF",
    16: "EXP", 17: "FLOOR", 18: "GELU_APPROX_TANH_BWD", 19: "GELU_APPROX_TANH_FWD", 20: "GELU_BWD", 21: "GELU_FWD",
    22: "GEN_INDEX", 23: "IDENTITY", 24: "LOG", 25: "LOGICAL_AND", 26: "LOGICAL_NOT", 27: "LOGICAL_OR", 28: "MAX",
    29: "MIN", 30: "MUL", 31: "NEG", 32: "RECIPROCAL", 33: "RELU_BWD", 34: "RELU_FWD", 35: "RSQRT",
    36: "SIGMOID_BWD", 37: "SIGMOID_FWD", 38: "SIN", 39: "SOFTPLUS_BWD", 40: "SOFTPLUS_FWD", 41: "SQRT", 42: "SUB",
    43: "SWISH_BWD", 44: "SWISH_FWD", 45: "TAN", 46: "TANH_BWD", 47: "TANH_FWD", 48: "MOD", 49: "POW", 50: "COS",
}
REDUCTION_MODES = {0: "NOT_SET", 1: "ADD", 2: "MUL", 3: "MIN", 4: "MAX", 5: "AMAX", 6: "AVG", 7: "NORM1", 8: "NORM2",
                   9: "MUL_NO_ZEROS"}
RESAMPLE_MODES = {0: "NOT_SET", 1: "MAXPOOL", 2: "AVGPOOL_EXCLUDE_PADDING", 3: "AVGPOOL_INCLUDE_PADDING",
                  4: "BILINEAR", 5: "NEAREST"}

# op -> (hipDNN's enum, {our mode: hipDNN's value}); our modes: op_catalog (pointwise 0 add, 1 mul, 2 relu,
# 3 gelu (erf); reduction 0 sum, 1 max; resample 0 nearest, 1 bilinear)
_MODES = {
    "pointwise": (POINTWISE_MODES, {0: 2, 1: 30, 2: 34, 3: 21}),
    "reduction": (REDUCTION_MODES, {0: 1, 1: 4}),
    "resample": (RESAMPLE_MODES, {0: 5, 1: 4}),
}
_TO_OURS = {op: {theirs: ours for ours, theirs in table.items()} for op, (_, table) in _MODES.items()}


def mode_from_hipdnn(op: str, value: int) -> int | None:
    """Our mode for hipDNN's mode integer of ``op``; None for a mode none of our ops runs."""
    return _TO_OURS.get(op, {}).get(value)


def mode_to_hipdnn(op: str, value: int) -> int | None:
    """hipDNN's mode integer for our mode of ``op``; None when hipDNN has none (never for our modes)."""
    return _MODES[op][1].get(value) if op in _MODES else None


def mode_name(op: str, hipdnn_value: int) -> str:
    """hipDNN's name of one of its mode integers (``ADD``), or ``unknown``."""
    return _MODES[op][0].get(hipdnn_value, "unknown") if op in _MODES else "unknown"


def tensor_id_of(op: str, spelled: str) -> str:
    """Our tensor id for a file's ``tensor_id``: hipDNN's ``x_tensor_uid``, ``dy_tensor_uid``... are read as X, dY...;
    anything else is kept as it is."""
    if not spelled.endswith("_tensor_uid"):
        return spelled
    base = spelled[:-len("_tensor_uid")]
    named = _TENSOR_NAMES.get(op, {}).get(base)
    if named is not None:
        return named
    spec = OPS.get(op)
    ours = {t.lower(): t for t in spec.tensor_ids} if spec is not None else {}
    return ours.get(base.lower(), spelled)
