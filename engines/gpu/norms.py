"""RMSNorm on a GPU: a hand-written module's own computation, torch's ``F.rms_norm``, and a fused Triton kernel.

``torch.rmsnorm_module`` is what a model's hand-written RMSNorm computes (farm.model.hand_norms: seven elementwise
kernels in eager); it is the default of a problem of library "module", so a hand-written norm is routed only to a
candidate that beats it. ``torch.rmsnorm`` is ``F.rms_norm`` (the default of ``nn.RMSNorm``'s problems).
``triton.rmsnorm`` is one kernel a row block: the row's mean square in fp32, and the module's own rounding (Llama's:
the normalized row cast to the input's dtype before the weight multiplies it; Gemma's: ``1 + weight`` in fp32, one
cast at the end), so its output is the module's up to the order of the row's sum.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from farm.plugin import DirectCall, Device, Knob, KnobValue, Problem, Support, module_rmsnorm, norm_eps

from ._common import TORCH_DTYPES, GpuEngine, TorchPlan, torch_module, triton_compile_key
from .triton_gemm import CompilePool, direct_launcher

MAX_WIDTH = 65536  # a row a program: its registers


class _RmsNormEngine(GpuEngine):
    ops = frozenset({"rmsnorm"})
    storage_dtypes = frozenset({"fp32", "fp16", "bf16"})

    def supports(self, problem: Problem, device: Device) -> Support:
        x, y = problem.tensor("X"), problem.tensor("Y")
        if not (x.is_contiguous and y.is_contiguous):
            return Support.no("contiguous rows (X and Y)")
        if problem.tensor("scale").dtype != x.dtype:
            return Support.no("a weight of the input's dtype")
        return self.also(problem)

    def also(self, problem: Problem) -> Support:
        return Support.yes()


class TorchModuleRmsNorm(_RmsNormEngine):
    """A hand-written RMSNorm's own computation: the default of its problem (library "module")."""

    name = "torch.rmsnorm_module"
    library = "module"
    priority = 4

    def also(self, problem: Problem) -> Support:
        if problem.library != "module":
            return Support.no("the computation of a model's hand-written norm (problems of library module) only")
        return Support.yes()

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch, eps = torch_module(), norm_eps(problem.criteria_dict)
        offset = problem.criteria_dict.get("scale_offset", 0)

        def produce(t: Mapping[str, Any]) -> Any:
            return module_rmsnorm(torch, t["X"], t["scale"], eps, offset)

        return TorchPlan(lambda t: t["Y"].copy_(produce(t)), device, produce=produce, copies_output=True)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall | None:
        torch, eps = torch_module(), norm_eps(problem.criteria_dict)
        offset = problem.criteria_dict.get("scale_offset", 0)
        return DirectCall(functools.partial(module_rmsnorm, torch), ("X", "scale"), args=(eps, offset),
                          label=f"the hand-written RMSNorm (eps {eps:g}{', 1 + weight' if offset else ''})")


class TorchRmsNorm(_RmsNormEngine):
    """``F.rms_norm``: nn.RMSNorm's call, and a candidate for a hand-written RMSNorm scaled by its weight."""

    name = "torch.rmsnorm"
    priority = 10

    def also(self, problem: Problem) -> Support:
        if not hasattr(torch_module().nn.functional, "rms_norm"):
            return Support.no("this torch has no F.rms_norm (torch >= 2.4)")
        if problem.criteria_dict.get("scale_offset"):
            return Support.no("F.rms_norm scales by the weight, not by scale_offset + weight (Gemma's norm)")
        return Support.yes()

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        rms_norm = torch_module().nn.functional.rms_norm
        shape, eps = (problem.tensor("X").dims[-1],), norm_eps(problem.criteria_dict)

        def produce(t: Mapping[str, Any]) -> Any:
            return rms_norm(t["X"], shape, t["scale"], eps)

        return TorchPlan(lambda t: t["Y"].copy_(produce(t)), device, produce=produce, copies_output=True)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall | None:
        shape, eps = (problem.tensor("X").dims[-1],), norm_eps(problem.criteria_dict)
        return DirectCall(_rms_norm_call, ("X", "scale"), args=(shape, eps),
                          label=f"F.rms_norm(X, {list(shape)}, scale, eps={eps:g})")


def _rms_norm_call(x: Any, w: Any, shape: tuple[int, ...], eps: float) -> Any:
    return torch_module().nn.functional.rms_norm(x, shape, w, eps)


def _norm_kernel() -> Any:
    """The kernel factory the compile pool's processes call ("module:function")."""
    return _kernels()


@functools.lru_cache(maxsize=1)
def _kernels() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, ROWS, N, eps, OFFSET: tl.constexpr, BLOCK: tl.constexpr,
                       ROWS_PER: tl.constexpr):
        """ROWS_PER rows of N a program: mean square in fp32, the module's rounding (see the module's text)."""
        cols = tl.arange(0, BLOCK)
        inside = cols < N
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        for i in range(ROWS_PER):
            row = tl.program_id(0) * ROWS_PER + i
            live = inside & (row < ROWS)
            x = tl.load(x_ptr + row * N + cols, mask=live, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
            if OFFSET == 0:  # Llama's: the normalized row in the input's dtype, then the weight
                y = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32) * w
            else:  # Gemma's: (1 + weight) in fp32, one cast at the end
                y = x * rstd * (OFFSET + w)
            tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=live)

    return rmsnorm_kernel


class TritonRmsNorm(_RmsNormEngine):
    """One fused kernel for a row block (the module's seven elementwise kernels, or F.rms_norm's, in one launch)."""

    name = "triton.rmsnorm"
    priority = 20
    knobs = (Knob.int("ROWS_PER", 1, choices=(1, 2, 4, 8), doc="rows a program normalises"),
             Knob.int("num_warps", 4, choices=(1, 2, 4, 8, 16), doc="warps of a program"))

    def __init__(self, compile_pool: CompilePool | None = None) -> None:
        self._procs = compile_pool or CompilePool()

    def also(self, problem: Problem) -> Support:
        try:
            import triton  # noqa: F401
        except ImportError:
            return Support.no("triton is not installed (pip install 'tunefarm[triton]')")
        width = problem.tensor("X").rows[1]
        if width > MAX_WIDTH:
            return Support.no(f"rows of {width}: at most {MAX_WIDTH} a program")
        return Support.yes()

    def _launch(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> tuple[tuple[Any, ...], dict[str, Any],
                                                                                  tuple[int, int, int]]:
        rows, n = problem.tensor("X").rows
        per = int(knobs.get("ROWS_PER", 1))
        meta = {"OFFSET": int(problem.criteria_dict.get("scale_offset", 0)), "BLOCK": max(16, 1 << (n - 1).bit_length()),
                "ROWS_PER": per, "num_warps": int(knobs.get("num_warps", 4))}
        return (rows, n, norm_eps(problem.criteria_dict)), meta, (-(-rows // per), 1, 1)

    def compile_key(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> str:
        scalars, meta, _ = self._launch(problem, knobs)
        return triton_compile_key("triton.rmsnorm", device, (problem.dtype,), meta, scalars[:2])

    def run_jit(self, problem: Problem, knobs: Mapping[str, KnobValue], t: Mapping[str, Any]) -> None:
        """The plan's launch through Triton's JIT on tensors ``t`` (X, scale, Y): under ``TRITON_INTERPRET=1`` on
        a CPU, which is how the kernel is tested without a GPU."""
        scalars, meta, grid = self._launch(problem, knobs)
        _kernels()[grid](t["X"], t["scale"], t["Y"], *scalars, **meta)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        kernel = _kernels()
        scalars, meta, grid = self._launch(problem, knobs)
        name = TORCH_DTYPES[problem.dtype]
        compiled = self._procs.compile(f"{__name__}:_norm_kernel", kernel, (name, name, name), scalars, grid, meta)
        launch = direct_launcher(kernel, compiled, grid, meta, device.index)
        return TorchPlan(lambda t: launch(t["X"], t["scale"], t["Y"], *scalars), device)
