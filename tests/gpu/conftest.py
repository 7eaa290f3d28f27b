"""GPU tests: collected everywhere, skipped (with the reason) where no CUDA GPU is visible."""

import pytest


def cuda_or_skip():
    from farm.devices.runtimes import RuntimeUnavailable, runtime_for

    rt = runtime_for("cuda")
    try:
        count = rt.device_count()
    except RuntimeUnavailable as exc:
        pytest.skip(f"no CUDA GPU: {exc}", allow_module_level=True)
    return rt, count
