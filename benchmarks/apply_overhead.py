"""The host's cost of a routed call of farm.apply, on the CPU: a stack of nn.Linear layers (M = 1, tiny) whose
every layer is routed to one numpy decision, against the same stack unapplied, and a routed call against the
same engine called directly through farm.ops.

    python benchmarks/apply_overhead.py            # a table: us a step and a call
    bash ../shared/tools/bench-vs.sh REV benchmarks/apply_overhead.py

What a routed call adds over the plan it runs is its lookup and its checks (the input's layout, the weight's
memory, autocast, autograd): the figure to compare between commits is ``routed - farm.ops`` a call.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import farm  # noqa: E402
from farm.devices.device import cpu_device  # noqa: E402
from farm.nn.torch_calls import read_call  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402

LAYERS, WIDTH = 16, 64
DECISION = ("cpu.matmul.blas", (("order", "transposed"),))  # not the default, old code and new


def timed(fn, repeats: int = 15, calls: int = 400) -> float:
    """Median us a call of ``fn`` over ``repeats`` samples of ``calls`` calls."""
    for _ in range(calls):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def decided_stack(path: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The stack and its input; ``path``: an override file deciding its layers' problem for DECISION."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)]).eval()
    x = torch.randn(1, WIDTH)
    cpu = cpu_device()
    problem = read_call(torch.nn.functional.linear, (x, model[0].weight, None), {}).problem
    write_overrides(path, [OverrideEntry.for_problem(problem, *DECISION)],
                    device={"signature": cpu.signature, "properties": cpu.properties.to_dict()}, mode="replace")
    return model, x


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "o.json")
        model, x = decided_stack(path)
        with torch.no_grad():
            plain = timed(lambda: model(x))
            farm.apply(model, path)
            model(x)
            applied = timed(lambda: model(x))
            farm.unapply(model)
            import os

            os.environ["FARM_HEUR_CONFIG_PATH"] = path
            import farm.ops as ops

            w = model[0].weight.detach().t()
            ops.matmul(x, w)
            direct = timed(lambda: ops.matmul(x, w))
    print("| what | us |")
    print("| --- | --- |")
    print(f"| the stack unapplied, a step ({LAYERS} linear layers) | {plain:.1f} |")
    print(f"| the stack applied, a step | {applied:.1f} |")
    print(f"| a routed call (applied step / layers) | {applied / LAYERS:.2f} |")
    print(f"| the same plan through farm.ops, a call | {direct:.2f} |")
    print(f"| routed - farm.ops, a call | {applied / LAYERS - direct:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
