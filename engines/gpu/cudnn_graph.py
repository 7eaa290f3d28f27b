"""cuDNN's execution plans through its graph API (package ``nvidia-cudnn-frontend``), one candidate each.

For a convolution (forward, data and weight gradient), a matmul or a forward attention, the engine
builds cuDNN's operation graph, asks its heuristics (modes A and B, then the fallback list) for
execution plans, and lists the first ``FARM_LIBRARY_PLANS`` as candidates. A plan is named the way
cuDNN names it: an engine id (``engine``) and the values of its knobs (``TILE_SIZE``, ``STAGES``,
``SPLIT_K_SLC``..., numbered as in cuDNN's backend API, which is how the plan names spell them:
``eng62_k2=5_k13=1``); a knob the plan does not set is ``-1``, and ``engine=-1`` is cuDNN's own first
choice. The graph of a problem, its plan list and each built plan are kept for the process, so the
tuner's later candidates and a replay of the winner reuse them; a call is one ``execute`` of the built
plan on the caller's stream, with a workspace of the calling stream's own (``PerStream``: two streams'
calls must not share one).
"""

from __future__ import annotations

import logging
import math
import re
import threading
from typing import Any, Mapping, Sequence

from farm.plugin import Device, KnobValue, Problem, Support

from ._common import GpuEngine, PerStream, TorchPlan, current_raw_stream, torch_module
from .library_plans import UNSET, PlanCache, id_knob, import_or_reason, plan_limit

log = logging.getLogger("farm.engines.gpu")

# cudnnBackendKnobType_t, in the backend's order: the numbers in plan names (k2=...) index this.
CUDNN_KNOBS = (
    "SPLIT_K", "SWIZZLE", "TILE_SIZE", "USE_TEX", "EDGE", "KBLOCK", "LDGA", "LDGB", "CHUNK_K", "SPLIT_H",
    "WINO_TILE", "MULTIPLY", "SPLIT_K_BUF", "TILEK", "STAGES", "REDUCTION_MODE", "CTA_SPLIT_K_MODE",
    "SPLIT_K_SLC", "IDX_MODE", "SLICED", "SPLIT_RS", "SINGLEBUFFER", "LDGC", "SPECFILT", "KERNEL_CFG",
    "WORKSPACE", "TILE_CGA", "TILE_CGA_M", "TILE_CGA_N", "BLOCK_SIZE", "OCCUPANCY", "ARRAY_SIZE_PER_THREAD",
    "NUM_OF_THREADS_PER_BLOCK", "SPLIT_COLS", "TILE_ROWS", "TILE_COLS", "LOAD_SIZE", "CTA_COUNT", "STREAM_K",
    "SPLIT_P_SLC", "TILE_M", "TILE_N", "WARP_SPEC_CFG", "SWAP_AB", "INPUT_TMA_ENABLE", "OUTPUT_TMA_ENABLE",
)
_KNOB_NUMBER = {name: i for i, name in enumerate(CUDNN_KNOBS)}
_PLAN_NAME = re.compile(r"^eng(\d+)((?:_k\d+=-?\d+)*)$")
_DATA_TYPES = {"fp16": "HALF", "bf16": "BFLOAT16", "fp32": "FLOAT"}
_CONV = ("conv_fprop", "conv_dgrad", "conv_wgrad")


def parse_plan_name(name: str) -> dict[str, int] | None:
    """``eng62_k2=5_k13=1`` -> ``{"engine": 62, "TILE_SIZE": 5, "TILEK": 1}``; None for a name of another
    form or a knob number this table does not know (such a plan is not listed: it could not be replayed)."""
    m = _PLAN_NAME.match(name)
    if not m:
        return None
    out = {"engine": int(m.group(1))}
    for part in filter(None, m.group(2).split("_")):
        number, value = part[1:].split("=")
        if int(number) >= len(CUDNN_KNOBS):
            return None
        out[CUDNN_KNOBS[int(number)]] = int(value)
    return out


def cudnn_or_reason() -> tuple[Any, str]:
    return import_or_reason("cudnn", "nvidia-cudnn-frontend")


class _Handles(threading.local):
    """One cuDNN handle per thread and device (a handle is not for concurrent use), set to the stream
    of each call only when that changes."""

    def __init__(self) -> None:
        self.by_device: dict[int, list[Any]] = {}

    def get(self, cudnn: Any, index: int, stream: int) -> Any:
        entry = self.by_device.get(index)
        if entry is None:
            with torch_module().cuda.device(index):
                entry = [cudnn.create_handle(), None]
            self.by_device[index] = entry
        if entry[1] != stream:
            cudnn.set_stream(entry[0], stream)
            entry[1] = stream
        return entry[0]


class _Graph:
    """One problem's operation graph on one device, with cuDNN's plan list for it."""

    def __init__(self, graph: Any, uids: dict[str, int], names: list[str]) -> None:
        self.graph = graph
        self.uids = uids  # tensor id -> the graph tensor's uid
        self.names = names  # cuDNN's plans, best first (modes A, B, then fallback; each once)
        self.settings = [parse_plan_name(n) for n in names]

    def index_of(self, knobs: Mapping[str, KnobValue]) -> int:
        if int(knobs.get("engine", UNSET)) == UNSET:
            return 0
        want = {k: int(v) for k, v in knobs.items() if int(v) != UNSET}
        for i, setting in enumerate(self.settings):
            if setting == want:
                return i
        shown = ",".join(f"{k}={v}" for k, v in want.items())
        raise RuntimeError(f"cuDNN lists no plan {shown} for this problem (it lists {len(self.names)}); "
                           "a plan recorded with another cuDNN version may be gone")

    def build(self, index: int) -> int:
        """Build plan ``index`` (it becomes the graph's plan to run); returns its workspace bytes."""
        self.graph.build_plan_at_index(index)
        return int(self.graph.get_workspace_size_plan_at_index(index))


class CudnnGraph(GpuEngine):
    """Convolutions, matmul and forward attention by cuDNN's own listed execution plans (NVIDIA, fp16/bf16)."""

    name = "cudnn.graph"
    ops = frozenset({*_CONV, "matmul", "sdpa_fwd"})
    priority = 30
    storage_dtypes = frozenset({"fp16", "bf16"})
    knobs = (id_knob("engine", "cuDNN engine id (-1: cuDNN's first heuristic choice)"),
             *(id_knob(name, f"cuDNN knob {name} (-1: not set)") for name in CUDNN_KNOBS))

    def __init__(self) -> None:
        self._graphs: PlanCache[_Graph] = PlanCache()
        self._handles = _Handles()

    # -- discovery -------------------------------------------------------------------------
    def supports(self, problem: Problem, device: Device) -> Support:
        if device.vendor != "nvidia":
            return Support.no("cuDNN runs on NVIDIA GPUs (on AMD, MIOpen's find results would plug in here)")
        cudnn, reason = cudnn_or_reason()
        if cudnn is None:
            return Support.no(reason)
        if problem.compute_dtype != "fp32":
            return Support.no(f"compute {problem.compute_dtype}: this engine accumulates in fp32")
        if problem.op in _CONV:
            for t in problem.tensors:
                if len(t.dims) != 4:
                    return Support.no(f"tensor {t.id} has {len(t.dims)} dims: 2-D convolutions only")
            return Support.yes()
        if problem.op == "matmul":
            if problem.has_tensor("bias"):
                return Support.no("a bias is not fused here (torch.matmul and triton.gemm take it)")
            if _matmul_dims(problem) is None:
                return Support.no("A, B and C must fold into one batch dimension (B shared or of A's batch)")
            return Support.yes()
        d = problem.tensor("Q").dims[3]
        if d % 8 or d > 256 or problem.tensor("V").dims[3] != d:
            return Support.no(f"head dim {d}: cuDNN attention needs Q, K and V of one head dim, a multiple of 8 "
                              "up to 256")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> Sequence[Mapping[str, KnobValue]]:
        g = self._graph(problem, device)
        listed = [s for s in g.settings if s is not None]
        return listed[:plan_limit()]

    # -- plans ----------------------------------------------------------------------------
    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        cudnn, _ = cudnn_or_reason()
        listed = self._graph(problem, device)
        index = listed.index_of(knobs)
        # A graph of its own for the plan: cuDNN runs a graph's built ("candidate") plan through a variant
        # pack prepared once, so a call passes only the pointers (execute_plan_at_index builds one per call;
        # frontend 1.26, the pinned one, has both).
        g = self._make_graph(problem, device)
        if g.names[index] != listed.names[index]:
            raise RuntimeError(f"cuDNN listed {g.names[index]!r} where it listed {listed.names[index]!r} before")
        ws_bytes = g.build(index)
        where = torch.device("cuda", device.index)

        def workspace() -> tuple[Any, int]:
            buf = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=where)
            return buf, buf.data_ptr()

        workspaces = PerStream(workspace, device.index)
        handles, dev_index, raw_stream = self._handles, device.index, current_raw_stream(torch)
        graph = g.graph
        graph._prepare_variant_pack_template()
        by_uid = {uid: tid for tid, uid in g.uids.items()}
        order = tuple(by_uid[uid] for uid in graph._get_variant_pack_uids_sorted())
        execute = graph._execute_with_ptrs  # the pointers in uid order, the workspace, the handle

        def fn(t: Mapping[str, Any]) -> None:
            stream = raw_stream(dev_index)
            execute([t[tid].data_ptr() for tid in order], workspaces.get(stream)[1],
                    handles.get(cudnn, dev_index, stream))

        plan = TorchPlan(fn, device, ws_bytes)
        plan.keep = (g, workspaces)  # the built plan and its workspaces live as long as the plan
        plan.cudnn_plan = g.names[index]
        return plan

    def _graph(self, problem: Problem, device: Device) -> _Graph:
        """The problem's graph with cuDNN's plan list (kept: listing and every build ask for it)."""
        return self._graphs.get((problem.key, device.index), lambda: self._make_graph(problem, device))

    def _make_graph(self, problem: Problem, device: Device) -> _Graph:
        cudnn, reason = cudnn_or_reason()
        if cudnn is None:
            raise RuntimeError(reason)
        torch = torch_module()
        handle = self._handles.get(cudnn, device.index, current_raw_stream(torch)(device.index))
        io = getattr(cudnn.data_type, _DATA_TYPES[problem.dtype])
        graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        tensors = _describe(cudnn, graph, problem)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        names: list[str] = []
        seen: set[str] = set()
        for i in range(graph.get_execution_plan_count()):
            name = graph.get_plan_name_at_index(i)
            names.append(name if name not in seen else f"{name}#dup{i}")  # keeps indices; a repeat is not listed
            seen.add(name)
        log.debug("autotune: cuDNN lists %d plans for %s", len(names), problem.label())
        return _Graph(graph, {tid: t.get_uid() for tid, t in tensors.items()}, names)


def _matmul_dims(problem: Problem) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]] | None:
    """A, B, C as cuDNN's [batch, rows, cols] dims and strides; None when they do not fold so."""
    out: list[list[int]] = []
    a = problem.tensor("A")
    batch = math.prod(a.dims[:-2]) if len(a.dims) > 2 else 1
    for tid in ("A", "B", "C"):
        t = problem.tensor(tid)
        dims, strides = list(t.dims), list(t.strides)
        if len(dims) == 2:
            dims, strides = [1, *dims], [dims[0] * dims[1], *strides]
        elif len(dims) == 4:  # [b0, b1, r, c] -> [b0*b1, r, c] when b0 steps over b1 evenly
            if strides[0] != strides[1] * dims[1]:
                return None
            dims, strides = [dims[0] * dims[1], dims[2], dims[3]], [strides[1], strides[2], strides[3]]
        if dims[0] not in (1, batch):
            return None
        out += [dims, strides]
    return out[0], out[1], out[2], out[3], out[4], out[5]


def _describe(cudnn: Any, graph: Any, problem: Problem) -> dict[str, Any]:
    """Add the problem's op to ``graph``; returns the graph tensor of each of the problem's tensors."""
    dtype = getattr(cudnn.data_type, _DATA_TYPES[problem.dtype])

    def tensor(tid: str, dims: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Any:
        t = problem.tensor(tid)
        return graph.tensor(name=tid, dim=list(dims or t.dims), stride=list(strides or t.strides), data_type=dtype)

    def output(node: Any, tid: str, dims: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Any:
        t = problem.tensor(tid)
        node.set_output(True).set_dim(list(dims or t.dims)).set_stride(list(strides or t.strides)).set_data_type(dtype)
        return node

    tensors: dict[str, Any] = {}
    c = problem.criteria_dict
    if problem.op in _CONV:
        geometry = {"padding": [c["pad_h"], c["pad_w"]], "stride": [c["stride_h"], c["stride_w"]],
                    "dilation": [c["dilation_h"], c["dilation_w"]], "compute_data_type": cudnn.data_type.FLOAT}
        if problem.op == "conv_fprop":
            tensors["X"], tensors["W"] = tensor("X"), tensor("W")
            tensors["Y"] = output(graph.conv_fprop(image=tensors["X"], weight=tensors["W"], **geometry), "Y")
        elif problem.op == "conv_dgrad":
            tensors["dY"], tensors["W"] = tensor("dY"), tensor("W")
            tensors["dX"] = output(graph.conv_dgrad(loss=tensors["dY"], filter=tensors["W"], **geometry), "dX")
        else:
            tensors["X"], tensors["dY"] = tensor("X"), tensor("dY")
            tensors["dW"] = output(graph.conv_wgrad(image=tensors["X"], loss=tensors["dY"], **geometry), "dW")
    elif problem.op == "matmul":
        folded = _matmul_dims(problem)
        assert folded is not None  # supports() said so
        a_dims, a_strides, b_dims, b_strides, c_dims, c_strides = folded
        tensors["A"], tensors["B"] = tensor("A", a_dims, a_strides), tensor("B", b_dims, b_strides)
        product = graph.matmul(A=tensors["A"], B=tensors["B"], compute_data_type=cudnn.data_type.FLOAT)
        tensors["C"] = output(product, "C", c_dims, c_strides)
    else:
        tensors.update({tid: tensor(tid) for tid in ("Q", "K", "V")})
        scale = 1.0 / math.sqrt(problem.tensor("Q").dims[3])
        kwargs = {"attn_scale": scale, "use_causal_mask": bool(c.get("causal"))}
        try:
            o, _stats = graph.sdpa(q=tensors["Q"], k=tensors["K"], v=tensors["V"], generate_stats=False, **kwargs)
        except TypeError:  # frontends before generate_stats took is_inference
            o, _stats = graph.sdpa(q=tensors["Q"], k=tensors["K"], v=tensors["V"], is_inference=True, **kwargs)
        tensors["O"] = output(o, "O")
    return tensors


__all__ = ["CudnnGraph", "CUDNN_KNOBS", "parse_plan_name"]
