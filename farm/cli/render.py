"""Tables for people (rich) and plain dicts for ``--json``; used by the CLI only."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Iterable, Sequence

from rich.table import Table
from rich.text import Text

from farm.model.engine import Engine, EngineRegistry, engine_id, user_knobs
from farm.model.knobs import format_settings
from farm.model.records import AutotuneResult
from farm.tuner.confirm import ConfirmRun
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


FOLD_KNOBS = 8  # knob lines shown per engine in farm engines' table


def engines_table(registry: EngineRegistry, engines: Iterable[Engine], here: dict[str, str] | None = None) -> Table:
    table = Table(title="Engines", show_lines=True)
    table.add_column("engine", style="bold")
    table.add_column("id", justify="right")
    table.add_column("ops")
    table.add_column("knobs (type, range, default)", no_wrap=True)
    table.add_column("exhaustive", justify="center")
    table.add_column("from")
    if here is not None:
        table.add_column("runs here")
    for e in engines:
        described = [k.describe() for k in user_knobs(e)]
        if len(described) > FOLD_KNOBS:  # cuDNN's 47: the first few, and where to find the rest
            described = described[:FOLD_KNOBS - 1] + [f"... and {len(described) - FOLD_KNOBS + 1} more "
                                                      f"(farm engines --json)"]
        knobs = "\n".join(described) or "-"
        row = [Text(e.name), str(engine_id(e)), Text(", ".join(sorted(e.ops))), Text(knobs),
               "yes" if e.supports_exhaustive else "no", Text(registry.origin(e))]
        if here is not None:
            answer = here.get(e.name, "")
            row.append(Text(answer, style="green" if answer.startswith("yes") else "dim"))
        table.add_row(*row)
    return table


def engine_dict(registry: EngineRegistry, e: Engine) -> dict[str, Any]:
    return {
        "name": e.name,
        "id": engine_id(e),
        "ops": sorted(e.ops),
        "supports_exhaustive": bool(e.supports_exhaustive),
        "origin": registry.origin(e),
        "knobs": [
            {"name": k.name, "type": k.type.value, "default": k.default, "min": k.min, "max": k.max,
             "choices": list(k.choices), "doc": k.doc}
            for k in user_knobs(e)
        ],
    }


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
        notes.append(f"{outcome.pruned} candidate(s) not measured: the cost model ranked them out (pruned rows)")
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
    if w.confirmed is not None and not w.confirmed.settled and rule == "default_not_beaten":
        text = "undecided"  # the stage's budget ran out: the default is published (the caption says so)
    return text


def round_cells(values: Sequence[float | None], rounds: Sequence[str | None], head: str = "ms"
                ) -> tuple[str, list[str]]:
    """A figure column named by the round its figures come from (``stage ms``); where rows mix rounds, each cell
    names its own (``0.4257 main``). A round of None: no figure ("-")."""
    from farm.store.deciding import ROUND_NAMES

    names = [ROUND_NAMES.get(r, r) if r is not None else None for r in rounds]
    distinct = {n for n in names if n is not None}
    if len(distinct) == 1:
        return f"{distinct.pop()} {head}", [fmt_ms(v) if n is not None else "-" for v, n in zip(values, names)]
    return head, [f"{fmt_ms(v)} {n}" if n is not None else "-" for v, n in zip(values, names)]


def next_step(load: "HostLoad | None", budget_ms: float | None = None) -> str:
    """What to try after an undecided stage: a quiet machine; one BLAS thread a call, unless the run had one
    already; a confirmation budget four times this one (8000 ms at least). The same command re-confirms them."""
    if load is None:  # a run elsewhere (a GPU, a cluster's nodes): what ran is not known here
        threads = "--cpu-threads 1 on a CPU, "
    else:  # a CPU run on this host
        threads = "" if load.blas_threads == 1 else "--cpu-threads 1, "
    budget = max(8000, round(4 * budget_ms)) if budget_ms else 8000
    return (f"Next: a quiet machine, {threads}or autotune: {{confirm: {{budget_ms: {budget}}}}}; the same command "
            "re-confirms only these.")


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
    for o, w, ms in zip(outcomes, decided, times):
        # a candidate that failed in the main round or in a confirmation stage (this run's, or one the reducer read)
        failed = len({r.label for r in o.results if not r.succeeded}
                     | {r.label for run in o.confirmations for r in run.results if not r.succeeded}
                     | set(w.stage_failed if w is not None else ()))
        note = w.why if w is not None else ""
        if w is not None and not o.results:
            note = "; ".join(x for x in ("measured before", note) if x)
        if w is not None and w.confirmed is not None and not w.confirmed.settled:
            undecided.append(o.problem.name)
        elif w is not None and w.short_where_replayed:  # its check is listed under the table: the reason is there
            doubtful.setdefault("short of its figure where replayed", []).append(o.problem.name)
        elif w is not None and w.confirmed is None and w.noisy:  # as farm report says it (no stage to settle it)
            doubtful.setdefault("noisy, no confirmation stage ran", []).append(o.problem.name)
        elif w is not None and w.confirmed is None and w.default_noisy and w.label != w.default:
            doubtful.setdefault("the default is noisy: the speed-up over it is doubtful", []).append(o.problem.name)
        for other in (w.others if w is not None else ()):
            note = "; ".join(x for x in (note, f"{other.call}: {other.label} {fmt_speedup(other.speedup_over_default, other.speedup_interval)}") if x)
        decision = short_decision(w) if w is not None else "no winner"
        if failed:
            decision += f", {failed} failed"
        if w is not None and w.others:
            decision += ", " + ", ".join(f"{x.call}: {x.label}" for x in w.others)
        cells = [Text(o.problem.name), ms,
                 fmt_speedup(w.speedup_over_default, w.speedup_interval if verbose else None).replace(" (", "\n(")
                 if w is not None else "-",
                 Text(decision, style="yellow" if w is not None and w.confirmed is not None and not w.confirmed.settled
                      else "")]
        names = Text(w.label) if w is not None else Text(o.error or "no winner", style="red")
        if verbose:
            names.append(f"\n{len(o.results) + o.skipped} candidate(s)" + (f"; {note}" if note else ""), style="dim")
        cells.append(names)
        table.add_row(*cells)
    parts = [f"Untrusted ({reason}): {', '.join(names)}." for reason, names in doubtful.items()]
    if undecided:
        cause = load.cause() if load is not None else ""
        parts.insert(0, "too noisy to trust: " + ", ".join(undecided)
                     + " (the confirmation budget ran out undecided: the default is published). "
                     + (cause + " " if cause else "") + next_step(load, budget_ms))
    caption = " ".join(parts) or "too noisy to trust: nothing"
    table.caption = Text(caption, style="yellow" if undecided or doubtful else "dim")
    table.caption_justify = "left"
    return table


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
        "winner": winner.as_dict() if winner is not None else None,  # the reducer's decision (farm.tuner.winner)
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
    table = Table(title="Override files", title_justify="left")
    for col, justify in (("device signature", "left"), ("problems", "right"), ("entries", "right"),
                         ("not the fastest", "right"), ("no winner", "right"), ("file", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for s in report.signatures:
        w = s.write
        file = "-" if w is None else f"{w.path} ({w.added} added, {w.replaced} replaced)"
        if w is not None and w.moved_aside:
            file += f"; the file as it was is kept at {w.moved_aside}"
        if s.winners_path:
            file += f"\n{s.winners_path}"
        if s.csv_path:
            file += f"\n{s.csv_path}"
        table.add_row(Text(s.signature), str(s.problems), str(s.entries), str(s.kept_over_fastest),
                      str(len(s.no_winner)), Text(file))
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
        table.add_row("query", Text(f'{_python()} -c "import duckdb; duckdb.sql(\\"{winners_query(out)}\\").show()"'))
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


def farm_outcomes(workload: Any, report: Any, signature: str) -> list[ProblemOutcome]:
    """Per-problem outcomes of one signature from a farm report (finalist rows replace earlier ones),
    ranked the reducer's way: its winner first, then by median."""
    import dataclasses as dc

    out = []
    skipped = dict(report.problems_skipped.get(signature, {}))
    skipped.update({name: "waiting for a device of this kind (resume to measure it)"
                    for name in getattr(report, "waiting", {}).get(signature, ())})
    for wp in workload.problems:
        rows = report.results.get((signature, wp.name), [])
        latest: dict[Any, AutotuneResult] = {}
        for r in rows:
            latest[r.spec] = r
        w = report.summary.winner(signature, wp.problem.key) if report.summary else None
        ranked = ranked_by_decision(list(latest.values()), w)
        stages = tuple(ConfirmRun.of(c.value, report.confirmations[(signature, wp.name, c.value)]) for c in wp.calls
                       if (signature, wp.name, c.value) in report.confirmations)
        out.append(ProblemOutcome(wp, ranked, skipped.get(wp.name, ""), 0.0, confirmations=stages))
    return out


def farm_tables(workload: Any, report: Any, verbose: bool = False, load: HostLoad | None = None) -> list[Table]:
    """The run's tables; ``load``: this host's, for the CPU signatures its workers measured here."""
    tables = []
    for sig in sorted({w.signature for w in report.workers}):
        outcomes = farm_outcomes(workload, report, sig)
        t = summary_table(outcomes, report.wall_s, lambda key, _s=sig: report.summary.winner(_s, key), verbose=verbose,
                          load=load if sig.startswith("cpu-") else None, budget_ms=workload.autotune.confirm.budget_ms)
        t.title = Text(f"{sig}: {len(outcomes)} problem(s)")
        tables.append(t)
    from farm.analysis.phases import from_statuses

    phases = from_statuses(report.run_id, report.tuning_s, report.statuses) \
        if report.workers_started and report.statuses else None
    if verbose:
        tables.append(workers_table(report))
    else:
        tables.append(workers_line(report, phases))
    if report.nodes and (len(report.nodes) > 1 or any(n["state"] != "active" or n["joined_s"] is not None
                                                      for n in report.nodes)):
        tables.append(nodes_table(report.nodes, report.waiting))
    if phases is not None and verbose:
        tables.append(phases_table(phases))
    if report.pruning:
        tables.append(pruning_table(report.pruning))
    if report.summary is not None and report.summary.verified:
        from farm.cli.render_verify import verified_lines, verified_table

        tables.append(verified_table(report.summary.verified, title="Verified where replayed") if verbose
                      else verified_lines(report.summary.verified, title="Verified where replayed"))
    return tables


def workers_table(report: Any) -> Table:
    workers = Table(title=f"Workers ({report.tuning_s:.1f} s of tuning, {report.wall_s:.1f} s in all)",
                    title_justify="left")
    for col, justify in (("worker", "left"), ("host", "left"), ("device", "left"), ("signature", "left"),
                         ("candidates", "right"), ("failed", "right"), ("restarts", "right"), ("busy", "right")):
        workers.add_column(col, justify=justify)  # type: ignore[arg-type]
    for st in report.statuses:
        frac = st.busy_s / report.tuning_s if report.tuning_s else 0.0
        workers.add_row(Text(st.name), Text(st.host), Text(st.device), Text(st.signature), str(st.candidates),
                        str(st.failures), str(st.restarts), f"{100 * frac:.0f} %")
    return workers


def workers_line(report: Any, phases: Any) -> Text:
    """The workers in one line (the table, and the device time by phase: -v, farm report)."""
    n = len(report.statuses)
    busy = sum(st.busy_s for st in report.statuses) / (n * report.tuning_s) if n and report.tuning_s else 0.0
    failed = sum(st.failures for st in report.statuses)
    restarts = sum(st.restarts for st in report.statuses)
    text = f"Workers: {n}, {report.tuning_s:.1f} s of tuning ({100 * busy:.0f} % busy), {report.wall_s:.1f} s in all"
    text += "".join(f", {v} {what}" for v, what in ((failed, "failed"), (restarts, "restarted")) if v)
    if phases is not None and getattr(phases, "total", None) is not None and report.tuning_s:
        whole = phases.total.total or 1.0
        parts = [(p, phases.total.get(p) / whole) for p in ("measure", "confirm")]
        text += "; " + ", ".join(f"{p} {100 * f:.0f} %" for p, f in parts if f >= 0.005)
    return Text(text)


def nodes_table(nodes: Sequence[dict[str, Any]], waiting: dict[str, list[str]] | None = None) -> Table:
    """The Ray nodes that ran device workers: where, which devices, active or lost, when they joined or went."""
    from farm.cli.progress import clock

    table = Table(title="Nodes", title_justify="left")
    for col, justify in (("node", "left"), ("host", "left"), ("devices", "left"), ("signature", "left"),
                         ("state", "left"), ("joined", "right"), ("lost", "right"), ("candidates", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for n in nodes:
        style = {"lost": "red"}.get(n["state"], "")
        table.add_row(Text(n["node_id"][:8]), Text(n["host"]), Text(", ".join(n["workers"])),
                      Text(", ".join(n["signatures"])), Text(n["state"], style=style),
                      "at start" if n["joined_s"] is None else clock(n["joined_s"]),
                      "-" if n["lost_s"] is None else clock(n["lost_s"]), str(n["candidates"]))
    if waiting:
        table.caption = Text("waiting for a device: " + "; ".join(f"{sig}: {len(names)} problem(s)"
                                                                  for sig, names in waiting.items()), style="yellow")
    return table


def pruning_table(pruning: dict[str, Any]) -> Table:
    """What farm tune --prune measured: settings, counts, and the problems it measured in full (and why)."""
    t = Table(title=f"Pruned by the cost model {pruning['model']} (top-k {pruning['top_k']}, explore "
                    f"{pruning['explore']:g}, seed {pruning['seed']})", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", overflow="fold")
    n, m = pruning["candidates"], pruning["measured"]
    t.add_row("measured", f"{m} of {n} candidates ({n / m:.1f}x fewer)" if m else f"0 of {n}")
    t.add_row("pruned", f"{pruning['pruned']} (rows with disposition pruned and the predicted relative time)")
    full = [f"{name}: {why}" for problems in pruning["measured_in_full"].values() for name, why in problems.items()]
    t.add_row("measured in full", Text("\n".join(full) or "none (every problem inside the training data)"))
    trained = pruning.get("trained_on") or {}
    t.add_row("trained on", Text(f"{trained.get('problems')} problem(s) of {', '.join(trained.get('families', []))}"))
    return t


def phases_table(phases: Any) -> Table:
    """Where each worker's time went (farm.analysis.phases.RunPhases): seconds and share per phase, a total row,
    and in the title what kept the devices from measuring."""
    from farm.tuner.phases import PHASES

    total = phases.total
    worst = ", ".join(f"{p} {100 * f:.0f} %" for p, f in phases.overhead()[:3])
    signatures = sorted({w.signature for w in phases.workers})
    one = len(signatures) == 1  # one signature goes in the title: a column would fold it mid-name
    t = Table(title=f"Device time by phase ({len(phases.workers)} worker(s), {phases.tuning_s:.1f} s of tuning"
                    + (f"; not measuring: {worst}" if worst else "") + "): each worker's share"
                    + (f" ({signatures[0]})" if one else ""), title_justify="left")
    t.add_column("worker", no_wrap=True)
    t.add_column("seconds", justify="right", no_wrap=True)
    for p in PHASES:
        t.add_column(p, justify="right", no_wrap=True)
    if not one:
        t.add_column("signature", overflow="fold")  # last: it folds there, the figures stay on one line

    def cells(split: Any) -> list[str]:
        whole = split.total
        return [f"{whole:.{2 if whole < 10 else 1}f}"] + [
            f"{100 * split.get(p) / whole:.0f} %" if whole > 0 and split.get(p) > 0 else "-" for p in PHASES]

    for w in phases.workers:
        t.add_row(Text(w.name), *cells(w.split), *([] if one else [Text(w.signature)]))
    if len(phases.workers) > 1:
        t.add_row(Text("total", style="bold"), *cells(total), *([] if one else [""]))
    return t


def farm_dict(workload: Any, out: str, report: Any) -> dict[str, Any]:
    import dataclasses as dc

    signatures = {}
    for sig in sorted({w.signature for w in report.workers}):
        signatures[sig] = [outcome_dict(o, report.summary.winner(sig, o.problem.problem.key))
                           for o in farm_outcomes(workload, report, sig)]
    return {
        "workload": {"name": workload.name, "source": workload.source, "digest": workload.digest},
        "autotune": to_jsonable(workload.autotune),
        "executor": "ray", "job_id": report.job_id, "run_id": report.run_id, "out": out, "wall_s": report.wall_s,
        "tuning_s": report.tuning_s, "phases": {"tuning_s": report.tuning_s, "total": report.phases.to_json()},
        "rows_written": report.rows_written, "candidates": report.total, "remeasured": report.remeasured,
        "counts": report.counts, "skipped_problems": report.problems_skipped,
        "workers": [{**st.to_json(), "gpu_ids": list(w.gpu_ids), "pid": w.pid,
                     "properties": w.properties.to_dict()} for st, w in zip(report.statuses, report.workers)],
        "signatures": signatures,
        "no_winner": report.summary.no_winner,
        "reduce": reduce_dict(report.reduce) if report.reduce else None,
        "pruning": report.pruning,
        "verified": report.summary.verified,
        "nodes": report.nodes,
        "waiting_for_devices": report.waiting,
    }


def devices_table(probes: Any) -> Table:
    table = Table(title="Devices", show_lines=True, title_justify="left")
    for col, justify in (("runtime", "left"), ("index", "right"), ("name", "left"), ("arch", "left"),
                         ("units", "right"), ("memory", "right"), ("L2", "right"), ("clock", "right"),
                         ("driver / runtime", "left"), ("libraries", "left"), ("signature", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    notes = []
    for p in probes:
        for d in p.devices:
            libs = "\n".join(f"{k} {v}" for k, v in d.libraries) or "-"
            table.add_row(p.runtime, str(d.index), Text(d.name), Text(d.arch), str(d.compute_units),
                          fmt_bytes(d.total_memory), fmt_bytes(d.l2_bytes), f"{d.clock_mhz} MHz" if d.clock_mhz else "-",
                          Text(f"{d.driver_version or '-'} / {d.runtime_version or '-'}"), Text(libs), Text(d.signature))
        if p.note:
            notes.append(f"{p.runtime}: {p.note}")
    if notes:
        table.caption = Text("\n".join(notes), style="dim")
    return table


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


def policies_table(registry: Any, order: Sequence[str]) -> Table:
    table = Table(title="Selection policies (order in force: " + " > ".join(order) + ")", title_justify="left")
    for col, justify in (("#", "right"), ("name", "left"), ("id", "right"), ("API", "left"), ("origin", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for info in registry.info():
        pos = str(order.index(info.name) + 1) if info.name in order else "-"
        table.add_row(pos, Text(info.name), str(info.id), ".".join(map(str, info.api_version)), Text(info.origin))
    return table




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
