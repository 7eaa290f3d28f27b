"""The Ray farm's tables and ``--json`` for ``farm tune``: per signature the summary, the workers, the nodes, the
phases of the devices' time, what the cost model pruned; used by the CLI only."""

from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table
from rich.text import Text

from farm.cli.tables.runs import HostLoad, outcome_dict, ranked_by_decision, reduce_dict, summary_table, to_jsonable
from farm.model.records import AutotuneResult
from farm.tuner.judging.confirm import ConfirmRun
from farm.tuner.problem_tuning import ProblemOutcome


def farm_outcomes(workload: Any, report: Any, signature: str) -> list[ProblemOutcome]:
    """Per-problem outcomes of one signature from a farm report (finalist rows replace earlier ones),
    ranked the reducer's way: its winner first, then by median."""
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
        from farm.cli.tables.verify import verified_lines, verified_table

        tables.append(verified_table(report.summary.verified, title="Verified where replayed") if verbose
                      else verified_lines(report.summary.verified, title="Verified where replayed"))
    return tables


def workers_table(report: Any) -> Table:
    workers = Table(title=f"Workers ({report.tuning_s:.1f} s of tuning, {report.wall_s:.1f} s in all)",
                    title_justify="left")
    for col, justify in (("worker", "left"), ("host", "left"), ("device", "left"), ("signature", "left"),
                         ("rows", "right"), ("failed", "right"), ("restarts", "right"), ("busy", "right")):
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
                         ("state", "left"), ("joined", "right"), ("lost", "right"), ("rows", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for n in nodes:
        style = {"lost": "red"}.get(n["state"], "")
        table.add_row(Text(n["node_id"][:8]), Text(n["host"]), Text(", ".join(n["workers"])),
                      Text(", ".join(n["signatures"])), Text(n["state"], style=style),
                      "at start" if n["joined_s"] is None else clock(n["joined_s"]),
                      "-" if n["lost_s"] is None else clock(n["lost_s"]), str(n.get("rows", n.get("candidates", 0))))  # "candidates": older job.json
    if waiting:
        table.caption = Text("waiting for a device: " + "; ".join(f"{sig}: {len(names)} problem(s)"
                                                                  for sig, names in waiting.items()), style="yellow")
    return table


def pruning_table(pruning: dict[str, Any]) -> Table:
    """What farm tune measured and spared: the cost model's settings, counts, the problems it measured in full (and
    why), what the tune assumed, and the problems a published decision spared (only checked)."""
    from farm.costmodel.history import bound_line

    model = pruning.get("model")
    title = (f"Pruned by the cost model {model} (top-k {pruning['top_k']}, explore {pruning['explore']:g}, seed "
             f"{pruning['seed']})" if model else "Decided problems only checked")
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", overflow="fold")
    if model:
        n, m = pruning["candidates"], pruning["measured"]
        t.add_row("measured", f"{m} of {n} candidates ({n / m:.1f}x fewer)" if m else f"0 of {n}")
        t.add_row("pruned", f"{pruning['pruned']} (rows with disposition pruned and the predicted relative time)")
        full = [f"{name}: {why}" for problems in pruning["measured_in_full"].values() for name, why in problems.items()]
        t.add_row("measured in full", Text("\n".join(full) or "none (every problem inside the training data)"))
        trained = pruning.get("trained_on") or {}
        t.add_row("trained on", Text(f"{trained.get('problems')} problem(s) of {', '.join(trained.get('families', []))}"))
        if "held_out" in trained:
            t.add_row("bound", Text(bound_line(trained["held_out"], pruning["top_k"])))
    decided = pruning.get("decided") or {}
    checked = [name for names in (decided.get("checked") or {}).values() for name in names]
    if pruning.get("check_decided") or checked:
        t.add_row("decided", Text(f"{len(checked)} problem(s) decided in the published root, only checked (the winner "
                                  f"against the default): {decided.get('spared', 0)} candidates not measured"
                                  if checked else "none of these problems is decided in the published root"))
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
    signatures = {}
    for sig in sorted({w.signature for w in report.workers}):
        signatures[sig] = [outcome_dict(o, report.summary.winner(sig, o.problem.problem.key))
                           for o in farm_outcomes(workload, report, sig)]
    return {
        "workload": {"name": workload.name, "source": workload.source, "digest": workload.digest},
        "autotune": to_jsonable(workload.autotune),
        "executor": "ray", "ray_started": report.workers_started,  # False: a resume with nothing to measure
        "job_id": report.job_id, "run_id": report.run_id, "out": out, "wall_s": report.wall_s,
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
