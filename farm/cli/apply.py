"""farm apply: route a model's calls to the decisions, and check them on the model's own step.

    farm apply examples/models.py:decoder runs/dec --with batch=1 --with batch=8
    farm apply mypkg.models:decoder ROOT --call graph --dry-run

For each step (``--with``) and calling mode (``--call``; eager and graph on a GPU, eager on a CPU), the model is
built (farm.nn.targets), applied (farm.nn.routing: only non-default decisions are routed) and checked
(farm.nn.step_check): the step untouched, with every routed decision and with each alone, in paired rounds; a
decision the step is not faster with is withdrawn where the decisions live (a run folder: its rows, then a
reduce; a published root or a file: its entries), unless ``--dry-run``. In production: ``farm.apply(model, RUN)``.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table

from farm.cli.args import positive_int
from farm.cli.console import make_console, print_json


def cmd_apply(args: argparse.Namespace) -> int:
    from farm.nn.routing import apply, unapply
    from farm.nn.step_check import CheckSettings, check_step
    from farm.nn.step_record import record_check
    from farm.nn.targets import build, load_factory, parse_with
    from farm.nn.torch_calls import torch_module
    from farm.store.targets import resolve

    torch = torch_module()
    factory = load_factory(args.target)
    settings = CheckSettings(rounds=args.rounds)
    console, out = make_console(), []
    with torch.no_grad():
        for given in [parse_with(w) for w in args.with_] or [{}]:
            built = build(factory, given, device=args.device)
            weights = [*built.model.parameters(), *built.model.buffers()]
            gpu = bool(weights) and weights[0].device.type == "cuda"
            modes = [c for c in (args.call or ("eager,graph" if gpu else "eager")).split(",") if c]
            for mode in modes:
                apply(built.model, args.overrides)
                applied = _applied(built.model)
                name = f"{factory.__name__}[{built.label}]"
                check = check_step(built.step, applied, call=mode, model=name, settings=settings,
                                   progress=None if args.json else (lambda s: console.print(escape(s))))
                target = resolve(args.overrides, applied.decisions.device)
                written = [] if args.dry_run else record_check(check, target, applied.decisions.file,
                                                                applied.decisions.device)
                unapply(built.model)
                out.append((check, written))
                if not args.json:
                    _show(console, check, written)
    if args.json:
        print_json([_check_dict(c, w) for c, w in out])
    return 0


def _applied(model: Any) -> Any:
    from farm.nn.routing import applied_to

    applied = applied_to(model)
    assert applied is not None
    return applied


def _show(console: Any, check: Any, written: list[str]) -> None:
    if check.judged:
        table = Table(title=f"{check.model} ({check.call}): each routed decision on the step", title_justify="left")
        table.add_column("problem", overflow="fold")
        table.add_column("decision", overflow="fold")
        table.add_column("step with it", justify="right")
        table.add_column("verdict", overflow="fold")
        for j in check.judged:
            alone = f"{j.alone.speedup:.3f}x" if j.alone is not None else ""
            table.add_row(escape(j.problem.label()), escape(j.label), alone, escape(j.verdict.split(":", 1)[0]))
        console.print(table)
        for j in check.withdrawn:
            console.print(f"withdrawn {escape(j.label)}: {escape(j.verdict.split(': ', 1)[-1])}", soft_wrap=True)
    if check.note:
        console.print(f"{escape(check.model)} ({check.call}): {escape(check.note)}")
    figure = check.result.describe() if check.result is not None else "1.000x (every call the library's)"
    console.print(f"{escape(check.model)} ({check.call}): step {check.untouched_ms:.3f} ms untouched, "
                  f"{check.applied_ms:.3f} ms applied: {figure}", soft_wrap=True)
    for line in written:
        console.print(escape(line), soft_wrap=True)


def _check_dict(check: Any, written: list[str]) -> dict[str, Any]:
    r = check.result
    return {"model": check.model, "call": check.call, "untouched_ms": check.untouched_ms,
            "applied_ms": check.applied_ms, "speedup": check.speedup,
            "interval": [r.speedup_low, r.speedup_high] if r is not None else None, "rounds": check.rounds,
            "steps_per_sample": check.steps_per_sample, "note": check.note, "written": written,
            "decisions": [{"problem": j.problem.label(), "problem_key": j.problem.key, "decision": j.label,
                           "default": j.default, "sites": list(j.sites),
                           "step_speedup": j.alone.speedup if j.alone is not None else None,
                           "interval": [j.alone.speedup_low, j.alone.speedup_high] if j.alone is not None else None,
                           "kept": j.kept, "verdict": j.verdict} for j in check.judged]}


def add_apply_parser(sub: Any) -> None:
    p = sub.add_parser("apply", help="apply the decisions to a model and check each on the model's own step; "
                                     "withdraw the ones that make it slower")
    p.add_argument("target", help="FILE.py:NAME or package.module:NAME, a function returning (model, args[, kwargs])")
    p.add_argument("overrides", help="a farm tune --out folder, a published root, or an override file")
    p.add_argument("--with", dest="with_", action="append", default=[], metavar="K=V[,K=V]",
                   help="keyword arguments for the factory, one step each (e.g. --with batch=1 --with batch=8)")
    p.add_argument("--device", help="passed to the factory as device= (e.g. cuda, cpu)")
    p.add_argument("--call", help="calling modes checked: eager, graph or eager,graph (default: both on a GPU, "
                                  "eager on a CPU)")
    p.add_argument("--rounds", type=positive_int, default=11,
                   help="paired rounds of each check at the most (default 11, at least 8): a variant stops once its "
                        "99 %% interval decides")
    p.add_argument("--dry-run", action="store_true", help="check and print; withdraw nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_apply)
