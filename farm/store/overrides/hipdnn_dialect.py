"""Override entries in hipDNN's own spelling (``farm publish --dialect hipdnn``), so its reader selects them unchanged.

hipDNN's reader (backend heuristics/config/EngineOverrideConfig.hpp, version 2 files) matches a rule when its op
is the query's, its criteria are exactly the query's (names and values) and its tensors are exactly the query's key
tensors, each found by ``tensor_id`` with equal ``dim`` and ``stride`` (-1 any); the first rule declared wins. The
query (hipdnn_frontend/detail/GraphMatchKey.hpp) names tensors ``x_tensor_uid``..., the modes in hipDNN's enums,
and no output, bias of a matmul, convolution geometry or causal flag. So each entry is written with exactly that
key (``HIPDNN_KEY``), modes in hipDNN's integers, the parts our problems imply (a norm's ``norm_fwd_phase`` 1 and
``epsilon_tensor_uid``), and exact rules before wildcard ones (our reader's order, kept under first-match).
``data_type`` and ``compute_data_type`` stay: hipDNN's reader does not read them, ours tells dtypes apart with them.

Entries hipDNN cannot tell apart are said (``Note``): where they differ only in dtypes both are written (hipDNN
uses the first for both); where they differ in nothing its key or our dtypes hold (two convolutions of one shape
and other padding), the later one is left out, since no reader of the file could select it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from farm.store.overrides.hipdnn_names import HIPDNN_CRITERIA, HIPDNN_KEY, HIPDNN_OP_NAMES, IMPLIED_CRITERIA, mode_to_hipdnn
from farm.store.overrides.entries import OverrideEntry, TensorRule

DIALECTS = ("farm", "hipdnn")


@dataclass(frozen=True)
class Note:
    """What writing one entry in hipDNN's spelling did beyond respelling it."""

    index: int  # position among the entries given
    label: str
    kind: str  # "left_out" | "shadowed" | "kept_as_is"
    why: str


def to_hipdnn(entries: Sequence[OverrideEntry], labels: Sequence[str] | None = None
              ) -> tuple[list[OverrideEntry], list[Note]]:
    """``entries`` respelled as hipDNN reads them, exact rules first, with what could not be written plainly."""
    labels = list(labels) if labels is not None else [e.op for e in entries]
    notes: list[Note] = []
    written: list[tuple[int, OverrideEntry]] = []
    ours_seen: dict[tuple[Any, ...], int] = {}
    theirs_seen: dict[tuple[Any, ...], int] = {}
    for i, e in enumerate(entries):
        converted, why = _respelled(e)
        if converted is None:
            notes.append(Note(i, labels[i], "kept_as_is", why))
            written.append((i, e))
            continue
        ours, theirs = converted.match_key(), _hipdnn_key(converted)
        if ours in ours_seen:
            first = ours_seen[ours]
            notes.append(Note(i, labels[i], "left_out",
                              f"the same rule as {labels[first]} to every reader ({_lost(e)} not in hipDNN's key)"))
            continue
        ours_seen[ours] = i
        if theirs in theirs_seen:
            first = theirs_seen[theirs]
            notes.append(Note(i, labels[i], "shadowed",
                              f"hipDNN uses {labels[first]} for it (it does not match data types); farm.ops tells "
                              "them apart"))
        else:
            theirs_seen[theirs] = i
        written.append((i, converted))
    written.sort(key=lambda ie: not ie[1].exact)  # stable: exact rules first, each bucket in file order
    return [e for _, e in written], notes


def _respelled(e: OverrideEntry) -> tuple[OverrideEntry | None, str]:
    key = HIPDNN_KEY.get(e.op)
    if key is None:
        return None, f"op {e.op} has no match key in hipDNN"
    if e.positional:
        return None, "a version-1 rule (tensors by position): written as it is"
    by_id = {t.tensor_id: t for t in e.tensors}
    tensors: list[TensorRule] = []
    implied: list[dict[str, Any]] = []
    for theirs, ours in key:
        if ours is None:
            implied.append(_implied_tensor(e, theirs))
        elif ours in by_id:
            tensors.append(replace(by_id[ours], id_spelled=theirs))
        elif not (e.op == "pointwise" and ours == "B"):
            return None, f"it does not name {ours}, which hipDNN's key for {e.op} holds: written as it is"
    if any(t is None for t in implied):
        return None, "hipDNN's key needs a tensor its rule cannot state: written as it is"
    criteria, spelled = _criteria(e)
    return replace(e, tensors=tuple(tensors), criteria=criteria, criteria_spelled=spelled,
                   op_spelled=HIPDNN_OP_NAMES.get(e.op), implied_criteria=tuple(IMPLIED_CRITERIA.get(e.op, {}).items()),
                   implied_tensors=tuple(implied), from_problem=False), ""


def _criteria(e: OverrideEntry) -> tuple[tuple[tuple[str, int | None], ...], tuple[tuple[str, str, int], ...]]:
    """The entry's criteria hipDNN's key has (a mode, under hipDNN's name and in its enum), and their spelling."""
    names = HIPDNN_CRITERIA.get(e.op, {})
    spelled_before = {ours: raw for ours, _, raw in e.criteria_spelled}
    given = dict(e.criteria)
    kept, spelled = [], []
    for theirs, ours in names.items():
        if ours not in given:
            continue
        value = given[ours]
        raw = mode_to_hipdnn(e.op, value) if value is not None else spelled_before.get(ours)
        kept.append((ours, value))
        spelled.append((ours, theirs, raw))
    return tuple(kept), tuple(spelled)


def _implied_tensor(e: OverrideEntry, theirs: str) -> dict[str, Any] | None:
    """The tensor of hipDNN's key our problem implies: an epsilon (one element, any layout), or an sdpa_bwd's
    softmax statistics ([batch, heads, seq_q, 1] as hipDNN's SDPA lays them out, any layout)."""
    for t in e.implied_tensors:
        if t.get("tensor_id") == theirs:
            return dict(t)
    if theirs == "epsilon_tensor_uid":
        return {"tensor_id": theirs, "dim": [1]}
    if theirs == "stats_tensor_uid":
        q = next((t for t in e.tensors if t.tensor_id == "Q"), None)
        if q is None or len(q.dims) != 4:
            return None
        return {"tensor_id": theirs, "dim": [q.dims[0], q.dims[1], q.dims[2], 1]}
    return None


def _hipdnn_key(e: OverrideEntry) -> tuple[Any, ...]:
    """What hipDNN's reader tells rules apart by: op, criteria as written, tensors by id with dims and strides."""
    doc = e.to_json()
    tensors = frozenset((t["tensor_id"], tuple(t["dim"]), tuple(t.get("stride") or ())) for t in doc["tensors"])
    return doc["op"], tuple(sorted(doc["criteria"].items())), tensors


def _lost(e: OverrideEntry) -> str:
    """What of ``e`` hipDNN's key does not hold: its other criteria, its outputs, a bias."""
    kept_criteria = set(HIPDNN_CRITERIA.get(e.op, {}).values())
    key_ids = {ours for _, ours in HIPDNN_KEY.get(e.op, ())}
    parts = [f"{k}={v}" for k, v in e.criteria if k not in kept_criteria]
    parts += [t.tensor_id for t in e.tensors if t.tensor_id not in key_ids]
    return ", ".join(parts) or "nothing"


def shared_key(e: OverrideEntry) -> tuple[Any, ...]:
    """What a rule's match key keeps in both spellings (hipDNN's key tensors, a mode, dtypes), so a rule and its
    respelled twin are found as one (farm diff of a file and the one publish --dialect hipdnn made of it)."""
    key_ids = {ours for _, ours in HIPDNN_KEY.get(e.op, ()) if ours is not None}
    modes = set(HIPDNN_CRITERIA.get(e.op, {}).values())
    tensors = frozenset((t.tensor_id, t.dims, t.strides, t.data_type) for t in e.tensors if t.tensor_id in key_ids)
    return e.op, tuple((k, v) for k, v in e.criteria if k in modes), tensors, e.compute_data_type


def hipdnn_spelled(e: OverrideEntry) -> bool:
    """A rule in hipDNN's words: its tensors named ``*_tensor_uid`` (all of them or none: the first says)."""
    return bool(e.tensors) and (e.tensors[0].id_spelled or "").endswith("_tensor_uid")


def spelled_like_twin(e: OverrideEntry, twins: Sequence[OverrideEntry]) -> OverrideEntry:
    """``e`` in hipDNN's spelling where ``twins`` (the rules of a file sharing its key in both spellings, none
    sharing its match key) is one rule in hipDNN's spelling that the respelled ``e`` replaces; else ``e``."""
    if len(twins) != 1 or not hipdnn_spelled(twins[0]):
        return e
    respelled, _ = _respelled(e)
    return respelled if respelled is not None and respelled.match_key() == twins[0].match_key() else e
