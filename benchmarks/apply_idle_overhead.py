"""What an applied model costs in eager where no decision runs in eager (every eager decision withdrawn by the
model check, or ``farm.apply(model, call="graph")``), on the CPU: a stack of nn.Linear layers (M = 1, tiny), each
routed in graphs only, against the same stack unapplied.

    python benchmarks/apply_idle_overhead.py
    bash ../shared/tools/bench-vs.sh REV benchmarks/apply_idle_overhead.py

A decode step in eager is bound by the host (a 7-8B decoder: hundreds of module calls a step); where nothing runs
in eager, each routed module's call should cost what the module's own does: the figure is ``applied - plain`` a call.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import farm  # noqa: E402
from apply_overhead import DECISION, LAYERS, WIDTH, timed  # noqa: E402
from farm.devices.device import cpu_device  # noqa: E402
from farm.nn.torch_calls import read_call  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402


def main() -> int:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)]).eval()
    x = torch.randn(1, WIDTH)
    cpu = cpu_device()
    problem = read_call(torch.nn.functional.linear, (x, model[0].weight, None), {}).problem
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        path = str(Path(tmp) / "o.json")
        write_overrides(path, [OverrideEntry.for_problem(problem, *DECISION)],
                        device={"signature": cpu.signature, "properties": cpu.properties.to_dict()}, mode="replace")
        for _ in range(2):  # interleaved: plain, applied, plain, applied
            plain = timed(lambda: model(x))
            farm.apply(model, path, call="graph")
            model(x)
            applied = timed(lambda: model(x))
            farm.unapply(model)
            rows.append((plain, applied))
    plain = min(r[0] for r in rows)
    applied = min(r[1] for r in rows)
    print("| what | us |")
    print("| --- | --- |")
    print(f"| the stack unapplied, a step ({LAYERS} linear layers) | {plain:.1f} |")
    print(f"| applied, graph decisions only, a step in eager | {applied:.1f} |")
    print(f"| applied - unapplied, a module call | {(applied - plain) / LAYERS:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
