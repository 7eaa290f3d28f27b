"""farm tune: one workload on every device (Ray) or in this process, with its tables, restarts and --dry-run."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from rich.markup import escape

from farm.cli.args import nonnegative_int, nonnegative_seconds, positive_int, positive_seconds, fraction
from farm.cli.console import make_console, print_json, real_stdout, real_stdout_back
from farm.errors import InputError


# -- farm tune ------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    from farm.model.engine import default_engine_registry
    from farm.model.workload import load_workload

    registry = default_engine_registry()
    workload = load_workload(args.workload, registry)  # every input error surfaces here, before any device time
    out = args.out or f"runs/{_folder_name(workload.name)}"
    settings = tune_settings(args, workload, out)
    workload = settings.workload_for(workload)  # both executors read pruning and reconfirming from the workload
    if args.dry_run:
        history = _history_results(args.history) if args.history else \
            (_earlier_runs(workload.name, out) if not args.out else [])
        return _dry_run(workload, local_device(args.devices), registry, args.json, out, history)
    if args.in_process:
        return _tune_in_process(args, settings, workload, out, registry)
    return _tune_on_ray(args, settings, workload, out)


def tune_settings(args: argparse.Namespace, workload: Any, out: str) -> Any:
    """The tune's settings (farm.fleet.options.TuneSettings), built once from the command line: pruning or the
    history (trained here, before any device time), incumbents, checks, sharding, budgets."""
    from farm.fleet.options import KEEP, FarmOptions, TuneSettings

    if args.retune_decided and not args.history:
        raise InputError("--retune-decided needs --history naming a published root", field="--retune-decided")
    incumbents, check_decided = args.incumbents, False
    if args.history and not args.dry_run:
        history = _history(args, workload, out)
        prune, incumbents, check_decided = history.prune or KEEP, history.incumbents, history.check_decided
    else:
        prune = _pruning(args, workload)
    options = FarmOptions(shard_size=args.shard_size, finalist_k=args.finalist_k,
                          candidate_timeout_s=args.candidate_timeout, cpu_threads=args.cpu_threads,
                          reduce=not args.no_reduce, top_k=args.top_k, keep_results=True, incumbents=incumbents,
                          check_decided=check_decided, log_level=logging.getLogger("farm").getEffectiveLevel(),
                          verifier=_verifier(args), device_wait_s=args.device_wait, max_devices=args.max_devices)
    return TuneSettings(options, prune, args.reconfirm)


def _pruning(args: argparse.Namespace, workload: Any) -> Any:
    """--prune MODEL (and its settings) over the workload's autotune.prune, --no-prune (None), or KEEP. Both
    executors read (and refuse) the model file before the job folder or a device is touched; --dry-run reads it
    here."""
    import dataclasses

    from farm.fleet.options import KEEP
    from farm.model.records import PruneSettings

    config = workload.autotune
    if args.no_prune:
        return None
    if not (args.prune or config.prune is not None):
        if any(v is not None for v in (args.prune_top_k, args.prune_explore, args.prune_seed)):
            raise InputError("--prune-top-k, --prune-explore and --prune-seed need --prune MODEL, --history or "
                             "autotune.prune in the workload", field="--prune")
        return KEEP
    base = PruneSettings(model=args.prune) if args.prune else config.prune
    given = {k: v for k, v in (("top_k", args.prune_top_k), ("explore", args.prune_explore),
                               ("seed", args.prune_seed)) if v is not None}
    prune = dataclasses.replace(base, **given)
    if args.dry_run:
        from farm.costmodel.model import CostModel

        CostModel.load(prune.model)
    return prune


def _history_results(sources: Sequence[str]) -> list[str]:
    """The results folders of --history's sources (a published root's history/ folder) for a dry run's estimate."""
    from farm.costmodel.history import read_history

    return list(read_history(sources).datasets)


def _history(args: argparse.Namespace, workload: Any, out: str) -> Any:
    """--history: the cost model trained on those results (kept in the run folder: a job folder on object storage
    keeps it in a local cache instead), the incumbents and the checks (farm.costmodel.history.set_up_history)."""
    import tempfile

    from farm.costmodel.history import set_up_history
    from farm.store.location import is_uri

    if args.prune or args.no_prune:
        raise InputError("--history trains the cost model it prunes with: give --history or --prune/--no-prune, "
                         "not both", field="--history")
    folder = Path(tempfile.gettempdir(), "tunefarm-history", _folder_name(workload.name)) if is_uri(out) else Path(out)
    err = make_console(stderr=True)
    history = set_up_history(args.history, folder, incumbents=args.incumbents, retune_decided=args.retune_decided,
                             top_k=args.prune_top_k, explore=args.prune_explore, seed=args.prune_seed,
                             progress=None if args.json else (lambda line: err.print(f"history: {escape(line)}")))
    if history.learned and not args.json:
        err.print(f"history: {escape(history.learned)}", soft_wrap=True)
    return history


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


def local_device(spec: str) -> Any:
    from farm.devices.open import open_device
    from farm.fleet.options import DeviceRequest

    request = DeviceRequest.parse(spec)
    if request.kind == "sim":
        return open_device("sim", 0, sim=request.sim)
    return open_device("cpu" if request.kind == "cpu" else "auto")


def _tune_in_process(args: argparse.Namespace, settings: Any, workload: Any, out: str, registry: Any) -> int:
    from farm.cli.tables.runs import host_load, local_dict, query_line, results_table, summary_table, where_table
    from farm.cli.tables.farm import pruning_table
    from farm.cli.tables.verify import verified_table
    from farm.fleet.local_run import run_local

    if settings.options.cpu_threads is not None:
        from farm.devices.runtimes.cpu import set_blas_threads

        set_blas_threads(settings.options.cpu_threads)  # before the device opens: the count is part of its signature
    device = local_device(args.devices)
    _check_fits(workload, device.properties)
    console = make_console()
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

    report = run_local(workload, out, device, registry, options=settings.options, on_problem=show,
                       on_hang=lambda message, _out=real_stdout(): _restart(args, message, _out))
    if args.json:
        print_json(local_dict(workload, out, device, report))
    else:
        console.print(summary_table(report.outcomes, report.wall_s,
                                    lambda key: report.summary.winner(device.signature, key), verbose=_verbose(args),
                                    load=host_load(None, 1, args.cpu_threads) if device.signature.startswith("cpu-") else None,
                                    budget_ms=workload.autotune.confirm.budget_ms))
        if report.pruning:
            console.print(pruning_table(report.pruning))
        if report.summary.verified:
            console.print(verified_table(report.summary.verified, title="Verified where replayed"))
        console.print(where_table(out, report.summary))
        if report.summary.reduce is not None:
            console.print(query_line(out, console.width), soft_wrap=True)
    return _finish(args, report.summary)


MAX_RESTARTS = 50


def _restart(args: argparse.Namespace, message: str, stdout: Any = None) -> None:
    """A candidate hung in this process: start the same command again; it resumes after that candidate."""
    restarts = int(os.environ.get("FARM_IN_PROCESS_RESTARTS", "0") or 0) + 1
    err = make_console(stderr=True)
    if restarts > MAX_RESTARTS:
        err.print(f"[bold red]error:[/] {escape(message)}; {MAX_RESTARTS} restarts already, giving up "
                  "(run the same command to go on)", soft_wrap=True)
        os._exit(3)
    err.print(f"[yellow]{escape(message)}[/]; restarting to go on ({restarts})", soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ["FARM_IN_PROCESS_RESTARTS"] = str(restarts)
    real_stdout_back(stdout)
    os.execv(sys.executable, [sys.executable, "-m", "farm", *args.argv])


def _verifier(args: argparse.Namespace) -> Any:
    """farm tune's check after its reduce (farm verify, fixing decisions that lose to the direct call), or None
    with --no-verify or --no-reduce."""
    if args.no_verify or args.no_reduce:
        return None
    import functools

    from farm.replay.verified import VerifySettings
    from farm.replay.verify_process import verify_in_new_process

    # a replay that hangs is bounded as a candidate is: flagged, fixed, and the job ends
    return functools.partial(verify_in_new_process, only_losers=True,
                             settings=VerifySettings(timeout_s=args.candidate_timeout))


def _warn_oversubscribed(workers: int) -> None:
    """More CPU workers than cores: they measure at the same time and slow each other down."""
    from farm.devices.runtimes.cpu import usable_cores

    cores = usable_cores()
    if workers > cores:
        make_console(stderr=True).print(
            f"[yellow]warning:[/] --devices cpu:{workers} starts {workers} measuring workers on {cores} usable "
            f"core(s): they run at once and slow each other down, so their timings are slower and noisier than "
            f"production's; use cpu:{cores} or fewer", soft_wrap=True)


def _finish(args: argparse.Namespace, summary: Any, warning: str = "") -> int:
    """The closing line (stderr, so --json stays clean) and the exit status."""
    code = summary.exit_code(allow_partial=args.allow_partial)
    if summary.waiting:
        import shlex

        left = "; ".join(f"{len(names)} problem(s) on {sig}" for sig, names in summary.waiting.items())
        make_console(stderr=True).print(
            f"[yellow]waiting:[/] no device of a kind the cluster lost came back within --device-wait: {escape(left)} "
            f"wait for one (exit status {code}). When a node with one is up, resume with:\n  "
            f"{escape(shlex.join(['farm', *args.argv]))}", soft_wrap=True)
        return code
    if warning:
        make_console(stderr=True).print(f"[yellow]warning:[/] these winners were {escape(warning)}. The override files say "
                                    "so, and farm publish refuses them unless --force", soft_wrap=True)
    if summary.missing:
        names = [f"{name} ({why})" for problems in summary.no_winner.values() for name, why in problems.items()]
        shown = "; ".join(names[:5]) + (f"; and {len(names) - 5} more" if len(names) > 5 else "")
        verdict = "accepted (--allow-partial)" if code == 0 else f"exit status {code}; --allow-partial accepts that"
        make_console(stderr=True).print(f"[yellow]finished:[/] {summary.winners} of {summary.problems} problem(s) have a "
                                    f"winner, {summary.missing} have none: {escape(shown)} ({verdict})", soft_wrap=True)
    return code


def _tune_on_ray(args: argparse.Namespace, settings: Any, workload: Any, out: str) -> int:
    from farm.cli.progress import ProgressView
    from farm.cli.tables.runs import host_load, query_line, where_table
    from farm.cli.tables.farm import farm_dict, farm_tables
    from farm.fleet.options import DeviceRequest
    from farm.fleet.on_ray.cluster import run_farm

    request = DeviceRequest.parse(args.devices)
    if request.kind == "cpu" and not (args.address or os.environ.get("RAY_ADDRESS")):
        _check_fits(workload, local_device("cpu").properties)  # the workers run on this host
        _warn_oversubscribed(request.count or 1)
    options = settings.options
    if not sys.stderr.isatty():
        # the workers' lines Ray forwards here go to a file or a pipe: no colour codes in their prefix, and no
        # "[repeated Nx across cluster]" summaries (which carry colour codes of their own)
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if options.log_level < logging.WARNING:
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # -v asked for every line: Ray would fold repeats away
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    console = make_console()
    header = (f"tuning [bold]{escape(workload.name)}[/] ({len(workload.problems)} problem(s)) on "
              f"{'Ray cluster ' + escape(address) if address else 'a local Ray instance'}, "
              f"devices: {escape(args.devices)}, into {escape(out)}")
    # the header comes with the first progress update: a resume with nothing to measure starts no Ray and says so
    view = None if args.json else ProgressView(console, workload.name, interval_s=args.progress_every, header=header,
                                               joining=address or "")
    try:
        report = run_farm(workload, out, devices=request, address=address, options=options,
                          progress=view.update if view else None)
    finally:
        if view is not None:
            view.close()
    if args.json:
        print_json(farm_dict(workload, out, report))
    else:
        if report.total == 0 and not report.rows_written and not report.workers_started:
            console.print(f"nothing left to measure in {escape(out)}: every candidate has a result (no Ray instance "
                          "was started); the winners are decided again from what is there")
        # an embedded instance's CPU workers (--devices cpu, or auto without a GPU) ran on this host: its load is theirs
        here = request.kind in ("cpu", "auto") and address is None
        cpu_workers = sum(w.signature.startswith("cpu-") for w in report.workers)
        load = host_load(view.load_peak if view else None, cpu_workers or 1, args.cpu_threads) if here else None
        for table in farm_tables(workload, report, verbose=_verbose(args), load=load):
            console.print(table)
        console.print(where_table(out, report.summary))
        if report.summary.reduce is not None:
            console.print(query_line(out, console.width), soft_wrap=True)
    from farm.fleet.on_ray.cluster import oversubscribed_cpu

    return _finish(args, report.summary, oversubscribed_cpu(request, address))


def _print_candidates(workload: Any, device: Any, registry: Any, rows: list[Any], reasons: dict[str, set[str]],
                      applies: set[str]) -> Any:
    """The dry run's table of candidates per problem, and the engines that apply to none here, once each."""
    from rich.table import Table
    from rich.text import Text

    # an engine that applies to no problem here, for one reason (another kind of device, a library missing)
    # is listed once below the table, not on every problem's row
    here = {e: next(iter(r)) for e, r in reasons.items() if e not in applies and len(r) == 1}
    table = Table(title=f"{workload.name}: candidates per problem (dry run, nothing measured)", show_lines=True)
    for col in ("problem", "candidates", "not applicable to this problem"):
        table.add_column(col)
    for wp, specs, skipped in rows:
        own = [f"{e}: {r}" for e, r in skipped if e not in here]
        names = [s.describe(registry) for s in specs]
        table.add_row(Text(f"{wp.name}\n{wp.problem.label()}"), Text(f"{len(specs)}: " + ", ".join(names)),
                      Text("\n".join(own) or "-"))
    console = make_console()
    console.print(table)
    by_reason: dict[str, list[str]] = {}
    for engine, why in sorted(here.items()):
        by_reason.setdefault(why, []).append(engine)
    for why, engines in by_reason.items():
        console.print(Text(f"not on {device.properties.name} ({device.runtime.name}): {', '.join(engines)}: {why}"),
                      soft_wrap=True)
    return console


def _earlier_runs(name: str, out: str) -> list[str]:
    """Run folders under ``out``'s parent (runs/) whose job.json names the workload ``name``, newest first: the
    history of a dry run given no --out, where the Quick start's ``--out runs/quick`` is not the default folder
    (runs/cpu-quick). The default folder itself is read anyway."""
    import json

    found = []
    for job in Path(out).parent.glob("*/job.json"):
        if job.parent == Path(out):
            continue
        try:
            doc = json.loads(job.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not ours to judge here: farm report names a broken job.json
        if isinstance(doc, dict) and isinstance(doc.get("workload"), dict) and doc["workload"].get("name") == name:
            found.append((job.stat().st_mtime, str(job.parent)))
    return [folder for _, folder in sorted(found, reverse=True)]


def _dry_run(workload: Any, device: Any, registry: Any, as_json: bool, out: str, history: Sequence[str] = ()) -> int:
    """The candidates of every problem on this host's device, their total and an estimate of the device time (from
    the run folder's results and ``history``; none where there is none), measuring nothing."""
    from farm.analysis.estimate import EarlierTimes, already_measured, estimate
    from farm.tuner.autotuner import Autotuner
    from farm.tuner.problem_tuning import plan_specs_for

    rows = []
    reasons: dict[str, set[str]] = {}  # engine -> why it does not apply, over every problem it was asked about
    applies: set[str] = set()
    for wp in workload.problems:
        tuner = Autotuner(wp.problem, device, registry=registry)
        specs = plan_specs_for(wp, tuner)
        configs = registry.explain(wp.problem, device)
        for c in configs:
            if c.applicable:
                applies.add(c.engine_name)
            else:
                reasons.setdefault(c.engine_name, set()).add(c.reason)
        rows.append((wp, specs, [(c.engine_name, c.reason) for c in configs if not c.applicable]
                     + list(tuner._collection.dropped)))
    from farm.store.dataset import ResultsDataset, results_folder

    history = [str(results_folder(h)) for h in history]
    for h in history:  # a folder the user named must be there (the run folder may not be yet)
        ResultsDataset(h)
    sig = device.signature
    plans = _plans(workload, device, registry, [(wp, specs) for wp, specs, _ in rows])
    results = f"{out.rstrip('/')}/results"
    cost = estimate(sig, plans, EarlierTimes([results, *history]), measured=already_measured(results, sig),
                    confirm_budget_ms=workload.autotune.confirm.budget_ms, confirm=workload.autotune.confirm.enabled)
    if as_json:
        print_json({"problems": [{"name": wp.name, "problem_key": wp.problem.key, "label": wp.problem.label(),
                                   "candidates": [s.describe(registry) for s in specs],
                                   "not_applicable": [f"{e}: {r}" for e, r in skipped]}
                                  for wp, specs, skipped in rows],
                     "estimate": [cost.to_json()]})
        return 0
    console = _print_candidates(workload, device, registry, rows, reasons, applies)
    from farm.cli.tables.runs import estimate_table

    console.print(estimate_table([cost]))
    return 0


def _plans(workload: Any, device: Any, registry: Any, found: Sequence[tuple[Any, Sequence[Any]]]) -> list[Any]:
    """Each problem's candidates as the estimate counts them: those the workload's cost model keeps, if it has one."""
    from farm.analysis.estimate import ProblemPlan

    pruner = None
    if workload.autotune.prune is not None:
        from farm.costmodel.pruning import Pruner

        pruner = Pruner(workload.autotune.prune)
    plans = []
    for wp, specs in found:
        named = [(registry.get(s.engine_id).name if s.engine_id in registry else str(s.engine_id), s) for s in specs]
        keep = range(len(named))
        if pruner is not None and named:
            keep = pruner.decide(device.signature, wp.name, wp.problem, device.properties.to_dict(),
                                 [(e, s.knobs) for e, s in named]).measure
        kept = [named[i] for i in keep]
        plans.append(ProblemPlan(wp.name, wp.problem.key, wp.problem.op, tuple((e, s.key) for e, s in kept),
                                 calls=len(wp.calls), pruned=len(named) - len(kept)))
    return plans


def add_tune_parser(sub: Any) -> None:
    """The farm tune subcommand and its options."""
    p = sub.add_parser("tune", help="tune every problem of a workload file on every device (Ray)")
    p.add_argument("-v", "--verbose", action="count", default=0, dest="command_verbose",
                   help="log more, as farm -v tune does (-v: the tuner's autotune: lines, -vv: debug)")
    p.add_argument("workload", help="workload YAML file (see docs/workload.md)")
    p.add_argument("--out", help="output folder: results/ (Parquet), overrides/, job.json (default runs/<workload name>); "
                                 "an existing one is resumed")
    p.add_argument("--devices", default="auto",
                   help="auto (GPUs if any, else the CPU), gpu, cpu[:N], sim:N or sim:FILE.yaml (default auto)")
    p.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray instance)")
    p.add_argument("--in-process", action="store_true", help="no Ray: tune on one local device in this process")
    p.add_argument("--shard-size", type=positive_int, default=128,
                   help="split problems with more candidates across devices, then re-measure finalists (default 128)")
    p.add_argument("--finalist-k", type=positive_int, default=3, help="finalists per shard (default 3)")
    p.add_argument("--candidate-timeout", type=positive_seconds, default=120.0,
                   help="seconds without a result before a worker counts as hung and is restarted (default 120)")
    p.add_argument("--device-wait", type=nonnegative_seconds, default=300.0, metavar="SECONDS",
                   help="when the cluster loses the last node of a device kind with work left, wait this long for one "
                        "to join; then finish the rest, mark that kind's problems as waiting and exit 4 (a resume "
                        "measures them) (default 300)")
    p.add_argument("--max-devices", type=positive_int, default=None, metavar="N",
                   help="start at most N device workers, now and as nodes join (a shared cluster; default: every "
                        "device the cluster has)")
    p.add_argument("--cpu-threads", type=positive_int, default=None,
                   help="BLAS threads of each CPU worker (default: what production uses: this process's count on a "
                        "local Ray instance, the host's usable cores on a cluster); part of the CPU device signature")
    p.add_argument("--progress-every", type=positive_seconds, default=10.0,
                   help="seconds between progress lines when output is not a terminal (default 10)")
    p.add_argument("--top-k", type=positive_int, default=3, help="ranking depth kept in the override metadata (default 3)")
    p.add_argument("--no-reduce", action="store_true", help="write results only, no override files")
    p.add_argument("--reconfirm", action="store_true",
                   help="a resume also runs again each confirmation stage whose budget ended (undecided, or a tie "
                        "within noise; the advice printed under an undecided problem); without it a resume measures "
                        "only what is missing")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the check after the reduce: each decision replayed through farm.ops beside the direct "
                        "library call where it runs (farm verify); a decision that loses to the direct call is "
                        "then not published")
    _add_pruning_options(p)
    p.add_argument("--incumbents", metavar="PATH",
                   help="override file, folder or published root: its winners are kept when a new candidate "
                        "is faster only within noise (default: none)")
    p.add_argument("--allow-partial", action="store_true",
                   help="exit 0 when the run finished but some problems have no winner (default: exit 3)")
    p.add_argument("--json", action="store_true", help="print results as JSON instead of tables")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and list the candidates, their total and an estimate of the device time (from the "
                        "run folder's results and --history), measure nothing")
    p.set_defaults(func=cmd_tune)


def _add_pruning_options(p: Any) -> None:
    """What a tune measures of each problem: a cost model's ranking (--prune, --history) and published decisions."""
    p.add_argument("--prune", metavar="MODEL",
                   help="measure only what this cost model (farm model train) ranks worth it: the default, the "
                        "incumbent, the top-k by predicted time and a random share of the rest (docs/costmodel.md)")
    p.add_argument("--prune-top-k", type=positive_int, default=None,
                   help="with --prune or --history: the top-k (default 7)")
    p.add_argument("--prune-explore", type=fraction, default=None,
                   help="with --prune or --history: the share of the rest measured at random (default 0.05)")
    p.add_argument("--prune-seed", type=nonnegative_int, default=None,
                   help="with --prune or --history: the random draw's seed, recorded in job.json (default 0)")
    p.add_argument("--no-prune", action="store_true", help="measure every candidate, even if the workload prunes")
    p.add_argument("--history", action="append", metavar="SOURCE",
                   help="earlier results (a run or results folder, or a published root with its history/): a cost "
                        "model trained on them ranks each problem's candidates and the tune measures the default, the "
                        "incumbent and the top-k (--prune-top-k); a problem the published root already decides for "
                        "the device is only checked; with --dry-run, estimate from them (repeatable; "
                        "docs/costmodel.md)")
    p.add_argument("--retune-decided", action="store_true",
                   help="with --history ROOT: tune a problem the published root decides like any other")


def _verbose(args: Any) -> bool:
    """-v given (before or after the command): tables with every column."""
    from farm.cli.args import verbose_level

    return verbose_level(args) > 0
