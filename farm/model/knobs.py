"""Knobs: named, typed, validated settings of an engine.

A knob is an int, float or str with either a range (int/float) or a list of
choices, and a default. Knob settings are normalised to a sorted tuple of
(name, value) pairs holding only the values that differ from the default, so
``{}`` and ``{"tile": <default>}`` name the same candidate and knob order never
matters.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence, Union

from farm.errors import InputError

KnobValue = Union[int, float, str]
KnobSettings = tuple[tuple[str, KnobValue], ...]

# Managed by the tuner in EXHAUSTIVE mode; stripped (with a warning) from user plan specs.
BENCHMARKING_KNOB = "global.benchmarking"


class KnobType(str, enum.Enum):
    INT = "int"
    FLOAT = "double"  # the override file's spelling
    STR = "string"

    @classmethod
    def parse(cls, text: str) -> "KnobType":
        aliases = {"int": cls.INT, "integer": cls.INT, "int64": cls.INT,
                   "double": cls.FLOAT, "float": cls.FLOAT, "real": cls.FLOAT,
                   "string": cls.STR, "str": cls.STR}
        try:
            return aliases[str(text).lower()]
        except KeyError:
            raise InputError("knob type must be int, double or string", field="type", value=text) from None


@dataclass(frozen=True)
class Knob:
    """A typed engine setting with a range or choices, and a default."""

    name: str
    type: KnobType
    default: KnobValue
    min: float | None = None
    max: float | None = None
    choices: tuple[KnobValue, ...] = ()
    doc: str = ""

    def __post_init__(self) -> None:
        if self.choices and (self.min is not None or self.max is not None):
            raise ValueError(f"knob {self.name}: give a range or choices, not both")
        if self.type is KnobType.STR and not self.choices:
            raise ValueError(f"knob {self.name}: a string knob needs choices")
        object.__setattr__(self, "choices", tuple(self.choices))
        # The default must itself be valid.
        self.validate(self.default, engine="<definition>")

    @staticmethod
    def int(name: str, default: int, *, min: int | None = None, max: int | None = None,
            choices: Sequence[int] = (), doc: str = "") -> "Knob":
        return Knob(name, KnobType.INT, default, min, max, tuple(choices), doc)

    @staticmethod
    def float(name: str, default: float, *, min: float | None = None, max: float | None = None,
              choices: Sequence[float] = (), doc: str = "") -> "Knob":
        return Knob(name, KnobType.FLOAT, float(default), min, max, tuple(float(c) for c in choices), doc)

    @staticmethod
    def str(name: str, default: str, *, choices: Sequence[str], doc: str = "") -> "Knob":
        return Knob(name, KnobType.STR, default, None, None, tuple(choices), doc)

    def validate(self, value: Any, *, engine: str) -> KnobValue:
        """The value coerced to the knob's type, or an InputError naming engine, knob and value."""
        field_path = f"engine {engine} knob {self.name}"
        if self.type is KnobType.INT:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
                raise InputError("expected an integer", field=field_path, value=value)
            v: KnobValue = int(value)
        elif self.type is KnobType.FLOAT:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError("expected a finite number", field=field_path, value=value)
            v = float(value)
        else:
            if not isinstance(value, str):
                raise InputError("expected a string", field=field_path, value=value)
            v = value
        if self.choices and v not in self.choices:
            raise InputError(f"must be one of {list(self.choices)}", field=field_path, value=value)
        if self.min is not None and v < self.min:  # type: ignore[operator]
            raise InputError(f"must be >= {_fmt(self.min)}", field=field_path, value=value)
        if self.max is not None and v > self.max:  # type: ignore[operator]
            raise InputError(f"must be <= {_fmt(self.max)}", field=field_path, value=value)
        return v

    def describe(self) -> str:
        """``tile: int in {32, 64, 128}, default 64``-style text for tables."""
        if self.choices:
            dom = "{" + ", ".join(str(c) for c in self.choices) + "}"
            rng = f" in {dom}"
        elif self.min is not None or self.max is not None:
            lo = _fmt(self.min) if self.min is not None else "-inf"
            hi = _fmt(self.max) if self.max is not None else "inf"
            rng = f" in [{lo}, {hi}]"
        else:
            rng = ""
        return f"{self.name}: {self.type.value}{rng} = {self.default}"


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else str(x)


def normalize_settings(
    knobs: Iterable[Knob],
    settings: Mapping[str, Any] | Iterable[tuple[str, Any]],
    *,
    engine: str,
) -> KnobSettings:
    """Validated, canonical knob settings (defaults dropped, sorted by name).

    Raises InputError for an unknown knob or a bad value. The benchmarking knob
    is not handled here: callers strip it first.
    """
    by_name = {k.name: k for k in knobs}
    items = settings.items() if isinstance(settings, Mapping) else settings
    out: dict[str, KnobValue] = {}
    for name, value in items:
        knob = by_name.get(name)
        if knob is None:
            known = ", ".join(sorted(by_name)) or "none"
            raise InputError(f"unknown knob (known: {known})", field=f"engine {engine} knob {name}", value=value)
        v = knob.validate(value, engine=engine)
        if v != knob.default:
            out[name] = v
        else:
            out.pop(name, None)
    return tuple(sorted(out.items()))


def resolve(knobs: Iterable[Knob], settings: KnobSettings) -> dict[str, KnobValue]:
    """Every knob's value: defaults overlaid with ``settings``."""
    values: dict[str, KnobValue] = {k.name: k.default for k in knobs}
    values.update(dict(settings))
    return values


def value_from_text(text: str) -> KnobValue:
    """A value written as text (``128``, ``0.5``, ``serial``): an int, else a float, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def knob_type_of(value: KnobValue) -> KnobType:
    if isinstance(value, bool):
        return KnobType.INT
    if isinstance(value, int):
        return KnobType.INT
    if isinstance(value, float):
        return KnobType.FLOAT
    return KnobType.STR


def format_settings(settings: KnobSettings) -> str:
    """``tile=64,threads=2`` (``default`` when empty)."""
    return ",".join(f"{k}={v}" for k, v in settings) if settings else "default"


def candidate_label(engine_name: str, knobs: KnobSettings) -> str:
    """``engine[knob=value,...]`` (``engine[default]``): how every surface names a candidate."""
    return f"{engine_name}[{format_settings(tuple(knobs))}]"
