"""FNV-1a 64-bit identifiers for engines and policies.

Engine and policy ids are the FNV-1a-64 hash of the UTF-8 name, reinterpreted
as a signed 64-bit integer, so they fit an int64 column and a C ``int64_t``.
"""

from __future__ import annotations

import re

FNV64_OFFSET_BASIS = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a_64(data: bytes) -> int:
    """Unsigned FNV-1a 64-bit hash of ``data``."""
    h = FNV64_OFFSET_BASIS
    for byte in data:
        h ^= byte
        h = (h * FNV64_PRIME) & _MASK64
    return h


def to_int64(value: int) -> int:
    """Reinterpret an unsigned 64-bit value as signed int64."""
    value &= _MASK64
    return value - (1 << 64) if value >= (1 << 63) else value


def name_to_id(name: str) -> int:
    """Signed FNV-1a-64 of the UTF-8 encoding of ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"an id is derived from a non-empty name, got {name!r}")
    return to_int64(fnv1a_64(name.encode("utf-8")))


# an engine named by its id: hipDNN's writer spells an engine it has no name for as its id in hex (or decimal)
_ID_SPELLING = re.compile(r"0[xX][0-9a-fA-F]{1,16}|-?[0-9]{1,20}")


def engine_name_to_id(name: str) -> int:
    """Engine id: signed FNV-1a-64 of the engine name; a name that is an id already (``0x8f1d...``, hipDNN's
    fallback, or decimal) is that id, as a signed 64-bit integer."""
    if isinstance(name, str) and _ID_SPELLING.fullmatch(name):
        value = int(name, 16) if name[:2] in ("0x", "0X") else int(name)
        if -(1 << 63) <= value < (1 << 64):
            return to_int64(value)
    return name_to_id(name)


def policy_name_to_id(name: str) -> int:
    """Policy id: signed FNV-1a-64 of the policy name."""
    return name_to_id(name)
