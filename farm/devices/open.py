"""The one way to open a device by kind: what the CLI, the farm's workers and farm.ops call.

    open_device("auto")          # the first GPU runtime with a device, else the CPU
    open_device("gpu")           # the first GPU runtime with a device, else RuntimeUnavailable
    open_device("cuda", 1)       # one runtime, one device index
    open_device("cpu")
    open_device("sim", 2, sim=SimConfig.parse(...))   # simulated device slot 2
"""

from __future__ import annotations

import dataclasses

from farm.devices.device import Device, cpu_device, gpu_device
from farm.devices.runtimes.base import RuntimeUnavailable
from farm.devices.sim import SimConfig, sim_device
from farm.errors import InputError

KINDS = ("auto", "gpu", "cuda", "hip", "cpu", "sim")


def open_device(kind: str = "auto", index: int = 0, *, sim: SimConfig | None = None,
                physical_index: int | None = None) -> Device:
    """A device of ``kind`` (see KINDS). ``physical_index`` records the host's index of a GPU a process sees
    as ``index`` (a Ray worker sees only its GPU, as 0)."""
    if kind not in KINDS:
        raise InputError(f"expected one of {', '.join(KINDS)}", field="device kind", value=kind)
    if kind == "sim":
        if sim is None:
            raise InputError("a simulated device needs its simulation config", field="device kind", value=kind)
        group, _ = sim.slots()[index]
        return sim_device(sim, group, index)
    if kind == "cpu":
        return cpu_device(index)
    errors = []
    for name in (kind,) if kind in ("cuda", "hip") else ("cuda", "hip"):
        try:
            dev = gpu_device(name, index)
        except RuntimeUnavailable as exc:
            errors.append(str(exc))
            continue
        if physical_index is not None:
            dev = dataclasses.replace(dev, properties=dataclasses.replace(dev.properties, index=physical_index))
        return dev
    if kind == "auto":
        return cpu_device(index)
    raise RuntimeUnavailable("no GPU: " + "; ".join(errors))
