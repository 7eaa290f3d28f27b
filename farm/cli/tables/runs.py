"""Tables for people (rich) and plain dicts for ``--json``; used by the CLI only."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from farm.cli.names import Name

from farm.model.records import AutotuneResult
from farm.tuner.problem_tuning import ProblemOutcome


def fmt_ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value >= 100:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.3f}"
    return f"{value:.4f}"


def fmt_speedup(speedup: float | None, interval: tuple[float, float] | None = None) -> str:
    """'1.23x' or, with its interval, '1.23x (1.18-1.29)'."""
    if not speedup:
        return "-"
    if interval is None:
        return f"{speedup:.2f}x"
    hi = "inf" if math.isinf(interval[1]) else f"{interval[1]:.2f}"
    return f"{speedup:.2f}x ({interval[0]:.2f}-{hi})"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _status(r: AutotuneResult) -> Text:
    """ok, or the disposition and the start of its error (the whole error: the results rows, --json)."""
    if r.succeeded:
        return Text("ok" + (" (re-measured)" if r.error else ""), style="green")
    msg = r.error if len(r.error) <= 120 else r.error[:117] + "..."
    return Text(f"{r.disposition.value}: {msg}" if msg else r.disposition.value, style="red")


def results_table(outcome: ProblemOutcome, position: str = "") -> Table:
    wp = outcome.problem
    head = f"{position} {wp.name}".strip()
    title = f"{head}: {wp.problem.label()}  (key {wp.problem.key}; the main round's times)"
    table = Table(title=Text(title), title_justify="left")
    # one line a candidate but for the last two columns: its status and its label fold there, never cut
    for col, justify in (("rank", "right"), ("median ms", "right"), ("min ms", "right"), ("mad ms", "right"),
                         ("iters", "right"), ("status", "left"), ("candidate", "left")):
        table.add_column(col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=col not in ("status", "candidate"))
    for r in outcome.results:
        table.add_row(
            str(r.rank) if r.rank >= 0 else "-",
            fmt_ms(r.median_ms),
            fmt_ms(r.min_ms),
            fmt_ms(r.mad_ms),
            str(r.iterations) + ("" if r.converged or not r.succeeded else "*"),
            _status(r),
            Text(r.label),
            style="bold" if r.rank == 0 else None,
        )
    notes = [f"{outcome.skipped} candidate(s) measured before, not repeated"] if outcome.skipped else []
    if outcome.pruned:
        notes.append(f"{outcome.pruned} candidate(s) not measured: pruned rows (the cost model ranked them out, or the "
                     "published root decides the problem: its winner checked against the default)")
    if notes:
        table.caption = Text("; ".join(notes))
    if outcome.error:
        table.caption = Text(outcome.error, style="red")
    return table


# the decision in a few words (the whole reason: -v, JSON, farm report)
_SHORT = {"confirmed": "confirmed", "default_not_beaten": "default kept", "incumbent_not_beaten": "incumbent kept",
          "not_delivered": "replay lost", "withdrawn_in_model": "model withdrew it", "default_failed": "default failed",
          "fastest": "fastest",
          "stable_over_noisy": "stable over noisy", "default_within_noise": "default (within noise)",
          "incumbent_within_noise": "incumbent (within noise)"}


def short_decision(w: Any) -> str:
    """How a decision was made, in a few words (``default kept, undecided``)."""
    rule = getattr(w.rule, "value", str(w.rule))
    text = _SHORT.get(rule, rule.replace("_", " "))
    if w.confirmed is not None and rule == "default_not_beaten" and not w.confirmed.settled:
        # the stage's budget ran out: a tie within the measured noise, or undecided (the caption says what next)
        text = "tied in noise" if w.confirmed.tie else "undecided"  # the default kept
    return text


def round_cells(values: Sequence[float | None], rounds: Sequence[str | None], head: str = "ms"
                ) -> tuple[str, list[str]]:
    """A figure column named by the round its figures come from (``stage ms``); where rows mix rounds, each cell
    names its own (``0.4257 main``). A round of None: no figure ("-")."""
    from farm.store.deciding.records import ROUND_NAMES

    names = [ROUND_NAMES.get(r, r) if r is not None else None for r in rounds]
    distinct = {n for n in names if n is not None}
    if len(distinct) == 1:
        return f"{distinct.pop()} {head}", [fmt_ms(v) if n is not None else "-" for v, n in zip(values, names)]
    return head, [f"{fmt_ms(v)} {n}" if n is not None else "-" for v, n in zip(values, names)]


def next_step(load: "HostLoad | None", budget_ms: float | None = None, cpu: bool | None = None) -> str:
    """What to try after an undecided stage: a quiet machine; one BLAS thread a call where the devices are CPUs,
    unless the run had one already; a confirmation budget four times this one (8000 ms at least). The same command
    with --reconfirm confirms them again. ``cpu``: the undecided problems' devices are CPUs (True), GPUs (False),
    or not known (None: a cluster's nodes)."""
    if cpu is False:  # GPUs: BLAS threads are not theirs
        threads = ""
    elif load is None:  # a run elsewhere (a cluster's nodes): what ran is not known here
        threads = "--cpu-threads 1 on a CPU, "
    else:  # a CPU run on this host
        threads = "" if load.blas_threads == 1 else "--cpu-threads 1, "
    budget = max(8000, round(4 * budget_ms)) if budget_ms else 8000
    return (f"Next: a quiet machine, {threads}or autotune: {{confirm: {{budget_ms: {budget}}}}}; the same command "
            "with --reconfirm confirms only these again.")


@dataclasses.dataclass(frozen=True)
class HostLoad:
    """What a CPU run on this host saw: the peak 1-minute load average, the usable cores, and what the farm's own
    workers asked of them (workers x BLAS threads). The measured cause of a noisy result, where there is one."""

    peak: float
    cores: int
    workers: int
    blas_threads: int

    def cause(self) -> str:
        """``Measured: ...`` naming what made the times swing ('' when nothing points at the host)."""
        own = self.workers * self.blas_threads
        parts = []
        if self.peak > own + 1.0:  # Ray's own processes and the driver: about one core more at most
            parts.append(f"the load reached {self.peak:.1f} on {self.cores} core(s), the farm's own work "
                         f"{own} ({self.workers} worker(s) x {self.blas_threads} BLAS thread(s)): other work ran")
        if self.blas_threads > 1:
            parts.append(f"{self.blas_threads} BLAS threads a call, which swing most under load")
        return ("Measured: " + "; ".join(parts) + ".") if parts else ""


def host_load(peak: float | None, workers: int, blas_threads: int | None) -> HostLoad | None:
    """This host's load for a CPU run on it (``peak``: the highest 1-minute load average seen; None: read it now)."""
    import os

    from farm.devices.runtimes.cpu import blas_threads_in_force, usable_cores

    try:
        now = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this platform
        return None
    return HostLoad(max(peak or 0.0, now), usable_cores(), max(workers, 1), blas_threads or blas_threads_in_force())


def summary_table(outcomes: Sequence[ProblemOutcome], wall_s: float, winner_of: Any = None,
                  verbose: bool = False, load: HostLoad | None = None, budget_ms: float | None = None) -> Table:
    """One row per problem: the reducer's winner (what the override file replays, its label in full), its median,
    its speed-up over the default and how it was decided in a few words; ``verbose`` adds the speed-up's 99 %
    interval, the candidates and the whole reason.

    ``winner_of(problem_key)`` returns the :class:`~farm.store.deciding.Winner` of a problem, or None; ``load``
    (a CPU run on this host) names the measured cause of a noisy result; ``budget_ms``: the workload's confirmation
    budget, which the next step offers to raise.
    """
    table = Table(title=f"Summary: {len(outcomes)} problem(s) in {wall_s:.1f} s", title_justify="left")
    # the winner last: it takes the width the others leave and folds there, never cut
    # -v writes the candidates and the whole reason under the winner (columns of their own would squeeze it)
    columns = [("problem", "left"), ("ms", "right"), ("speed-up", "right"), ("decision", "left"), ("winner", "left")]
    for col, justify in columns:
        table.add_column(col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=col in ("problem", "ms", "speed-up"),
                         min_width=None)
    undecided: list[str] = []  # the stage's budget ran out: one reason, one next step, said once after them
    doubtful: dict[str, list[str]] = {}  # the other untrusted decisions, by reason
    decided = [winner_of(o.problem.problem.key) if winner_of is not None else None for o in outcomes]
    head, times = round_cells([w.median_ms if w else None for w in decided], [w.round if w else None for w in decided])
    table.columns[1].header = head
    kinds: set[bool] = set()  # the undecided problems' devices: CPUs (True) or GPUs (False)
    for o, w, ms in zip(outcomes, decided, times):
        doubt = _doubt(w)
        if doubt == "undecided":
            undecided.append(o.problem.name)
            kinds.add(str(w.signature).startswith("cpu-"))
        elif doubt:
            doubtful.setdefault(doubt, []).append(o.problem.name)
        table.add_row(*_summary_row(o, w, ms, verbose))
    parts = [f"Untrusted ({reason}): {', '.join(names)}." for reason, names in doubtful.items()]
    if undecided:
        cause = load.cause() if load is not None else ""
        parts.insert(0, "too noisy to trust: " + ", ".join(undecided)
                     + " (the confirmation budget ran out undecided: the default is published). "
                     + (cause + " " if cause else "") + next_step(load, budget_ms, kinds.pop() if len(kinds) == 1 else None))
    caption = " ".join(parts) or "too noisy to trust: nothing"
    table.caption = Text(caption, style="yellow" if undecided or doubtful else "dim")
    table.caption_justify = "left"
    return table


def _doubt(w: Any) -> str:
    """Why a decision is not to be trusted, in a few words ('undecided': its stage's budget ran out); '' if it is."""
    if w is None:
        return ""
    if w.confirmed is not None and not w.confirmed.decided:
        return "undecided"
    if w.short_where_replayed:  # its check is listed under the table: the reason is there
        return "short of its figure where replayed"
    if w.confirmed is None and w.noisy:  # as farm report says it (no stage to settle it)
        return "noisy, no confirmation stage ran"
    if w.confirmed is None and w.default_noisy and w.label != w.default:
        return "the default is noisy: the speed-up over it is doubtful"
    return ""


def _summary_row(o: ProblemOutcome, w: Any, ms: Any, verbose: bool) -> list[Any]:
    """A problem's cells: name, ms, speed-up, the decision in a few words, the winner (and with -v, why)."""
    # a candidate that failed in the main round or in a confirmation stage (this run's, or one the reducer read)
    failed = len({r.label for r in o.results if not r.succeeded}
                 | {r.label for run in o.confirmations for r in run.results if not r.succeeded}
                 | set(w.stage_failed if w is not None else ()))
    note = w.why if w is not None else ""
    if w is not None and not o.results:
        note = "; ".join(x for x in ("measured before", note) if x)
    for other in (w.others if w is not None else ()):
        note = "; ".join(x for x in (note, f"{other.call}: {other.label} "
                                           f"{fmt_speedup(other.speedup_over_default, other.speedup_interval)}") if x)
    decision = short_decision(w) if w is not None else "no winner"
    if failed:
        decision += f", {failed} failed"
    if w is not None and w.others:
        decision += ", " + ", ".join(f"{x.call}: {x.label}" for x in w.others)
    cells = [Text(o.problem.name), ms,
             fmt_speedup(w.speedup_over_default, w.speedup_interval if verbose else None).replace(" (", "\n(")
             if w is not None else "-",
             Text(decision, style="yellow" if w is not None and w.confirmed is not None and not w.confirmed.decided
                  else "")]
    if w is None:
        return [*cells, Text(o.error or "no winner", style="red")]
    if not verbose:
        return [*cells, Name(w.label)]  # breaks at its joints, never mid-word
    more = Text(f"{len(o.results) + o.skipped} candidate(s)" + (f"; {note}" if note else ""), style="dim")
    return [*cells, Group(Name(w.label), more)]


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name != "ranking_fn"}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def outcome_dict(o: ProblemOutcome, winner: Any = None) -> dict[str, Any]:
    results = [_result_dict(r) for r in o.results]
    return {
        "name": o.problem.name,
        "index": o.problem.index,
        "problem_key": o.problem.problem.key,
        "problem": o.problem.problem.canonical(),
        "label": o.problem.problem.label(),
        "error": o.error,
        "wall_ms": o.wall_ms,
        "skipped": o.skipped,
        "pruned": o.pruned,
        "winner": winner.as_dict() if winner is not None else None,  # the reducer's decision (farm.tuner.judging.winner)
        "results": results,
        "confirmation": [{"call": run.call.value, "rounds": run.rounds, "settled": run.settled,
                          "wall_ms": run.wall_ms, "results": [_result_dict(r) for r in run.results]}
                         for run in o.confirmations],
    }


def _result_dict(r: AutotuneResult) -> dict[str, Any]:
    d = to_jsonable(r)
    d["knobs"] = dict(r.knobs)
    d["succeeded"] = r.succeeded
    return d


def reduce_table(report: Any) -> Table:
    """One row per device signature: the signature with its files under it (names break at their joints, never
    cut: the paths are what a person copies), then the counts."""
    table = Table(title="Override files", title_justify="left")
    for col, justify in (("device signature / files", "left"), ("problems", "right"), ("entries", "right"),
                         ("not the fastest", "right"), ("no winner", "right")):
        table.add_column(col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=not col.startswith("device"))
    for s in report.signatures:
        w = s.write
        lines: list[Any] = [Name(s.signature, style="bold")]
        if w is None:
            lines.append(Text("no file written"))
        else:
            lines += [Name(str(w.path)), Text(f"({w.added} added, {w.replaced} replaced)", style="dim")]
            if w.moved_aside:
                lines += [Text("the file as it was is kept at", style="dim"), Name(str(w.moved_aside))]
            if w.set_aside:
                lines.append(Text(f"{w.set_aside} unreadable entr{'y' if w.set_aside == 1 else 'ies'} left out "
                                  "(in the copy)", style="yellow"))
        lines += [Name(str(x)) for x in (s.winners_path, s.csv_path) if x]
        table.add_row(Group(*lines), str(s.problems), str(s.entries), str(s.kept_over_fastest), str(len(s.no_winner)))
    if report.skipped_files:
        table.caption = Text(f"{len(report.skipped_files)} unreadable results file(s) skipped", style="yellow")
    return table


def reduce_dict(report: Any) -> dict[str, Any]:
    return {
        "rows": report.rows,
        "skipped_files": [{"path": p, "reason": r} for p, r in report.skipped_files],
        "signatures": [
            {"signature": s.signature, "problems": s.problems, "entries": s.entries,
             "kept_over_fastest": s.kept_over_fastest, "no_winner": s.no_winner,
             "file": s.write.path if s.write else None, "winners_table": s.winners_path or None,
             "added": s.write.added if s.write else 0,
             "replaced": s.write.replaced if s.write else 0, "moved_aside": s.write.moved_aside if s.write else "",
             "set_aside_unreadable": s.write.set_aside if s.write else 0,
             "tunableop_csv": s.csv_path or None}
            for s in report.signatures
        ],
    }


def winners_query(out: str) -> str:
    """The SQL that lists the winners of a run folder (the README's query)."""
    from farm.store.location import Location

    winners = Location.of(out).join("overrides", "*.winners.parquet").uri.split("?")[0]
    return (f"SELECT problem_name, engine_name, knobs, median_ms, why "
            f"FROM '{winners}' ORDER BY device_signature, problem_name")


def _shown(path: str) -> str:
    """A local path as a person types it here: relative when under the working folder."""
    import os

    if "://" in path or not os.path.isabs(path):
        return path
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def _python() -> str:
    """This interpreter as a person types it here: relative when under the working folder (``.venv/bin/python``:
    a bare ``python`` is not the one with tunefarm installed after the README's install)."""
    import os
    import sys

    exe = sys.executable or "python"
    here = os.path.join(".venv", "bin", os.path.basename(exe))
    if sys.prefix != sys.base_prefix and os.path.exists(here) \
            and os.path.realpath(".venv") == os.path.realpath(sys.prefix):
        return here  # the working folder's .venv is this one (a link to it included)
    rel = os.path.relpath(exe) if os.path.isabs(exe) else exe
    return rel if not rel.startswith("..") else exe


def _joined(out: str, name: str) -> str:
    from farm.store.location import Location

    return Location.of(out).join(name).uri


def query_line(out: str, width: int = 100) -> Text:
    """The command that lists the winners, broken at spaces into lines of ``width`` with shell continuations (a
    backslash ends each line but the last): pasted into bash, it runs as one line would. Print it with
    ``soft_wrap=True`` (a table would fold it mid-string: a SyntaxError when pasted)."""
    cmd = f'{_python()} -c "import duckdb; duckdb.sql(\\"{winners_query(out)}\\").show()"'
    label, indent = "query     ", " " * 10
    room = max(40, width - len(indent) - 2)
    lines: list[str] = []
    line = ""
    for word in cmd.split(" "):
        if line and len(line) + 1 + len(word) > room:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return Text(label + (" \\\n" + indent).join(lines))


def where_table(out: str, summary: Any) -> Table:
    table = Table(title=f"Outputs of job {summary.job_id} (run {summary.run_id})", title_justify="left",
                  show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column("what", no_wrap=True)
    table.add_column("where", overflow="fold")
    table.add_row("results", Text(f"{_joined(out, 'results')}  ({summary.rows_written} new rows)"))
    if summary.reduce is not None:
        for s in summary.reduce.signatures:
            if s.write is not None:
                table.add_row("overrides", Text(f"{_shown(s.write.path)}  ({s.entries} entries)"))
            if s.winners_path:
                table.add_row("winners", Text(_shown(s.winners_path)))
    for sig, problems in summary.no_winner.items():
        for name, why in problems.items():
            table.add_row(Text("no winner", style="red"), Text(f"{name} on {sig}: {why}"))
    return table


def ranked_by_decision(results: Sequence[AutotuneResult], w: Any) -> tuple[AutotuneResult, ...]:
    """Results ranked the reducer's way: its winner first (the confirmation stage may overrule the main round's
    order), then by median; failures last, rank -1."""
    import dataclasses as dc

    first = (w.engine_name, tuple(w.knobs)) if w is not None else None
    ok = sorted((r for r in results if r.succeeded),
                key=lambda r: ((r.engine_name, tuple(r.knobs)) != first, r.median_ms, r.candidate))
    bad = [r for r in results if not r.succeeded]
    return tuple([dc.replace(r, rank=i) for i, r in enumerate(ok)] + [dc.replace(r, rank=-1) for r in bad])


def local_dict(workload: Any, out: str, device: Any, report: Any) -> dict[str, Any]:
    """The in-process run in the same shape as :func:`farm_dict` (one worker, one signature)."""
    candidates = sum(len(o.results) for o in report.outcomes)
    return {
        "workload": {"name": workload.name, "source": workload.source, "digest": workload.digest},
        "autotune": to_jsonable(workload.autotune),
        "executor": "in-process", "job_id": report.job_id, "run_id": report.run_id, "out": out,
        "wall_s": report.wall_s, "rows_written": report.rows_written, "candidates": candidates, "remeasured": 0,
        "counts": report.counts, "pruning": report.pruning,
        "skipped_problems": {device.signature: {o.problem.name: o.error for o in report.outcomes
                                                if o.error and not o.results}},
        "workers": [{"name": f"in-process:{device.index}", "signature": device.signature, "host": device.properties.host,
                     "candidates": candidates, "properties": device.properties.to_dict()}],
        "signatures": {device.signature: [_decided(o, report.summary.winner(device.signature, o.problem.problem.key))
                                          for o in report.outcomes]},
        "no_winner": report.summary.no_winner,
        "reduce": reduce_dict(report.reduce) if report.reduce else None,
        "verified": report.summary.verified,
    }


def _decided(o: ProblemOutcome, w: Any) -> dict[str, Any]:
    """An in-process outcome as JSON, its results ranked as the reducer decided (as farm_outcomes ranks Ray's)."""
    import dataclasses as dc

    return outcome_dict(dc.replace(o, results=ranked_by_decision(o.results, w)) if w is not None else o, w)


def _seconds(s: float) -> str:
    from farm.cli.progress import clock

    return f"{s:.1f} s" if s < 60 else f"{clock(s)} ({s:.0f} s)"


def estimate_table(estimates: Sequence[Any]) -> Table:
    """farm tune --dry-run's cost per device signature (farm.analysis.estimate.Estimate)."""
    t = Table(title="What the tune would cost (device time on one device of each signature)", title_justify="left")
    for col, justify in (("signature", "left"), ("problems", "right"), ("candidates", "right"),
                         ("main round", "left"), ("confirmation stage", "left"), ("in all", "right")):
        t.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    notes = []
    for e in estimates:
        count = f"{e.candidates}" + (f"\n({e.pruned} pruned)" if e.pruned else "")
        left = e.candidates - e.measured_before
        if not left:
            main = "nothing: every candidate has a result (a resume skips them)"
        elif e.main_s is None:
            main = "no estimate: no history of this signature"
        else:
            main = f"about {_seconds(e.main_s)}"
            parts = [f"{e.own} from their own last run" if e.own else "",
                     f"{e.alike} from the same engine and op" if e.alike else "",
                     f"{e.unknown} not estimated (no history)" if e.unknown else ""]
            main += " (" + ", ".join(x for x in parts if x) + ")"
        if e.measured_before and left:
            main += f"; {e.measured_before} measured already (a resume skips them)"
        stage = ("off" if e.confirm_budget_s == 0 else
                 f"about {_seconds(e.confirm_s)} (as before)" if e.confirm_s is not None else
                 f"at most about {_seconds(e.confirm_budget_s)} (its budget; no history)")
        total = e.total_s
        whole = "-" if total is None else f"about {_seconds(total)}" + (" + ?" if e.unknown else "")
        t.add_row(Text(e.signature), str(e.problems), count, Text(main), Text(stage), whole)
        if e.sources:
            notes.append(f"{e.signature}: from {', '.join(_shown(s) for s in e.sources)}")
    t.caption = Text("history: " + "; ".join(notes) if notes else
                     "no history: run once (or give --history RESULTS) for an estimate", style="dim")
    t.caption_justify = "left"
    return t
