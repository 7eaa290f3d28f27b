import json

import pytest

from farm.errors import InputError
from farm.model.op_catalog import CATEGORY_PRIORITY, OPS, OpCategory, core_op, op_spec
from farm.model.problem import Problem, TensorDesc, contiguous_strides


def mm(**kw):
    return Problem.create("matmul", {"A": [4, 3], "B": [3, 5]}, **kw)


def test_contiguous_strides_and_output_inference():
    p = mm()
    assert p.tensor("A").strides == (3, 1)
    assert p.tensor("C").dims == (4, 5)
    assert p.tensor("C").strides == contiguous_strides((4, 5)) == (5, 1)
    assert p.compute_dtype == "fp32"
    assert [t.id for t in p.tensors] == ["A", "B", "C"]


def test_key_is_deterministic_and_ignores_tensor_order_and_defaults():
    a = Problem.create("conv_fprop", {"X": [1, 4, 8, 8], "W": [6, 4, 3, 3]}, criteria={"pad_h": 1})
    b = Problem.create("conv_fprop", {"W": [6, 4, 3, 3], "X": [1, 4, 8, 8]},
                       criteria={"pad_h": 1, "stride_h": 1, "groups": 1})
    assert a == b and a.key == b.key
    assert len(a.key) == 16
    assert a.key != Problem.create("conv_fprop", {"X": [1, 4, 8, 8], "W": [6, 4, 3, 3]}).key
    # the canonical JSON is stable text: sorted keys, all criteria, tensors sorted by id
    canon = json.loads(a.canonical_json())
    assert [t["id"] for t in canon["tensors"]] == ["W", "X", "Y"]
    assert canon["criteria"]["stride_w"] == 1


def test_key_changes_with_strides_dtype_and_compute_dtype():
    base = mm().key
    assert Problem.create("matmul", {"A": [4, 3], "B": {"dims": [3, 5], "strides": [1, 3]}}).key != base
    assert mm(dtype="fp16").key != base
    assert mm(compute_dtype="tf32").key != base


def test_canonical_round_trip():
    p = Problem.create("sdpa_fwd", {"Q": [1, 8, 16, 32], "K": [1, 2, 16, 32], "V": [1, 2, 16, 32]},
                       criteria={"causal": 1}, dtype="bf16")
    assert Problem.from_canonical(json.loads(p.canonical_json())) == p


@pytest.mark.parametrize(
    "tensors, field",
    [
        ({"A": [4, 0], "B": [0, 5]}, "tensors.A.dims"),
        ({"A": [4, 3], "B": [4, 5]}, "tensors.B.dims"),
        ({"A": [4, 3], "B": {"dims": [3, 5], "strides": [5]}}, "tensors.B.strides"),
        ({"A": [4, 3], "B": {"dims": [3, 5], "strides": [1, 1]}}, "tensors.B.strides"),
        ({"A": [4, 3], "B": {"dims": [3, 5], "strides": [5, -1]}}, "tensors.B.strides"),
        ({"A": [4, 3]}, "tensors.B"),
        ({"A": [4, 3], "B": [3, 5], "Z": [1]}, "tensors.Z"),
        ({"A": [4, 3], "B": {"dims": [3, 5], "dtype": "fp12"}}, "tensors.B.dtype"),
        ({"A": [4, 3], "B": {"dims": [3, 5], "layout": "nhwc"}}, "tensors.B.layout"),
    ],
)
def test_bad_tensors_name_the_field_and_value(tensors, field):
    with pytest.raises(InputError) as info:
        Problem.create("matmul", tensors)
    assert info.value.field == field
    assert field in str(info.value)


def test_overlap_check_accepts_permuted_layouts():
    # channels-last NCHW dims: strides (HWC, 1, WC, C) do not overlap
    p = Problem.create("conv_fprop", {"X": {"dims": [2, 4, 5, 5], "strides": [100, 1, 20, 4]}, "W": [3, 4, 1, 1]})
    assert not p.tensor("X").is_contiguous
    assert p.tensor("X").storage_elements == 200


def test_unknown_op_and_criteria_are_clear_errors():
    with pytest.raises(InputError, match="unknown op 'gemm'"):
        Problem.create("gemm", {"A": [1, 1]})
    with pytest.raises(InputError) as info:
        Problem.create("matmul", {"A": [2, 2], "B": [2, 2]}, criteria={"causal": 1})
    assert info.value.field == "criteria.causal"
    with pytest.raises(InputError, match="integer-coded"):
        Problem.create("sdpa_fwd", {"Q": [1, 1, 2, 4], "K": [1, 1, 2, 4], "V": [1, 1, 2, 4]}, criteria={"causal": "yes"})


def test_tf32_needs_fp32_storage():
    assert mm(compute_dtype="tf32").compute_dtype == "tf32"
    with pytest.raises(InputError, match="tf32"):
        mm(dtype="fp16", compute_dtype="tf32")
    assert mm(dtype="bf16").compute_dtype == "fp32"
    assert mm(dtype="float16").dtype == "fp16"  # aliases


def test_conv_shapes_groups_stride_dilation():
    p = Problem.create("conv_fprop", {"X": [2, 8, 17, 15], "W": [12, 4, 3, 3]},
                       criteria={"groups": 2, "stride_h": 2, "pad_w": 1, "dilation_w": 2})
    assert p.tensor("Y").dims == (2, 12, 8, 13)
    with pytest.raises(InputError) as info:
        Problem.create("conv_fprop", {"X": [2, 8, 5, 5], "W": [12, 8, 3, 3]}, criteria={"groups": 3})
    assert info.value.field == "criteria.groups"
    with pytest.raises(InputError, match="does not fit"):
        Problem.create("conv_fprop", {"X": [1, 1, 2, 2], "W": [1, 1, 5, 5]})
    with pytest.raises(InputError) as info:
        Problem.create("conv_fprop", {"X": [1, 1, 4, 4], "W": [1, 1, 3, 3]}, criteria={"stride_h": 0})
    assert info.value.field == "criteria.stride_h"


def test_conv_gradients_need_all_tensors_and_check_them():
    crit = {"pad_h": 1, "pad_w": 1}
    ok = Problem.create("conv_dgrad", {"dY": [2, 6, 8, 8], "W": [6, 4, 3, 3], "dX": [2, 4, 8, 8]}, criteria=crit)
    assert ok.output_ids == ("dX",)
    with pytest.raises(InputError, match="dX"):
        Problem.create("conv_dgrad", {"dY": [2, 6, 8, 8], "W": [6, 4, 3, 3]}, criteria=crit)
    with pytest.raises(InputError) as info:
        Problem.create("conv_wgrad", {"X": [2, 4, 8, 8], "dY": [2, 6, 7, 8], "dW": [6, 4, 3, 3]}, criteria=crit)
    assert info.value.field == "tensors.dY.dims"


def test_sdpa_gqa_and_bad_heads():
    p = Problem.create("sdpa_fwd", {"Q": [2, 8, 10, 16], "K": [2, 2, 12, 16], "V": [2, 2, 12, 24]})
    assert p.tensor("O").dims == (2, 8, 10, 24)
    with pytest.raises(InputError) as info:
        Problem.create("sdpa_fwd", {"Q": [2, 8, 10, 16], "K": [2, 3, 12, 16], "V": [2, 3, 12, 16]})
    assert info.value.field == "tensors.K.dims"
    back = Problem.create("sdpa_bwd", {"Q": [1, 2, 4, 8], "K": [1, 2, 4, 8], "V": [1, 2, 4, 8],
                                       "O": [1, 2, 4, 8], "dO": [1, 2, 4, 8]})
    assert {t.id for t in back.tensors} >= {"dQ", "dK", "dV"}


def test_norms_batchnorm_and_pointwise():
    assert Problem.create("rmsnorm", {"X": [3, 7, 16], "scale": [16]}).tensor("Y").dims == (3, 7, 16)
    with pytest.raises(InputError) as info:
        Problem.create("layernorm", {"X": [3, 16], "scale": [16], "bias": [15]})
    assert info.value.field == "tensors.bias.dims"
    bn = Problem.create("batchnorm_inference", {"X": [2, 3, 4, 4], "scale": [3], "bias": [3], "mean": [3], "var": [3]})
    assert bn.tensor("Y").dims == (2, 3, 4, 4)
    with pytest.raises(InputError, match="need tensor B"):
        Problem.create("pointwise", {"A": [4]}, criteria={"mode": 0})
    assert Problem.create("pointwise", {"A": [4]}, criteria={"mode": 2}).tensor("C").dims == (4,)


def test_core_op_priority_mapping():
    assert CATEGORY_PRIORITY == {
        OpCategory.CONVOLUTION: 70, OpCategory.SDPA: 60, OpCategory.MATMUL: 50, OpCategory.BATCHNORM: 40,
        OpCategory.NORM: 30, OpCategory.REDUCTION: 20, OpCategory.RESAMPLE: 20, OpCategory.POINTWISE: 10,
    }
    assert core_op(["pointwise", "matmul", "layernorm"]) == "matmul"
    assert core_op(["pointwise", "conv_fprop", "sdpa_fwd"]) == "conv_fprop"
    assert core_op(["resample", "reduction"]) == "resample"  # equal priority: the first wins
    assert core_op(["rmsnorm", "batchnorm_inference"]) == "batchnorm_inference"
    assert op_spec("conv_wgrad").category is OpCategory.CONVOLUTION
    assert op_spec("sdpa_bwd").priority == 60
    assert {"conv_fprop", "conv_dgrad", "conv_wgrad", "sdpa_fwd", "sdpa_bwd", "matmul", "layernorm", "rmsnorm"} <= set(OPS)
    with pytest.raises(InputError):
        core_op([])


def test_labels_and_flops():
    p = Problem.create("matmul", {"A": [2, 64, 32], "B": [2, 32, 16]})
    assert p.flops == 2 * 2 * 64 * 16 * 32
    assert p.label().startswith("matmul A[2,64,32] B[2,32,16] fp32")
    assert "strided" in Problem.create("matmul", {"A": [4, 3], "B": {"dims": [3, 5], "strides": [1, 3]}}).label()


def test_tensor_desc_validation():
    with pytest.raises(InputError):
        TensorDesc.create("", [1])
    with pytest.raises(InputError) as info:
        TensorDesc.create("A", [2, True])
    assert info.value.field == "tensors.A.dims"
