"""PyTorch scaled_dot_product_attention with the backend forced: flash, memory-efficient, cuDNN, math.

``backend=auto`` is PyTorch's own dispatch (the default path). An attention mask
(the problem's ``mask``) is passed as ``attn_mask``. Whether a backend applies
(dtype, head dim, GQA, a mask, layout, architecture) is asked of PyTorch itself
(``torch.backends.cuda.can_use_*``) during discovery, so an engine that does
not apply says so there instead of failing to compile. Causal masking is
top-left aligned (``is_causal``); Hq != Hkv runs as grouped-query attention.
"""

from __future__ import annotations

from typing import Any, Mapping

from farm.plugin import DirectCall, Device, Knob, KnobValue, Problem, Support

from ._common import GpuEngine, TorchPlan, empty_like_desc, torch_module

BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")
_SDP = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
_CAN_USE = {"flash": "can_use_flash_attention", "efficient": "can_use_efficient_attention",
            "cudnn": "can_use_cudnn_attention"}


class TorchSdpa(GpuEngine):
    name = "torch.sdpa"
    ops = frozenset({"sdpa_fwd"})
    priority = 10
    takes_mask = True
    knobs = (Knob.str("backend", "auto", choices=BACKENDS, doc="attention kernel; auto = PyTorch's own choice"),)

    def supports(self, problem: Problem, device: Device) -> Support:
        torch = torch_module()
        if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            return Support.no("this torch has no scaled_dot_product_attention")
        if problem.tensor("Q").dims[1] != problem.tensor("K").dims[1]:
            major, minor = (int(x) for x in torch.__version__.split(".")[:2])
            if (major, minor) < (2, 5):  # the builtin has no inspectable signature; enable_gqa came in 2.5
                return Support.no("grouped-query attention needs torch >= 2.5 (enable_gqa)")
        return Support.yes()

    def knob_support(self, problem: Problem, device: Device, knobs: Mapping[str, KnobValue]) -> Support:
        return self.backend_support(problem, device, str(knobs.get("backend", "auto")))

    def backend_support(self, problem: Problem, device: Device, backend: str) -> Support:
        """Whether PyTorch would run ``backend`` on this problem (asked on real tensors of its layout)."""
        if backend in ("auto", "math"):
            return Support.yes()
        torch = torch_module()
        fn = getattr(torch.backends.cuda, _CAN_USE[backend], None)
        params_cls = getattr(torch.backends.cuda, "SDPAParams", None)
        if fn is None or params_cls is None:
            return Support.no(f"this torch cannot tell whether the {backend} backend applies")
        q, k, v = (empty_like_desc(problem, t, device) for t in ("Q", "K", "V"))
        mask = empty_like_desc(problem, "mask", device) if problem.has_tensor("mask") else None
        causal = bool(problem.criteria_dict.get("causal"))
        gqa = q.shape[1] != k.shape[1]
        try:
            params = params_cls(q, k, v, mask, 0.0, causal, gqa)
        except TypeError:  # torch < 2.5: no enable_gqa argument
            params = params_cls(q, k, v, mask, 0.0, causal)
        ok = bool(fn(params, False))
        return Support.yes() if ok else Support.no(f"PyTorch's {backend} backend does not take this problem")

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        if knobs.get("backend") != "math":
            return 0
        b, h, sq, _ = problem.tensor("Q").dims
        skv = problem.tensor("K").dims[2]
        return b * h * sq * skv * 4  # the materialised scores, fp32

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        backend = str(knobs["backend"])
        support = self.backend_support(problem, device, backend)
        if not support:
            raise RuntimeError(support.reason)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        causal = bool(problem.criteria_dict.get("causal"))
        gqa = problem.tensor("Q").dims[1] != problem.tensor("K").dims[1]
        extra = {"enable_gqa": True} if gqa else {}

        if problem.has_tensor("mask"):
            def produce(t: Mapping[str, Any]) -> Any:
                return sdpa(t["Q"], t["K"], t["V"], attn_mask=t["mask"], **extra)
        else:
            def produce(t: Mapping[str, Any]) -> Any:
                return sdpa(t["Q"], t["K"], t["V"], is_causal=causal, **extra)

        def fn(t: Mapping[str, Any]) -> None:
            t["O"].copy_(produce(t))

        context = None
        if backend != "auto":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            chosen = [getattr(SDPBackend, _SDP[backend])]

            def context() -> Any:
                return sdpa_kernel(chosen)
        return TorchPlan(fn, device, self.estimate_workspace(problem, knobs), context=context, produce=produce,
                         copies_output=True)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall | None:
        """``F.scaled_dot_product_attention(Q, K, V, is_causal=..., enable_gqa=...)``: PyTorch's own dispatch."""
        causal = bool(problem.criteria_dict.get("causal"))
        kwargs: dict[str, Any] = {"is_causal": causal}
        if problem.tensor("Q").dims[1] != problem.tensor("K").dims[1]:
            kwargs["enable_gqa"] = True
        flags = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        names: tuple[str, ...] = ("Q", "K", "V")
        if problem.has_tensor("mask"):
            names, flags = ("Q", "K", "V", "mask"), "mask, " + flags  # attn_mask is the 4th positional argument
        return DirectCall(torch_module().nn.functional.scaled_dot_product_attention, names, kwargs=kwargs,
                          label=f"F.scaled_dot_product_attention({', '.join(names)}, {flags})")
