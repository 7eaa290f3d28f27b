"""The steps of a model a workload was captured from (farm capture), and how each problem is used in them.

A captured workload lists its steps (one per batch size or input: a label, and where the step was timed on a
device, the host's time to issue it, its wall time and what bounds it) and, per problem, each step's calls,
time a call and share. What bounds a step decides how the problem's eager calls are ranked: a step the host
bounds pays each call's host time (the device waits for the host), a step the device bounds its device time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from farm.errors import InputError

HOST_BOUND_SHARE = 0.8  # a step whose host issues its work for >= this share of its wall time waits on the host
BOUNDS = ("host", "device", "")


@dataclass(frozen=True)
class StepInfo:
    """One captured step: its label, and where it ran on a device, its times (ms) and what bounds it."""

    label: str
    device: str = ""  # "cuda:0", "cpu", "meta"
    host_ms: float | None = None  # the host's time to issue one step, not waiting for the device
    wall_ms: float | None = None  # one step to its end (synchronised)
    bound: str = ""  # "host", "device", or "" (not timed)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "device": self.device}
        if self.wall_ms is not None:
            out.update(host_ms=round(self.host_ms or 0.0, 4), wall_ms=round(self.wall_ms, 4), bound=self.bound)
        return out


@dataclass(frozen=True)
class Use:
    """How one step uses a problem: calls per step, and where timed, the time a call and share of the step."""

    step: str
    calls: int
    ms: float | None = None
    share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"calls": self.calls}
        if self.ms is not None:
            out["ms"] = round(self.ms, 6)
        if self.share is not None:
            out["share"] = round(self.share, 4)
        return out


def bound_of(host_ms: float, wall_ms: float) -> str:
    """What bounds a step: the host when issuing it takes most of its wall time (the device waits), else the
    device (the host is ahead: its calls' host cost hides behind the device's work)."""
    return "host" if wall_ms <= 0 or host_ms >= HOST_BOUND_SHARE * wall_ms else "device"


def host_bound(uses: Sequence[Use], steps: Mapping[str, StepInfo]) -> bool:
    """A problem's eager calls are ranked by host time when any step using it is host-bound (a host cost it adds
    slows that step down, whatever it saves on the device)."""
    return any(steps[u.step].bound == "host" for u in uses if u.step in steps)


# -- parsing (a workload's ``steps``, a problem's ``steps`` and ``sites``) -----------------------------
def parse_steps(raw: Any, prefix: str = "steps") -> tuple[StepInfo, ...]:
    if not isinstance(raw, list):
        raise InputError("expected a list of steps ({label, device, host_ms, wall_ms, bound})", field=prefix, value=raw)
    out: list[StepInfo] = []
    for i, item in enumerate(raw):
        where = f"{prefix}[{i}]"
        if not isinstance(item, Mapping):
            raise InputError("expected a mapping with a label", field=where, value=item)
        unknown = set(item) - {"label", "device", "host_ms", "wall_ms", "bound"}
        if unknown:
            raise InputError("unknown field (allowed: bound, device, host_ms, label, wall_ms)",
                             field=f"{where}.{sorted(unknown)[0]}", value=item[sorted(unknown)[0]])
        label = item.get("label")
        if not isinstance(label, str) or not label:
            raise InputError("expected a non-empty string", field=f"{where}.label", value=label)
        if label in {s.label for s in out}:
            raise InputError("step labels must be unique", field=f"{where}.label", value=label)
        bound = item.get("bound", "")
        if bound not in BOUNDS:
            raise InputError("expected host or device", field=f"{where}.bound", value=bound)
        device = item.get("device", "")
        if not isinstance(device, str):
            raise InputError("expected a string", field=f"{where}.device", value=device)
        out.append(StepInfo(label, device, _ms(item.get("host_ms"), f"{where}.host_ms"),
                            _ms(item.get("wall_ms"), f"{where}.wall_ms"), bound))
    return tuple(out)


def parse_uses(raw: Any, labels: Sequence[str], prefix: str) -> tuple[Use, ...]:
    if not isinstance(raw, Mapping):
        raise InputError("expected a mapping of step label to {calls, ms, share}", field=prefix, value=raw)
    out = []
    for label, use in raw.items():
        where = f"{prefix}.{label}"
        if label not in labels:
            raise InputError(f"no such step (the workload's steps: {', '.join(labels) or 'none'})", field=where,
                             value=label)
        if not isinstance(use, Mapping) or "calls" not in use:
            raise InputError("expected {calls: N} (and ms, share)", field=where, value=use)
        unknown = set(use) - {"calls", "ms", "share"}
        if unknown:
            raise InputError("unknown field (allowed: calls, ms, share)", field=f"{where}.{sorted(unknown)[0]}",
                             value=use[sorted(unknown)[0]])
        calls = use["calls"]
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise InputError("expected an integer >= 1", field=f"{where}.calls", value=calls)
        share = _ms(use.get("share"), f"{where}.share")
        out.append(Use(str(label), calls, _ms(use.get("ms"), f"{where}.ms"), share))
    return tuple(out)


def parse_sites(raw: Any, prefix: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise InputError("expected a list of module paths", field=prefix, value=raw)
    return tuple(raw)


def _ms(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError("expected a finite number >= 0", field=where, value=value)
    return float(value)
