"""The ``farm`` command line. The only module that prints."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Sequence

from rich.markup import escape

from farm._version import __version__
from farm.errors import FarmError, InputError

log = logging.getLogger("farm.cli")
from farm.cli.apply import add_apply_parser
from farm.cli.args import nonnegative_int, positive_int, add_verbose_everywhere, verbose_level
from farm.cli.capture import add_capture_parser
from farm.cli.console import make_console, print_json, setup_logging, json_stdout
from farm.cli.model import add_model_parser
from farm.cli.tune import add_tune_parser
from farm.cli.verify import add_verify_parser


# -- farm engines ---------------------------------------------------------------------------
def cmd_engines(args: argparse.Namespace) -> int:
    from farm.cli.engines_here import local_devices, runs_here
    from farm.cli.tables.cards import WIDE
    from farm.cli.tables.engines import engine_dict, engines_cards, engines_table
    from farm.model.engine import default_engine_registry, engine_priority

    registry = default_engine_registry()
    engines = sorted((e for e in registry if args.op is None or args.op in e.ops),
                     key=lambda e: (sorted(e.ops), engine_priority(e), e.name))
    if args.op is not None and not engines:
        from farm.model.op_catalog import op_spec

        op_spec(args.op)  # unknown op -> clear error; known op with no engine -> empty list
    here = runs_here(registry, engines, local_devices())
    if args.here:
        engines = [e for e in engines if here[e.name].startswith("yes")]
    # what runs on this machine first, then the rest (each group by op, priority, name)
    engines.sort(key=lambda e: not here[e.name].startswith("yes"))
    if args.json:
        print_json([{**engine_dict(registry, e), "runs_here": here[e.name]} for e in engines])
    elif args.op is not None and not engines:
        make_console().print(f"no engine serves {escape(args.op)} (built-in or installed as a plugin)")
    else:
        console = make_console()
        console.print((engines_table if console.width >= WIDE else engines_cards)(registry, engines, here))
    return 0


# -- farm devices ---------------------------------------------------------------------------
def cmd_devices(args: argparse.Namespace) -> int:
    from farm.cli.tables.cards import WIDE
    from farm.cli.tables.engines import devices_cards, devices_table
    from farm.devices.device import probe

    probes = probe()
    if args.json:
        print_json({
            "devices": [d.to_dict() for p in probes for d in p.devices],
            "runtimes": [{"runtime": p.runtime, "devices": len(p.devices), "note": p.note} for p in probes],
        })
    else:
        console = make_console()
        console.print(devices_table(probes) if console.width >= WIDE else devices_cards(probes))
    return 0


# -- farm reduce ----------------------------------------------------------------------------
def cmd_reduce(args: argparse.Namespace) -> int:
    from farm.cli.tables.runs import reduce_dict, reduce_table
    from farm.store.dataset import results_folder
    from farm.store.reduce import reduce_results

    results = results_folder(args.results)  # a run folder (farm tune --out) works too
    if args.ray:
        report = _reduce_on_ray(args, results)
    else:
        report = reduce_results(results, args.out, top_k=args.top_k, mode=args.mode,
                                tunableop_csv=args.tunableop_csv, incumbents=args.incumbents,
                                unreadable="set_aside" if args.set_aside_unreadable else "refuse")
    if args.json:
        print_json(reduce_dict(report))
    else:
        console = make_console()
        for path, reason in report.skipped_files:
            make_console(stderr=True).print(f"[yellow]skipped[/] {escape(path)}: {escape(reason)}")
        console.print(reduce_table(report))
    if not any(s.entries for s in report.signatures):
        make_console(stderr=True).print(f"nothing to reduce: no successful measurement in {escape(str(args.results))} "
                                    f"({report.rows} rows read)")
        return 1
    return 0


def _reduce_on_ray(args: argparse.Namespace, results: Any) -> Any:
    import ray

    from farm.fleet.on_ray.distributed_reduce import reduce_on_ray

    started = not ray.is_initialized()
    if started:
        # a new local instance unless told which (ray.init() alone joins a cluster `ray start` left on this machine)
        address = args.address or (None if os.environ.get("RAY_ADDRESS") else "local")
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        return reduce_on_ray(results, args.out, top_k=args.top_k, mode=args.mode,
                             tunableop_csv=args.tunableop_csv, incumbents=args.incumbents,
                             unreadable="set_aside" if args.set_aside_unreadable else "refuse")
    finally:
        if started:
            ray.shutdown()


# -- farm policies --------------------------------------------------------------------------
def cmd_policies(args: argparse.Namespace) -> int:
    from farm.cli.tables.engines import policies_table
    from farm.replay.selection import DEFAULT_ORDER, ORDER_ENV, PolicyRegistry, resolve_order

    registry = PolicyRegistry.default()
    order = [p.name for p in resolve_order(registry)]
    configs = _config_status(registry)
    if args.json:
        print_json({"policies": [{"name": i.name, "id": i.id, "api_version": list(i.api_version), "origin": i.origin}
                                  for i in registry.info()],
                     "rejected": [{"where": w, "reason": r} for w, r in registry.rejected],
                     "order": order, "order_from": ORDER_ENV if os.environ.get(ORDER_ENV) else "default",
                     "default_order": list(DEFAULT_ORDER), "config": configs})
        return 0
    console = make_console()
    console.print(policies_table(registry, order))
    for where, reason in registry.rejected:
        console.print(f"[yellow]rejected[/] {escape(where)}: {escape(reason)}")
    for c in configs:
        where = f"{c['env']}={c['path']}" if c["path"] else "no override file"
        state = "[green]loaded[/]" if c["loaded"] else "[yellow]not loaded[/]"
        console.print(f"Config on {escape(c['device'])}: {escape(where)}: {state}: {escape(c['detail'])}", soft_wrap=True)
    return 0


def _config_status(registry: Any) -> list[dict[str, Any]]:
    """What FARM_HEUR_CONFIG_PATH gives each device of this machine (the Config policy's own answer)."""
    from farm.cli.engines_here import local_devices
    from farm.devices.fb import encode_device_properties
    from farm.replay.selection import CONFIG

    policy = registry.find(CONFIG)
    out = []
    for device in local_devices():
        session = policy.session(encode_device_properties(device.properties)) if policy is not None else None
        status = getattr(session, "status", None)
        if status is not None:
            out.append({"device": f"{device.runtime.name}:{device.index} {device.signature}", **status()})
    return out


# -- farm publish ---------------------------------------------------------------------------
def cmd_publish(args: argparse.Namespace) -> int:
    from farm.cli.tables.reports import publish_dict, publish_tables
    from farm.store.publish.root import publish

    if not args.to.strip():
        raise InputError("the publishing root must not be empty", field="--to", value=args.to)
    history = None
    if args.history:  # checked before anything is written at the root
        from farm.store.publish.history import copy_history, plan_history

        history = plan_history(args.overrides, args.to)
    reports = publish(args.overrides, args.to, force=args.force, replace=args.replace, dry_run=args.dry_run,
                      trusted_only=args.trusted_only, dialect=args.dialect)
    copied = None
    if history is not None and not args.dry_run and not any(r.refused for r in reports):
        copied = copy_history(history)
    if args.json:
        print_json({**publish_dict(reports), **({"history": vars(copied)} if copied else {})})
    else:
        console = make_console()
        for table in publish_tables(reports, args.dry_run, console.width):
            console.print(table)
        if copied is not None:
            console.print(f"history: {copied.copied} results file(s) copied into {escape(copied.folder)}"
                          + (f", {copied.present} there already" if copied.present else ""))
        for r in reports:
            if r.refused:
                make_console(stderr=True).print(f"[bold red]refused[/] {escape(r.signature)}: {escape(r.refused)}")
    return 1 if any(r.refused for r in reports) else 0


# -- farm report ----------------------------------------------------------------------------
def _not_an_overrides_folder(path: str) -> None:
    """An overrides folder given where results are read: one error line saying what to give instead."""
    from pathlib import Path

    p = Path(path)
    if "://" in path or not p.is_dir() or (p / "results").is_dir():
        return
    if any(p.glob("*.winners.parquet")) and not any(p.glob("device_signature=*")):
        raise InputError(f"an overrides folder, not results: give the results folder ({p.parent / 'results'}) or the "
                         f"run folder ({p.parent}); farm diff compares override files", source=path)
def cmd_report(args: argparse.Namespace) -> int:
    from farm.analysis.report import build_report, report_dict
    from farm.analysis.report_html import write_html
    from farm.cli.tables.reports import report_tables

    _not_an_overrides_folder(args.results)
    report = build_report(args.results)
    if args.html:
        write_html(report, args.html)
    if args.json:
        print_json(report_dict(report))
    else:
        console = make_console()
        for table in report_tables(report, verbose=verbose_level(args) > 0):
            console.print(table)
        if args.html:
            console.print(f"plots: {escape(args.html)}")
    return 0 if report.signatures else 1


# -- farm diff ------------------------------------------------------------------------------
def cmd_diff(args: argparse.Namespace) -> int:
    from farm.analysis.diff import diff_dict, diff_paths
    from farm.cli.tables.reports import diff_table

    rows = diff_paths(args.a, args.b)
    if args.json:
        print_json(diff_dict(rows))
    else:
        make_console().print(diff_table(rows, args.a, args.b, show_same=args.all, limit=args.limit))
    return 0


# -- entry point ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="farm", description="tunefarm: autotune GPU (and CPU) kernels and publish the winners.")
    parser.add_argument("--version", action="version", version=f"tunefarm {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v: autotune lines, -vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = _listing(sub, "engines", "list engines, the ops they serve and their knobs", cmd_engines)
    p.add_argument("--op", help="only engines implementing this op")
    p.add_argument("--here", action="store_true", help="only engines that run on this machine's devices")
    _listing(sub, "devices", "list visible devices (GPUs and the CPU), their properties and signatures", cmd_devices)

    add_capture_parser(sub)
    add_tune_parser(sub)
    add_apply_parser(sub)
    _add_result_commands(sub)
    add_verbose_everywhere(parser)
    return parser


def _listing(sub: Any, name: str, help: str, func: Any) -> Any:
    """A command that prints a table (``--json``: machine-readable output); -> its parser."""
    p = sub.add_parser(name, help=help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=func)
    return p


def _add_result_commands(sub: Any) -> None:
    """farm reduce, policies, publish, report and diff."""
    p = sub.add_parser("reduce", help="turn a results dataset into one override file per device signature")
    p.add_argument("results", help="results folder (e.g. runs/x/results) or a pyarrow.fs URI (s3://bucket/job/results)")
    p.add_argument("--out", required=True, help="folder for <device_signature>.json files")
    p.add_argument("--ray", action="store_true",
                   help="reduce on a Ray cluster, one task per device signature (--address, else a local instance)")
    p.add_argument("--address", help="Ray cluster address for --ray (default: $RAY_ADDRESS, else a new local instance)")
    p.add_argument("--top-k", type=positive_int, default=3, help="ranking depth kept in the metadata (default 3)")
    p.add_argument("--mode", choices=("append", "replace", "new"), default="append",
                   help="append: replace matching entries, keep the rest (default); replace: start over; "
                        "new: refuse to touch an existing file")
    p.add_argument("--tunableop-csv", action="store_true", help="also write TunableOp-style CSV files")
    p.add_argument("--incumbents", metavar="PATH",
                   help="override file, folder or published root: its winners are kept when a new candidate "
                        "is faster only within noise (default: none)")
    p.add_argument("--set-aside-unreadable", action="store_true",
                   help="an existing file's entries no reader can read (production refuses the whole file while "
                        "they are there) are left out, the file as it was kept beside; default: refuse, write nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_reduce)

    _listing(sub, "policies", "list the selection policies loaded (built-in and plugins) and the order in force",
             cmd_policies)

    _add_publish(sub)

    p = sub.add_parser("report", help="summarise a results folder: failures, speed-ups, noise, device disagreement")
    p.add_argument("results", help="results folder (e.g. runs/x/results)")
    p.add_argument("--html", help="also write a self-contained HTML page with plots (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_report)

    add_model_parser(sub)
    add_verify_parser(sub)

    p = sub.add_parser("diff", help="compare two results folders or two override files (or folders of them): winners "
                                    "and times")
    p.add_argument("a", help="the old side: a results folder (or run folder), an override file, or a folder of "
                             "override files (a run's overrides/, a published root)")
    p.add_argument("b", help="the new side, of the same kind")
    p.add_argument("--all", action="store_true",
                   help="also list problems whose winner and time did not change (or a winner by < 3 %%)")
    p.add_argument("--limit", type=nonnegative_int, default=40,
                   help="rows in the table, the largest changes first (default 40; 0: all; --json has every row)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_diff)



def _add_publish(sub: Any) -> None:
    """farm publish."""
    p = sub.add_parser("publish", help="publish override files per architecture under a root (folder, s3://, gs://)")
    p.add_argument("overrides", help="folder of <device_signature>.json override files (e.g. runs/x/overrides)")
    p.add_argument("--to", required=True, help="publishing root: ROOT/<arch>/<signature>.json and ROOT/index.json")
    p.add_argument("--force", action="store_true", help="publish even winners measured slower than the ones they replace")
    p.add_argument("--replace", action="store_true", help="replace each published file instead of merging into it")
    p.add_argument("--history", action="store_true",
                   help="also copy the run's results (beside the overrides folder) into ROOT/history/, which "
                        "farm tune --history ROOT learns from (docs/costmodel.md)")
    p.add_argument("--dry-run", action="store_true", help="show what would change, write nothing")
    p.add_argument("--trusted-only", action="store_true",
                   help="leave out entries marked untrusted (undecided by their confirmation stage, or short of "
                        "their figure where farm verify replayed them)")
    p.add_argument("--dialect", choices=("farm", "hipdnn"), default="farm",
                   help="spelling of the files written: farm (the RFC's tensor names X, W, A, B...; the default) or "
                        "hipdnn (hipDNN's own: x_tensor_uid..., its mode enums, exactly its match key), which "
                        "hipDNN's reader selects from unchanged; farm.ops reads both (docs/overrides.md)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_publish)

def _did_you_mean(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str:
    """'' unless the command named is not one of farm's; then a line naming the closest ones."""
    import difflib

    commands = next((list(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), [])
    word = next((w for w in argv if not w.startswith("-")), None)
    if word is None or word in commands:
        return ""
    close = difflib.get_close_matches(word, commands, n=2, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"unknown command {word!r}: {hint}(farm --help lists the commands: {', '.join(commands)})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # the command line as given, for a restart (farm tune --in-process) and a resume line: in the namespace before
    # parsing, so that nothing is set on the parsed arguments afterwards
    given = argparse.Namespace(argv=list(sys.argv[1:] if argv is None else argv))
    suggestion = _did_you_mean(parser, given.argv)
    if suggestion:
        make_console(stderr=True).print(f"[bold red]error:[/] {escape(suggestion)}", markup=True, highlight=False,
                                        soft_wrap=True)
        return 2
    args = parser.parse_args(argv, namespace=given)
    setup_logging(verbose_level(args))
    from farm.tuner.interrupts import SIGINTS

    SIGINTS.install()  # a KeyboardInterrupt an engine raises fails its candidate; the user's Ctrl-C stops the run
    try:
        if getattr(args, "json", False):
            with json_stdout():  # JSON alone on stdout, whatever Ray or a library prints
                return int(args.func(args) or 0)
        return int(args.func(args) or 0)
    except FarmError as exc:
        # one line, however narrow the terminal: scripts grep it, people read it whole
        make_console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False,
                                    soft_wrap=True)
        return 2
    except OSError as exc:
        # a path the user gave that cannot be made, read or written (a file where a folder should be, a
        # read-only mount, a full disk): name it in one line; nothing written before is touched
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f) or "a file"
        make_console(stderr=True).print(f"[bold red]error:[/] {escape(where)}: {escape(exc.strerror or str(exc))}",
                                    markup=True, highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err = make_console(stderr=True)
        if getattr(args, "func", None) is not None and args.func.__name__ == "cmd_tune":
            import shlex

            # every row measured so far is on disk: the same command goes on from there
            err.print("interrupted: the results measured so far are kept; to go on, run again:\n  farm "
                      + shlex.join(args.argv), markup=False, highlight=False, soft_wrap=True)
        else:
            err.print("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
