"""farm capture: a model's tunable operations into a workload file.

    farm capture examples/models.py:decoder --with batch=1 --with batch=8    # a model factory (farm.nn.targets)
    farm capture examples/models.py:decoder --meta                            # shapes only, no memory, no times
    farm capture infer.py --args '--batch 8'                                  # a whole script, as one step

Each ``--with`` builds the model once and captures one step (its label); the steps merge into one workload.
On a real device each step is then timed (the host's time to issue it, its wall time, what bounds it) and
each problem's direct call, for its share of the step. Steps run under ``torch.no_grad()``.
"""

from __future__ import annotations

import argparse
import runpy
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from farm.cli.console import make_console, print_json
from farm.cli.names import Name
from farm.errors import InputError


def cmd_capture(args: argparse.Namespace) -> int:
    from farm.nn.captured import load_template, merge, problem_names

    template = load_template(args.template) if args.template else None
    device = "meta" if args.meta else args.device
    calls = tuple(c for c in (args.call or "").split(",") if c) or None
    _refuse_to_replace(args)
    if ":" in args.target and not args.target.endswith(".py"):
        parts, name = _capture_factory(args, device, calls)
    else:
        parts, name = _capture_script(args, calls)
    workload = merge(parts, name=args.name or name)
    out = Path(args.out or f"runs/{workload.name}/workload.yaml")
    template, note = _for_the_device(template, workload)
    if not args.force:
        _same_problems(out, workload)
    workload.write(out, template)
    if args.json:
        print_json({"workload": str(out), "name": workload.name, "steps": [s.to_dict() for s in workload.steps],
                     "problems": [{"name": n, "op": p.problem.op, "label": p.problem.label(), "key": p.problem.key,
                                   "calls": list(p.calls), "sites": list(p.sites),
                                   "uses": {u.step: u.to_dict() for u in p.uses}}
                                  for n, p in zip(problem_names(workload.problems), workload.problems)],
                     "skipped": [{"kind": s.kind, "reason": s.reason, "count": s.count, "sites": list(s.sites)}
                                 for s in workload.skipped],
                     "coverage": [c.to_dict() for c in workload.coverage], "notes": [note] if note else []})
        return 0
    console = make_console()
    if note:
        console.print(f"[yellow]note[/] {escape(note)}")
    console.print(_problems_table(workload))
    if over_whole(workload):
        console.print("[yellow]note[/] a problem's calls, timed alone, took longer than the whole step: the machine "
                      "was busy while it timed them, so no share is shown there; capture again on a quiet machine "
                      "(or --no-time to skip the timing)", soft_wrap=True)
    for s in workload.steps:
        if s.wall_ms is not None:
            console.print(f"step {escape(s.label)} on {escape(s.device)}: {s.wall_ms:.3f} ms, the host issues it in "
                          f"{s.host_ms:.3f} ms: bound by the {s.bound}"
                          + (" (eager calls are ranked by their host time)" if s.bound == "host" else ""))
    for s in workload.skipped:
        console.print(f"[yellow]not captured[/] {s.count} {escape(s.kind)} call(s) at {escape(', '.join(s.sites[:3]))}: "
                      f"{escape(s.reason)}")
    if workload.coverage:
        console.print(_coverage_table(workload.coverage))
        for c in workload.coverage:
            console.print(f"step {escape(c.step)}: the farm's problems take {100 * c.covered:.1f} % of its {c.time} "
                          "time: what tuning can reach")
    console.print(f"wrote {escape(str(out))}: {len(workload.problems)} problem(s) from {len(workload.steps)} step(s)")
    # a run folder of its own: beside a workload at runs/<name>/, else runs/<name> (not the workloads' folder)
    run_dir = out.parent if out.parent.parent.name == "runs" else Path("runs") / workload.name
    console.print(f"next: farm tune {escape(str(out))} --out {escape(str(run_dir))}", soft_wrap=True)
    return 0


def _for_the_device(template: Any, workload: Any) -> tuple[Any, str]:
    """The template as this capture can use it: on a CPU, its eager calling mode alone (a CPU has no CUDA graphs:
    a graph decision could neither be tuned nor checked there), and a note saying so."""
    if not template or "call" not in template or not workload.steps or \
            any(not s.device.startswith("cpu") for s in workload.steps):
        return template, ""
    calls = template["call"] if isinstance(template["call"], list) else [template["call"]]
    if "graph" not in calls:
        return template, ""
    return {**template, "call": "eager"}, ("the template's calling modes include graph; this capture ran on a CPU, "
                                           "which has no CUDA graphs: the workload tunes eager calls only")


def _refuse_to_replace(args: argparse.Namespace) -> None:
    """Without --out, the default path (runs/<name>/workload.yaml) is where the last capture of this model went:
    another capture (a --meta one of a device's, say) does not silently replace it, before any work is done; nor,
    with --out, does it replace the workload a run folder was tuned from."""
    if args.force:
        return
    if args.out:
        return  # onto a tuned run's workload: checked once the capture says which problems it has (_same_problems)
    if ":" in args.target and not args.target.endswith(".py"):
        name = args.name or args.target.rpartition(":")[2].replace("_", "-")
    else:
        name = args.name or Path(args.target).stem.replace("_", "-")
    out = Path(f"runs/{name}/workload.yaml")
    if out.exists():
        raise InputError("a workload is there already (a capture of this model?): give --out, or --force to replace "
                         "it", source=str(out))


def _same_problems(out: Path, workload: Any) -> None:
    """A run folder tuned from ``out`` (job.json beside it) keeps its workload's problems: a capture with the same
    problems replaces it (its times are new), one with other problems is refused, unless --force (the run's results
    would be another workload's)."""
    if not out.is_file() or not (out.parent / "job.json").exists():
        return
    from farm.model.workload import load_workload

    try:
        before = {wp.problem.key for wp in load_workload(out).problems}
    except Exception:  # unreadable: what the run was tuned from cannot be told, so it is not replaced unasked
        before = None
    if before != {p.problem.key for p in workload.problems}:
        raise InputError("a tuned run's workload (job.json is beside it) with other problems than this capture's: "
                         "replacing it would make that run's results another workload's; give another --out, or "
                         "--force", source=str(out))


def _capture_factory(args: argparse.Namespace, device: str | None, calls: Any) -> tuple[list[Any], str]:
    from farm.nn.capturing import capture
    from farm.nn.targets import build, load_factory, parse_with
    from farm.nn.torch_calls import torch_module

    factory = load_factory(args.target)
    parts = []
    with torch_module().no_grad():
        for given in [parse_with(w) for w in args.with_] or [{}]:
            built = build(factory, given, device=device)
            with capture(built.model, label=built.label, calls=calls) as c:
                built.step()
            if device != "meta" and not args.no_time and c.workload().problems:
                c.time_step(built.step)
            parts.append(c.workload())
    return parts, factory.__name__.replace("_", "-")


def _capture_script(args: argparse.Namespace, calls: Any) -> tuple[list[Any], str]:
    from farm.nn.capturing import capture

    script = Path(args.target)
    if not script.is_file():
        raise InputError("expected a script (FILE.py) or a factory (FILE.py:NAME, package.module:NAME)",
                         source=args.target)
    argv = sys.argv
    sys.argv = [str(script), *shlex.split(args.script_args)]
    try:
        with capture(label=script.stem, calls=calls, steps=args.steps, name=script.stem) as c:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    return [c.workload()], script.stem.replace("_", "-")


def _problems_table(workload: Any) -> Table:
    from farm.nn.captured import problem_names

    steps = [s.label for s in workload.steps]
    table = Table(title=f"{workload.name}: {len(workload.problems)} problem(s) the farm tunes", title_justify="left")
    table.add_column("problem", overflow="fold")
    for label in steps:  # one column a step: calls, ms a call and share under each other (80 columns fit)
        table.add_column(f"{label}\ncalls\nms a call\nshare", justify="right")
    table.add_column("call sites", overflow="fold")
    for name, p in zip(problem_names(workload.problems), workload.problems):
        cells: list[Any] = [Name(name)]  # names and sites break at their joints, never mid-word
        uses = {u.step: u for u in p.uses}
        for label in steps:
            u = uses.get(label)
            cells.append("\n".join([str(u.calls), f"{u.ms:.4f}" if u.ms is not None else "-", share_text(u.share)])
                         if u else "")
        cells.append(Name(", ".join(p.sites)))
        table.add_row(*cells)
    return table


def share_text(share: float | None) -> str:
    """A problem's share of its step as printed: never above 100 % (its calls timed alone took longer than the
    step: the machine was busy while it timed them, and the figure means nothing)."""
    if share is None:
        return "-"
    return f"{100 * share:.1f} %" if share <= 1.0 else "? (busy)"


def over_whole(workload: Any) -> bool:
    """A problem's calls, timed alone, took longer than their step: the timing ran on a busy machine."""
    return any(u.share is not None and u.share > 1.0 for p in workload.problems for u in p.uses)


def _coverage_table(coverage: Any) -> Table:
    """Each step's time by kind of call: the farm's problems first, then what tuning does not reach."""
    kinds = list(dict.fromkeys(k.kind for c in coverage for k in c.kinds))
    table = Table(title="the step by kind of call", title_justify="left")
    table.add_column("kind", overflow="fold")
    for c in coverage:  # one column a step (80 columns fit several)
        table.add_column(f"{c.step}\n{c.time} ms (share)\ncalls", justify="right")
    for kind in kinds:
        cells: list[Any] = [Name(kind)]
        for c in coverage:
            k = next((k for k in c.kinds if k.kind == kind), None)
            cells.append(f"{k.ms:.3f} ({100 * k.share:.1f} %)\n{k.calls}" if k else "")
        table.add_row(*cells)
    return table


def add_capture_parser(sub: Any) -> None:
    p = sub.add_parser("capture", help="capture a PyTorch model's tunable operations (shapes, calls per step, share) "
                                       "into a workload file")
    p.add_argument("target", help="FILE.py:NAME or package.module:NAME, a function returning (model, args[, kwargs]); "
                                  "or a script FILE.py, run whole as one step (its arguments: --args)")
    p.add_argument("--with", dest="with_", action="append", default=[], metavar="K=V[,K=V]",
                   help="keyword arguments for the factory, one step each (e.g. --with batch=1 --with batch=8)")
    p.add_argument("--out", help="the workload file to write (default: runs/<name>/workload.yaml, not replaced "
                                 "without --force)")
    p.add_argument("--force", action="store_true", help="replace the default workload file where one is there")
    p.add_argument("--device", help="passed to the factory as device= (e.g. cuda, cpu)")
    p.add_argument("--meta", action="store_true", help="build on the meta device: shapes only (no memory, no times)")
    p.add_argument("--call", help="calling modes to tune: eager, graph or eager,graph (default: as each call was made)")
    p.add_argument("--template", help="a workload file whose autotune, engines, call and seed the captured one takes")
    p.add_argument("--name", help="the workload's name (default: the factory's or script's)")
    p.add_argument("--steps", type=int, default=1, help="a script: how many steps it runs (calls per step = calls / steps)")
    p.add_argument("--no-time", action="store_true", help="do not time the steps after capturing them")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--args", dest="script_args", default="", metavar="'ARGS'",
                   help="a script: its command-line arguments, as one quoted string")
    p.set_defaults(func=cmd_capture)
