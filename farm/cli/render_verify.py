"""Tables of farm verify's checks (farm verify, and farm tune's check after its reduce)."""

from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table
from rich.text import Text


def _x(value: Any) -> str:
    return f"{value:.3f}x" if isinstance(value, (int, float)) else "-"


def _ms(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value * 1e3:.1f} us" if value < 1.0 else f"{value:.3f} ms"


def verified_lines(records: Sequence[dict[str, Any]], *, title: str = "farm verify") -> Text:
    """The checks in a few lines: how many hold, and each one that does not (the table: -v, farm report)."""
    held = sum(r["verdict"] == "holds" for r in records)
    lines = [f"{title}: {held} of {len(records)} decision(s) hold (farm.ops beside the direct call)"]
    for r in records:
        if r["verdict"] != "holds":  # its note (why a flagged default is no loss): -v
            lines.append(f"  {r['problem']} ({r['call']}): {r['verdict'].split(' (the default is published')[0]}")
    return Text("\n".join(lines), style="" if held == len(records) else "yellow")


def verified_table(records: Sequence[dict[str, Any]], *, title: str = "farm verify") -> Table:
    """One row per decision checked: what was published, what farm.ops delivers beside the direct call, and
    the verdict; notes (host CPUs, decisions not measured) as the caption."""
    held = sum(r["verdict"] == "holds" for r in records)
    t = Table(title=f"{title}: {held} of {len(records)} decision(s) hold", title_justify="left")
    for col, justify in (("problem", "left"), ("call", "left"), ("published winner", "left"), ("published", "right"),
                         ("delivered (99 % interval)", "right"), ("farm.ops", "right"), ("direct call", "right"),
                         ("verdict", "left")):
        t.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    notes: list[str] = []
    for r in records:
        interval = r.get("delivered_interval")
        delivered = _x(r.get("delivered"))
        if interval and all(isinstance(v, (int, float)) for v in interval):
            delivered += f" ({interval[0]:.3f}-{interval[1]:.3f})"
        verdict = r["verdict"]
        style = "green" if verdict == "holds" else "yellow" if verdict.startswith(("fixed", "not verified")) else "red"
        t.add_row(Text(r["problem"]), Text(r["call"]), Text(r["published_winner"]), _x(r.get("published")),
                  delivered, _ms(r.get("replay_ms")), Text(f"{_ms(r.get('direct_ms'))} {r.get('direct') or ''}".strip()),
                  Text(verdict, style=style))
        notes += [f"{r['problem']} ({r['call']}): {n}" for n in r.get("notes") or ()]
    if notes:
        t.caption = Text("\n".join(dict.fromkeys(notes)), justify="left")
    return t
