"""GPU tests: collected everywhere, skipped (with the reason) where no CUDA GPU is visible."""

import pytest


def cuda_or_skip():
    from farm.devices.runtimes.base import RuntimeUnavailable
    from farm.devices.runtimes import runtime_for

    rt = runtime_for("cuda")
    try:
        count = rt.device_count()
    except RuntimeUnavailable as exc:
        pytest.skip(f"no CUDA GPU: {exc}", allow_module_level=True)
    return rt, count


def captured(step):
    """One CUDA graph of ``step()`` (warmed on a side stream first, as torch.cuda.graph asks) and the output its
    capture returned (what a replay writes): (graph, out)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out
