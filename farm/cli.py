"""The ``farm`` command line. The only module that prints."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape

from . import __version__
from .errors import FarmError

log = logging.getLogger("farm.cli")


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    # piped output (logs, CI) gets wide tables rather than 80-column wrapping
    return Console(stderr=stderr, highlight=False, width=None if probe.is_terminal else 200)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


# -- farm engines ---------------------------------------------------------------------------
def cmd_engines(args: argparse.Namespace) -> int:
    from .engine import default_engine_registry
    from .render import engine_dict, engines_table

    registry = default_engine_registry()
    engines = sorted((e for e in registry if args.op is None or args.op in e.ops),
                     key=lambda e: (sorted(e.ops), getattr(e, "priority", 100), e.name))
    if args.op is not None and not engines:
        from .operations import op_spec

        op_spec(args.op)  # unknown op -> clear error; known op with no engine -> empty list
    if args.json:
        _print_json([engine_dict(registry, e) for e in engines])
    else:
        _console().print(engines_table(registry, engines))
    return 0


# -- farm tune ------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    from .device import cpu_device
    from .engine import default_engine_registry
    from .render import outcome_dict, results_table, summary_table, to_jsonable
    from .tuning import tune_workload
    from .workload import load_workload

    registry = default_engine_registry()
    workload = load_workload(args.workload, registry)  # every input error surfaces here, before tuning
    device = cpu_device()
    console = _console()
    if args.dry_run:
        return _dry_run(workload, device, registry, args.json)
    total = len(workload.problems)
    started = time.perf_counter()
    if not args.json:
        console.print(f"tuning [bold]{escape(workload.name)}[/] ({total} problem(s)) on "
                      f"{escape(device.properties.name)} [dim]{device.signature}[/]")
    done = 0

    def show(outcome: Any) -> None:
        nonlocal done
        done += 1
        if args.json:
            return
        console.print(results_table(outcome, f"[{done}/{total}]"))
        console.print()

    outcomes = tune_workload(workload, device, registry, on_problem=show)
    wall = time.perf_counter() - started
    if args.json:
        _print_json({
            "workload": {"name": workload.name, "source": workload.source, "digest": workload.digest},
            "device": device.properties.to_dict(),
            "autotune": to_jsonable(workload.autotune),
            "wall_s": wall,
            "problems": [outcome_dict(o) for o in outcomes],
        })
    else:
        console.print(summary_table(outcomes, wall))
    failed = [o for o in outcomes if o.winner is None and o.error]
    return 1 if failed and len(failed) == len(outcomes) else 0


def _dry_run(workload: Any, device: Any, registry: Any, as_json: bool) -> int:
    from rich.table import Table
    from rich.text import Text

    from .autotune import Autotuner
    from .tuning import plan_specs_for

    rows = []
    for wp in workload.problems:
        tuner = Autotuner(wp.problem, device, registry=registry)
        specs = plan_specs_for(wp, tuner)
        rows.append((wp, [s.describe(registry) for s in specs],
                     [f"{c.engine_name}: {c.reason}" for c in registry.explain(wp.problem, device) if not c.applicable]))
    if as_json:
        _print_json([{"name": wp.name, "problem_key": wp.problem.key, "label": wp.problem.label(),
                      "candidates": specs, "not_applicable": skipped} for wp, specs, skipped in rows])
        return 0
    table = Table(title=f"{workload.name}: candidates per problem (dry run, nothing measured)", show_lines=True)
    for col in ("problem", "candidates", "not applicable here"):
        table.add_column(col)
    for wp, specs, skipped in rows:
        table.add_row(Text(f"{wp.name}\n{wp.problem.label()}"), Text(f"{len(specs)}: " + ", ".join(specs)),
                      Text("\n".join(skipped) or "-"))
    _console().print(table)
    return 0


# -- entry point ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="farm", description="tunefarm: autotune GPU (and CPU) kernels and publish the winners.")
    parser.add_argument("--version", action="version", version=f"tunefarm {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v: autotune lines, -vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("engines", help="list engines, the ops they serve and their knobs")
    p.add_argument("--op", help="only engines implementing this op")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_engines)

    p = sub.add_parser("tune", help="tune every problem of a workload file")
    p.add_argument("workload", help="workload YAML file (see docs/workload.md)")
    p.add_argument("--json", action="store_true", help="print results as JSON instead of tables")
    p.add_argument("--dry-run", action="store_true", help="validate and list the candidates, measure nothing")
    p.set_defaults(func=cmd_tune)
    return parser


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("farm")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except FarmError as exc:
        _console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
        return 2
    except KeyboardInterrupt:
        _console(stderr=True).print("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
