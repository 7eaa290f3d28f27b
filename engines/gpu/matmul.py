"""PyTorch matmul engines: the default path, and the BLAS backend chosen with precision knobs.

matmul covers plain, batched (A with batch dims, B batched or shared) and
matmul+bias (``addmm``/``baddbmm``, the cuBLASLt epilogue path). TF32 is used
exactly when the problem's compute dtype is tf32: it changes results, so it is
part of the problem, not a knob.
"""

from __future__ import annotations

from typing import Any, Mapping

from farm.device import Device
from farm.dtypes import itemsize
from farm.engine import Support
from farm.knobs import Knob, KnobValue
from farm.problem import Problem

from ._common import GpuEngine, TorchPlan, ZeroPaddedAB, elements, flags, gemm_mkn, round_up, torch_dtype, torch_module


def _matmul_fn(problem: Problem) -> Any:
    """fn(tensors) computing C = A @ B (+ bias) into C."""
    torch = torch_module()
    has_bias = problem.has_tensor("bias")
    a_dims, c_dims = problem.tensor("A").dims, problem.tensor("C").dims
    m, k, n = a_dims[-2], a_dims[-1], c_dims[-1]

    def fn(t: Mapping[str, Any]) -> None:
        a, b, c = t["A"], t["B"], t["C"]
        if not has_bias:
            torch.matmul(a, b, out=c)
            return
        bias = t["bias"].reshape(-1)
        if a.dim() == 2:
            torch.addmm(bias, a, b, out=c)
            return
        a3 = a.reshape(-1, m, k)
        b3 = (b if b.dim() == a.dim() else b.expand(*a.shape[:-2], k, n)).reshape(-1, k, n)
        if c.is_contiguous():
            torch.baddbmm(bias, a3, b3, out=c.view(-1, m, n))
        else:
            c.copy_(torch.baddbmm(bias, a3, b3).view(c.shape))

    return fn


class _TorchMatmulBase(GpuEngine):
    ops = frozenset({"matmul"})

    def supports(self, problem: Problem, device: Device) -> Support:
        if problem.compute_dtype == "tf32" and problem.dtype != "fp32":
            return Support.no("tf32 applies to fp32 data")
        if problem.compute_dtype == "fp64":
            return Support.no("fp64 is out of scope for the GPU matmul engines")
        return Support.yes()

    def _matmul_flags(self, problem: Problem, reduced: bool | None = None) -> dict[str, Any]:
        values: dict[str, Any] = {"allow_tf32": problem.compute_dtype == "tf32"}
        if reduced is not None:
            if problem.dtype == "fp16":
                values["allow_fp16_reduced_precision_reduction"] = reduced
            elif problem.dtype == "bf16":
                values["allow_bf16_reduced_precision_reduction"] = reduced
        return values


class TorchMatmul(_TorchMatmulBase):
    """PyTorch's default path: torch.matmul / addmm with the library's own heuristics."""

    name = "torch.matmul"
    priority = 10

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        settings = self._matmul_flags(problem)
        return TorchPlan(_matmul_fn(problem), device, context=lambda: flags(torch.backends.cuda.matmul, **settings))


class TorchBlas(_TorchMatmulBase):
    """PyTorch with the BLAS library picked (cuBLAS or cuBLASLt; on ROCm hipBLAS or hipBLASLt)."""

    name = "torch.blas"
    priority = 20
    knobs = (
        Knob.str("backend", "cublaslt", choices=("cublas", "cublaslt"),
                 doc="torch.backends.cuda.preferred_blas_library (hipBLAS/hipBLASLt on ROCm)"),
        Knob.int("reduced_precision", 1, choices=(0, 1),
                 doc="allow fp16/bf16 reduced-precision reductions inside the GEMM"),
    )

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        settings = self._matmul_flags(problem, bool(knobs["reduced_precision"]))
        backend = str(knobs["backend"])

        class _Context:
            def __enter__(self) -> None:
                self.prev = torch.backends.cuda.preferred_blas_library()
                torch.backends.cuda.preferred_blas_library(backend)
                self.flags = flags(torch.backends.cuda.matmul, **settings)
                self.flags.__enter__()

            def __exit__(self, *exc: Any) -> None:
                self.flags.__exit__(*exc)
                torch.backends.cuda.preferred_blas_library(self.prev)

        return TorchPlan(_matmul_fn(problem), device, context=_Context)


class TorchMatmulPadded(_TorchMatmulBase):
    """torch.matmul on zero-padded copies with aligned leading dimensions (Inductor's pad_mm).

    An odd M, N or K leaves the BLAS library's leading dimensions unaligned and keeps it off
    its fastest kernels. A and B are copied into buffers whose K and N extents are multiples of
    ``multiple`` (zeros in the K padding leave the product exact); ``output`` says where the
    product goes: ``direct`` writes it into C as laid out by the problem, ``padded`` into an
    aligned buffer copied to C afterwards. The copies are part of every run, so they are
    measured too. The buffers are held by the plan (``estimate_workspace`` counts them).
    """

    name = "torch.matmul_padded"
    priority = 30
    knobs = (Knob.int("multiple", 8, choices=(8, 16, 32, 64, 128),
                      doc="pad K and N (and M for a padded output) up to a multiple of this"),
             Knob.str("output", "direct", choices=("direct", "padded"),
                      doc="write into C as it is, or into an aligned buffer copied to C"))

    def supports(self, problem: Problem, device: Device) -> Support:
        base = super().supports(problem, device)
        if not base:
            return base
        m, k, n = gemm_mkn(problem)
        if m % 8 == 0 and k % 8 == 0 and n % 8 == 0:
            return Support.no(f"M={m}, K={k}, N={n} are aligned already (multiples of 8)")
        return Support.yes()

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        a_shape, b_shape, c_shape = _padded_shapes(problem, int(knobs.get("multiple", 8)),
                                                   str(knobs.get("output", "direct")) == "padded")
        return ZeroPaddedAB.nbytes(problem, a_shape, b_shape) + elements(c_shape) * itemsize(problem.tensor("C").dtype)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        padded_out = str(knobs["output"]) == "padded"
        a_shape, b_shape, c_shape = _padded_shapes(problem, int(knobs["multiple"]), padded_out)
        ab = ZeroPaddedAB(problem, device, a_shape, b_shape)
        c_p = (torch.empty(c_shape, dtype=torch_dtype(problem.tensor("C").dtype), device=torch.device("cuda", device.index))
               if c_shape else None)
        m, k, n = gemm_mkn(problem)
        a_p, b_p = ab.a, ab.b
        a_mm, b_mm = a_p[..., :m, :], b_p[..., :, :n]  # K padded with zeros; leading dimensions aligned
        has_bias = problem.has_tensor("bias")

        def fn(t: Mapping[str, Any]) -> None:
            ab.copy_in(t)
            if c_p is not None:
                torch.matmul(a_p, b_p, out=c_p)
                if has_bias:
                    torch.add(c_p[..., :m, :n], t["bias"].reshape(-1), out=t["C"])
                else:
                    t["C"].copy_(c_p[..., :m, :n])
            elif has_bias:
                if a_mm.dim() == 2:
                    torch.addmm(t["bias"].reshape(-1), a_mm, b_mm, out=t["C"])
                else:
                    torch.add(torch.matmul(a_mm, b_mm), t["bias"].reshape(-1), out=t["C"])
            else:
                torch.matmul(a_mm, b_mm, out=t["C"])

        settings = self._matmul_flags(problem)
        plan = TorchPlan(fn, device, context=lambda: flags(torch.backends.cuda.matmul, **settings))
        ab.keep_until_done(plan, c_p)
        return plan


def _padded_shapes(problem: Problem, multiple: int, padded_out: bool) -> tuple[tuple[int, ...], ...]:
    """Buffer shapes for A, B and (padded output only; else ()) C."""
    m, k, n = gemm_mkn(problem)
    a, b = problem.tensor("A").dims, problem.tensor("B").dims
    rows = round_up(m, multiple) if padded_out else m
    kp, np_ = round_up(k, multiple), round_up(n, multiple)
    return (*a[:-2], rows, kp), (*b[:-2], kp, np_), ((*a[:-2], round_up(m, multiple), np_) if padded_out else ())
