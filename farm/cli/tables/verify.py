"""Tables of farm verify's checks (farm verify, and farm tune's check after its reduce)."""

from __future__ import annotations

from typing import Any, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from farm.cli.names import Name


def _x(value: Any) -> str:
    return f"{value:.3f}x" if isinstance(value, (int, float)) else "-"


def _ms(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value * 1e3:.1f} us" if value < 1.0 else f"{value:.3f} ms"


MAX_LINES = 4  # the checks that do not hold, listed under farm tune's summary; the rest are counted


def verified_lines(records: Sequence[dict[str, Any]], *, title: str = "farm verify") -> Text:
    """The checks in a few lines: how many hold, and each one that does not (the table: -v, farm report)."""
    held = sum(r["verdict"] == "holds" for r in records)
    lines = [f"{title}: {held} of {len(records)} decision(s) hold (farm.ops beside the direct call)"]
    others = [r for r in records if r["verdict"] != "holds"]
    for r in others[:MAX_LINES]:  # one line each: the direct call's plan and the note (a flagged default) are in -v
        verdict = r["verdict"].split(" (the default is published")[0].split("; ")[0]  # its first finding
        if r.get("direct"):
            verdict = verdict.replace(f"the direct call {r['direct']}", "the direct call")
        lines.append(f"  {r['problem']} ({r['call']}): {verdict}")
    if len(others) > MAX_LINES:
        lines.append(f"  and {len(others) - MAX_LINES} more (each one: -v, or farm report)")
    return Text("\n".join(lines), style="" if held == len(records) else "yellow")


def verified_table(records: Sequence[dict[str, Any]], *, title: str = "farm verify") -> Table:
    """One row per decision checked: the problem and its calling mode, the published winner and the direct call
    under it (that column folds, the figures keep their width), published beside delivered (its 99 % interval
    under it), farm.ops' and the direct call's medians, and the verdict's first word; its reason and the notes
    (host CPUs, decisions not measured) as the caption."""
    held = sum(r["verdict"] == "holds" for r in records)
    t = Table(title=f"{title}: {held} of {len(records)} decision(s) hold (delivered: its 99 % interval below)",
              title_justify="left", caption_justify="left")
    for col, justify in (("problem / winner / direct call", "left"), ("published", "right"), ("delivered", "right"),
                         ("farm.ops", "right"), ("direct", "right"), ("verdict", "left")):
        t.add_column(col, justify=justify, overflow="fold",  # type: ignore[arg-type]
                     no_wrap=not col.startswith("problem"))
    notes: list[str] = []
    for r in records:
        interval = r.get("delivered_interval")
        delivered = _x(r.get("delivered"))
        if interval and all(isinstance(v, (int, float)) for v in interval):
            delivered += f"\n({interval[0]:.3f}-{interval[1]:.3f})"
        verdict = r["verdict"]
        word, _, why = verdict.partition(": ")
        style = "green" if verdict == "holds" else "yellow" if verdict.startswith(("fixed", "not verified")) else "red"
        # names break at their joints, never mid-word (farm.cli.names)
        what = [Name(f"{r['problem']} ({r['call']})"), Name(str(r["published_winner"]), style="bold")]
        if r.get("direct"):
            what.append(Name(f"vs {r['direct']}", style="dim"))
        if why:
            notes.append(f"{r['problem']} ({r['call']}): {verdict}")
        t.add_row(Group(*what), _x(r.get("published")), delivered, _ms(r.get("replay_ms")), _ms(r.get("direct_ms")),
                  Text(word, style=style))
        notes += [f"{r['problem']} ({r['call']}): {n}" for n in r.get("notes") or ()]
    notes.append(DEFINITIONS)
    t.caption = Text("\n".join(dict.fromkeys(notes)))
    return t


# what the two figures are, in words (the table's medians are each side's own: their ratio is close to, not the same
# as, the paired figure)
DEFINITIONS = ("published: the winner's speed-up over the default as the file records it (measured where it was "
               "tuned). delivered: farm.ops' speed-up over the direct library call here, the median over the paired "
               "rounds of direct / farm.ops in each round (so it is close to, not exactly, the ratio of the two "
               "medians beside it), its 99 % interval under it.")
