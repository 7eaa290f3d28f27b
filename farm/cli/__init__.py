"""The ``farm`` command line. The only module that prints."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from farm._version import __version__
from farm.errors import FarmError, InputError

log = logging.getLogger("farm.cli")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class _SafeConsole(Console):
    """A console that prints the text of names and messages with their control characters made visible:
    a name from a file (workload, results, override file) cannot move the cursor or retitle the terminal."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", seg.text), seg.style)
            for seg in buffer)


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    # piped output (logs, CI) gets wide tables rather than 80-column wrapping
    return _SafeConsole(stderr=stderr, highlight=False, width=None if probe.is_terminal else 200)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


# -- farm engines ---------------------------------------------------------------------------
def cmd_engines(args: argparse.Namespace) -> int:
    from farm.cli.render import engine_dict, engines_table
    from farm.model.engine import default_engine_registry, engine_priority

    registry = default_engine_registry()
    engines = sorted((e for e in registry if args.op is None or args.op in e.ops),
                     key=lambda e: (sorted(e.ops), engine_priority(e), e.name))
    if args.op is not None and not engines:
        from farm.model.op_catalog import op_spec

        op_spec(args.op)  # unknown op -> clear error; known op with no engine -> empty list
    if args.json:
        _print_json([engine_dict(registry, e) for e in engines])
    else:
        _console().print(engines_table(registry, engines))
    return 0


# -- farm devices ---------------------------------------------------------------------------
def cmd_devices(args: argparse.Namespace) -> int:
    from farm.cli.render import devices_table
    from farm.devices.device import probe

    probes = probe()
    if args.json:
        _print_json({
            "devices": [d.to_dict() for p in probes for d in p.devices],
            "runtimes": [{"runtime": p.runtime, "devices": len(p.devices), "note": p.note} for p in probes],
        })
    else:
        _console().print(devices_table(probes))
    return 0


# -- farm tune ------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    from farm.model.engine import default_engine_registry
    from farm.model.workload import load_workload

    registry = default_engine_registry()
    workload = load_workload(args.workload, registry)  # every input error surfaces here, before any device time
    out = args.out or f"runs/{_folder_name(workload.name)}"
    if args.dry_run:
        return _dry_run(workload, _local_device(args.devices), registry, args.json)
    if args.in_process:
        return _tune_in_process(args, workload, out, registry)
    return _tune_on_ray(args, workload, out)


def _check_fits(workload: Any, props: Any) -> None:
    """A problem whose tensors cannot fit in the device's memory is a workload error, before any device time."""
    from farm.tuner.problem_tuning import memory_shortfall

    for i, wp in enumerate(workload.problems):
        too_big = memory_shortfall(wp.problem, props)
        if too_big:
            raise InputError(f"{wp.name}: {too_big}", field=f"problems[{i}].tensors", source=workload.source)


def _folder_name(name: str) -> str:
    """A workload's name as one folder under runs/: no separators, no '..', no control characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "workload"
    return safe[:100]


def _local_device(spec: str) -> Any:
    from farm.devices.device import open_device
    from farm.fleet.cluster import DeviceRequest

    request = DeviceRequest.parse(spec)
    if request.kind == "sim":
        from farm.devices.sim import sim_device

        group, _ = request.sim.slots()[0]
        return sim_device(request.sim, group, 0)
    if request.kind == "cpu":
        return open_device("cpu")
    return open_device("auto")


def _tune_in_process(args: argparse.Namespace, workload: Any, out: str, registry: Any) -> int:
    from farm.cli.render import local_dict, results_table, summary_table, where_table
    from farm.fleet.job import run_local

    device = _local_device(args.devices)
    _check_fits(workload, device.properties)
    console = _console()
    total = len(workload.problems)
    if not args.json:
        console.print(f"tuning [bold]{escape(workload.name)}[/] ({total} problem(s)) in-process on "
                      f"{escape(device.properties.name)} [dim]{device.signature}[/] into {escape(out)}")
    done = 0

    def show(outcome: Any) -> None:
        nonlocal done
        done += 1
        if not args.json:
            console.print(results_table(outcome, f"[{done}/{total}]"))
            console.print()

    report = run_local(workload, out, device, registry, on_problem=show, reduce=not args.no_reduce, top_k=args.top_k,
                       incumbents=args.incumbents, candidate_timeout_s=args.candidate_timeout,
                       on_hang=lambda message: _restart(args, message))
    if args.json:
        _print_json(local_dict(workload, out, device, report))
    else:
        console.print(summary_table(report.outcomes, report.wall_s,
                                    lambda key: report.summary.winner(device.signature, key)))
        console.print(where_table(out, report.summary))
    return report.summary.exit_code


MAX_RESTARTS = 50


def _restart(args: argparse.Namespace, message: str) -> None:
    """A candidate hung in this process: start the same command again; it resumes after that candidate."""
    restarts = int(os.environ.get("FARM_IN_PROCESS_RESTARTS", "0") or 0) + 1
    err = _console(stderr=True)
    if restarts > MAX_RESTARTS:
        err.print(f"[bold red]error:[/] {escape(message)}; {MAX_RESTARTS} restarts already, giving up "
                  "(run the same command to go on)", soft_wrap=True)
        os._exit(3)
    err.print(f"[yellow]{escape(message)}[/]; restarting to go on ({restarts})", soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ["FARM_IN_PROCESS_RESTARTS"] = str(restarts)
    os.execv(sys.executable, [sys.executable, "-m", "farm", *args.argv])


def _tune_on_ray(args: argparse.Namespace, workload: Any, out: str) -> int:
    from farm.cli.progress import ProgressView
    from farm.cli.render import farm_dict, farm_tables, where_table
    from farm.fleet.cluster import DeviceRequest, FarmOptions, run_farm

    request = DeviceRequest.parse(args.devices)
    if request.kind == "cpu" and not (args.address or os.environ.get("RAY_ADDRESS")):
        _check_fits(workload, _local_device("cpu").properties)  # the workers run on this host
    options = FarmOptions(shard_size=args.shard_size, finalist_k=args.finalist_k,
                          candidate_timeout_s=args.candidate_timeout, cpu_threads=args.cpu_threads,
                          reduce=not args.no_reduce, top_k=args.top_k, keep_results=True, incumbents=args.incumbents)
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    console = _console()
    view = None if args.json else ProgressView(console, workload.name, interval_s=args.progress_every)
    if view is not None:
        console.print(f"tuning [bold]{escape(workload.name)}[/] ({len(workload.problems)} problem(s)) on "
                      f"{'Ray cluster ' + escape(address) if address else 'a local Ray instance'}, "
                      f"devices: {escape(args.devices)}, into {escape(out)}")
    try:
        report = run_farm(workload, out, devices=request, address=address, options=options,
                          progress=view.update if view else None)
    finally:
        if view is not None:
            view.close()
    if args.json:
        _print_json(farm_dict(workload, out, report))
    else:
        for table in farm_tables(workload, report):
            console.print(table)
        console.print(where_table(out, report.summary))
    return report.summary.exit_code


# -- farm reduce ----------------------------------------------------------------------------
def cmd_reduce(args: argparse.Namespace) -> int:
    from farm.cli.render import reduce_dict, reduce_table
    from farm.store.reduce import reduce_results

    report = reduce_results(args.results, args.out, top_k=args.top_k, mode=args.mode, tunableop_csv=args.tunableop_csv,
                            incumbents=args.incumbents)
    if args.json:
        _print_json(reduce_dict(report))
    else:
        console = _console()
        for path, reason in report.skipped_files:
            _console(stderr=True).print(f"[yellow]skipped[/] {escape(path)}: {escape(reason)}")
        console.print(reduce_table(report))
    if not any(s.entries for s in report.signatures):
        _console(stderr=True).print(f"nothing to reduce: no successful measurement in {escape(str(args.results))} "
                                    f"({report.rows} rows read)")
        return 1
    return 0


# -- farm policies --------------------------------------------------------------------------
def cmd_policies(args: argparse.Namespace) -> int:
    from farm.cli.render import policies_table
    from farm.replay.selection import DEFAULT_ORDER, ORDER_ENV, PolicyRegistry, resolve_order

    registry = PolicyRegistry.default()
    order = [p.name for p in resolve_order(registry)]
    if args.json:
        _print_json({"policies": [{"name": i.name, "id": i.id, "api_version": list(i.api_version), "origin": i.origin}
                                  for i in registry.info()],
                     "rejected": [{"where": w, "reason": r} for w, r in registry.rejected],
                     "order": order, "order_from": ORDER_ENV if os.environ.get(ORDER_ENV) else "default",
                     "default_order": list(DEFAULT_ORDER)})
        return 0
    console = _console()
    console.print(policies_table(registry, order))
    for where, reason in registry.rejected:
        console.print(f"[yellow]rejected[/] {escape(where)}: {escape(reason)}")
    return 0


# -- farm publish ---------------------------------------------------------------------------
def cmd_publish(args: argparse.Namespace) -> int:
    from farm.cli.render import publish_dict, publish_tables
    from farm.store.publish import publish

    if not args.to.strip():
        raise InputError("the publishing root must not be empty", field="--to", value=args.to)
    reports = publish(args.overrides, args.to, force=args.force, replace=args.replace, dry_run=args.dry_run)
    if args.json:
        _print_json(publish_dict(reports))
    else:
        console = _console()
        for table in publish_tables(reports, args.dry_run):
            console.print(table)
        for r in reports:
            if r.refused:
                _console(stderr=True).print(f"[bold red]refused[/] {escape(r.signature)}: {escape(r.refused)}")
    return 1 if any(r.refused for r in reports) else 0


# -- farm report ----------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    from farm.analysis.report import build_report, report_dict, write_html
    from farm.cli.render import report_tables

    report = build_report(args.results)
    if args.html:
        write_html(report, args.html)
    if args.json:
        _print_json(report_dict(report))
    else:
        console = _console()
        for table in report_tables(report):
            console.print(table)
        if args.html:
            console.print(f"plots: {escape(args.html)}")
    return 0 if report.signatures else 1


# -- farm diff ------------------------------------------------------------------------------
def cmd_diff(args: argparse.Namespace) -> int:
    from farm.analysis.diff import diff_dict, diff_paths
    from farm.cli.render import diff_table

    rows = diff_paths(args.a, args.b)
    if args.json:
        _print_json(diff_dict(rows))
    else:
        _console().print(diff_table(rows, args.a, args.b, show_same=args.all))
    return 0


def _dry_run(workload: Any, device: Any, registry: Any, as_json: bool) -> int:
    from rich.table import Table
    from rich.text import Text

    from farm.tuner.autotuner import Autotuner
    from farm.tuner.problem_tuning import plan_specs_for

    rows = []
    for wp in workload.problems:
        tuner = Autotuner(wp.problem, device, registry=registry)
        specs = plan_specs_for(wp, tuner)
        rows.append((wp, [s.describe(registry) for s in specs],
                     [f"{c.engine_name}: {c.reason}" for c in registry.explain(wp.problem, device) if not c.applicable]
                     + [f"{label}: {reason}" for label, reason in tuner._collection.dropped]))
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

    p = sub.add_parser("devices", help="list visible devices (GPUs and the CPU), their properties and signatures")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("tune", help="tune every problem of a workload file on every device (Ray)")
    p.add_argument("workload", help="workload YAML file (see docs/workload.md)")
    p.add_argument("--out", help="output folder: results/ (Parquet), overrides/, job.json (default runs/<workload name>); "
                                 "an existing one is resumed")
    p.add_argument("--devices", default="auto",
                   help="auto (GPUs if any, else the CPU), gpu, cpu[:N], sim:N or sim:FILE.yaml (default auto)")
    p.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray instance)")
    p.add_argument("--in-process", action="store_true", help="no Ray: tune on one local device in this process")
    p.add_argument("--shard-size", type=_positive_int, default=128,
                   help="split problems with more candidates across devices, then re-measure finalists (default 128)")
    p.add_argument("--finalist-k", type=_positive_int, default=3, help="finalists per shard (default 3)")
    p.add_argument("--candidate-timeout", type=_positive_seconds, default=120.0,
                   help="seconds without a result before a worker counts as hung and is restarted (default 120)")
    p.add_argument("--cpu-threads", type=_positive_int, default=None,
                   help="BLAS threads of each CPU worker (default: what production uses: this process's count on a "
                        "local Ray instance, the host's usable cores on a cluster); part of the CPU device signature")
    p.add_argument("--progress-every", type=_positive_seconds, default=10.0,
                   help="seconds between progress lines when output is not a terminal (default 10)")
    p.add_argument("--top-k", type=_positive_int, default=3, help="ranking depth kept in the override metadata (default 3)")
    p.add_argument("--no-reduce", action="store_true", help="write results only, no override files")
    p.add_argument("--incumbents", metavar="PATH",
                   help="override file, folder or published root: its winners are kept when a new candidate "
                        "is faster only within noise (default: none)")
    p.add_argument("--json", action="store_true", help="print results as JSON instead of tables")
    p.add_argument("--dry-run", action="store_true", help="validate and list the candidates, measure nothing")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("reduce", help="turn a results dataset into one override file per device signature")
    p.add_argument("results", help="results folder (e.g. runs/x/results)")
    p.add_argument("--out", required=True, help="folder for <device_signature>.json files")
    p.add_argument("--top-k", type=_positive_int, default=3, help="ranking depth kept in the metadata (default 3)")
    p.add_argument("--mode", choices=("append", "replace", "new"), default="append",
                   help="append: replace matching entries, keep the rest (default); replace: start over; "
                        "new: refuse to touch an existing file")
    p.add_argument("--tunableop-csv", action="store_true", help="also write TunableOp-style CSV files")
    p.add_argument("--incumbents", metavar="PATH",
                   help="override file, folder or published root: its winners are kept when a new candidate "
                        "is faster only within noise (default: none)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_reduce)

    p = sub.add_parser("policies", help="list the selection policies loaded (built-in and plugins) and the order in force")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_policies)

    p = sub.add_parser("publish", help="publish override files per architecture under a root (folder, s3://, gs://)")
    p.add_argument("overrides", help="folder of <device_signature>.json override files (e.g. runs/x/overrides)")
    p.add_argument("--to", required=True, help="publishing root: ROOT/<arch>/<signature>.json and ROOT/index.json")
    p.add_argument("--force", action="store_true", help="publish even winners measured slower than the ones they replace")
    p.add_argument("--replace", action="store_true", help="replace each published file instead of merging into it")
    p.add_argument("--dry-run", action="store_true", help="show what would change, write nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("report", help="summarise a results folder: failures, speed-ups, noise, device disagreement")
    p.add_argument("results", help="results folder (e.g. runs/x/results)")
    p.add_argument("--html", help="also write a self-contained HTML page with plots (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("diff", help="compare two results folders or two override files: winners and times")
    p.add_argument("a", help="the old side: a results folder (or run folder) or an override file")
    p.add_argument("b", help="the new side, of the same kind")
    p.add_argument("--all", action="store_true", help="also list problems whose winner did not change (or by < 3 %%)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_diff)
    return parser


def _positive_seconds(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (it may be replaced after setup, e.g. by test capture)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _SafeFormatter(logging.Formatter):
    """Log lines with control characters made visible (names in them come from files)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)
                         for line in super().format(record).split("\n"))


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _StderrHandler()
    handler.setFormatter(_SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("farm")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for a restart (farm tune --in-process)
    _setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except FarmError as exc:
        # one line, however narrow the terminal: scripts grep it, people read it whole
        _console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False,
                                    soft_wrap=True)
        return 2
    except OSError as exc:
        # a path the user gave that cannot be made, read or written (a file where a folder should be, a
        # read-only mount, a full disk): name it in one line; nothing written before is touched
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f) or "a file"
        _console(stderr=True).print(f"[bold red]error:[/] {escape(where)}: {escape(exc.strerror or str(exc))}",
                                    markup=True, highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        _console(stderr=True).print("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
