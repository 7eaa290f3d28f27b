"""Compare two result sets or two override files: which winners changed, and by how much.

    farm diff runs/before/results runs/after/results     # per signature and problem
    farm diff old/<sig>.json new/<sig>.json              # override files, by match key
    farm diff runs/before/overrides runs/after/overrides # folders of override files (or two published roots)

Both kinds compare the same thing, the reducer's decision (farm.tuner.judging.winner): a results folder is
decided the way ``farm tune`` decided it (with its job's incumbents), an override file holds the
decision already. So the diff of two run folders and the diff of their override files agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable

from farm.errors import InputError
from farm.store.dataset import results_folder
from farm.store.location import Location
from farm.store.publish.published import INDEX

NEAR_TIE = 0.03  # a changed winner within 3 % of the old one's time counts as a near tie
# a same winner whose time moved by more than this (or than 3 sigma of both sides' noise, where larger)
TIME_CHANGE = 0.05
# "confirmed tie": a confirmation stage that decided measured both winners in paired rounds, their interval holding 1
STATUSES = ("added", "removed", "winner changed", "time changed", "near tie", "confirmed tie", "same winner")


@dataclass(frozen=True)
class DiffRow:
    signature: str
    problem: str
    status: str  # one of STATUSES
    old_winner: str
    new_winner: str
    old_ms: float | None
    new_ms: float | None
    new_tie: bool = False  # the new side published its default: a tie within noise (no challenger shown faster)

    @property
    def changed(self) -> bool:
        """The published winner (engine and knobs) differs: what a replay runs changed, a tie or not."""
        return bool(self.old_winner and self.new_winner and self.old_winner != self.new_winner)

    @property
    def ratio(self) -> float | None:
        """new time / old time (below 1: faster now)."""
        return self.new_ms / self.old_ms if self.old_ms and self.new_ms else None


@dataclass(frozen=True)
class _Side:
    """One problem's winner on one side: where it is, what it is called, what it runs, its median time."""

    signature: str
    problem: str
    winner: str  # engine[knobs]
    ms: float | None
    ties: tuple[str, ...] = ()  # candidates its confirmation stage could not tell from it (paired interval holds 1)
    mad: float | None = None  # its median absolute deviation, ms, where recorded
    settled: bool = True  # its stage decided (before its budget ended, or a tie within noise when it did): an
    # undecided stage's "ties" are no verdict
    shared: Hashable = None  # an override rule's key in both spellings (hipdnn_dialect.shared_key), with its signature
    tie: bool = False  # its default published: its stage's budget ended with no challenger faster (a tie in noise)


def diff_paths(a: str | Path, b: str | Path) -> list[DiffRow]:
    """Two override files (local), or two results folders / job folders (local or ``pyarrow.fs`` URIs)."""
    la, lb = Location.of(a), Location.of(b)
    for loc in (la, lb):
        if not loc.exists():
            raise InputError("not found", source=str(loc))
    if not la.is_dir() and not lb.is_dir() and la.local and lb.local:
        return compare(*_both_overrides(la.local_path, lb.local_path))
    if la.is_dir() and lb.is_dir():
        kinds = [_folder_kind(x) for x in (la, lb)]
        if kinds == ["overrides", "overrides"]:
            return compare(_from_override_folder(la.local_path), _from_override_folder(lb.local_path))
        if kinds == ["results", "results"]:
            # a run folder (farm tune --out) works too
            ra, rb = (Location.of(results_folder(x)) for x in (a, b))
            return compare(_from_results(ra), _from_results(rb))
    raise InputError("compare two override files, two folders of override files or two results folders, not one of "
                     "each", source=f"{a} vs {b}")


def _override_files(folder: Path) -> list[Path]:
    """The override files of a folder: ``<signature>.json`` in it (a run's overrides/) or one level down (a
    published root, ROOT/<arch>/<signature>.json); hidden files and the root's index.json are not."""
    found = [*folder.glob("*.json"), *folder.glob("*/*.json")]
    return sorted(p for p in found if not p.name.startswith(".") and p.name != INDEX)


def _folder_kind(loc: Location) -> str:
    """``results`` (Parquet results, or a run folder) or ``overrides`` (override files only). A local folder with
    neither is an error: a diff of it would say "no change" of nothing."""
    if not loc.local:
        return "results"  # a pyarrow.fs URI: a results folder
    folder = Path(results_folder(loc.local_path))
    if any(folder.glob("device_signature=*")):
        return "results"
    if _override_files(loc.local_path):
        return "overrides"
    raise InputError("holds no results (device_signature=<signature>/op=<op>/ Parquet) and no override files "
                     "(<signature>.json)", source=str(loc))


def _from_override_folder(folder: Path) -> dict[Hashable, _Side]:
    """Every file's winners; two files of one device signature are an error naming both (which one a diff
    should take is the user's to say: merged silently, one file's winners would hide the other's)."""
    sides: dict[Hashable, _Side] = {}
    seen: dict[str, Path] = {}
    for path in _override_files(folder):
        got = _from_overrides(path)
        sig = next((side.signature for side in got.values()), "")
        if sig and sig in seen:
            raise InputError(f"two override files of device signature {sig}: {seen[sig]} and {path}; diff one of "
                             "them (give its path) or move the other out of the folder", source=str(folder))
        seen.setdefault(sig, path)
        sides.update(got)
    return sides


PARALLEL_BYTES = 8 * 2**20  # two files at least this large are read side by side, in a second process


def _both_overrides(a: Path, b: Path) -> tuple[dict[Hashable, _Side], dict[Hashable, _Side]]:
    """Both sides of a diff of override files. Large ones (100,000 entries: seconds of parsing each) are read in
    parallel where a second core and ``fork`` are there: the old side in a child process, the new one here."""
    import multiprocessing

    from farm.devices.runtimes.cpu import usable_cores

    if min(a.stat().st_size, b.stat().st_size) < PARALLEL_BYTES or usable_cores() < 2 \
            or "fork" not in multiprocessing.get_all_start_methods():
        return _from_overrides(a), _from_overrides(b)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        old = pool.apply_async(_from_overrides, (a,))
        new = _from_overrides(b)
        return old.get(), new


def _from_overrides(path: Path) -> dict[Hashable, _Side]:
    from farm.store.overrides.hipdnn_dialect import shared_key
    from farm.store.overrides.parsing import load_overrides
    from farm.store.publish.root import entry_desc, entry_label, entry_ms, check_knobs

    f = load_overrides(path)
    check_knobs(f, str(path))  # a knob value of the wrong type is an error here as in farm publish
    sig = f.device_signature or ""
    return {(sig, e.match_key()): _Side(sig, entry_label(e), entry_desc(e), entry_ms(e), _ties(e), _mad(e), _settled(e),
                                        (sig, shared_key(e)), _tie(e))
            for e in f.entries}


def _paired_across_spellings(old: dict[Hashable, _Side], new: dict[Hashable, _Side]) -> dict[Hashable, _Side]:
    """``new`` with each rule no rule of ``old`` shares a match key with, but one alone shares its key in both
    spellings with, filed under that rule's key: a file and the one ``farm publish --dialect hipdnn`` made of it
    (no outputs or bias, hipDNN's names) hold the same rules."""
    def alone(side: dict[Hashable, _Side], others: dict[Hashable, _Side]) -> dict[Hashable, Hashable]:
        keys: dict[Hashable, list[Hashable]] = {}
        for k, v in side.items():
            if k not in others and v.shared is not None:
                keys.setdefault(v.shared, []).append(k)
        return {shared: ks[0] for shared, ks in keys.items() if len(ks) == 1}

    old_alone, new_alone = alone(old, new), alone(new, old)
    moved = {new_alone[s]: old_alone[s] for s in new_alone.keys() & old_alone.keys()}
    return {moved.get(k, k): v for k, v in new.items()} if moved else new


def _mad(e: Any) -> float | None:
    v = (e.metadata or {}).get("mad_ms")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


def _settled(e: Any) -> bool:
    """Whether an entry's confirmation stage decided: ``settled``, or a ``tie`` within noise when its budget ended
    (True where not recorded false)."""
    conf = ((e.metadata or {}).get("selection") or {}).get("confirmation")
    return not (isinstance(conf, dict) and conf.get("settled") is False and conf.get("tie") is not True)


def _tie(e: Any) -> bool:
    """An entry whose confirmation stage ended in a tie within noise (its default published)."""
    conf = ((e.metadata or {}).get("selection") or {}).get("confirmation")
    return isinstance(conf, dict) and conf.get("tie") is True


def _ties(e: Any) -> tuple[str, ...]:
    """``autotune_metadata.selection.confirmation.ties`` of an entry (strings only; anything else: none)."""
    found = (((e.metadata or {}).get("selection") or {}).get("confirmation") or {}).get("ties") \
        if isinstance(((e.metadata or {}).get("selection") or {}).get("confirmation"), dict) else None
    return tuple(x for x in found if isinstance(x, str)) if isinstance(found, list) else ()


def _from_results(folder: Location) -> dict[Hashable, _Side]:
    from farm.store.deciding.rule import decide_folder

    d = decide_folder(folder)
    return {key: _Side(w.signature, w.problem_name, w.label, w.median_ms, w.confirmed.ties if w.confirmed else (),
                       w.mad_ms, w.confirmed.decided if w.confirmed else True,
                       tie=bool(w.confirmed is not None and w.confirmed.tie)) for key, w in d.winners.items()}


def _time_changed(o: _Side, n: _Side) -> bool:
    """The same winner, its time moved beyond noise: by more than TIME_CHANGE, and by more than 3 sigma of the two
    sides' recorded noise (sigma = 1.4826 MAD)."""
    if not (o.ms and n.ms):
        return False
    noise = 3 * 1.4826 * ((o.mad or 0.0) ** 2 + (n.mad or 0.0) ** 2) ** 0.5
    return abs(n.ms - o.ms) > max(TIME_CHANGE * o.ms, noise)


def compare(old: dict[Hashable, _Side], new: dict[Hashable, _Side]) -> list[DiffRow]:
    """One row per problem on either side (the same rules for results folders and override files)."""
    new = _paired_across_spellings(old, new)
    rows = []
    for key in sorted(set(old) | set(new), key=lambda k: ((old.get(k) or new.get(k)).signature,  # type: ignore[union-attr]
                                                          (new.get(k) or old.get(k)).problem)):  # type: ignore[union-attr]
        o, n = old.get(key), new.get(key)
        if o is None:
            assert n is not None
            rows.append(DiffRow(n.signature, n.problem, "added", "", n.winner, None, n.ms))
        elif n is None:
            rows.append(DiffRow(o.signature, o.problem, "removed", o.winner, "", o.ms, None))
        else:
            status = "same winner" if o.winner == n.winner else "winner changed"
            if status == "same winner" and _time_changed(o, n):
                status = "time changed"
            elif status == "winner changed" and ((n.settled and o.winner in n.ties) or (o.settled and n.winner in o.ties)):
                # measured together by a stage that decided, the two could not be told apart (a stage whose budget
                # ended undecided ties everything it could not separate yet: that is no verdict)
                status = "confirmed tie"
            elif status == "winner changed" and o.ms and n.ms and abs(n.ms / o.ms - 1) <= NEAR_TIE:
                status = "near tie"  # another candidate by a hair: measurement noise, not a new best kernel
            rows.append(DiffRow(n.signature, n.problem, status, o.winner, n.winner, o.ms, n.ms, n.tie))
    return rows


def headline(rows: list[DiffRow]) -> str:
    """What changed, in one phrase: every problem whose published winner changed is counted (a tie included:
    what a replay runs is another kernel); "no change" only where both sides select the same for every problem."""
    changed = [r for r in rows if r.changed]
    to_tie = sum(r.new_tie for r in changed)
    parts = []
    if changed:
        parts.append(f"{len(changed)} winner{'s' if len(changed) != 1 else ''} changed" +
                     (f", {to_tie} of them to a tie: the default published" if to_tie else ""))
    for status in ("added", "removed", "time changed"):
        n = sum(r.status == status for r in rows)
        if n:
            parts.append(f"{n} {status}")
    return "; ".join(parts) if parts else "no change"


def diff_dict(rows: list[DiffRow]) -> dict[str, Any]:
    return {"rows": [{"signature": r.signature, "problem": r.problem, "status": r.status, "old_winner": r.old_winner or None,
                      "new_winner": r.new_winner or None, "old_ms": r.old_ms, "new_ms": r.new_ms, "ratio": r.ratio,
                      "winner_changed": r.changed, "new_tie": r.new_tie}
                     for r in rows],
            "counts": {s: sum(r.status == s for r in rows) for s in STATUSES},
            "winners_changed": sum(r.changed for r in rows),
            "winners_changed_to_a_tie": sum(r.changed and r.new_tie for r in rows),
            "headline": headline(rows)}
