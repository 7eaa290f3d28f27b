"""The confirmation stage's rows read into the decisions: each problem with a stage is decided from its latest
whole session per calling mode (farm.tuner.judging.winner.decide_stage), and the stage's rows join the decided table so
the winner's row is there."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa

from farm.store.dataset import ResultsDataset
from farm.store.deciding.loading import COLUMNS, key_at, knobs_of, label_of, load_confirmations, strings
from farm.model.records import CALL_ORDER
from farm.store.deciding.records import CONFIRM, Confirmation, StageFailure, Winner
from farm.tuner.judging.paired import paired_ratio
from farm.tuner.judging.winner import confirmed_why, decide_stage, is_noisy

if TYPE_CHECKING:
    from farm.store.deciding.rule import Compared

Key = tuple[str, str]  # (signature, problem key)


class StageRows:
    """The columns of the stage's whole sessions, sorted newest first within a (signature, problem, calling mode)."""

    def __init__(self, conf: pa.Table) -> None:
        self.table = conf
        col = {c: strings(conf[c]).to_pylist() for c in ("device_signature", "problem_key", "call", "session_id",
                                                         "candidate_key", "engine_name", "host_cpu", "call_path")}
        self.sigs, self.pkeys, self.calls = col["device_signature"], col["problem_key"], col["call"]
        self.sessions, self.keys, self.names = col["session_id"], col["candidate_key"], col["engine_name"]
        self.cpus, self.paths = col["host_cpu"], col["call_path"]
        self.costs = conf["tuning_ms"].to_numpy(zero_copy_only=False).astype(float)
        self.per_sample, self.set_counts = conf["calls_per_sample"].to_pylist(), conf["input_sets"].to_pylist()
        lists = conf["samples_ms"].combine_chunks()
        self.values = lists.values.to_numpy(zero_copy_only=False).astype(float)
        self.offsets = lists.offsets.to_numpy()

    def samples(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def latest_sessions(self, failures: dict[Key, dict[str, StageFailure]]) -> dict[tuple[str, str, str], list[int]]:
        """(signature, problem, call) -> the rows of its newest session, less the candidates that failed a stage."""
        groups: dict[tuple[str, str, str], list[int]] = {}
        latest: dict[tuple[str, str, str], str] = {}
        for i, key in enumerate(zip(self.sigs, self.pkeys, self.calls)):
            if key not in latest:
                latest[key] = self.sessions[i]  # rows are sorted newest first within a problem and mode
            if self.sessions[i] == latest[key] and self.keys[i] not in failures.get(key[:2], ()):
                groups.setdefault(key, []).append(i)
        return groups


@dataclass(frozen=True)
class StageDecision:
    """One problem's stage in one calling mode, decided: its rows in ranking order and what they say."""

    rows: list[int]  # StageRows rows, in decide_stage's order
    dec: Any  # farm.tuner.judging.winner.StageDecision
    median: list[float]
    mad: list[float]
    samples: list[np.ndarray]

    def ranking(self) -> list[int]:
        """The rows, the winner first, then by median."""
        w = self.dec.winner
        return [self.rows[w]] + [self.rows[j] for j in sorted(range(len(self.rows)), key=lambda j: (self.median[j], j))
                                 if j != w]


def apply_confirmations(data: ResultsDataset, table: pa.Table, c: "Compared", d: Any, winners: dict[Key, Winner],
                        failures: dict[Key, dict[str, StageFailure]] | None = None,
                        default_failed: dict[Key, StageFailure] | None = None,
                        top: dict[Key, list[int]] | None = None) -> tuple[pa.Table, dict[Key, Winner]]:
    """Decide every problem that has a confirmation stage from its latest session per calling mode.

    A candidate in ``failures`` (failed in a stage) is in no decision; where the default is one of them
    (``default_failed``), the rest are compared with no one given the default's benefit of the doubt.
    ``top`` (the main round's ranking per problem) is updated in place: a decided problem's ranking is its stage's."""
    failures, default_failed = failures or {}, default_failed or {}
    conf = load_confirmations(data)
    if conf.num_rows == 0:
        return table, winners
    conf = conf.sort_by([("device_signature", "ascending"), ("problem_key", "ascending"), ("call", "ascending"),
                         ("measured_at", "descending")])
    stage = StageRows(conf)
    defaults = {(c.sigs[g], c.pkeys[g]): c.keys[c.rows[r]] for g, r in enumerate(d.default.tolist()) if r >= 0}
    offset = table.num_rows
    decided: dict[Key, list[Winner]] = {}
    stage_top: dict[tuple[str, str, str], list[int]] = {}
    for (sig, pkey, call), rows in stage.latest_sessions(failures).items():
        main = winners.get((sig, pkey))
        if main is None or len(rows) < 2:
            continue
        found = _decide(stage, rows, defaults.get((sig, pkey)), c.incumbent_keys.get((sig, pkey)),
                        default_failed.get((sig, pkey)))
        decided.setdefault((sig, pkey), []).append(
            _stage_winner(main, stage, found, call, offset, default_failed.get((sig, pkey)),
                          tuple(f.describe() for f in failures.get((sig, pkey), {}).values())))
        stage_top[(sig, pkey, call)] = [offset + i for i in found.ranking()]
    if not decided:
        return table, winners
    out = _merge(winners, decided, stage_top, top, table, stage, offset)
    return pa.concat_tables([table, conf.select(list(COLUMNS))], promote_options="permissive"), out


def _decide(stage: StageRows, rows: list[int], default_key: str | None, incumbent_key: str | None,
            gone: StageFailure | None) -> StageDecision:
    keys = [stage.keys[i] for i in rows]
    dec, order = decide_stage(keys, [stage.samples(i) for i in rows], default_key=default_key,
                              incumbent_key=incumbent_key, default_flags=[k.endswith(":[]") for k in keys],
                              default_failed=gone is not None)
    rows = [rows[j] for j in order]
    samples = [stage.samples(i) for i in rows]
    med = [float(np.median(x)) if len(x) else math.nan for x in samples]
    mad = [float(np.median(np.abs(x - m))) if len(x) else math.nan for x, m in zip(samples, med)]
    return StageDecision(rows, dec, med, mad, samples)


def _stage_winner(main: Winner, stage: StageRows, found: StageDecision, call: str, offset: int,
                  gone: StageFailure | None, failed: tuple[str, ...]) -> Winner:
    """The problem's decision for ``call`` from its stage: ``main`` (the main round's) with the stage's figures."""
    rows, dec, med, samples = found.rows, found.dec, found.median, found.samples
    label = _labeller(stage, rows)
    w, ref = dec.winner, dec.reference
    fastest = min(range(len(rows)), key=lambda j: (med[j], j))
    confirmation = _confirmation(stage, found, call, label, gone, failed)
    phrase = confirmed_why(dec, label)
    if gone is not None:
        against = (dec.versus.describe() + " against " + label(dec.best) if dec.versus and dec.best >= 0
                   else "nothing else finished")
        phrase = (f"the default, {gone.label}, failed in the confirmation stage ({gone.reason}): "
                  f"{label(w)} is the fastest of the rest ({against})")
    elif failed:
        phrase = f"{phrase}; failed in the confirmation stage, never published: {'; '.join(failed)}"
    return dataclasses.replace(
        main, engine_name=stage.names[rows[w]], knobs=knobs_of(stage.keys[rows[w]]), median_ms=med[w],
        min_ms=float(np.min(samples[w])) if len(samples[w]) else None, mad_ms=found.mad[w],
        noisy=bool(is_noisy(np.array([med[w]]), np.array([found.mad[w]]))[0]), rule=dec.rule,
        why=phrase, fastest=label(fastest), fastest_ms=med[fastest],
        default=gone.label if gone is not None else label(ref), default_ms=None if gone is not None else med[ref],
        row=offset + rows[w], confirmed=confirmation, round=CONFIRM,
        default_row=offset + rows[ref] if ref >= 0 and gone is None else -1)


def _labeller(stage: StageRows, rows: list[int]) -> Callable[[int], str]:
    def label(j: int) -> str:
        return label_of(stage.names[rows[j]], stage.keys[rows[j]]) if j >= 0 else ""

    return label


def _confirmation(stage: StageRows, found: StageDecision, call: str, label: Callable[[int], str],
                  gone: StageFailure | None, failed: tuple[str, ...]) -> Confirmation:
    rows, dec, samples = found.rows, found.dec, found.samples
    w, ref, versus = dec.winner, dec.reference, dec.versus
    best = dec.challengers.get(dec.best) if dec.best >= 0 else None
    ties = tuple(label(j) for j in range(len(rows)) if j != w and paired_ratio(samples[j], samples[w]).includes_one())
    won = w != ref and versus is not None
    return Confirmation(
        call=call, rounds=min((len(x) for x in samples), default=0), settled=dec.settled,
        cost_ms=float(np.nansum(stage.costs[rows])), speedup=versus.speedup if won else None,
        low=versus.speedup_low if won else None, high=versus.speedup_high if won else None,
        best=label(dec.best), best_speedup=best.speedup if best else None,
        best_low=best.speedup_low if best else None, best_high=best.speedup_high if best else None, ties=ties,
        host_cpus=tuple(sorted({stage.cpus[i] for i in rows if stage.cpus[i]})),
        calls_per_sample=stage.per_sample[rows[ref]], input_sets=stage.set_counts[rows[ref]],
        default_call=stage.paths[rows[ref]] or "", default_failed=gone.reason if gone is not None else "",
        failed=failed, tie=dec.tie)


def _merge(winners: dict[Key, Winner], decided: dict[Key, list[Winner]], stage_top: dict[tuple[str, str, str], list[int]],
           top: dict[Key, list[int]] | None, table: pa.Table, stage: StageRows, offset: int) -> dict[Key, Winner]:
    """Each decided problem's decisions, its first calling mode's primary (CALL_ORDER), the others beside it; its
    ranking the stage's, then the main round's candidates the stage did not measure."""
    out = dict(winners)
    for key, found in decided.items():
        found.sort(key=lambda w: CALL_ORDER.get(w.call, len(CALL_ORDER)))
        out[key] = dataclasses.replace(found[0], others=tuple(found[1:]))
        if top is not None:
            mine = stage_top[(*key, found[0].call)]
            measured = {stage.keys[i - offset] for i in mine}
            top[key] = mine + [i for i in top.get(key, []) if key_at(table, i) not in measured]
    return out
