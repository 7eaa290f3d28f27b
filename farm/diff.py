"""Compare two result sets or two override files: which winners changed, and by how much.

    farm diff runs/before/results runs/after/results     # per signature and problem
    farm diff old/<sig>.json new/<sig>.json              # override files, by match key
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError

NEAR_TIE = 0.03  # winners of two result sets within 3 % of each other count as a tie
STATUSES = ("added", "removed", "winner changed", "near tie", "same winner")


@dataclass(frozen=True)
class DiffRow:
    signature: str
    problem: str
    status: str  # added, removed, winner changed, near tie, same winner
    old_winner: str
    new_winner: str
    old_ms: float | None
    new_ms: float | None

    @property
    def ratio(self) -> float | None:
        """new time / old time (below 1: faster now)."""
        return self.new_ms / self.old_ms if self.old_ms and self.new_ms else None


def diff_paths(a: str | Path, b: str | Path) -> list[DiffRow]:
    pa, pb = Path(a), Path(b)
    for p in (pa, pb):
        if not p.exists():
            raise InputError("not found", source=str(p))
    if pa.is_file() and pb.is_file():
        return _diff_overrides(pa, pb)
    if pa.is_dir() and pb.is_dir():
        return _diff_results(_results_dir(pa), _results_dir(pb))
    raise InputError("compare two override files or two results folders, not one of each", source=f"{pa} vs {pb}")


def _results_dir(p: Path) -> Path:
    return p / "results" if (p / "results").is_dir() else p  # a run folder works too


def _diff_overrides(a: Path, b: Path) -> list[DiffRow]:
    from .overrides import load_overrides
    from .publish import diff_entries

    fa, fb = load_overrides(a), load_overrides(b)
    sig = fb.device_signature or fa.device_signature or ""
    added, changed, removed, _ = diff_entries(fa.entries, fb.entries)
    rows = [DiffRow(sig, c.key, "added", "", c.new_engine, None, c.new_ms) for c in added]
    rows += [DiffRow(sig, c.key, "winner changed", c.old_engine, c.new_engine, c.old_ms, c.new_ms) for c in changed]
    rows += [DiffRow(sig, c.key, "removed", c.old_engine, "", c.old_ms, None) for c in removed]
    old_by = {e.match_key(): e for e in fa.entries}
    from .publish import _desc, _label, _ms

    for e in fb.entries:
        o = old_by.get(e.match_key())
        if o is not None and (o.engine_name, o.knobs) == (e.engine_name, e.knobs):
            rows.append(DiffRow(sig, _label(e), "same winner", _desc(o), _desc(e), _ms(o), _ms(e)))
    return rows


def _diff_results(a: Path, b: Path) -> list[DiffRow]:
    from .report import build_report

    ra, rb = build_report(a), build_report(b)
    old = {(s.signature, p.key): p for s in ra.signatures for p in s.problems}
    new = {(s.signature, p.key): p for s in rb.signatures for p in s.problems}
    rows = []
    for key in sorted(set(old) | set(new)):
        o, n = old.get(key), new.get(key)
        if o is None:
            rows.append(DiffRow(key[0], n.name, "added", "", n.winner, None, n.winner_ms))  # type: ignore[union-attr]
        elif n is None:
            rows.append(DiffRow(key[0], o.name, "removed", o.winner, "", o.winner_ms, None))
        else:
            status = "same winner" if o.winner == n.winner else "winner changed"
            if status == "winner changed" and abs(n.winner_ms / o.winner_ms - 1) <= NEAR_TIE:
                status = "near tie"  # another candidate by a hair: measurement noise, not a new best kernel
            rows.append(DiffRow(key[0], n.name, status, o.winner, n.winner, o.winner_ms, n.winner_ms))
    return rows


def diff_dict(rows: list[DiffRow]) -> dict[str, Any]:
    return {"rows": [{"signature": r.signature, "problem": r.problem, "status": r.status, "old_winner": r.old_winner or None,
                      "new_winner": r.new_winner or None, "old_ms": r.old_ms, "new_ms": r.new_ms, "ratio": r.ratio}
                     for r in rows],
            "counts": {s: sum(r.status == s for r in rows) for s in STATUSES}}
