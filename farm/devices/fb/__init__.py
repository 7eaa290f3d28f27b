"""FlatBuffers payloads of the heuristics RFC: device properties and serialized problems.

    encode_device_properties(props) -> bytes      decode_device_properties(bytes) -> DeviceProperties
    encode_problem(problem) -> bytes              decode_problem(bytes) -> Problem

Decoders verify the buffer first (farm.devices.fb.verify) and raise FlatBufferError on
malformed bytes. The schemas are the .fbs files beside this module; the code in
generated/ is flatc's (``python -m farm.devices.fb.generate`` rewrites it).
"""

from __future__ import annotations

from typing import Sequence

import flatbuffers

from farm.devices.fb.generated import Criterion as _Criterion
from farm.devices.fb.generated import DeviceProperties as _Device
from farm.devices.fb.generated import Library as _Library
from farm.devices.fb.generated import Problem as _Problem
from farm.devices.fb.generated import Tensor as _Tensor
from farm.devices.fb.verify import DEVICE_PROPERTIES, PROBLEM, FlatBufferError, verify_buffer
from farm.devices.properties import DeviceProperties
from farm.errors import InputError
from farm.model.problem import Problem

DEVICE_IDENTIFIER = b"TFDP"
PROBLEM_IDENTIFIER = b"TFPB"

__all__ = ["FlatBufferError", "decode_device_properties", "decode_problem", "encode_device_properties", "encode_problem"]


def _strings(b: flatbuffers.Builder, *values: str) -> list[int]:
    return [b.CreateString(v) for v in values]


def _vector_of_tables(b: flatbuffers.Builder, start_vector, offsets: list[int]) -> int:
    start_vector(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def encode_device_properties(props: DeviceProperties) -> bytes:
    b = flatbuffers.Builder(512)
    libs = []
    for name, version in props.libraries:
        n, v = _strings(b, name, version)
        _Library.Start(b)
        _Library.AddName(b, n)
        _Library.AddVersion(b, v)
        libs.append(_Library.End(b))
    libraries = _vector_of_tables(b, _Device.StartLibrariesVector, libs)
    vendor, name, arch, drv, rt, uuid, host, pci, sig = _strings(
        b, props.vendor, props.name, props.arch, props.driver_version, props.runtime_version, props.uuid, props.host,
        props.pci_bus, props.signature)
    _Device.Start(b)
    _Device.AddVendor(b, vendor)
    _Device.AddName(b, name)
    _Device.AddArch(b, arch)
    _Device.AddComputeUnits(b, props.compute_units)
    _Device.AddTotalMemory(b, props.total_memory)
    _Device.AddL2Bytes(b, props.l2_bytes)
    _Device.AddClockMhz(b, props.clock_mhz)
    _Device.AddWarpSize(b, props.warp_size)
    _Device.AddDriverVersion(b, drv)
    _Device.AddRuntimeVersion(b, rt)
    _Device.AddLibraries(b, libraries)
    _Device.AddIndex(b, props.index)
    _Device.AddUuid(b, uuid)
    _Device.AddHost(b, host)
    _Device.AddPciBus(b, pci)
    _Device.AddSignature(b, sig)
    b.Finish(_Device.End(b), file_identifier=DEVICE_IDENTIFIER)
    return bytes(b.Output())


def _s(value: bytes | None) -> str:
    return value.decode("utf-8") if value is not None else ""


def decode_device_properties(buf: bytes) -> DeviceProperties:
    """Verified DeviceProperties; FlatBufferError on malformed bytes or a wrong signature."""
    verify_buffer(buf, DEVICE_PROPERTIES, DEVICE_IDENTIFIER, "device-properties")
    d = _Device.DeviceProperties.GetRootAs(bytes(buf), 0)
    libs = []
    for i in range(d.LibrariesLength()):
        lib = d.Libraries(i)
        libs.append((_s(lib.Name()), _s(lib.Version())))
    props = DeviceProperties(
        vendor=_s(d.Vendor()), name=_s(d.Name()), arch=_s(d.Arch()), compute_units=d.ComputeUnits(),
        total_memory=d.TotalMemory(), l2_bytes=d.L2Bytes(), clock_mhz=d.ClockMhz(), warp_size=d.WarpSize(),
        driver_version=_s(d.DriverVersion()), runtime_version=_s(d.RuntimeVersion()), libraries=tuple(sorted(libs)),
        index=d.Index(), uuid=_s(d.Uuid()), host=_s(d.Host()), pci_bus=_s(d.PciBus()),
    )
    stored = _s(d.Signature())
    if stored and stored != props.signature:
        raise FlatBufferError(f"malformed device-properties buffer: signature {stored!r} does not match "
                              f"the properties ({props.signature!r})")
    return props


def tensor_table(b: flatbuffers.Builder, tid: str, dims: Sequence[int], strides: Sequence[int], dtype: str) -> int:
    """A Tensor table in ``b``; -> its offset."""
    tid_at, dtype_at = _strings(b, tid, dtype)
    vectors = []
    for start, values in ((_Tensor.StartDimsVector, dims), (_Tensor.StartStridesVector, strides)):
        start(b, len(values))
        for v in reversed(values):
            b.PrependInt64(v)
        vectors.append(b.EndVector())
    _Tensor.Start(b)
    _Tensor.AddId(b, tid_at)
    _Tensor.AddDims(b, vectors[0])
    _Tensor.AddStrides(b, vectors[1])
    _Tensor.AddDtype(b, dtype_at)
    return _Tensor.End(b)


def problem_buffer(b: flatbuffers.Builder, op: str, tensors: Sequence[int], criteria: Sequence[int],
                   compute_dtype: str, key: str) -> bytes:
    """A finished Problem buffer of tables already in ``b`` (tensor_table's offsets, criteria's)."""
    tensor_vec = _vector_of_tables(b, _Problem.StartTensorsVector, list(tensors))
    crit_vec = _vector_of_tables(b, _Problem.StartCriteriaVector, list(criteria))
    op_at, cdt, key_at = _strings(b, op, compute_dtype, key)
    _Problem.Start(b)
    _Problem.AddOp(b, op_at)
    _Problem.AddTensors(b, tensor_vec)
    _Problem.AddCriteria(b, crit_vec)
    _Problem.AddComputeDtype(b, cdt)
    _Problem.AddKey(b, key_at)
    b.Finish(_Problem.End(b), file_identifier=PROBLEM_IDENTIFIER)
    return bytes(b.Output())


def encode_problem(problem: Problem) -> bytes:
    b = flatbuffers.Builder(512)
    tensors = [tensor_table(b, t.id, t.dims, t.strides, t.dtype) for t in problem.tensors]
    crits = []
    for name, value in problem.criteria:
        n = b.CreateString(name)
        _Criterion.Start(b)
        _Criterion.AddName(b, n)
        _Criterion.AddValue(b, value)
        crits.append(_Criterion.End(b))
    return problem_buffer(b, problem.op, tensors, crits, problem.compute_dtype, problem.key)


def decode_problem(buf: bytes) -> Problem:
    """Verified, validated Problem; FlatBufferError on malformed bytes or an invalid problem."""
    verify_buffer(buf, PROBLEM, PROBLEM_IDENTIFIER, "problem")
    p = _Problem.Problem.GetRootAs(bytes(buf), 0)
    tensors = {}
    for i in range(p.TensorsLength()):
        t = p.Tensors(i)
        dims = [int(t.Dims(j)) for j in range(t.DimsLength())]
        strides = [int(t.Strides(j)) for j in range(t.StridesLength())]
        tensors[_s(t.Id())] = {"dims": dims, "strides": strides, "dtype": _s(t.Dtype())}
    criteria = {}
    for i in range(p.CriteriaLength()):
        c = p.Criteria(i)
        criteria[_s(c.Name())] = int(c.Value())
    try:
        problem = Problem.create(_s(p.Op()), tensors, criteria=criteria, compute_dtype=_s(p.ComputeDtype()) or None)
    except InputError as exc:
        raise FlatBufferError(f"malformed problem buffer: the problem it holds is invalid: {exc}") from None
    stored = _s(p.Key())
    if stored and stored != problem.key:
        raise FlatBufferError(f"malformed problem buffer: key {stored!r} does not match the problem ({problem.key!r})")
    return problem
