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
# small problems per op (outputs the shapes do not determine are given); GEMMs of odd sizes and a skinny
# one too, for the engines made for those
_EXAMPLES: dict[str, list[tuple[dict[str, Any], dict[str, int]]]] = {
    "matmul": [({"A": [64, 64], "B": [64, 64]}, {}), ({"A": [4095, 4097], "B": [4097, 4093]}, {}),
               ({"A": [16, 4096], "B": [4096, 4096]}, {})],  # and a skinny one (decode)
}
_ONE: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
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
for _op, _example_one in _ONE.items():
    _EXAMPLES[_op] = [_example_one]


def _examples(op: str, engine: Engine) -> list[Problem]:
    stored = sorted(getattr(engine, "storage_dtypes", ()) or ())
    dtype = "fp16" if "fp16" in stored else "fp32" if "fp32" in stored or not stored else stored[0]
    out = []
    for shapes, criteria in _EXAMPLES.get(op, []):
        try:
            out.append(Problem.create(op, shapes, criteria=criteria, dtype=dtype))
        except FarmError:
            continue
    return out


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
            problems = [p for op in sorted(engine.ops) for p in _examples(op, engine)]
            answers = [registry.config_for(engine, p, device) for p in problems]
            if any(a.applicable for a in answers):
                yes.append(f"{device.runtime.name}:{device.index}")
            elif answers:
                why.append(answers[-1].reason)
        # the reason of the last device asked: the GPUs come after the CPU, and their reason is the telling one
        out[engine.name] = f"yes: {', '.join(yes)}" if yes else f"no: {why[-1] if why else 'no example problem'}"
    return out
