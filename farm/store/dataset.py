"""Reading a results folder: the readable files and rows, broken ones skipped and named."""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from farm.devices.properties import DeviceProperties
from farm.errors import InputError
from farm.model.problem import Problem
from farm.store.location import Location
from farm.store.results import CHECK_ROUNDS, DATASET_SCHEMA, FILE_SCHEMA, PARTITIONING, SCHEMA_VERSION
from farm.model.plans import spec_of

log = logging.getLogger("farm.store.dataset")


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


def fenced_sessions(results: "str | Path | Location") -> list[tuple[str, str, str, str, set[str]]]:
    """(run id, signature, op, session, counted part names) of every fenced session the job record beside the
    results folder names (none where there is no record, or it is unreadable: the reader reads as before)."""
    try:
        text = Location.of(results).parent().read_text("job.json")
        record = json.loads(text) if text else {}
    except Exception:  # no record here (a results folder of its own), or one a reader cannot read: nothing fenced
        return []
    out = []
    for run in record.get("runs", []) if isinstance(record, dict) else []:
        for f in run.get("fenced", []) if isinstance(run, dict) else []:
            try:
                out.append((str(run["run_id"]), str(f["signature"]), str(f["op"]), str(f["session_id"]),
                            set(map(str, f.get("counted", [])))))
            except (KeyError, TypeError):
                continue
    return out


class ResultsDataset:
    """The readable part of a results folder: broken files and rows are reported and skipped.

    A file is skipped when it sits outside the partition layout, is not a Parquet file of this schema,
    or fails to read (a corrupt data page under an intact footer is found when it is first read);
    a row is skipped when a value in it is one no tunefarm writer produces (see ``_ROW_CHECKS``).
    Each is logged once and listed in ``skipped``.
    """

    def __init__(self, root: "str | Path | Location", signatures: Collection[str] | None = None) -> None:
        """``signatures``: read only these device signatures' partitions (their folders; nothing else is listed
        beyond the names)."""
        self.location = Location.of(root)
        self.root: Path | str = self.location.local_path if self.location.local else self.location.uri
        if not self.location.is_dir():
            raise InputError("results folder not found", source=str(self.root))
        self.files: list[str] = []
        self.skipped: list[SkippedFile] = []
        for path in self.location.files(".parquet"):
            rel = Path(self.location.relative(path))
            if any(part.startswith((".", "_")) for part in rel.parts):
                continue  # temp files of writers in progress
            if signatures is not None and _partition_signature(rel.parts[0]) not in signatures:
                continue
            reason = _check_layout(rel) or _check_file(path, self.location.fs)
            if reason:
                self._skip(path, reason)
            else:
                self.files.append(path)
        self._skip_late_parts()

    def _skip_late_parts(self) -> None:
        """Skip the parts a lost node's worker wrote of a session after its run had ended (the session ran again
        elsewhere: its rows would be read twice). The run record (job.json beside the results) names each fenced
        session and the parts counted of it; a part of that run holding its rows and not counted is skipped."""
        fenced = fenced_sessions(self.location)
        if not fenced:
            return
        for path in list(self.files):
            head, _, name = path.rpartition("/")
            for run_id, sig, op, session, counted in fenced:
                if name in counted or not name.startswith(f"part-{run_id}-") or not head.endswith(f"/op={op}") \
                        or _partition_signature(Path(self.location.relative(path)).parts[0]) != sig:
                    continue
                sessions = pq.read_table(path, columns=["session_id"], filesystem=self.location.fs)["session_id"]
                if session in sessions.to_pylist():
                    self.files.remove(path)
                    self._skip(path, f"written by a lost node's worker after its run ended (session {session} ran "
                                     "again elsewhere): its rows are not data")
                    break

    def check_pages(self) -> "ResultsDataset":
        """Read every file whole, and skip those that fail (a corrupt data page under an intact footer reads fine
        until its column is read): a resume then counts as measured exactly what the reducer will read."""
        for path in list(self.files):
            try:
                with self.location.fs.open_input_file(path) as fh:
                    pq.ParquetFile(fh).read()
            except Exception as exc:  # any decoding error of any page: the part is unreadable for every reader
                self.files.remove(path)
                self._skip(path, f"not a readable Parquet file ({type(exc).__name__}: {_first_line(exc)})")
        return self

    def partition(self, signature: str) -> "ResultsDataset":
        """This dataset's files of one device signature (checked already: nothing is listed or logged again)."""
        part = copy.copy(self)
        part.files = [f for f in self.files
                      if _partition_signature(Path(self.location.relative(f)).parts[0]) == signature]
        part.skipped = []
        return part

    def _skip(self, path: str, reason: str) -> None:
        if any(s.path == path and s.reason == reason for s in self.skipped):
            return
        log.warning("results: skipping %s: %s", path, reason)
        self.skipped.append(SkippedFile(path, reason))

    def dataset(self, dictionary: Sequence[str] = (), files: Sequence[str] | None = None) -> ds.Dataset:
        """The readable files as one dataset; ``dictionary`` columns are read dictionary-encoded."""
        schema, fmt = DATASET_SCHEMA, ds.ParquetFileFormat()
        if dictionary:
            schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in dictionary else f
                                for f in DATASET_SCHEMA])
            fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=set(dictionary)))
        return ds.dataset(self.files if files is None else list(files), schema=schema, format=fmt,
                          partitioning=PARTITIONING, partition_base_dir=self.location.path,
                          filesystem=self.location.fs)

    def table(self, columns: Sequence[str] | None = None, filter: Any = None, *,
              dictionary: Sequence[str] = ()) -> pa.Table:
        """The rows of every readable file (``filter``: a pyarrow expression); broken files and rows skipped."""
        cols = list(columns) if columns else list(DATASET_SCHEMA.names)
        checked = [c for c in cols if c in _ROW_CHECKS]
        t = self._read(cols, filter, dictionary)
        if not checked:
            return t
        bad = self._bad_rows(t, checked)
        if bad is None:
            return t
        # some rows are bad: read the file names too (only now: a column of them costs a string per row)
        named = self._read(cols + ["__filename"], filter, dictionary)
        self._name_bad_rows(named, checked)
        return named.filter(pc.invert(self._bad_rows(named, checked))).select(cols)

    def _read(self, read: list[str], filter: Any, dictionary: Sequence[str]) -> pa.Table:
        while True:
            if not self.files:
                return self.dataset(dictionary, files=[]).schema.empty_table().select(
                    [c for c in read if c != "__filename"])
            try:
                return self.dataset(dictionary).to_table(columns=read, filter=filter)
            except (pa.ArrowException, OSError) as exc:
                if not self._skip_unreadable(read, filter, dictionary):
                    raise InputError(f"cannot read the results: {_first_line(exc)}", source=str(self.root)) from None

    def _skip_unreadable(self, columns: list[str], filter: Any, dictionary: Sequence[str]) -> bool:
        """Read each file alone; skip those that fail. True when one was found."""
        bad = []
        for f in self.files:
            try:
                self.dataset(dictionary, files=[f]).to_table(columns=columns, filter=filter)
            except (pa.ArrowException, OSError) as exc:
                bad.append(f)
                self._skip(f, f"unreadable ({type(exc).__name__}: {_first_line(exc)})")
        self.files = [f for f in self.files if f not in bad]
        return bool(bad)

    @staticmethod
    def _hits(t: pa.Table, name: str) -> Any:
        hit = _ROW_CHECKS[name](t[name])
        if name == "problem_json" and "problem_key" in t.column_names:
            hit = pc.or_(hit, _key_mismatch(t["problem_json"], t["problem_key"]))
        return hit

    def _bad_rows(self, t: pa.Table, checked: Sequence[str]) -> Any:
        """True for each row a check refuses; None when none does."""
        bad = None
        for name in checked:
            hit = self._hits(t, name)
            if pc.any(hit).as_py():
                bad = hit if bad is None else pc.or_(bad, hit)
        return bad

    def _name_bad_rows(self, t: pa.Table, checked: Sequence[str]) -> None:
        """Skip (log and list) each file with bad rows, naming the check and an example value."""
        for name in checked:
            hit = self._hits(t, name)
            if not pc.any(hit).as_py():
                continue
            where = t.filter(hit)
            for path in sorted(set(_str(where["__filename"]).to_pylist())):
                example = where.filter(pc.equal(_str(where["__filename"]), path))[name][0].as_py()
                n = pc.sum(pc.and_(hit, pc.equal(_str(t["__filename"]), path))).as_py()
                self._skip(path, f"{n} row(s) skipped: {name} {_brief(example)}")

    def signatures(self) -> list[str]:
        return sorted(set(self.table(["device_signature"]).column("device_signature").to_pylist()))

    def done_candidates(self, device_signature: str) -> dict[str, set[str]]:
        """problem key -> candidate keys with a row on this signature (any disposition but ``pruned``: a
        candidate a cost model skipped is measured by a run that does not prune; no farm verify or model check row:
        a check of a published decision measures no candidate): the resume set."""
        t = self.table(["problem_key", "candidate_key"], filter=(ds.field("device_signature") == device_signature)
                       & (ds.field("disposition") != "pruned") & ~ds.field("round").isin(list(CHECK_ROUNDS)))
        done: dict[str, set[str]] = {}
        for pk, ck in zip(t.column("problem_key").to_pylist(), t.column("candidate_key").to_pylist()):
            done.setdefault(pk, set()).add(ck)
        return done


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _str(col: Any) -> Any:
    return col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col


def _bad_strings(valid: Any) -> Any:
    """A row check for a string column: True where ``valid(value)`` fails or the value is null.

    Each distinct value is checked once (dictionary-encoded columns: their dictionaries only).
    """

    def ok(v: Any, seen: dict[Any, bool]) -> bool:
        if v not in seen:
            try:
                seen[v] = v is not None and bool(valid(v))
            except Exception:  # a value from a file: any failure to read it means it is not ours
                seen[v] = False
        return seen[v]

    def check(col: Any) -> Any:
        seen: dict[Any, bool] = {}
        out = []
        for chunk in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]):
            if pa.types.is_dictionary(chunk.type):
                bad = [i for i, v in enumerate(chunk.dictionary.to_pylist()) if not ok(v, seen)]
                hit = pc.is_in(chunk.indices, value_set=pa.array(bad, chunk.indices.type))
            else:
                bad = [v for v in pc.unique(chunk).to_pylist() if v is not None and not ok(v, seen)]
                hit = pc.is_in(chunk, value_set=pa.array(bad, pa.string()))
            out.append(pc.or_(pc.fill_null(hit, False), pc.is_null(chunk)))
        return pa.chunked_array(out, pa.bool_())
    return check


@functools.lru_cache(maxsize=1 << 16)
def _problem_key(text: str) -> str | None:
    """The key of a row's problem_json, or None when it is no valid problem (one parse per distinct text, for the
    validity check and the key check alike)."""
    try:
        return Problem.from_canonical(json.loads(text)).key
    except Exception:  # a value from a file: any failure to read it means it is not ours
        return None


def _key_mismatch(problem_json: Any, problem_key: Any) -> Any:
    """True where a row's problem_key is not the key of its problem_json (an entry would match other shapes)."""
    key_of = _problem_key

    out = []
    for chunk in (problem_json.chunks if isinstance(problem_json, pa.ChunkedArray) else [problem_json]):
        if pa.types.is_dictionary(chunk.type):
            expected = pa.array([key_of(v) if v is not None else None for v in chunk.dictionary.to_pylist()],
                                pa.string()).take(chunk.indices)
        else:  # each distinct text parsed once, without a Python string per row
            distinct = pc.unique(chunk)
            keys = pa.array([key_of(v) if v is not None else None for v in distinct.to_pylist()], pa.string())
            expected = keys.take(pc.index_in(chunk, value_set=distinct))
        out.append(expected)
    expected = pa.chunked_array(out, pa.string())
    return pc.fill_null(pc.not_equal(expected, _str(problem_key)), False)



def _infinite(col: Any) -> Any:
    return pc.fill_null(pc.is_inf(col), False)



# the columns readers rely on, and what makes a value one no tunefarm writer produces
_ROW_CHECKS: dict[str, Any] = {
    "candidate_key": _bad_strings(lambda v: spec_of(v) is not None),
    "problem_json": _bad_strings(lambda v: _problem_key(v) is not None),
    "device_json": _bad_strings(lambda v: DeviceProperties.from_dict(json.loads(v)) is not None),
    "problem_key": _bad_strings(lambda v: bool(v)),
    "measured_at": pc.is_null,
    "candidate_index": pc.is_null,
    "iterations": pc.is_null,
    **{c: _infinite for c in ("min_ms", "avg_ms", "stddev_ms", "median_ms", "mad_ms")},
}


SIGNATURE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")


OP_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _partition_signature(folder: str) -> str | None:
    return unquote(folder.split("=", 1)[1]) if folder.startswith("device_signature=") else None


def partition_signatures(root: "str | Path | Location") -> list[str]:
    """The device signatures a results folder has partitions for, from the folder names alone (no file read)."""
    loc = Location.of(root)
    if not loc.is_dir():
        raise InputError("results folder not found", source=str(root))
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=False))
    found = {_partition_signature(i.base_name) for i in infos if i.type == pafs.FileType.Directory}
    return sorted(s for s in found if s and safe_signature(s))


def results_folder(root: "str | Path") -> "str | Path":
    """Where ``root``'s results are: a run folder's (``farm tune --out``) ``results/``, else ``root`` itself."""
    sub = Location.of(root).join("results")
    if not sub.is_dir():
        return root
    return sub.local_path if sub.local else sub.uri


def safe_signature(signature: str) -> bool:
    """A device signature usable as a file name: what device_signature() makes (no path separators, no '..')."""
    return bool(SIGNATURE_RE.match(signature)) and ".." not in signature


def _check_layout(rel: Path) -> str:
    """'' when a file sits at device_signature=<signature>/op=<op>/, else why it is not a results file here."""
    parts = rel.parts
    if len(parts) != 3 or not parts[0].startswith("device_signature=") or not parts[1].startswith("op="):
        return "not in a device_signature=<signature>/op=<op>/ folder"
    sig = unquote(parts[0].split("=", 1)[1])
    if not safe_signature(sig):
        return f"the folder names no device signature ({sig!r})"
    if not OP_RE.match(unquote(parts[1].split("=", 1)[1])):
        return f"the folder names no op ({parts[1]!r})"
    return ""


def _check_file(path: str, fs: Any) -> str:
    """'' when the file is a readable results file, else why not."""
    try:
        meta = pq.read_metadata(path, filesystem=fs)
    except Exception as exc:  # truncated, not Parquet, unreadable
        return f"not a readable Parquet file ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    version = (meta.metadata or {}).get(b"tunefarm.schema_version")
    if version is None:
        return "not a tunefarm results file (no schema version)"
    if not version.isdigit() or len(version) > 6:
        return f"not a tunefarm results file (schema version {_brief(version)})"
    if int(version) > SCHEMA_VERSION:
        return f"written by a newer tunefarm (schema {int(version)} > {SCHEMA_VERSION})"
    try:
        schema = meta.schema.to_arrow_schema()
    except Exception as exc:
        return f"not a readable Parquet file ({type(exc).__name__}: {_first_line(exc)})"
    for f in FILE_SCHEMA:
        have = schema.field(f.name).type if f.name in schema.names else None
        if have is None and f.name in _REQUIRED_COLUMNS:
            return f"not a tunefarm results file (no {f.name} column)"
        if have is not None and have != f.type and not (pa.types.is_dictionary(have) and have.value_type == f.type):
            return f"not a tunefarm results file (column {f.name} is {have}, not {f.type})"
    return ""


# without these a row means nothing (the others may be missing in a file: they read as null)
_REQUIRED_COLUMNS = ("schema_version", "job_id", "session_id", "round", "measured_at", "device_json", "problem_key",
                     "problem_json", "engine_name", "candidate_key", "candidate_index", "succeeded", "disposition")
