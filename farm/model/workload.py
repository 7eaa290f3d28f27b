"""Workload files: the shapes to tune, which engines and knob sweeps, and tuning settings.

A workload is YAML (see docs/workload.md)::

    name: cpu-quick
    autotune: {strategy: run_until_stable, max_iterations: 30}
    engines:                       # defaults for every problem
      exclude: [cpu.matmul.einsum]
      sweep:
        cpu.matmul.blocked: {block_k: [128, 512]}     # list = axis, scalar = fixed
    problems:
      - op: matmul
        tensors: {A: {dims: [256, 256]}, B: {dims: [256, 256]}}

Everything is validated on load, before any device time is spent; an error
names the file, the line, the field path (``problems[3].tensors.B.dims``) and
the offending value.
"""

from __future__ import annotations

import dataclasses

import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from farm.errors import InputError, UnknownNameError
from farm.fsutil import read_text_file
from farm.model.engine import EngineRegistry, user_knobs
from farm.model.knobs import BENCHMARKING_KNOB, KnobValue
from farm.model.model_steps import StepInfo, Use, host_bound, parse_sites, parse_steps, parse_uses
from farm.model.plans import EngineSweep, cartesian_product
from farm.model.problem import LIBRARIES, Problem
from farm.model.records import AutotuneConfig, CallMode, parse_calls
from farm.model.tunableop_gemms import is_untuned_file, untuned_workload

WORKLOAD_VERSION = 1
_TOP_KEYS = {"version", "name", "description", "seed", "call", "autotune", "engines", "problems", "steps", "library"}
_PROBLEM_KEYS = {"name", "op", "dtype", "compute_dtype", "tensors", "criteria", "engines", "call", "steps", "sites",
                 "library"}
_ENGINE_KEYS = {"include", "exclude", "defaults", "sweep"}
_CONFIG_KEYS = {f.name for f in fields(AutotuneConfig)} - {"ranking_fn", "engine_id_filter", "ranking", "storage"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True)
class EngineSelection:
    """Which engines and knob settings a problem is tuned with."""

    include: tuple[str, ...] | None = None  # None: every applicable engine
    exclude: tuple[str, ...] = ()
    defaults: bool = True  # a default-knob candidate per selected engine
    sweeps: tuple[EngineSweep, ...] = ()

    def selects(self, engine_name: str) -> bool:
        if engine_name in self.exclude:
            return False
        return self.include is None or engine_name in self.include

    def to_dict(self) -> dict[str, Any]:
        return {
            "include": list(self.include) if self.include is not None else "all",
            "exclude": list(self.exclude),
            "defaults": self.defaults,
            "sweep": {str(s.engine): {**{k: list(v) for k, v in s.axes.items()}, **dict(s.fixed)} for s in self.sweeps},
        }


@dataclass(frozen=True)
class WorkloadProblem:
    index: int
    name: str
    problem: Problem
    engines: EngineSelection
    calls: tuple[CallMode, ...] = (CallMode.EAGER,)  # how production calls it: each is confirmed and decided
    uses: tuple[Use, ...] = ()  # captured from a model: each step's calls of it (farm.model.model_steps)
    sites: tuple[str, ...] = ()  # captured from a model: the module paths that call it
    host_bound: bool = False  # a step calling it is bound by the host: its eager calls are ranked by host time


@dataclass(frozen=True)
class Workload:
    name: str
    source: str
    problems: tuple[WorkloadProblem, ...]
    autotune: AutotuneConfig
    seed: int = 0
    description: str = ""
    digest: str = field(default="", compare=False)
    steps: tuple[StepInfo, ...] = ()  # the model steps it was captured from (farm capture)

    @property
    def problem_count(self) -> int:
        return len(self.problems)


def parse_size(value: Any, *, field: str) -> int:
    """Bytes from an int or a string like ``256MiB`` / ``1.5 GB``."""
    if isinstance(value, bool):
        raise InputError("expected a size in bytes such as 268435456 or '256MiB'", field=field, value=value)
    if isinstance(value, int):
        if value < 0:
            raise InputError("must be >= 0", field=field, value=value)
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise InputError("expected a size in bytes such as 268435456 or '256MiB'", field=field, value=value)


def load_workload(path: str | Path, registry: EngineRegistry | None = None) -> Workload:
    """Read and validate a workload file."""
    from farm.model.engine import default_engine_registry

    registry = registry or default_engine_registry()
    path = Path(path)
    source = str(path)
    text = read_text_file(path, "workload file")
    if is_untuned_file(text):  # PyTorch TunableOp's untuned-GEMM file: its GEMMs are the problems
        return parse_workload(untuned_workload(text, source=source), source=source, registry=registry, text=text)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_nodes(node, source)
        data = yaml.safe_load(text)
    except RecursionError:
        raise InputError(f"nested too deeply (a workload needs at most {MAX_DEPTH} levels)", source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"not valid YAML: {problem}", source=where) from None
    try:
        workload = parse_workload(data, source=source, registry=registry, text=text)
    except InputError as exc:
        line = _locate(node, exc.field)
        raise exc.within(source=f"{source}:{line}" if line else source) from None
    _check_captured_count(text, workload, source)
    return workload


_CAPTURED = re.compile(r"^# captured by farm capture: (\d+) problem\(s\)[^\n]*")
END_LINE = "# end of the workload farm capture wrote"
END_SAID = "to its last line '# end'"  # in the first line of a file that ends with END_LINE


def _check_captured_count(text: str, workload: "Workload", source: str) -> None:
    """A file farm capture wrote says how many problems it holds, and (since it says so in its first line) ends
    with END_LINE: one cut short at a line boundary (a copy that stopped) is still valid YAML with the last problems
    gone, or the last problem's last fields, and must not load as if whole."""
    m = _CAPTURED.match(text)
    if not m:
        return
    advice = "capture it again, or remove the first line if the edit was meant"
    if int(m.group(1)) != len(workload.problems):
        raise InputError(f"farm capture wrote {m.group(1)} problem(s) here and {len(workload.problems)} are read: "
                         f"the file is cut short or was edited ({advice})", source=source)
    if END_SAID in m.group(0) and text.rstrip().rsplit("\n", 1)[-1].strip() != END_LINE:
        raise InputError(f"farm capture's last line ({END_LINE!r}) is missing: the file is cut short, inside its "
                         f"last problem or after it ({advice})", source=source)


MAX_DEPTH = 64  # a workload is a handful of levels deep
MAX_NODES = 1_000_000  # values after YAML aliases are expanded: far beyond any real workload


def _check_nodes(node: Any, source: str) -> None:
    """Refuse a key given twice in one mapping (YAML would keep the last one silently), nesting deeper than
    MAX_DEPTH, and aliases that expand to more than MAX_NODES values (an "alias bomb")."""
    _no_duplicate_keys(node, source)
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(node, 1, False)]
    while stack:
        n, depth, children_done = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"nested too deeply (a workload needs at most {MAX_DEPTH} levels)",
                             source=f"{source}:{n.start_mark.line + 1}")
        if id(n) in sizes:
            continue
        kids = [x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode) else \
            list(n.value) if isinstance(n, yaml.SequenceNode) else []
        if not children_done and any(id(k) not in sizes for k in kids):
            stack.append((n, depth, True))
            stack.extend((k, depth + 1, False) for k in kids if id(k) not in sizes)
            continue
        sizes[id(n)] = 1 + sum(sizes.get(id(k), 1) for k in kids)
        if sizes[id(n)] > MAX_NODES:
            raise InputError(f"expands to more than {MAX_NODES} values (YAML aliases repeating aliases?)",
                             source=f"{source}:{n.start_mark.line + 1}")


def _no_duplicate_keys(node: Any, source: str) -> None:
    """A key given twice in one mapping is an error (YAML would keep the last one silently)."""
    stack = [node]
    seen_nodes: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen_nodes:
            continue  # an alias of a node checked already
        seen_nodes.add(id(n))
        if isinstance(n, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key, value in n.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise InputError(f"key given twice (first on line {seen[key.value]})", field=key.value,
                                         source=f"{source}:{key.start_mark.line + 1}")
                    seen[key.value] = key.start_mark.line + 1
                stack.append(value)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


def parse_workload(data: Any, *, source: str = "<workload>", registry: EngineRegistry, text: str = "") -> Workload:
    """Validate an already-parsed workload mapping."""
    if not isinstance(data, Mapping):
        raise InputError("a workload is a mapping with a 'problems' list", field="", value=type(data).__name__)
    _no_unknown(data, _TOP_KEYS, "")
    version = data.get("version", WORKLOAD_VERSION)
    if version != WORKLOAD_VERSION:
        raise InputError(f"unsupported workload version (this tunefarm reads {WORKLOAD_VERSION})", field="version", value=version)
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError("must be an integer >= 0", field="seed", value=seed)
    config = _autotune_config(data.get("autotune") or {}, "autotune")
    if config.prune is not None and source != "<workload>" and not Path(config.prune.model).is_absolute() \
            and "://" not in config.prune.model:
        # a workload names its model file as it names nothing else: relative to the workload file
        config = dataclasses.replace(config, prune=dataclasses.replace(
            config.prune, model=str(Path(source).parent / config.prune.model)))
    calls = parse_calls(data["call"], "call") if "call" in data else (CallMode.EAGER,)
    steps = parse_steps(data["steps"]) if data.get("steps") is not None else ()
    base = _engine_selection(data.get("engines") or {}, "engines", registry, None)
    library = _library(data.get("library", ""), "library")
    problems_raw = data.get("problems")
    if not isinstance(problems_raw, list) or not problems_raw:
        raise InputError("expected a non-empty list of problems", field="problems", value=problems_raw)
    problems = []
    names: set[str] = set()
    for i, raw in enumerate(problems_raw):
        wp = _problem(raw, i, registry, base, calls, steps, library)
        if wp.name in names:
            raise InputError("problem names must be unique", field=f"problems[{i}].name", value=wp.name)
        names.add(wp.name)
        problems.append(wp)
    digest = hashlib.sha256((text or json.dumps(data, sort_keys=True, default=str)).encode()).hexdigest()[:16]
    return Workload(
        name=str(data.get("name") or Path(source).stem),
        source=source,
        problems=tuple(problems),
        autotune=config,
        seed=seed,
        description=str(data.get("description") or ""),
        digest=digest,
        steps=steps,
    )


def _no_unknown(data: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise InputError(f"unknown field (allowed: {', '.join(sorted(allowed))})", field=where, value=data[key])


def _autotune_config(raw: Any, prefix: str) -> AutotuneConfig:
    if not isinstance(raw, Mapping):
        raise InputError("expected a mapping of tuning settings", field=prefix, value=raw)
    _no_unknown(raw, _CONFIG_KEYS, prefix)
    kwargs = dict(raw)
    if "workspace_limit" in kwargs and kwargs["workspace_limit"] is not None:
        kwargs["workspace_limit"] = parse_size(kwargs["workspace_limit"], field=f"{prefix}.workspace_limit")
    try:
        return AutotuneConfig(**kwargs)
    except InputError as exc:
        raise exc.within(prefix=prefix) from None
    except TypeError as exc:  # e.g. a float where an int comparison fails
        raise InputError(f"bad value: {exc}", field=prefix) from None


def _names(raw: Any, field_path: str, registry: EngineRegistry) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise InputError("expected a list of engine names", field=field_path, value=raw)
    for i, name in enumerate(raw):
        if name not in registry:
            raise InputError(f"unknown engine; known: {', '.join(e.name for e in registry)}",
                             field=f"{field_path}[{i}]", value=name)
    return tuple(raw)


def _engine_selection(raw: Any, prefix: str, registry: EngineRegistry, base: EngineSelection | None) -> EngineSelection:
    if not isinstance(raw, Mapping):
        raise InputError("expected a mapping with include / exclude / defaults / sweep", field=prefix, value=raw)
    _no_unknown(raw, _ENGINE_KEYS, prefix)
    sel = base or EngineSelection()
    include = sel.include
    if "include" in raw:
        include = None if raw["include"] in ("all", None) else _names(raw["include"], f"{prefix}.include", registry)
    exclude = _names(raw["exclude"], f"{prefix}.exclude", registry) if "exclude" in raw else sel.exclude
    defaults = sel.defaults
    if "defaults" in raw:
        if not isinstance(raw["defaults"], bool):
            raise InputError("expected true or false", field=f"{prefix}.defaults", value=raw["defaults"])
        defaults = raw["defaults"]
    sweeps = sel.sweeps
    if "sweep" in raw:
        sweeps = _sweeps(raw["sweep"], f"{prefix}.sweep", registry)
    return EngineSelection(include, exclude, defaults, sweeps)


def _sweeps(raw: Any, prefix: str, registry: EngineRegistry) -> tuple[EngineSweep, ...]:
    if not isinstance(raw, Mapping):
        raise InputError("expected a mapping of engine name to knob values", field=prefix, value=raw)
    out = []
    for name, knobs in raw.items():
        where = f"{prefix}[{name}]"
        try:
            engine = registry.get(str(name))
        except UnknownNameError as exc:
            raise InputError(str(exc), field=where, value=name) from None
        if not isinstance(knobs, Mapping) or not knobs:
            raise InputError("expected a mapping of knob name to a value or a list of values", field=where, value=knobs)
        by_name = {k.name: k for k in user_knobs(engine)}
        axes: dict[str, list[KnobValue]] = {}
        fixed: dict[str, KnobValue] = {}
        for knob_name, values in knobs.items():
            kwhere = f"{where}.{knob_name}"
            if knob_name == BENCHMARKING_KNOB:
                raise InputError("the tuner sets this knob itself (mode: exhaustive)", field=kwhere, value=values)
            knob = by_name.get(knob_name)
            if knob is None:
                raise InputError(f"unknown knob of {engine.name} (knobs: {', '.join(by_name) or 'none'})", field=kwhere, value=values)
            seq = values if isinstance(values, list) else [values]
            if not seq:
                raise InputError("an empty list sweeps nothing", field=kwhere, value=values)
            checked = []
            for v in seq:
                try:
                    checked.append(knob.validate(v, engine=engine.name))
                except InputError as exc:
                    raise InputError(exc.reason, field=kwhere, value=v) from None
            if isinstance(values, list):
                axes[knob_name] = checked
            else:
                fixed[knob_name] = checked[0]
        try:
            cartesian_product(axes)
        except InputError as exc:
            raise InputError(exc.reason, field=where, value=exc.value) from None
        out.append(EngineSweep(engine.name, axes, fixed))
    return tuple(out)


def _library(value: Any, field: str) -> str:
    if value not in LIBRARIES:
        raise InputError("the library whose calls the problems are: 'torch' (a captured torch model's calls), "
                         "'module' (what a model's own module computes by hand), or leave it out", field=field,
                         value=value)
    return value


def _problem(raw: Any, i: int, registry: EngineRegistry, base: EngineSelection,
             calls: tuple[CallMode, ...] = (CallMode.EAGER,), steps: tuple[StepInfo, ...] = (),
             library: str = "") -> WorkloadProblem:
    prefix = f"problems[{i}]"
    if not isinstance(raw, Mapping):
        raise InputError("expected a mapping with op and tensors", field=prefix, value=raw)
    _no_unknown(raw, _PROBLEM_KEYS, prefix)
    if "op" not in raw:
        raise InputError("missing op", field=f"{prefix}.op")
    if not isinstance(raw.get("tensors"), Mapping) or not raw["tensors"]:
        raise InputError("expected a mapping of tensor id to {dims: [...]}", field=f"{prefix}.tensors", value=raw.get("tensors"))
    if "library" in raw:  # a problem's own (a hand-written module's norm in a torch model's workload)
        library = _library(raw["library"], f"{prefix}.library")
    try:
        problem = Problem.create(
            raw["op"],
            raw["tensors"],
            criteria=raw.get("criteria") or {},
            compute_dtype=raw.get("compute_dtype"),
            dtype=raw.get("dtype"),
            library=library,
        )
    except InputError as exc:
        raise exc.within(prefix=prefix) from None
    engines = _engine_selection(raw.get("engines") or {}, f"{prefix}.engines", registry, base)
    # sweeps inherited from the top level apply to the problems their engine serves;
    # a sweep written on this problem must fit it
    own = engines.sweeps if isinstance(raw.get("engines"), Mapping) and "sweep" in raw["engines"] else ()
    for s in own:
        if problem.op not in registry.get(str(s.engine)).ops:
            raise InputError(f"engine {s.engine} does not implement {problem.op}", field=f"{prefix}.engines.sweep[{s.engine}]")
    if engines.include == ():
        raise InputError("include lists no engine: this problem would have no candidates", field=f"{prefix}.engines.include", value=[])
    if not engines.defaults and not any(engines.selects(str(s.engine)) and problem.op in registry.get(str(s.engine)).ops
                                        for s in engines.sweeps):
        raise InputError("defaults is false and no sweep applies to this op: this problem would have no candidates",
                         field=f"{prefix}.engines.defaults", value=False)
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise InputError("expected a string", field=f"{prefix}.name", value=name)
    if "call" in raw:
        calls = parse_calls(raw["call"], f"{prefix}.call")
    uses = parse_uses(raw["steps"], [s.label for s in steps], f"{prefix}.steps") if raw.get("steps") is not None else ()
    sites = parse_sites(raw["sites"], f"{prefix}.sites") if raw.get("sites") is not None else ()
    return WorkloadProblem(i, name or f"{problem.op}-{problem.key[:8]}", problem, engines, calls, uses, sites,
                           host_bound(uses, {s.label: s for s in steps}))


_TOKEN = re.compile(r"\[([^\]]+)\]|\.?([^.\[\]]+)")


def _locate(node: Any, field_path: str) -> int | None:
    """1-based line of ``field_path`` in the composed YAML tree (the deepest node found)."""
    if node is None or not field_path:
        return None
    line = node.start_mark.line + 1
    for m in _TOKEN.finditer(field_path):
        token = m.group(1) if m.group(1) is not None else m.group(2)
        nxt = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == token:
                    nxt = v
                    line = k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and token.isdigit() and int(token) < len(node.value):
            nxt = node.value[int(token)]
        if nxt is None:
            break
        node = nxt
        line = node.start_mark.line + 1
    return line
