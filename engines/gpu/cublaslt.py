"""cuBLASLt's algorithms as candidates, planned with nvmath-python (``nvmath.linalg.advanced.Matmul``).

What TunableOp does with hipBLASLt on ROCm, on CUDA: for a matmul, nvmath plans the problem
(descriptors, layouts, compute type) and asks cuBLASLt's heuristic for its algorithms; the first
``FARM_LIBRARY_PLANS`` are candidates. An algorithm is named by cuBLASLt's own configuration:
``algo`` (the algorithm id), ``tile``, ``stages``, ``split_k``, ``reduction`` (split-K reduction
scheme), ``swizzle``, ``custom``, ``inner_shape`` and ``cluster`` (cuBLASLt's enum values); ``-1``
everywhere is cuBLASLt's first choice. A built plan calls ``cublasLtMatmul`` itself with the planned
descriptors and the chosen algorithm (nvmath's ``execute`` allocates a result per call; this writes C
in place), on the caller's stream, with the algorithm's workspace allocated once.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from farm.plugin import Device, KnobValue, Problem, Support

from ._common import GpuEngine, PerStream, TorchPlan, current_raw_stream, empty_like_desc, torch_module
from .library_plans import UNSET, PlanCache, id_knob, import_or_reason, plan_limit

log = logging.getLogger("farm.engines.gpu")

# knob -> the attribute of nvmath's algorithm configuration interface (cuBLASLt's CUBLASLT_ALGO_CONFIG_*)
ALGO_FIELDS = {"algo": "id", "tile": "tile_id", "stages": "stages_id", "split_k": "splitk_num",
               "reduction": "reduction_scheme", "swizzle": "cta_swizzling", "custom": "custom_option",
               "inner_shape": "inner_shape_id", "cluster": "cluster_shape_id"}
ALIGNMENT = 16  # bytes: the alignment the planned algorithms assume of every operand (torch allocates at 256)


def nvmath_or_reason() -> tuple[Any, str]:
    return import_or_reason("nvmath.linalg.advanced", "nvmath-python")


def algorithm_knobs(algorithm: Any) -> dict[str, int]:
    """An nvmath Algorithm's configuration as knob values."""
    config = algorithm.config_ifc
    out = {}
    for knob, attr in ALGO_FIELDS.items():
        try:
            out[knob] = int(getattr(config, attr))
        except Exception:  # an attribute this CUDA's cuBLASLt does not have
            continue
    return out


class _Planned:
    """One problem's cuBLASLt plan on one device: nvmath's Matmul (descriptors and layouts) and its algorithms."""

    def __init__(self, matmul: Any, algorithms: Sequence[Any], operands: tuple[Any, ...]) -> None:
        self.matmul = matmul
        self.algorithms = tuple(algorithms)
        self.settings = [algorithm_knobs(a) for a in self.algorithms]
        self.operands = operands  # the tensors it was planned on: its layouts refer to their shapes

    def index_of(self, knobs: Mapping[str, KnobValue]) -> int:
        if int(knobs.get("algo", UNSET)) == UNSET:
            return 0
        want = {k: int(v) for k, v in knobs.items() if int(v) != UNSET}
        for i, setting in enumerate(self.settings):
            if all(setting.get(k) == v for k, v in want.items()):
                return i
        shown = ",".join(f"{k}={v}" for k, v in want.items())
        raise RuntimeError(f"cuBLASLt lists no algorithm {shown} for this problem (it lists {len(self.settings)}); "
                           "one recorded with another CUDA version may be gone")

    def workspace_size(self, index: int) -> int:
        buf = self.matmul.algorithm_object_to_buffer[self.algorithms[index]]
        return int(buf["workspace_size"].item() if hasattr(buf["workspace_size"], "item") else buf["workspace_size"])

    def algo_struct(self, index: int) -> Any:
        return self.matmul.algorithm_object_to_buffer[self.algorithms[index]]["algo"]


class CublasLt(GpuEngine):
    """matmul by each algorithm cuBLASLt's heuristic lists (NVIDIA; fp16 / bf16, fp32 with tf32 or strict)."""

    name = "cublaslt"
    ops = frozenset({"matmul"})
    priority = 40
    knobs = (id_knob("algo", "cuBLASLt algorithm id (-1: cuBLASLt's first choice)"),
             id_knob("tile", "CUBLASLT_ALGO_CONFIG_TILE_ID"),
             id_knob("stages", "CUBLASLT_ALGO_CONFIG_STAGES_ID"),
             id_knob("split_k", "CUBLASLT_ALGO_CONFIG_SPLITK_NUM"),
             id_knob("reduction", "CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME"),
             id_knob("swizzle", "CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING"),
             id_knob("custom", "CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION"),
             id_knob("inner_shape", "CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID"),
             id_knob("cluster", "CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID"))

    def __init__(self) -> None:
        self._planned: PlanCache[_Planned] = PlanCache()

    def supports(self, problem: Problem, device: Device) -> Support:
        if device.vendor != "nvidia":
            return Support.no("cuBLASLt runs on NVIDIA GPUs (on AMD, hipBLASLt's solution list would plug in here)")
        advanced, reason = nvmath_or_reason()
        if advanced is None:
            return Support.no(reason)
        if problem.has_tensor("bias"):
            return Support.no("a bias is not fused here (torch.matmul and triton.gemm take it)")
        a, b = problem.tensor("A").dims, problem.tensor("B").dims
        if len(a) > 3 or len(b) > 3:
            return Support.no("A and B of at most one batch dimension")
        if len(b) == 3 and len(a) != 3:
            return Support.no("a batched B needs a batched A")
        if problem.dtype == "fp32" and problem.compute_dtype not in ("fp32", "tf32"):
            return Support.no(f"fp32 tensors with {problem.compute_dtype} compute")
        if problem.dtype in ("fp16", "bf16") and problem.compute_dtype != "fp32":
            return Support.no(f"compute {problem.compute_dtype}: this engine accumulates in fp32")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> Sequence[Mapping[str, KnobValue]]:
        return self._plan(problem, device).settings[:plan_limit()]

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        from nvmath.bindings import cublasLt

        planned = self._plan(problem, device)
        index = planned.index_of(knobs)
        ws_bytes = planned.workspace_size(index)
        where = torch.device("cuda", device.index)

        def workspace() -> tuple[Any, int]:
            buf = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=where)
            return buf, buf.data_ptr()

        # a workspace per stream: two streams' calls at once must not share one (as cuBLAS's own, in torch)
        workspaces = PerStream(workspace, device.index)
        mm, algo = planned.matmul, planned.algo_struct(index)
        handle, desc = mm.handle, mm.mm_desc
        alpha, beta = mm.alpha.ctypes.data, mm.beta.ctypes.data
        a_layout, b_layout, c_layout, d_layout = mm.a_layout_ptr, mm.b_layout_ptr, mm.c_layout_ptr, mm.d_layout_ptr
        algo_ptr, dev_index, raw_stream = algo.ctypes.data, device.index, current_raw_stream(torch)
        matmul = cublasLt.matmul

        def fn(t: Mapping[str, Any]) -> None:
            a, b, c = t["A"].data_ptr(), t["B"].data_ptr(), t["C"].data_ptr()
            if (a | b | c) % ALIGNMENT:  # the algorithms were planned for aligned operands
                torch.matmul(t["A"], t["B"], out=t["C"])
                return
            stream = raw_stream(dev_index)
            ws = workspaces.get(stream)
            matmul(handle, desc, alpha, a, a_layout, b, b_layout, beta, c, c_layout, c, d_layout,
                   algo_ptr, ws[1], ws_bytes, stream)

        plan = TorchPlan(fn, device, ws_bytes)
        plan.keep = (planned, workspaces)  # the descriptors and the workspaces live as long as the plan
        return plan

    def _plan(self, problem: Problem, device: Device) -> _Planned:
        return self._planned.get((problem.key, device.index), lambda: self._make_plan(problem, device))

    def _make_plan(self, problem: Problem, device: Device) -> _Planned:
        advanced, reason = nvmath_or_reason()
        if advanced is None:
            raise RuntimeError(reason)
        torch = torch_module()
        a, b, c = (empty_like_desc(problem, tid, device) for tid in ("A", "B", "C"))
        options: dict[str, Any] = {"inplace": True}
        if problem.dtype == "fp32":
            from nvmath.linalg import ComputeType

            options["compute_type"] = (ComputeType.COMPUTE_32F_FAST_TF32 if problem.compute_dtype == "tf32"
                                       else ComputeType.COMPUTE_32F)
        stream = torch.cuda.current_stream(device.index)
        with torch.cuda.device(device.index):
            mm = advanced.Matmul(a, b, c, beta=0.0, options=options, stream=stream)
            algorithms = mm.plan(preferences={"limit": max(plan_limit(), 32)}, stream=stream)
        log.debug("autotune: cuBLASLt lists %d algorithms for %s", len(algorithms), problem.label())
        return _Planned(mm, algorithms, (a, b, c))


__all__ = ["CublasLt", "ALGO_FIELDS", "algorithm_knobs"]
