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
from apply_overhead import LAYERS, decided_stack, timed  # noqa: E402


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        path = str(Path(tmp) / "o.json")
        model, x = decided_stack(path)
        for _ in range(2):  # interleaved: plain, applied, plain, applied
            plain = timed(lambda: model(x))
            farm.apply(model, path, call="graph")
            model(x)
            applied = timed(lambda: model(x))
            farm.unapply(model)
            rows.append((plain, applied))
    plain = min(r[0] for r in rows)
    applied = min(r[1] for r in rows)
    table = [(f"the stack unapplied, a step ({LAYERS} linear layers)", f"{plain:.1f}"),
             ("applied, graph decisions only, a step in eager", f"{applied:.1f}"),
             ("applied - unapplied, a module call", f"{(applied - plain) / LAYERS:+.2f}")]
    print("| what | us |\n| --- | --- |\n" + "\n".join(f"| {what} | {us} |" for what, us in table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
