"""Tables of farm report, farm diff and farm publish."""

from __future__ import annotations

from typing import Any, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from farm.cli.names import Name
from farm.cli.tables.cards import WIDE, cards
from farm.cli.tables.runs import fmt_ms, fmt_speedup, round_cells
from farm.cli.tables.farm import phases_table


def _change_line(c: Any) -> str:
    if not c.old_engine:
        return f"+ {c.key}: {c.new_engine} {fmt_ms(c.new_ms)}"
    if not c.new_engine:
        return f"- {c.key}: {c.old_engine} {fmt_ms(c.old_ms)}"
    return f"~ {c.key}: {c.old_engine} {fmt_ms(c.old_ms)} -> {c.new_engine} {fmt_ms(c.new_ms)}"


def publish_tables(reports: Sequence[Any], dry_run: bool = False, width: int = WIDE) -> list[Any]:
    """The files published (a table; below WIDE columns a block a file, its signature and path whole), then the
    changes."""
    title = "Published" + (" (dry run: nothing written)" if dry_run else "")
    summary = Table(title=title, title_justify="left")
    for col, justify in (("device signature", "left"), ("added", "right"), ("winner changed", "right"),
                         ("removed", "right"), ("unchanged", "right"), ("status", "left"), ("file", "left")):
        summary.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    details = Table(title="Changes", title_justify="left", show_header=False)
    details.add_column("change")
    for r in reports:
        status = Text("refused", style="red") if r.refused else Text("skipped", style="yellow") if r.skipped \
            else Text("written" if r.written else "not written")
        summary.add_row(Text(r.signature), str(len(r.added)), str(len(r.changed)), str(len(r.removed)),
                        str(r.unchanged), status, Text(r.path))
        for c in r.added + r.changed + r.removed:
            details.add_row(Text(_change_line(c)))
        for c in r.regressions:
            details.add_row(Text("! slower: " + _change_line(c), style="red"))
    notes = []
    for r in reports:
        if r.untrusted:
            notes.append(f"{r.signature}: {len(r.untrusted)} of the entries published are untrusted (undecided by "
                         f"their confirmation stage, or short of their figure where replayed): "
                         f"{', '.join(r.untrusted)}; --trusted-only leaves them out")
        if r.left_out:
            notes.append(f"{r.signature}: {len(r.left_out)} untrusted entr{'y' if len(r.left_out) == 1 else 'ies'} "
                         f"left out (--trusted-only): {', '.join(r.left_out)}")
        if r.skipped:
            notes.append(f"{r.signature}: {r.skipped}")
        for n in r.dialect_notes:
            what = {"left_out": "left out", "shadowed": "written", "kept_as_is": "not respelled"}[n.kind]
            notes.append(f"{r.signature}: {n.label} {what}: {n.why}")
    if notes:
        summary.caption = Text("\n".join(notes), style="yellow", justify="left")
    if width < WIDE:
        summary = cards(title, [(r.signature, [
            ("changes", f"{len(r.added)} added, {len(r.changed)} winner changed, {len(r.removed)} removed, "
                        f"{r.unchanged} unchanged"),
            ("status", "refused" if r.refused else "skipped" if r.skipped else "written" if r.written else "not written"),
            ("file", r.path)]) for r in reports], "\n".join(notes))
    return [summary] + ([details] if details.row_count else [])


def publish_dict(reports: Sequence[Any]) -> dict[str, Any]:
    def change(c: Any) -> dict[str, Any]:
        return {"problem": c.key, "old_engine": c.old_engine or None, "new_engine": c.new_engine or None,
                "old_ms": c.old_ms, "new_ms": c.new_ms}

    return {"files": [{"signature": r.signature, "path": r.path, "written": r.written, "refused": r.refused or None,
                       "added": [change(c) for c in r.added], "changed": [change(c) for c in r.changed],
                       "removed": [change(c) for c in r.removed], "unchanged": r.unchanged,
                       "regressions": [change(c) for c in r.regressions], "untrusted": list(r.untrusted),
                       "left_out_untrusted": list(r.left_out), "skipped": r.skipped or None, "dialect": r.dialect,
                       "dialect_notes": [{"entry": n.label, "kind": n.kind, "why": n.why} for n in r.dialect_notes]}
                      for r in reports]}


_SHORT_OF_CHECKS = {"not_delivered": "replay lost", "withdrawn_in_model": "model withdrew it"}


def _decision(p: Any) -> str:
    """How a problem's winner was decided, in a few words (the whole reason: -v, --json)."""
    c = p.confirmation
    if p.rule in _SHORT_OF_CHECKS:  # a check where it runs put the default back: say which
        return _SHORT_OF_CHECKS[p.rule]
    if c is not None:
        if p.winner == p.default:
            if getattr(c, "settled", True):
                return "default kept"
            return "tied in noise" if getattr(c, "tie", False) else "undecided"  # the default kept
        return "confirmed"
    if not p.why:
        return "fastest"
    return "default kept" if p.winner == p.default else "within noise"


def report_tables(report: Any, verbose: bool = False) -> list[Table]:
    tables = []
    for s in report.signatures:
        tables += [_signature_table(s), _problems_table(s, verbose)]
        checks = s.checks
        if any(c["verdict"] for c in checks) or any(c["call"] == "graph" for c in checks):
            tables.append(_decisions_table(checks))
    if len(report.nodes) > 1 or any(n.state == "lost" or n.joined_s is not None for n in report.nodes):
        tables.append(_nodes_table(report))
    if report.phases is not None:
        tables.append(phases_table(report.phases))
    return tables


def _signature_table(s: Any) -> Table:
    """A signature at a glance: its devices, what was measured and failed, the winners against the default, noise."""
    t = Table(title=f"{s.device_name}  {s.signature}", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value")
    worst = s.worst
    geo = s.geomean_speedup
    t.add_row("devices", Text(", ".join(s.devices)))
    t.add_row("problems tuned", str(len(s.problems)))
    t.add_row("candidates measured", f"{sum(p.candidates for p in s.problems)} ({s.rows} rows)")
    if s.pruned:
        t.add_row("candidates pruned", f"{s.pruned} not measured: a cost model ranked them out or a published "
                  "decision spared them (farm tune --prune, --history)")
    t.add_row("failures", Text(", ".join(f"{k} {v}" for k, v in s.failures.items()) or "none"))
    t.add_row("tuning time", f"{s.tuning_s:.1f} s" + (f" (confirmation stages {s.confirm_s:.1f} s)" if s.confirm_s
                                                      else ""))
    t.add_row("winner vs default", f"geomean {geo:.3f}x, worst {worst.speedup:.3f}x ({worst.name})" if geo and worst
              else "no default candidate to compare with")
    t.add_row("noisiest (the winner's 1.4826 x MAD / median in its round)",
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
    return t


def _problems_table(s: Any, verbose: bool) -> Table:
    """One row per problem: its winner (under its name), the winner's time, speed-up, noise and how it was decided."""
    per = Table(title="per problem", title_justify="left")
    # the figures stay on one line; the names (the problem, its winner and default under it) break at their
    # joints and the decision at its spaces, never mid-word, so the table holds at 80 columns (-v adds the rest
    # under the names)
    cols = [("problem / winner (default)", "left"), ("ms", "right"), ("speed-up", "right"), ("noise", "right"),
            ("decision", "left")]
    if s.pruned:  # pruned candidates: a cost model's choice a reader must see
        cols[1:1] = [("pruned", "right")]
    head, times = round_cells([p.winner_ms for p in s.problems], [p.round for p in s.problems])
    for col, justify in cols:
        per.add_column(head if col == "ms" else col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                       no_wrap=col not in ("decision",) and not col.startswith("problem"), min_width=None,
                       max_width=20 if col == "decision" else None)
    for p, ms in zip(s.problems, times):
        per.add_row(*_problem_row(s, p, ms, verbose))
    return per


def _problem_row(s: Any, p: Any, ms: Any, verbose: bool) -> list[Any]:
    why = "; ".join(x for x in (p.why, f"not trusted: {p.doubt}" if p.untrusted else "") if x)
    parts: list[Any] = [Name(p.name, style="bold"), Name(p.winner)]  # each breaks at its joints, never mid-word
    if p.default and p.default != p.winner:
        parts.append(Name(f"({p.default}" + (f", {fmt_ms(p.default_ms)} ms" if verbose else "") + ")", style="dim"))
    if verbose:
        parts.append(Text(f"{p.candidates} candidate(s); device spread {p.spread:.3f} (main round)"
                          + (f"; {why}" if why else ""), style="yellow" if p.untrusted else "dim"))
    cells = [Group(*parts), ms,
             fmt_speedup(p.speedup, p.interval if verbose else None).replace(" (", "\n("),  # interval below
             f"{100 * p.noise:.1f} %",
             Text(_decision(p), style="yellow" if p.untrusted else "")]
    if s.pruned:
        cells[1:1] = [str(p.pruned)]
    return cells


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
    """Each problem's decision per calling mode: published beside delivered where farm verify replayed it. The
    winner goes under its problem (the first column folds, the figures keep their width); a verdict is its first
    word in the table and its reason in the caption."""
    t = Table(title="decisions by calling mode: published, and delivered where replayed (farm verify; its 99 % "
                    "interval below)", title_justify="left", caption_justify="left")
    for col, justify in (("problem / winner", "left"), ("call", "left"), ("published", "right"),
                         ("delivered", "right"), ("verdict", "left")):
        t.add_column(col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                     no_wrap=col != "problem / winner")
    reasons = []
    for c in checks:
        delivered = "-"
        if c["delivered"] is not None:
            lo, hi = c["delivered_interval"] or (None, None)
            delivered = f"{c['delivered']:.3f}x" + (f"\n({lo:.3f}-{hi:.3f})" if lo is not None and hi is not None
                                                     else "")
        verdict = c["verdict"] or "not verified"
        word, _, why = verdict.partition(": ")
        style = "green" if verdict == "holds" else "dim" if word == "not verified" else "yellow"
        if why:
            reasons.append(f"{c['problem']} ({c['call']}): {verdict}")
        t.add_row(Group(Name(c["problem"]), Name(c["winner"], style="dim")), c["call"],
                  f"{c['published']:.3f}x" if c["published"] else "-", delivered, Text(word, style=style))
    if reasons:
        t.caption = "\n".join(reasons)
    return t


def diff_table(rows: Sequence[Any], a: str, b: str, show_same: bool = False, limit: int = 40) -> Table:
    """The changes, the largest first: added, removed, changed winners and same winners whose time changed beyond
    noise (with ``show_same``, the rest too); at most ``limit`` rows (0: all), the count of the others in the
    caption. Labels fold, never cut; one signature goes in the title instead of a column."""
    import math

    from farm.analysis.diff import STATUSES, headline

    shown = [r for r in rows if show_same or r.status != "same winner"]  # a changed winner shows, a tie too
    order = {s: i for i, s in enumerate(STATUSES)}
    shown.sort(key=lambda r: (order[r.status], -abs(math.log(r.ratio)) if r.ratio else 0.0))
    left = len(shown) - limit if limit and len(shown) > limit else 0
    shown = shown[:limit] if left else shown
    signatures = sorted({r.signature for r in rows})
    one = len(signatures) == 1
    title = f"{a} -> {b}" + (f" ({signatures[0]})" if one else "") + ": " + headline(rows)
    table = Table(title=title, title_justify="left")
    columns = ([] if one else [("signature", "left")]) + [
        ("problem", "left"), ("change", "left"), ("old ms", "right"), ("new ms", "right"), ("new / old", "right"),
        ("winner (old -> new)", "left")]
    for col, justify in columns:  # every column on one line but the last: the labels fold there, whole
        table.add_column(col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=col in ("change", "old ms", "new ms", "new / old"))
    for r in shown:
        ratio = r.ratio
        style = "green" if ratio is not None and ratio < 0.97 else "red" if ratio is not None and ratio > 1.03 else ""
        if r.old_winner and r.new_winner and r.old_winner != r.new_winner:
            names: Any = Group(Name(r.old_winner), Name("-> " + r.new_winner, style="bold"))
        else:
            names = Name(r.new_winner or r.old_winner or "-")
        cells = ([] if one else [Name(r.signature)]) + [  # names break at their joints, never mid-word
            Name(r.problem), r.status, fmt_ms(r.old_ms), fmt_ms(r.new_ms),
            Text(f"{ratio:.3f}" if ratio else "-", style=style), names]
        table.add_row(*cells)
    if left:
        table.caption = f"... and {left:,} more (--limit 0 shows every one; --json gives them all)"
    elif not shown:
        table.caption = "no change" + ("" if show_same else " (--all lists every problem)")
    return table
