"""PyTorch matmul engines: the default path, and the BLAS backend chosen with precision knobs.

matmul covers plain, batched (A with batch dims, B batched or shared) and
matmul+bias (``addmm``/``baddbmm``, the cuBLASLt epilogue path). TF32 is used
exactly when the problem's compute dtype is tf32: it changes results, so it is
part of the problem, not a knob.
"""

from __future__ import annotations

from typing import Any, Mapping

from farm.plugin import DirectCall, Device, Knob, KnobValue, Problem, Support, itemsize

from ._common import (
    Flags,
    GpuEngine,
    TorchPlan,
    ZeroPaddedAB,
    elements,
    gemm_mkn,
    round_up,
    torch_dtype,
    torch_module,
)


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
        """The matmul flags that decide this problem's result, set per call: TF32 for fp32 data only (it changes
        nothing else, and a flag read is host time on every replayed call)."""
        values: dict[str, Any] = {"allow_tf32": problem.compute_dtype == "tf32"} if problem.dtype == "fp32" else {}
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
        produce = None
        if not problem.has_tensor("bias"):
            def produce(t: Mapping[str, Any]) -> Any:  # the caller's own a @ b
                return torch.matmul(t["A"], t["B"])
        return TorchPlan(_matmul_fn(problem), device, context=Flags(torch.backends.cuda.matmul, **settings),
                         produce=produce)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall | None:
        """``torch.matmul(A, B)``, or ``torch.addmm(bias, A, B)`` for a 2-D product with a bias; none for TF32
        (a user's call would depend on the process's global TF32 flag) or a batched product with a bias."""
        if problem.compute_dtype == "tf32":
            return None
        torch = torch_module()
        if not problem.has_tensor("bias"):
            return DirectCall(torch.matmul, ("A", "B"), label="torch.matmul(A, B)")
        if len(problem.tensor("A").dims) == 2:
            return DirectCall(torch.addmm, ("bias", "A", "B"), label="torch.addmm(bias, A, B)")
        return None


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
            """The BLAS library and flags for one call; entered only when something differs (``needed``)."""

            matmul_flags = Flags(torch.backends.cuda.matmul, **settings)

            @classmethod
            def needed(cls) -> bool:
                # the library in force prints as e.g. "_BlasBackend.Cublaslt"
                current = str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()
                return current != backend or cls.matmul_flags.needed()

            def __enter__(self) -> None:
                self.prev = torch.backends.cuda.preferred_blas_library()
                torch.backends.cuda.preferred_blas_library(backend)
                self.flags = self.matmul_flags()
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
    aligned buffer copied to C afterwards, ``split`` writes C's first N - N % multiple columns
    with the library (aligned extent, C's own aligned row stride: its fast kernels) and the
    last few with the Triton pad kernel, which computes them from the operands while it copies
    (a second library call without Triton). The copies are part of every run, so they are
    measured too. The buffers are held by the plan (``estimate_workspace`` counts them).
    """

    name = "torch.matmul_padded"
    priority = 30
    knobs = (Knob.int("multiple", 8, choices=(8, 16, 32, 64, 128),
                      doc="pad K and N (and M for a padded output) up to a multiple of this"),
             Knob.str("output", "direct", choices=("direct", "padded", "split"),
                      doc="write into C as it is, into an aligned buffer copied to C, or the aligned "
                          "columns of C in place and the rest apart"))

    def supports(self, problem: Problem, device: Device) -> Support:
        base = super().supports(problem, device)
        if not base:
            return base
        m, k, n = gemm_mkn(problem)
        if m % 8 == 0 and k % 8 == 0 and n % 8 == 0:
            return Support.no(f"M={m}, K={k}, N={n} are aligned already (multiples of 8)")
        return Support.yes()

    def knob_support(self, problem: Problem, device: Device, knobs: Mapping[str, KnobValue]) -> Support:
        if str(knobs.get("output", "direct")) != "split":
            return Support.yes()
        multiple = int(knobs.get("multiple", 8))
        _, _, n = gemm_mkn(problem)
        c = problem.tensor("C")
        if len(c.dims) != 2:
            return Support.no("output=split: 2-D problems only (torch would copy a batched strided output)")
        if n % multiple == 0 or n < multiple:
            return Support.no(f"output=split: N={n} has no aligned part and tail at multiple={multiple}")
        aligned = 16 // itemsize(c.dtype)
        if c.strides[1] != 1 or c.strides[0] % aligned:
            return Support.no(f"output=split: C's strides {list(c.strides)} are not row-major with a 16-byte "
                              "aligned row stride, so its columns cannot be written in place by aligned kernels")
        return Support.yes()

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        a_shape, b_shape, c_shape = _padded_shapes(problem, int(knobs.get("multiple", 8)),
                                                   str(knobs.get("output", "direct")))
        return ZeroPaddedAB.nbytes(problem, a_shape, b_shape) + elements(c_shape) * itemsize(problem.tensor("C").dtype)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        output = str(knobs["output"])
        support = self.knob_support(problem, device, knobs)
        if not support:
            raise ValueError(support.reason)
        a_shape, b_shape, c_shape = _padded_shapes(problem, int(knobs["multiple"]), output)
        m, k, n = gemm_mkn(problem)
        n_main = b_shape[-1] if output == "split" else n
        c_dtype, where = torch_dtype(problem.tensor("C").dtype), torch.device("cuda", device.index)

        def views(a_p: Any, b_p: Any) -> tuple[Any, ...]:
            # K padded with zeros, leading dimensions aligned; the padded output (a stream's own, as A's and B's)
            return a_p[..., :m, :], b_p[..., :, :n_main], (torch.empty(c_shape, dtype=c_dtype, device=where)
                                                           if c_shape else None)

        ab = ZeroPaddedAB(problem, device, a_shape, b_shape, derive=views)
        tail_in_kernel = ab.use_pad_kernel(tail_from=n_main if output == "split" else None)
        has_bias = problem.has_tensor("bias")

        def gemm_into(c: Any, a: Any, b: Any, bias: Any) -> None:
            if bias is None:
                torch.matmul(a, b, out=c)
            elif a.dim() == 2:
                torch.addmm(bias, a, b, out=c)
            else:
                torch.add(torch.matmul(a, b), bias, out=c)

        def fn(t: Mapping[str, Any]) -> None:
            a_p, b_p, a_mm, b_mm, c_p = ab.copy_in(t)
            bias = t["bias"].reshape(-1) if has_bias else None
            if c_p is not None:
                torch.matmul(a_p, b_p, out=c_p)
                if has_bias:
                    torch.add(c_p[..., :m, :n], bias, out=t["C"])
                else:
                    t["C"].copy_(c_p[..., :m, :n])
            elif output == "split":
                gemm_into(t["C"][:, :n_main], a_mm, b_mm, None if bias is None else bias[:n_main])
                if not tail_in_kernel:
                    gemm_into(t["C"][:, n_main:], t["A"], t["B"][:, n_main:], None if bias is None else bias[n_main:])
            else:
                gemm_into(t["C"], a_mm, b_mm, bias)

        settings = self._matmul_flags(problem)
        return TorchPlan(fn, device, context=Flags(torch.backends.cuda.matmul, **settings))


def _padded_shapes(problem: Problem, multiple: int, output: str) -> tuple[tuple[int, ...], ...]:
    """Buffer shapes for A, B and (padded output only; else ()) C.

    A split output copies only B's first N - N % multiple columns (the library's part).
    """
    m, k, n = gemm_mkn(problem)
    a, b = problem.tensor("A").dims, problem.tensor("B").dims
    padded_out = output == "padded"
    rows = round_up(m, multiple) if padded_out else m
    kp = round_up(k, multiple)
    np_ = n - n % multiple if output == "split" else round_up(n, multiple)
    return (*a[:-2], rows, kp), (*b[:-2], kp, np_), ((*a[:-2], round_up(m, multiple), np_) if padded_out else ())
