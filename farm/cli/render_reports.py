"""Tables of farm report, farm diff and farm publish."""

from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table
from rich.text import Text

from farm.cli.render import fmt_ms, fmt_speedup, phases_table


def _change_line(c: Any) -> str:
    if not c.old_engine:
        return f"+ {c.key}: {c.new_engine} {fmt_ms(c.new_ms)}"
    if not c.new_engine:
        return f"- {c.key}: {c.old_engine} {fmt_ms(c.old_ms)}"
    return f"~ {c.key}: {c.old_engine} {fmt_ms(c.old_ms)} -> {c.new_engine} {fmt_ms(c.new_ms)}"


def publish_tables(reports: Sequence[Any], dry_run: bool = False) -> list[Table]:
    summary = Table(title="Published" + (" (dry run: nothing written)" if dry_run else ""), title_justify="left")
    for col, justify in (("device signature", "left"), ("added", "right"), ("winner changed", "right"),
                         ("removed", "right"), ("unchanged", "right"), ("status", "left"), ("file", "left")):
        summary.add_column(col, justify=justify)  # type: ignore[arg-type]
    details = Table(title="Changes", title_justify="left", show_header=False)
    details.add_column("change")
    for r in reports:
        status = Text("refused", style="red") if r.refused else Text("written" if r.written else "not written")
        summary.add_row(Text(r.signature), str(len(r.added)), str(len(r.changed)), str(len(r.removed)),
                        str(r.unchanged), status, Text(r.path))
        for c in r.added + r.changed + r.removed:
            details.add_row(Text(_change_line(c)))
        for c in r.regressions:
            details.add_row(Text("! slower: " + _change_line(c), style="red"))
    return [summary] + ([details] if details.row_count else [])


def publish_dict(reports: Sequence[Any]) -> dict[str, Any]:
    def change(c: Any) -> dict[str, Any]:
        return {"problem": c.key, "old_engine": c.old_engine or None, "new_engine": c.new_engine or None,
                "old_ms": c.old_ms, "new_ms": c.new_ms}

    return {"files": [{"signature": r.signature, "path": r.path, "written": r.written, "refused": r.refused or None,
                       "added": [change(c) for c in r.added], "changed": [change(c) for c in r.changed],
                       "removed": [change(c) for c in r.removed], "unchanged": r.unchanged,
                       "regressions": [change(c) for c in r.regressions]} for r in reports]}


def report_tables(report: Any) -> list[Table]:
    tables = []
    for s in report.signatures:
        t = Table(title=f"{s.device_name}  {s.signature}", title_justify="left", show_header=False)
        t.add_column("what")
        t.add_column("value")
        worst = s.worst
        geo = s.geomean_speedup
        t.add_row("devices", Text(", ".join(s.devices)))
        t.add_row("problems tuned", str(len(s.problems)))
        t.add_row("candidates measured", f"{sum(p.candidates for p in s.problems)} ({s.rows} rows)")
        if s.pruned:
            t.add_row("candidates pruned", f"{s.pruned} not measured: a cost model ranked them out (farm tune --prune)")
        t.add_row("failures", Text(", ".join(f"{k} {v}" for k, v in s.failures.items()) or "none"))
        t.add_row("tuning time", f"{s.tuning_s:.1f} s" + (f" (confirmation stages {s.confirm_s:.1f} s)" if s.confirm_s
                                                          else ""))
        t.add_row("winner vs default", f"geomean {geo:.3f}x, worst {worst.speedup:.3f}x ({worst.name})" if geo and worst
                  else "no default candidate to compare with")
        t.add_row("noisiest (the winner's 1.4826 x MAD / median)",
                  Text(", ".join(f"{p.name} {100 * p.noise:.1f} %" for p in s.noisiest())))
        shaky = s.untrusted()
        t.add_row("too noisy to trust", Text("; ".join(f"{p.name}: {p.doubt}" for p in shaky) or "nothing",
                                             style="yellow" if shaky else ""))
        dis = s.disagreements()
        t.add_row("devices disagree on", Text("; ".join(f"{p.name}: " + ", ".join(f"{d} {c}" for d, c in
                                                                                     p.device_winners.items())
                                                        for p in dis) or "nothing"))
        held, checked = s.verified()
        if checked:
            bad = [f"{c['problem']} ({c['call']})" for c in s.checks if c["verdict"] and c["verdict"] != "holds"]
            t.add_row("verified where replayed", Text(f"{held} of {checked} decision(s) hold (farm verify: farm.ops "
                                                      "beside the direct call)" + (f"; not: {', '.join(bad)}" if bad else ""),
                                                      style="yellow" if bad else ""))
        for note in s.cpu_notes():
            t.add_row("host CPUs", Text(note, style="yellow"))
        tables.append(t)
        per = Table(title="per problem", title_justify="left")
        # names wrap onto more lines rather than lose their ends ("cpu.matmu…") on a narrow terminal
        cols = (("problem", "left"), ("cand", "right")) + ((("pruned", "right"),) if s.pruned else ()) + (
            ("winner", "left"), ("ms", "right"),
                             ("default", "left"), ("ms", "right"), ("speed-up", "right"), ("noise", "right"),
                             ("device spread", "right"), ("why", "left"))
        for col, justify in cols:
            per.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for p in s.problems:
            why = "; ".join(x for x in (p.why, f"not trusted: {p.doubt}" if p.untrusted else "") if x)
            per.add_row(Text(p.name), str(p.candidates), *((str(p.pruned),) if s.pruned else ()), Text(p.winner),
                        fmt_ms(p.winner_ms), Text(p.default),
                        fmt_ms(p.default_ms), fmt_speedup(p.speedup, p.interval), f"{100 * p.noise:.1f} %",
                        f"{p.spread:.3f}", Text(why, style="yellow" if p.untrusted else "dim"))
        tables.append(per)
        checks = s.checks
        if any(c["verdict"] for c in checks) or any(c["call"] == "graph" for c in checks):
            tables.append(_decisions_table(checks))
    if len(report.nodes) > 1 or any(n.state == "lost" or n.joined_s is not None for n in report.nodes):
        tables.append(_nodes_table(report))
    if report.phases is not None:
        tables.append(phases_table(report.phases))
    return tables


def _nodes_table(report: Any) -> Table:
    """What each Ray node measured (from the rows), and what the latest farm run says of it."""
    from farm.cli.progress import clock

    t = Table(title="per node (rows its workers measured; state in the last run it served)", title_justify="left")
    for col, justify in (("node", "left"), ("host", "left"), ("signature", "left"), ("candidates", "right"),
                         ("rows", "right"), ("failed", "right"), ("state", "left")):
        t.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for n in report.nodes:
        state = n.state or "-"
        if n.joined_s is not None:
            state += f", joined at {clock(n.joined_s)}"
        if n.lost_s is not None:
            state = f"lost at {clock(n.lost_s)}" + (f" (joined at {clock(n.joined_s)})" if n.joined_s is not None else "")
        t.add_row(Text(n.node_id[:8]), Text(", ".join(n.hosts)), Text(", ".join(n.signatures)), str(n.candidates),
                  str(n.rows), str(n.failures), Text(state, style="red" if n.state == "lost" else ""))
    if report.waiting:
        t.caption = Text("the latest run left problems waiting for a device: " + "; ".join(
            f"{sig}: {', '.join(names)}" for sig, names in report.waiting.items()) + " (a resume measures them)",
            style="yellow")
    return t


def _decisions_table(checks: Sequence[dict[str, Any]]) -> Table:
    """Each problem's decision per calling mode: published beside delivered where farm verify replayed it."""
    t = Table(title="decisions by calling mode: published, and delivered where replayed (farm verify)",
              title_justify="left")
    for col, justify in (("problem", "left"), ("call", "left"), ("winner", "left"), ("published", "right"),
                         ("delivered (99 % interval)", "right"), ("verdict", "left")):
        t.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for c in checks:
        delivered = "-"
        if c["delivered"] is not None:
            lo, hi = c["delivered_interval"] or (None, None)
            delivered = f"{c['delivered']:.3f}x" + (f" ({lo:.3f}-{hi:.3f})" if lo is not None and hi is not None else "")
        verdict = c["verdict"] or "not verified"
        style = "green" if verdict == "holds" else "dim" if verdict == "not verified" else "yellow"
        t.add_row(Text(c["problem"]), c["call"], Text(c["winner"]),
                  f"{c['published']:.3f}x" if c["published"] else "-", delivered, Text(verdict, style=style))
    return t


def diff_table(rows: Sequence[Any], a: str, b: str, show_same: bool = False) -> Table:
    from farm.analysis.diff import STATUSES

    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    table = Table(title=f"{a} -> {b}: " + ", ".join(f"{v} {k}" for k, v in counts.items()), title_justify="left")
    for col, justify in (("signature", "left"), ("problem", "left"), ("change", "left"), ("old winner", "left"),
                         ("old ms", "right"), ("new winner", "left"), ("new ms", "right"), ("new / old", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        if r.status in ("same winner", "near tie", "confirmed tie") and not show_same:
            continue
        ratio = r.ratio
        style = "green" if ratio is not None and ratio < 0.97 else "red" if ratio is not None and ratio > 1.03 else ""
        table.add_row(Text(r.signature), Text(r.problem), r.status, Text(r.old_winner or "-"), fmt_ms(r.old_ms),
                      Text(r.new_winner or "-"), fmt_ms(r.new_ms), Text(f"{ratio:.3f}" if ratio else "-", style=style))
    return table
