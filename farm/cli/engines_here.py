"""Where each engine can run on this machine: `farm engines`' "runs here" column.

An engine answers for a problem and a device (``applicable``); this asks it about a small problem of each
op it serves, in a dtype it stores, on each device this machine has (the CPU, its GPUs).
"""

from __future__ import annotations

from typing import Any, Iterable

from farm.errors import FarmError
from farm.model.engine import Engine, EngineRegistry
from farm.model.problem import Problem

_NCHW = [1, 8, 16, 16]
_PAD = {"pad_h": 1, "pad_w": 1}
# a small problem per op (outputs the shapes do not determine are given)
_EXAMPLES: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "matmul": ({"A": [64, 64], "B": [64, 64]}, {}),
    "conv_fprop": ({"X": _NCHW, "W": [8, 8, 3, 3]}, _PAD),
    "conv_dgrad": ({"dY": _NCHW, "W": [8, 8, 3, 3], "dX": _NCHW}, _PAD),
    "conv_wgrad": ({"X": _NCHW, "dY": _NCHW, "dW": [8, 8, 3, 3]}, _PAD),
    "sdpa_fwd": ({"Q": [1, 2, 64, 32], "K": [1, 2, 64, 32], "V": [1, 2, 64, 32]}, {}),
    "sdpa_bwd": ({t: [1, 2, 64, 32] for t in ("Q", "K", "V", "O", "dO")}, {}),
    "batchnorm_inference": ({"X": [2, 8, 4, 4], "scale": [8], "bias": [8], "mean": [8], "var": [8]}, {}),
    "layernorm": ({"X": [4, 64], "scale": [64], "bias": [64]}, {}),
    "rmsnorm": ({"X": [4, 64], "scale": [64]}, {}),
    "reduction": ({"X": [4, 64], "Y": [4, 1]}, {"mode": 0}),
    "resample": ({"X": _NCHW, "Y": [1, 8, 8, 8]}, {"mode": 0}),
    "pointwise": ({"A": [64, 64], "B": [64, 64]}, {"mode": 0}),
}


def _example(op: str, engine: Engine) -> Problem | None:
    shapes, criteria = _EXAMPLES.get(op, (None, {}))
    if shapes is None:
        return None
    stored = sorted(getattr(engine, "storage_dtypes", ()) or ())
    dtype = "fp16" if "fp16" in stored else "fp32" if "fp32" in stored or not stored else stored[0]
    try:
        return Problem.create(op, shapes, criteria=criteria, dtype=dtype)
    except FarmError:
        return None


def local_devices() -> list[Any]:
    """The CPU and every GPU this process can open (a GPU that fails to open is left out)."""
    from farm.devices.device import probe
    from farm.devices.open import open_device

    devices = [open_device("cpu", 0)]
    for p in probe():
        if p.runtime == "cpu":
            continue
        for props in p.devices:
            try:
                devices.append(open_device(p.runtime, props.index))
            except Exception:  # listed but not usable here: the probe's note says why
                continue
    return devices


def runs_here(registry: EngineRegistry, engines: Iterable[Engine], devices: list[Any]) -> dict[str, str]:
    """engine name -> "yes: cpu" / "yes: cuda:0, cuda:1" / "no: <the engine's reason>"."""
    out = {}
    for engine in engines:
        yes, why = [], []
        for device in devices:
            for op in sorted(engine.ops):
                problem = _example(op, engine)
                if problem is None:
                    continue
                support = registry.config_for(engine, problem, device)
                if support.applicable:
                    yes.append(f"{device.runtime.name}:{device.index}")
                    break
                why.append(support.reason)
        out[engine.name] = f"yes: {', '.join(yes)}" if yes else f"no: {why[0] if why else 'no example problem'}"
    return out
