"""``farm engines``, ``farm devices`` and ``farm policies``: the tables and ``--json`` of what this install has."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from rich.table import Table
from rich.text import Text

from farm.cli.tables.cards import cards
from farm.cli.tables.runs import fmt_bytes
from farm.model.engine import Engine, EngineRegistry, engine_id, user_knobs


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


def engines_cards(registry: EngineRegistry, engines: Iterable[Engine], here: dict[str, str] | None = None) -> Any:
    """farm engines at fewer than WIDE columns: an engine a block, its name whole."""
    records = []
    for e in engines:
        described = [k.describe() for k in user_knobs(e)]
        if len(described) > FOLD_KNOBS:
            described = described[:FOLD_KNOBS - 1] + [f"... and {len(described) - FOLD_KNOBS + 1} more "
                                                      f"(farm engines --json)"]
        fields = [("ops", ", ".join(sorted(e.ops))), ("id", str(engine_id(e))), ("knobs", "\n".join(described) or "-"),
                  ("exhaustive", "yes" if e.supports_exhaustive else "no"), ("from", registry.origin(e))]
        if here is not None:
            fields.append(("runs here", here.get(e.name, "")))
        records.append((e.name, fields))
    return cards("Engines", records)


def devices_cards(probes: Any) -> Any:
    """farm devices at fewer than WIDE columns: a device a block, its signature whole."""
    records, notes = [], []
    for p in probes:
        for d in p.devices:
            records.append((f"{p.runtime}:{d.index} {d.name}", [
                ("signature", d.signature), ("arch", d.arch), ("units", str(d.compute_units)),
                ("memory", fmt_bytes(d.total_memory)), ("L2", fmt_bytes(d.l2_bytes)),
                ("clock", f"{d.clock_mhz} MHz" if d.clock_mhz else "-"),
                ("driver / runtime", f"{d.driver_version or '-'} / {d.runtime_version or '-'}"),
                ("libraries", "\n".join(f"{k} {v}" for k, v in d.libraries) or "-")]))
        if p.note:
            notes.append(f"{p.runtime}: {p.note}")
    return cards("Devices", records, "\n".join(notes))


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


def policies_table(registry: Any, order: Sequence[str]) -> Table:
    table = Table(title="Selection policies (order in force: " + " > ".join(order) + ")", title_justify="left")
    for col, justify in (("#", "right"), ("name", "left"), ("id", "right"), ("API", "left"), ("origin", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for info in registry.info():
        pos = str(order.index(info.name) + 1) if info.name in order else "-"
        table.add_row(pos, Text(info.name), str(info.id), ".".join(map(str, info.api_version)), Text(info.origin))
    return table
