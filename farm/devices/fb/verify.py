"""A FlatBuffers verifier for our schemas (the Python runtime has none).

It checks, before any generated accessor reads a byte: the buffer is long
enough, the file identifier, every table's vtable and object bounds, every
field inside its object, every offset, string (terminated, UTF-8) and vector
inside the buffer, and the nesting depth. Malformed input raises
FlatBufferError; nothing else escapes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Union

from farm.errors import FarmError


class FlatBufferError(FarmError, ValueError):
    """Bytes that are not a well-formed buffer of the expected type."""


@dataclass(frozen=True)
class Scalar:
    size: int


@dataclass(frozen=True)
class String:
    pass


@dataclass(frozen=True)
class Vector:
    element: Union[Scalar, String, "Table"]
    max_len: int = 64


@dataclass(frozen=True)
class Table:
    name: str
    fields: tuple[tuple[str, Union[Scalar, String, Vector, "Table"]], ...]  # in schema order (slot = index)


I32, I64, U64 = Scalar(4), Scalar(8), Scalar(8)
STR = String()

LIBRARY = Table("Library", (("name", STR), ("version", STR)))
DEVICE_PROPERTIES = Table("DeviceProperties", (
    ("vendor", STR), ("name", STR), ("arch", STR), ("compute_units", I32), ("total_memory", U64),
    ("l2_bytes", U64), ("clock_mhz", I32), ("warp_size", I32), ("driver_version", STR), ("runtime_version", STR),
    ("libraries", Vector(LIBRARY, 256)), ("index", I32), ("uuid", STR), ("host", STR), ("pci_bus", STR),
    ("signature", STR),
))
TENSOR = Table("Tensor", (("id", STR), ("dims", Vector(I64, 16)), ("strides", Vector(I64, 16)), ("dtype", STR)))
CRITERION = Table("Criterion", (("name", STR), ("value", I64)))
PROBLEM = Table("Problem", (
    ("op", STR), ("tensors", Vector(TENSOR, 16)), ("criteria", Vector(CRITERION, 64)), ("compute_dtype", STR),
    ("key", STR),
))

# bounds on the work a buffer can ask for: far above any real problem or device, so a hostile
# payload is rejected in well under a millisecond per kilobyte
MAX_BUFFER_BYTES = 64 * 1024
MAX_DEPTH = 16
MAX_TABLES = 4096
MAX_STRING_BYTES = 4096


class _Verifier:
    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.n = len(buf)
        self.what = what
        self.tables = 0

    def fail(self, message: str) -> FlatBufferError:
        return FlatBufferError(f"malformed {self.what} buffer ({self.n} bytes): {message}")

    def u32(self, pos: int, what: str) -> int:
        if pos < 0 or pos + 4 > self.n:
            raise self.fail(f"{what} at offset {pos} is outside the buffer")
        return struct.unpack_from("<I", self.buf, pos)[0]

    def i32(self, pos: int, what: str) -> int:
        if pos < 0 or pos + 4 > self.n:
            raise self.fail(f"{what} at offset {pos} is outside the buffer")
        return struct.unpack_from("<i", self.buf, pos)[0]

    def u16(self, pos: int, what: str) -> int:
        if pos < 0 or pos + 2 > self.n:
            raise self.fail(f"{what} at offset {pos} is outside the buffer")
        return struct.unpack_from("<H", self.buf, pos)[0]

    def target(self, pos: int, what: str) -> int:
        """Follow the uoffset stored at ``pos``."""
        off = self.u32(pos, what)
        if off == 0:
            raise self.fail(f"{what} at offset {pos} is a zero offset")
        dest = pos + off
        if dest >= self.n:
            raise self.fail(f"{what} at offset {pos} points past the end ({dest})")
        return dest

    def string(self, pos: int, what: str) -> None:
        length = self.u32(pos, f"{what} length")
        if length > MAX_STRING_BYTES:
            raise self.fail(f"{what} at offset {pos} is {length} bytes long (at most {MAX_STRING_BYTES})")
        end = pos + 4 + length
        if end >= self.n:
            raise self.fail(f"{what} of {length} bytes at offset {pos} runs past the end")
        if self.buf[end] != 0:
            raise self.fail(f"{what} at offset {pos} is not null-terminated")
        try:
            bytes(self.buf[pos + 4:end]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at offset {pos} is not valid UTF-8") from None

    def vector(self, pos: int, vec: Vector, what: str, depth: int) -> None:
        count = self.u32(pos, f"{what} length")
        if count > vec.max_len:
            raise self.fail(f"{what} has {count} elements (at most {vec.max_len})")
        elem = vec.element
        size = elem.size if isinstance(elem, Scalar) else 4
        if pos + 4 + count * size > self.n:
            raise self.fail(f"{what} of {count} elements at offset {pos} runs past the end")
        if isinstance(elem, Scalar):
            return
        for i in range(count):
            slot = pos + 4 + 4 * i
            dest = self.target(slot, f"{what}[{i}]")
            if isinstance(elem, String):
                self.string(dest, f"{what}[{i}]")
            else:
                self.table(dest, elem, depth + 1, f"{what}[{i}]")

    def table(self, pos: int, spec: Table, depth: int, what: str) -> None:
        if depth > MAX_DEPTH:
            raise self.fail(f"{what}: tables nested deeper than {MAX_DEPTH}")
        self.tables += 1
        if self.tables > MAX_TABLES:
            raise self.fail(f"more than {MAX_TABLES} tables")
        vtable = pos - self.i32(pos, f"{what} ({spec.name}) vtable offset")
        vt_size = self.u16(vtable, f"{what} ({spec.name}) vtable size")
        obj_size = self.u16(vtable + 2, f"{what} ({spec.name}) object size")
        if vt_size < 4 or vt_size % 2 or vtable + vt_size > self.n:
            raise self.fail(f"{what} ({spec.name}) vtable at {vtable} has an invalid size {vt_size}")
        if obj_size < 4 or pos + obj_size > self.n:
            raise self.fail(f"{what} ({spec.name}) object at {pos} of size {obj_size} runs past the end")
        for slot, (name, kind) in enumerate(spec.fields):
            entry = 4 + 2 * slot
            if entry >= vt_size:
                break  # fields past the vtable are absent (written by an older schema)
            voff = self.u16(vtable + entry, f"{spec.name}.{name} field offset")
            if voff == 0:
                continue
            size = kind.size if isinstance(kind, Scalar) else 4
            if voff < 4 or voff + size > obj_size:
                raise self.fail(f"{spec.name}.{name} at {voff} lies outside its object (size {obj_size})")
            field_pos = pos + voff
            if isinstance(kind, Scalar):
                continue
            dest = self.target(field_pos, f"{spec.name}.{name}")
            if isinstance(kind, String):
                self.string(dest, f"{spec.name}.{name}")
            elif isinstance(kind, Vector):
                self.vector(dest, kind, f"{spec.name}.{name}", depth)
            else:
                self.table(dest, kind, depth + 1, f"{spec.name}.{name}")


def verify_buffer(buf: bytes, root: Table, identifier: bytes, what: str) -> None:
    """Raise FlatBufferError unless ``buf`` is a well-formed ``root`` buffer with ``identifier``."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise FlatBufferError(f"malformed {what} buffer: expected bytes, got {type(buf).__name__}")
    buf = bytes(buf)
    v = _Verifier(buf, what)
    if len(buf) > MAX_BUFFER_BYTES:
        raise v.fail(f"larger than {MAX_BUFFER_BYTES} bytes")
    if len(buf) < 8:
        raise v.fail("shorter than a root offset and a file identifier")
    if buf[4:8] != identifier:
        raise v.fail(f"file identifier {buf[4:8]!r}, expected {identifier!r}")
    root_pos = v.u32(0, "root offset")
    if root_pos < 8 or root_pos >= len(buf):
        raise v.fail(f"root table offset {root_pos} is outside the buffer")
    v.table(root_pos, root, 0, "root")
