"""farm verify: replay every published decision through farm.ops where it runs, beside the direct call.

    farm verify RUN               # a farm tune --out folder: its rows and override file learn the delivered figures
    farm verify ROOT              # a published root (farm publish): read-only unless --fix
    farm verify FILE.json         # one override file
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from farm.cli.args import positive_int, positive_seconds
from farm.cli.console import make_console, print_json
from farm.errors import InputError
from farm.store.targets import Target, resolve, rewrite_entries


def cmd_verify(args: argparse.Namespace) -> int:
    from farm.cli.tables.verify import verified_table
    from farm.cli.tune import local_device
    from farm.replay.verified import VerifySettings
    from farm.replay.verify import mark_fixes, verify_file
    from farm.store.overrides.parsing import load_overrides

    calls = (args.call,) if args.call else ("eager", "graph")
    settings = VerifySettings(calls=args.calls or 400, rounds=args.rounds, calls_given=args.calls is not None,
                              timeout_s=args.candidate_timeout)
    device = local_device(args.devices)
    target = resolve(args.target, device)
    f = load_overrides(target.path, strict=False)
    if f.device_signature and f.device_signature != device.signature and not target.note:
        raise InputError(f"the file is for device {f.device_signature}, this device is {device.signature}: verify it "
                         "where it is replayed, on a device of its signature", source=target.path)
    if args.fix and target.note:
        raise InputError(f"{target.note}: --fix republishes only a file of this device's own signature",
                         source=target.where)
    keys = _keys(f, args.problem, target.path)
    console = make_console(stderr=True)
    if not args.json:
        make_console().print(f"verifying {escape(target.path)} on {escape(device.properties.name)} "
                         f"[dim]{device.signature}[/] ({', '.join(calls)}; farm.ops beside the direct call)",
                         soft_wrap=True)
        if target.note:
            console.print(f"[yellow]note:[/] {escape(target.note)}", soft_wrap=True)

    def progress(done: int, total: int, v: Any) -> None:
        if not args.json:
            console.print(f"[{done}/{total}] {escape(v.decision.name)} ({v.decision.call}): {escape(v.verdict)}",
                          soft_wrap=True, highlight=False)

    verified, skipped = verify_file(target.path, f, device, keys=keys, calls=calls, settings=settings,
                                    progress=progress)
    if args.fix:
        verified = mark_fixes(verified)
    written, verified = _record(target, f, verified, device, args.fix)
    records = [v.as_dict() for v in verified]
    if args.json:
        print_json({"target": target.where, "file": target.path, "device": device.signature, "note": target.note,
                     "decisions": records, "not_verifiable": [{"problem": n, "why": w} for n, w in skipped],
                     "written": written, "refused_by_production": f.invalid or None})
    else:
        out = make_console()
        out.print(verified_table(records))
        for name, why in skipped:
            out.print(f"[dim]not verifiable:[/] {escape(name)}: {escape(why)}", soft_wrap=True)
        for line in written:
            out.print(escape(line), soft_wrap=True)
        if f.invalid:  # what production does with the file whatever the decisions above deliver
            make_console(stderr=True).print(f"[red]production refuses this file:[/] {escape(f.invalid)}; hipDNN's "
                                            "reader and farm.ops use none of its entries until it is fixed or removed",
                                            soft_wrap=True)
    left = [v for v in verified if v.flagged and v.fixable and not (v.fixed or v.corrected)]
    return 1 if args.strict and (left or f.invalid) else 0


def _keys(f: Any, names: list[str] | None, source: str) -> list[str] | None:
    """The problem keys of the entries named (by problem name or key); None: every entry."""
    if not names:
        return None
    have: dict[str, str] = {}
    for e in f.entries:
        meta = e.metadata or {}
        problem = e.problem()
        key = str(meta.get("problem_key") or (problem.key if problem else ""))
        for n in (meta.get("problem_name"), key):
            if n:
                have[str(n)] = key
    missing = [n for n in names if n not in have]
    if missing:
        raise InputError(f"names no entry of the file (its problems: {', '.join(sorted(have)[:20])})",
                         field="--problem", value=", ".join(missing), source=source)
    return [have[n] for n in names]


def _record(target: Target, f: Any, verified: list[Any], device: Any, fix: bool) -> tuple[list[str], list[Any]]:
    """Keep what was found: a run folder gets the rows (and its override file, reduced again, the figures and
    any fix); a published root or a file gets the fixes (and the figures) only with --fix. Returns what was
    written, and the checks as they stand now (a fix that did not land is no fix)."""
    if target.kind == "run":
        return _record_in_run(target, verified, device)
    if not fix:
        return [], verified
    from farm.replay.verify import fixed_entries

    entries = fixed_entries(f, [v for v in verified if not v.skipped])
    if not entries:
        return [], verified
    fixed = sum(v.fixed for v in verified)
    corrected = sum(v.corrected for v in verified)
    figures = f", {corrected} figure(s) corrected (the decision beats the direct call: kept)" if corrected else ""
    written = rewrite_entries(target, f, entries, device.signature)
    if target.kind == "file":
        return [f"{target.path}: {fixed} decision(s) replaced by the default{figures}, {len(verified)} check(s) "
                "recorded"], verified
    return [f"republished {path}: {fixed} decision(s) replaced by the default{figures}" for path in written], verified


def _record_in_run(target: Target, verified: list[Any], device: Any) -> tuple[list[str], list[Any]]:
    """The rows into the run, reduced again. A fix lands through the run's rows: a decision of a problem the run
    has no rows of (an entry the override file got from elsewhere) is not fixed, and says so."""
    import dataclasses

    from farm.replay.verify import result_rows
    from farm.store.deciding.rule import decide_folder
    from farm.store.run_records import record_in_run

    rows = [(r, d.problem, d.name, where) for r, d, where in result_rows(verified, device)]
    count, report = record_in_run(Path(target.where), target.path, rows, device.signature, name="verify")
    written = [s.write.path for s in report.signatures if s.write is not None]
    lines = [f"{count} verify row(s) in {Path(target.where) / 'results'}; reduced again: {', '.join(written)}"]
    if any(v.fixed for v in verified):
        decided = decide_folder(Path(target.where) / "results").winners
        stray = [v for v in verified if v.fixed and (device.signature, v.decision.problem.key) not in decided]
        if stray:
            note = "not fixed: this run has no rows of the problem (its entry came from elsewhere): fix that file"
            gone = {id(v) for v in stray}
            verified = [dataclasses.replace(v, fixed=False, notes=(*v.notes, note)) if id(v) in gone else v
                        for v in verified]
            lines.append(f"not fixed ({note.split(': ', 1)[1]}): {', '.join(v.decision.name for v in stray)}")
    return lines, verified


def add_verify_parser(sub: Any) -> None:
    p = sub.add_parser("verify", help="replay every published decision through farm.ops beside the direct library "
                                      "call, in its calling mode, and say what it delivers")
    p.add_argument("target", help="a farm tune --out folder, a published root (farm publish), or an override file")
    p.add_argument("--call", choices=("eager", "graph"),
                   help="only decisions for this calling mode (default: both, each as it is made)")
    p.add_argument("--devices", default="auto", help="auto (a GPU if any, else the CPU), gpu, cpu or sim:FILE.yaml")
    p.add_argument("--problem", action="append", metavar="NAME",
                   help="only this problem (its name or key in the file; repeatable)")
    p.add_argument("--calls", type=positive_int, default=None,
                   help="calls a sample: back-to-back (eager) or in a captured graph (graph) (default: as many as the "
                        "decision's confirmation stage timed, which the file records; else 400)")
    p.add_argument("--rounds", type=positive_int, default=9, help="paired rounds, interleaved (default 9)")
    p.add_argument("--candidate-timeout", type=positive_seconds, default=120.0, metavar="SECONDS",
                   help="a decision whose replay beside the direct call has not ended within this hangs where it is "
                        "replayed: flagged (fixed with --fix), and the decisions after it are not replayed (default "
                        "120)")
    p.add_argument("--fix", action="store_true",
                   help="publish the default in place of each flagged decision, saying why in the override file")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 while a flagged decision other than a default is left unfixed (for pipelines)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_verify)
