"""farm verify's checks read into the decisions: each decision in force gets its newest check (per calling mode),
and a decision a check fixed publishes the default in its place (rule ``not_delivered``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from farm.model.ids import engine_name_to_id
from farm.model.knobs import KnobSettings
from farm.store.dataset import ResultsDataset
from farm.store.deciding.loading import COLUMNS, key_at, knobs_of, label_of, load_confirmations, strings
from farm.store.deciding.records import VERIFY, Verification, Winner
from farm.model.plans import candidate_key
from farm.tuner.judging.paired import paired_ratio
from farm.tuner.judging.winner import ConfirmedRule

Key = tuple[str, str]  # (signature, problem key)
Pair = tuple[int, int]  # a check's (replay row, direct row)


class VerifyRows:
    """farm verify's whole sessions, newest first per (signature, problem, calling mode): (replay row, direct row)."""

    def __init__(self, ver: pa.Table) -> None:
        self.col = {name: strings(ver[name]).to_pylist() for name in (
            "device_signature", "problem_key", "call", "session_id", "candidate_key", "engine_name", "call_path",
            "verdict", "host_cpu")}
        self.per_sample, self.set_counts = ver["calls_per_sample"].to_pylist(), ver["input_sets"].to_pylist()
        self.stamps = pc.cast(ver["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)
        self.when = pc.strftime(ver["measured_at"].cast(pa.timestamp("s", tz="UTC"), safe=False),
                                format="%Y-%m-%dT%H:%M:%SZ").to_pylist()
        lists = ver["samples_ms"].combine_chunks()
        self.values = lists.values.to_numpy(zero_copy_only=False).astype(float)
        self.offsets = lists.offsets.to_numpy()
        self.sessions = self._sessions()

    def _sessions(self) -> dict[tuple[str, str, str], list[Pair]]:
        col, by_id = self.col, {}
        for i, sid in enumerate(col["session_id"]):
            by_id.setdefault(sid, []).append(i)
        out: dict[tuple[str, str, str], list[Pair]] = {}
        for rows in sorted(by_id.values(), key=lambda r: r[0]):
            replay = next((i for i in rows if col["call_path"][i] == "replay"), None)
            direct = next((i for i in rows if i != replay), None)
            if replay is not None and direct is not None:
                key = (col["device_signature"][replay], col["problem_key"][replay], col["call"][replay])
                out.setdefault(key, []).append((replay, direct))
        return out

    def samples(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def check(self, call: str, replay: int, direct: int) -> Verification:
        r = paired_ratio(self.samples(replay), self.samples(direct))
        ok = r.rounds > 0 and math.isfinite(r.ratio)
        col = self.col
        return Verification(call=call, delivered=r.speedup if ok else None, low=r.speedup_low if ok else None,
                            high=r.speedup_high if ok else None, rounds=r.rounds, verdict=col["verdict"][replay],
                            host_cpu=col["host_cpu"][replay],
                            direct=label_of(col["engine_name"][direct], col["candidate_key"][direct]),
                            calls_per_sample=self.per_sample[replay], input_sets=self.set_counts[replay],
                            verified_at=self.when[replay])

    def newest(self, found: list[Pair], decision: Winner, since: int) -> Pair | None:
        """The newest check of ``decision``'s candidate measured at ``since`` or later."""
        want = candidate_key(engine_name_to_id(decision.engine_name), decision.knobs)
        return next(((r, d) for r, d in found if self.col["candidate_key"][r] == want and self.stamps[r] >= since), None)


def apply_verifications(data: ResultsDataset, table: pa.Table, winners: dict[Key, Winner],
                        top: dict[Key, list[int]] | None = None) -> tuple[pa.Table, dict[Key, Winner]]:
    """Attach farm verify's checks to the decisions they checked (per calling mode). The newest check of the
    decision the stage made, not older than the stage, decides: where it fixed the decision, the default is
    published in its place (rule ``not_delivered``), and the newest check of that default (a later farm verify)
    is attached to it. A check of a candidate that is not the decision (a later tune changed it) is left aside."""
    winners = _apply_hangs(data, table, winners, top)
    ver = load_confirmations(data, VERIFY)
    if ver.num_rows == 0:
        return table, winners
    ver = ver.sort_by([("device_signature", "ascending"), ("problem_key", "ascending"), ("call", "ascending"),
                       ("measured_at", "descending")])
    checks = VerifyRows(ver)
    made_at = pc.cast(table["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)
    out = dict(winners)
    for (sig, pkey, call), found in checks.sessions.items():
        main = out.get((sig, pkey))
        decision = main.for_call(call) if main is not None else None
        if decision is None:
            continue
        since = int(made_at[decision.row]) if 0 <= decision.row < len(made_at) else 0  # the stage's own time
        hit = checks.newest(found, decision, since)
        if hit is None:
            continue
        decision, fixed = _checked(checks, found, hit, decision, call, table.num_rows)
        if fixed and top is not None and main.for_call(call) is main:  # the published default ranks first
            direct_key = checks.col["candidate_key"][hit[1]]
            top[(sig, pkey)] = [decision.row] + [i for i in top.get((sig, pkey), []) if key_at(table, i) != direct_key]
        out[(sig, pkey)] = main.with_call(call, decision)  # type: ignore[union-attr]
    return pa.concat_tables([table, ver.select(list(COLUMNS))], promote_options="permissive"), out


def _checked(checks: VerifyRows, found: list[Pair], hit: Pair, decision: Winner, call: str, offset: int
             ) -> tuple[Winner, bool]:
    """``decision`` with its newest check attached, or, where that check fixed it, the default in its place
    (and True)."""
    check = checks.check(call, *hit)
    if not check.fixed:
        return dataclasses.replace(decision, verified=check), False
    direct = hit[1]
    fixed = _fixed(decision, check, checks.col["engine_name"][direct], knobs_of(checks.col["candidate_key"][direct]),
                   checks.samples(direct), offset + direct)
    later = checks.newest(found, fixed, int(checks.stamps[hit[0]]))  # the default's own check since, if any
    if later is not None and later != hit:
        fixed = dataclasses.replace(fixed, verified=checks.check(call, *later))
    return fixed, True


def _fixed(decision: Winner, check: Verification, engine: str, knobs: KnobSettings, samples: np.ndarray,
           row: int) -> Winner:
    """The default in place of a decision farm verify fixed, timed by that check's direct calls."""
    med = float(np.median(samples)) if len(samples) else math.nan
    return decision.default_in_place(
        engine, knobs, median_ms=med, min_ms=float(np.min(samples)) if len(samples) else None,
        mad_ms=float(np.median(np.abs(samples - med))) if len(samples) else None, row=row,
        rule=ConfirmedRule.NOT_DELIVERED, verified=check, round=VERIFY,
        why=f"default published by farm verify: {decision.label} {check.verdict.split(': ', 1)[-1]}")


HUNG_COLUMNS = ("device_signature", "problem_key", "call", "candidate_key", "verdict", "host_cpu", "measured_at")


def _apply_hangs(data: ResultsDataset, table: pa.Table, winners: dict[Key, Winner],
                 top: dict[Key, list[int]] | None) -> dict[Key, Winner]:
    """Decisions whose replay hung in a check that fixed them (a ``timed_out`` verify row, no samples): the
    default in their place, timed by the stage that measured it (nothing of the check ended to time it)."""
    hung = data.table(list(HUNG_COLUMNS), filter=(ds.field("round") == VERIFY)
                      & (ds.field("disposition") == "timed_out"))
    if hung.num_rows == 0:
        return winners
    made_at = pc.cast(table["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)
    stamps = pc.cast(hung["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)
    out = dict(winners)
    for i in np.argsort(-stamps, kind="stable"):  # the newest check of a decision decides
        r = {c: hung[c][int(i)].as_py() for c in HUNG_COLUMNS}
        main = out.get((r["device_signature"], r["problem_key"]))
        decision = main.for_call(r["call"] or "") if main is not None else None
        if decision is None or decision.default_row < 0 or not str(r["verdict"] or "").startswith("fixed"):
            continue
        if r["candidate_key"] != candidate_key(engine_name_to_id(decision.engine_name), decision.knobs) \
                or stamps[i] < (made_at[decision.row] if 0 <= decision.row < len(made_at) else 0):
            continue
        row = decision.default_row
        engine = str(table["engine_name"][row].as_py())
        check = Verification(call=r["call"] or "", delivered=None, low=None, high=None, rounds=0,
                             verdict=str(r["verdict"]), host_cpu=str(r["host_cpu"] or ""), direct=decision.default or "",
                             calls_per_sample=None, input_sets=None, verified_at=str(r["measured_at"]))
        fixed = decision.default_in_place(
            engine, knobs_of(key_at(table, row)), median_ms=decision.default_ms or math.nan, min_ms=None, mad_ms=None,
            row=row, rule=ConfirmedRule.NOT_DELIVERED, verified=check,
            why=f"default published by farm verify: {decision.label} hangs where it is replayed")
        if top is not None and main.for_call(r["call"] or "") is main:  # type: ignore[union-attr]
            key = (r["device_signature"], r["problem_key"])
            top[key] = [row] + [j for j in top.get(key, []) if j != row]
        out[(r["device_signature"], r["problem_key"])] = main.with_call(r["call"] or "", fixed)  # type: ignore
    return out
