"""Engine override files: the v2 JSON of the hipDNN autotuning RFC, its entries and how they match.

    {
      "version": 2,
      "device": {"signature": "...", "properties": {...}},      # ours: which device it is for
      "engine_overrides": [
        {"op": "matmul", "engine_name": "...", "criteria": {...},
         "tensors": [{"tensor_id": "A", "dim": [...], "stride": [...], "data_type": "fp32"}, ...],
         "compute_data_type": "fp32",
         "autotune_metadata": {"rank": 0, ...,
                               "knobs": [{"knob_id": "tile", "type": "int", "value": 64}]}}  # omitted for default knobs
      ]
    }

Matching (heuristics RFC §17): an entry matches a problem with the same op, the
same number of tensors, every tensor matched by ``tensor_id`` (by position in v1
files) with equal dims (``-1`` matches any size) and strides (``[]`` or absent
matches any layout, ``-1`` any element), and every criterion it names equal.
``data_type`` and ``compute_data_type`` (our additions, so fp16 and fp32 rules of
one shape never collide) match when present. A rule must name its op's key tensors
(``key_tensors``). Exact rules (no -1 in dims or given strides) come before wildcard
rules, whatever their order in the file; within each bucket the first rule declared wins
(heuristics RFC §5.3.5, §17). Rules that give every field are found by a hash lookup.

Knobs live in ``autotune_metadata.knobs`` as the RFC lays them out (an entry-level ``knobs`` list, which
files of older tunefarm versions carry, is still read). Fields this build does not know, at any level,
are kept and written back unchanged.

Reading and writing the files: farm.store.overrides.files. Writes are atomic
(temp file + rename) and serialised across processes by a file lock, so
concurrent appenders lose no entry.
"""

from __future__ import annotations

import functools

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from farm.model.ids import engine_name_to_id
from farm.model.knobs import KnobSettings, knob_type_of
from farm.model.op_catalog import OPS
from farm.model.problem import LIBRARIES, Problem
from farm.store.overrides.hipdnn_names import mode_name, mode_to_hipdnn

log = logging.getLogger("farm.store.overrides.entries")

OVERRIDE_VERSION = 2
WRITE_MODES = ("new", "append", "replace")
# the hipDNN RFC's match key per op: a rule names at least these tensors (the others, outputs included, and
# our dtypes are optional: present they constrain the match, absent they do not) ...
KEY_TENSORS: dict[str, tuple[str, ...]] = {"sdpa_bwd": ("Q", "K", "V")}  # every other op: its required inputs
# ... and, for these ops, states these criteria: an ADD rule must not match a MUL graph
KEY_CRITERIA: dict[str, tuple[str, ...]] = {"pointwise": ("mode",), "reduction": ("mode",), "resample": ("mode",)}


def key_tensors(op: str) -> tuple[str, ...]:
    """The tensors a rule for ``op`` must name (empty for an op this build does not know)."""
    spec = OPS.get(op)
    return KEY_TENSORS.get(op, spec.inputs if spec else ())
_MEMO_LIMIT = 1 << 16  # distinct problems remembered per file before the memo starts over


@dataclass(frozen=True)
class TensorRule:
    tensor_id: str | None  # None in v1 (positional) files
    dims: tuple[int, ...]  # -1: any size
    strides: tuple[int, ...] = ()  # (): any layout; -1: any element
    data_type: str | None = None  # None: any
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)  # unknown fields, kept
    spelled: str | None = field(default=None, compare=False)  # the file's own name of data_type (HALF), kept
    id_spelled: str | None = field(default=None, compare=False)  # the file's own tensor id (x_tensor_uid), kept

    @property
    def complete(self) -> bool:
        """Every field given (found by hash)."""
        return (self.tensor_id is not None and -1 not in self.dims and bool(self.strides)
                and -1 not in self.strides and self.data_type is not None)

    @property
    def exact(self) -> bool:
        """No wildcard: no -1 in its dims, nor in its strides where it gives them (heuristics RFC §5.3.5)."""
        return -1 not in self.dims and -1 not in self.strides

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tensor_id is not None:
            out["tensor_id"] = self.id_spelled or self.tensor_id
        out["dim"] = list(self.dims)
        out["stride"] = list(self.strides)
        if self.data_type is not None:
            out["data_type"] = self.spelled or self.data_type
        if self.extra:
            out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


def _fits(rule: Sequence[int], actual: Sequence[int]) -> bool:
    return len(rule) == len(actual) and all(r == -1 or r == a for r, a in zip(rule, actual))


@dataclass(frozen=True)
class OverrideEntry:
    """One rule: problems it matches, the engine (and knobs) to use, and how it was measured."""

    op: str
    engine_name: str
    tensors: tuple[TensorRule, ...]
    criteria: tuple[tuple[str, int | None], ...] = ()  # None: a hipDNN mode none of our ops runs (matches nothing)
    knobs: KnobSettings = ()
    compute_data_type: str | None = None
    metadata: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # unknown fields, kept on rewrite
    compute_spelled: str | None = field(default=None, compare=False)  # the file's own name of compute_data_type
    # hipDNN's own spellings of the op and of criteria names (resample_fwd, pointwise_mode), kept on rewrite
    op_spelled: str | None = field(default=None, compare=False)
    # (ours, the file's name, the file's value: hipDNN's enum integer for a mode)
    criteria_spelled: tuple[tuple[str, str, int], ...] = field(default=(), compare=False)
    # parts of hipDNN's key our problems imply (a norm's norm_fwd_phase 1, its epsilon_tensor_uid): written, not matched
    implied_criteria: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    implied_tensors: tuple[Mapping[str, Any], ...] = field(default=(), compare=False, hash=False)
    # made from a validated Problem (from_canonical, for_problem): its op, tensors and criteria need no re-check
    from_problem: bool = field(default=False, compare=False, repr=False)

    @property
    def engine_id(self) -> int:
        return engine_name_to_id(self.engine_name)

    @property
    def positional(self) -> bool:
        return any(t.tensor_id is None for t in self.tensors)

    @property
    def complete(self) -> bool:
        """Every field of a problem given (so it is found by hash): all of the op's tensors, fully."""
        spec = OPS.get(self.op)
        return (spec is not None and not self.positional and all(t.complete for t in self.tensors)
                and self.compute_data_type is not None and set(dict(self.criteria)) == set(spec.criteria)
                and {t.tensor_id for t in self.tensors} >= set(spec.inputs) | set(spec.outputs))

    @property
    def exact(self) -> bool:
        """In the exact bucket (heuristics RFC §5.3.5, §17): no -1 in any tensor's dims or given strides. An exact
        rule is chosen before any wildcard rule, whatever their order in the file; within a bucket, the first."""
        return all(t.exact for t in self.tensors)

    @property
    def names_key_tensors(self) -> bool:
        """The rule states every key tensor of its op (X/W, dY/W, X/dY, A/B, Q/K/V...: ``key_tensors``): a rule
        naming only A would otherwise match every B. Outputs and our extras stay optional."""
        key = key_tensors(self.op)
        if self.positional:
            return len(self.tensors) >= len(key)
        return set(key) <= {t.tensor_id for t in self.tensors}

    @property
    def states_key_criteria(self) -> bool:
        """False for a rule of a pointwise, reduction or resample op that does not say its mode: it matches nothing."""
        named = dict(self.criteria)
        return all(k in named for k in KEY_CRITERIA.get(self.op, ()))

    def match_key(self) -> tuple[Any, ...]:
        """Identity for replace-on-append: (op, criteria, tensors by id ignoring order, compute dtype)."""
        return _match_key(self.op, self.criteria, self.tensors, self.compute_data_type)

    def matches(self, problem: Problem) -> bool:
        if problem.op != self.op or len(problem.tensors) < len(self.tensors) or not self.states_key_criteria \
                or not self.names_key_tensors:
            return False
        if self.compute_data_type is not None and self.compute_data_type != problem.compute_dtype:
            return False
        crit = problem.criteria_dict
        if any(crit.get(k) != v for k, v in self.criteria):
            return False
        if self.positional:
            order = [problem.tensor(t) for t in problem.spec.tensor_ids if problem.has_tensor(t)]
            pairs = list(zip(self.tensors, order))
        else:
            by_id = {t.id: t for t in problem.tensors}
            if any(r.tensor_id not in by_id for r in self.tensors):
                return False
            pairs = [(r, by_id[r.tensor_id]) for r in self.tensors]
        for rule, t in pairs:
            if not _fits(rule.dims, t.dims):
                return False
            if rule.strides and not _fits(rule.strides, t.strides):
                return False
            if rule.data_type is not None and rule.data_type != t.dtype:
                return False
        return True

    def differences(self, problem: Problem) -> list[str]:
        """What keeps this entry from matching ``problem``, field by field ([] when it matches)."""
        if problem.op != self.op:
            return [f"op {self.op} (the problem's: {problem.op})"]
        out = []
        if self.compute_data_type is not None and self.compute_data_type != problem.compute_dtype:
            out.append(f"compute dtype {self.compute_data_type} ({problem.compute_dtype})")
        crit = problem.criteria_dict
        spelled = {ours: (name, raw) for ours, name, raw in self.criteria_spelled}
        for k, v in self.criteria:
            if crit.get(k) == v:
                continue
            if k in spelled and spelled[k][0] != k:
                name, raw = spelled[k]
                what = f"hipDNN's {mode_name(self.op, raw)}" if k == "mode" else "hipDNN's value"
                ours = f"our {k} {v}" if v is not None else "no op here runs it"
                out.append(f"criteria.{name} {raw} ({what}: {ours}; the problem's {k}: {crit.get(k)})")
            else:
                out.append(f"criteria.{k} {v} ({crit.get(k)})")
        by_id = {t.id: t for t in problem.tensors}
        order = [problem.tensor(t) for t in problem.spec.tensor_ids if problem.has_tensor(t)]
        for i, rule in enumerate(self.tensors):
            t = order[i] if self.positional and i < len(order) else by_id.get(rule.tensor_id)
            name = rule.tensor_id or f"tensors[{i}]"
            if t is None:
                out.append(f"tensor {name} (the problem has none)")
                continue
            if not _fits(rule.dims, t.dims):
                out.append(f"{name}.dims {list(rule.dims)} ({list(t.dims)})")
            if rule.strides and not _fits(rule.strides, t.strides):
                out.append(f"{name}.strides {list(rule.strides)} ({list(t.strides)})")
            if rule.data_type is not None and rule.data_type != t.dtype:
                out.append(f"{name}.data_type {rule.data_type} ({t.dtype})")
        if not out and not self.matches(problem):
            out.append("a key tensor or criterion the op needs is not stated")
        return out

    def problem(self) -> Problem | None:
        """The one problem an exact rule describes (its tensors' dims, strides and dtypes all given), to be
        replayed as such (farm verify); None for a positional or wildcard rule, or one the op would refuse."""
        from farm.errors import InputError

        if self.positional or not self.exact or any(not t.strides or t.data_type is None for t in self.tensors):
            return None
        spec = {t.tensor_id: {"dims": list(t.dims), "strides": list(t.strides), "dtype": t.data_type}
                for t in self.tensors}
        library = (self.metadata or {}).get("library") if isinstance(self.metadata, Mapping) else None
        try:
            return Problem.create(self.op, spec, criteria=dict(self.criteria), compute_dtype=self.compute_data_type,
                                  library=library if library in LIBRARIES else "")
        except InputError:
            return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op_spelled or self.op, "engine_name": self.engine_name}
        out["criteria"] = self._criteria_json() if self.criteria_spelled else dict(self.criteria)
        out["criteria"].update(self.implied_criteria)
        out["tensors"] = [t.to_json() for t in self.tensors] + [dict(t) for t in self.implied_tensors]
        if self.compute_data_type is not None:
            out["compute_data_type"] = self.compute_spelled or self.compute_data_type
        if self.metadata is not None or self.knobs:
            meta = dict(self.metadata or {})
            if not self.knobs:
                meta.pop("knobs", None)  # omitted for default knobs
            elif not _describes(meta.get("knobs"), self.knobs):  # else the file's own list, with its fields
                meta["knobs"] = knob_list(self.knobs)
            out["autotune_metadata"] = meta
        if self.extra:
            out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def _criteria_json(self) -> dict[str, Any]:
        """Criteria as the file spelled them: hipDNN's names, and hipDNN's enum integer for a mode."""
        spelled = {ours: (name, raw) for ours, name, raw in self.criteria_spelled}
        out: dict[str, Any] = {}
        for k, v in self.criteria:
            if k not in spelled:
                out[k] = v
                continue
            name, raw = spelled[k]
            theirs = mode_to_hipdnn(self.op, v) if k == "mode" and v is not None else v
            out[name] = raw if theirs is None else theirs
        return out

    def spelled_like(self, other: "OverrideEntry") -> "OverrideEntry":
        """This entry written with ``other``'s spellings (hipDNN's op, criterion and tensor names), so a rule
        replaced in a file hipDNN wrote stays in hipDNN's words (same match key assumed)."""
        if other.op_spelled is None and not other.criteria_spelled and all(t.id_spelled is None for t in other.tensors) \
                and not other.implied_criteria and not other.implied_tensors:
            return self
        ids = {t.tensor_id: t.id_spelled for t in other.tensors if t.id_spelled is not None}
        tensors = tuple(replace(t, id_spelled=ids.get(t.tensor_id, t.id_spelled)) for t in self.tensors)
        mine = dict(self.criteria)
        crit = tuple((ours, name, mode_to_hipdnn(self.op, mine[ours]) if ours == "mode" and mine.get(ours) is not None
                      else mine.get(ours, raw)) for ours, name, raw in other.criteria_spelled if ours in mine)
        return replace(self, op_spelled=other.op_spelled, criteria_spelled=crit, tensors=tensors,
                       implied_criteria=self.implied_criteria or other.implied_criteria,
                       implied_tensors=self.implied_tensors or other.implied_tensors)

    @staticmethod
    def from_canonical(problem: Mapping[str, Any], engine_name: str, knobs: KnobSettings = (),
                       metadata: Mapping[str, Any] | None = None) -> "OverrideEntry":
        """An exact entry from a problem's canonical form (Problem.canonical(); no re-validation)."""
        return OverrideEntry(
            op=problem["op"],
            engine_name=engine_name,
            tensors=tuple(TensorRule(t["id"], tuple(t["dims"]), tuple(t["strides"]), t["dtype"]) for t in problem["tensors"]),
            criteria=tuple(sorted(problem["criteria"].items())),
            knobs=tuple(sorted(knobs)),
            compute_data_type=problem["compute_dtype"],
            metadata=dict(metadata) if metadata is not None else None,
            from_problem=True,
        )

    @staticmethod
    def for_problem(problem: Problem, engine_name: str, knobs: KnobSettings = (),
                    metadata: Mapping[str, Any] | None = None) -> "OverrideEntry":
        """An exact entry for ``problem`` (its library, where it has one, in the metadata: what its default is)."""
        if problem.library and (metadata is None or "library" not in metadata):
            metadata = {**(metadata or {}), "library": problem.library}
        return OverrideEntry(
            op=problem.op,
            engine_name=engine_name,
            tensors=tuple(TensorRule(t.id, t.dims, t.strides, t.dtype) for t in problem.tensors),
            criteria=problem.criteria,
            knobs=tuple(sorted(knobs)),
            compute_data_type=problem.compute_dtype,
            metadata=dict(metadata) if metadata is not None else None,
            from_problem=True,
        )


def knob_list(knobs: KnobSettings) -> list[dict[str, Any]]:
    """Knob settings in the RFC's ``autotune_metadata.knobs`` layout."""
    return [{"knob_id": k, "type": knob_type_of(v).value, "value": int(v) if isinstance(v, bool) else v}
            for k, v in knobs]


def _describes(raw: Any, knobs: KnobSettings) -> bool:
    """True when ``raw`` (a metadata knob list as read) names exactly these settings."""
    if not isinstance(raw, list) or not all(isinstance(k, dict) for k in raw):
        return False
    return len(raw) == len(knobs) and {k.get("knob_id"): k.get("value") for k in raw} == dict(knobs)


@functools.lru_cache(maxsize=1 << 16)
def _match_key(op: str, criteria: tuple[tuple[str, int], ...], rules: tuple[TensorRule, ...],
               compute_data_type: str | None) -> tuple[Any, ...]:
    # cached: a reduce keys every entry it writes, and entries of one problem share these fields
    tensors = frozenset((t.tensor_id, t.dims, t.strides, t.data_type) for t in rules) \
        if all(t.tensor_id is not None for t in rules) else tuple((t.dims, t.strides, t.data_type) for t in rules)
    return (op, tuple(sorted(_full_criteria(op, dict(criteria)).items())), tensors, compute_data_type)


def _full_criteria(op: str, criteria: Mapping[str, int]) -> dict[str, int]:
    spec = OPS.get(op)
    return {**dict(spec.criteria), **criteria} if spec else dict(criteria)


def _pattern(e: OverrideEntry) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(which fields of ``e`` are wildcards, the values of those that are not)."""
    rules, values = [], []
    for pos, t in enumerate(e.tensors):
        dims_fixed = tuple(i for i, d in enumerate(t.dims) if d != -1)
        strides_fixed = tuple(i for i, d in enumerate(t.strides) if d != -1) if t.strides else None
        rules.append((t.tensor_id if t.tensor_id is not None else pos, len(t.dims), dims_fixed,
                      len(t.strides) if t.strides else None, strides_fixed, t.data_type is not None))
        values.append((tuple(t.dims[i] for i in dims_fixed),
                       tuple(t.strides[i] for i in strides_fixed) if strides_fixed is not None else None, t.data_type))
    names = tuple(k for k, _ in e.criteria)
    pattern = (e.positional, len(e.tensors), tuple(rules), names, e.compute_data_type is not None)
    return pattern, (tuple(values), tuple(v for _, v in e.criteria), e.compute_data_type)


def _project(problem: Problem, pattern: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The values ``problem`` has in the fields ``pattern`` fixes; None when it cannot match the pattern at all."""
    positional, count, rules, names, has_compute = pattern
    if len(problem.tensors) < count:  # a rule may leave out tensors (outputs...): those are not constrained
        return None
    if positional:
        ordered = [problem.tensor(t) for t in problem.spec.tensor_ids if problem.has_tensor(t)]
    values = []
    for tid, ndims, dims_fixed, nstrides, strides_fixed, has_dtype in rules:
        if positional:
            if tid >= len(ordered):
                return None
            t = ordered[tid]
        elif problem.has_tensor(tid):
            t = problem.tensor(tid)
        else:
            return None
        if len(t.dims) != ndims or (nstrides is not None and len(t.strides) != nstrides):
            return None
        values.append((tuple(t.dims[i] for i in dims_fixed),
                       tuple(t.strides[i] for i in strides_fixed) if strides_fixed is not None else None,
                       t.dtype if has_dtype else None))
    crit = problem.criteria_dict
    return (tuple(values), tuple(crit.get(k) for k in names), problem.compute_dtype if has_compute else None)


def _query_key(problem: Problem) -> tuple[Any, ...]:
    return (problem.op, problem.criteria, frozenset((t.id, t.dims, t.strides, t.dtype) for t in problem.tensors),
            problem.compute_dtype)


@dataclass
class OverrideFile:
    """A parsed override file with an index for matching."""

    version: int
    entries: list[OverrideEntry]
    device: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    invalid: str = ""  # read as hipDNN does, a rule it cannot read made the whole file invalid: where and why

    def __post_init__(self) -> None:
        self._memo: dict[str, OverrideEntry | None] = {}  # problem key -> answer (the file never changes)
        # (exact entries by key, wildcard patterns), built at the first match: a file only written needs neither
        self._index: tuple[dict[tuple[Any, ...], OverrideEntry], dict[str, Any]] | None = None

    def _build_index(self) -> tuple[dict[tuple[Any, ...], tuple[int, OverrideEntry]], dict[str, Any]]:
        complete: dict[tuple[Any, ...], tuple[int, OverrideEntry]] = {}
        # the other entries grouped by shape of rule (which fields are wildcards or left out); within a group,
        # by the values of the fields that are not, so a lookup costs one dict probe per group, not a scan
        patterns: dict[str, dict[tuple[Any, ...], dict[tuple[Any, ...], tuple[int, OverrideEntry]]]] = {}
        for i, e in enumerate(self.entries):
            if not e.states_key_criteria:
                log.info("overrides: %s: rule %d for %s states no %s; it matches nothing", self.source, i, e.op,
                         "/".join(KEY_CRITERIA[e.op]))
            elif not e.names_key_tensors:
                log.info("overrides: %s: rule %d for %s does not name %s; it matches nothing", self.source, i, e.op,
                         "/".join(key_tensors(e.op)))
            elif e.complete:
                key = (e.op, tuple(sorted(dict(e.criteria).items())),
                       frozenset((t.tensor_id, t.dims, t.strides, t.data_type) for t in e.tensors), e.compute_data_type)
                complete.setdefault(key, (i, e))  # declaration order: the first one wins
            else:
                pattern, values = _pattern(e)
                patterns.setdefault(e.op, {}).setdefault(pattern, {}).setdefault(values, (i, e))
        self._index = (complete, patterns)  # one assignment: a reader in another thread sees all of it or none
        return self._index

    @property
    def device_signature(self) -> str | None:
        return (self.device or {}).get("signature")

    @property
    def is_autotune_file(self) -> bool:
        return self.version == OVERRIDE_VERSION and all(e.metadata is not None for e in self.entries)

    def nearest_miss(self, problem: Problem) -> str:
        """Why no entry matches ``problem``: the entry of its op that differs in the fewest fields, and how
        (for a log line under verbose; it walks every entry of the op)."""
        best: tuple[int, int, list[str]] | None = None
        for i, e in enumerate(self.entries):
            if e.op != problem.op:
                continue
            diff = e.differences(problem)
            if best is None or len(diff) < len(best[2]):
                best = (i, len(diff), diff)
        if best is None:
            return f"no entry is for op {problem.op}"
        i, _, diff = best
        return f"the nearest, engine_overrides[{i}] ({self.entries[i].engine_name}), differs in: {'; '.join(diff)}"

    def match(self, problem: Problem) -> OverrideEntry | None:
        """The entry for ``problem``: the first matching exact rule (no -1), else the first matching wildcard rule,
        in declaration order (memoised). Complete rules are found by hash, the others one probe per rule shape."""
        try:
            return self._memo[problem.key]
        except KeyError:
            pass
        complete, patterns = self._index or self._build_index()
        found = []
        by_hash = complete.get(_query_key(problem))
        if by_hash is not None:
            found.append(by_hash)
        for pattern, groups in patterns.get(problem.op, {}).items():
            values = _project(problem, pattern)
            if values is not None and values in groups:
                found.append(groups[values])
        hit = min(found, key=lambda ie: (not ie[1].exact, ie[0]))[1] if found else None
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[problem.key] = hit
        return hit

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version}
        if self.device is not None:
            out["device"] = dict(self.device)
        out.update({k: v for k, v in self.extra.items() if k not in ("version", "device", "engine_overrides")})
        out["engine_overrides"] = [e.to_json() for e in self.entries]
        return out


