"""The runtime tuner's results file (its design document's format, and PyTorch TunableOp's), read and written:
``Validator`` lines, then ``op,params,kernel,avg_time`` (ms).

    Validator,TP_TUNABLEOP_FORMAT,1
    Validator,CUDA_DEVICE,9.0:NVIDIA H200
    Validator,CUBLASLT_VERSION,120804
    Validator,DEVICE_SIGNATURE,nvidia-h200-sm90-132cu-490820f783
    GemmTunableOp_Float32,taN_m512_n1024_k256_bias0_dev0,lt_id7_tile12_stages3_splitk0_red0_swizzle0_custom0_inner1_cluster1,0.033
    GemmTunableOp_Half_NN,nn_4096_1024_512_ld_4096_512_4096,triton.gemm[BLOCK_M=128;BLOCK_N=64],0.0123
    conv_fprop,X:1x64x56x56:200704x3136x56x1:fp16;W:64x64x3x3:576x9x3x1:fp16;pad_h=1;compute=fp32,cpu.conv.im2col,0.41

A 2-D matmul is written in the runtime tuner's own line (its design document): ``GemmTunableOp_<Float32|Tf32|
Float64|Float16|BFloat16>``, ``ta<N|T>_m<M>_n<N>_k<K>_bias<0|1>_dev<ordinal>`` (``taT``: A given transposed,
column-major; B row-major; ``bias1``: a bias of N), and a cuBLASLt algorithm as its kernel
``lt_id<algo>_tile.._stages.._splitk.._red.._swizzle.._custom.._inner.._cluster..`` (our ``cublaslt`` engine's
knobs). A line of another device ordinal is kept, not replayed (the tuner keys its lines by ordinal). A matmul
that line cannot say (B column-major) is written as PyTorch TunableOp writes a GEMM, and so is every matmul of
a file that holds PyTorch's lines: BLAS's column-major view of ``C = A @ B`` on row-major tensors,
``C^T = B^T A^T`` (m = N, n = M, k = K; the first operand is B), ``GemmTunableOp_<type>_<TA><TB>`` and
``<ta><tb>_m_n_k_ld_lda_ldb_ldc``; lines without the ``_ld_`` part (older PyTorch) are read as dense. Every
other problem gets a line of our own: the op name,
then its tensors (``id:dims:strides:dtype``), criteria (``name=value``) and compute type, separated by ``;``
so no comma breaks TunableOp's reader. The kernel is ``engine[knob=value;...]``; ``Default`` is the
heuristic's top choice. Lines this build cannot map (another TunableOp op, a malformed line) and validators
are kept and written back, so a TunableOp user's file survives a round trip. A file is for this device and
build when every validator it shares with ours (CUDA_DEVICE, CUBLASLT_VERSION, GCN_ARCH_NAME on AMD, device
name, arch, driver, runtime and library versions, DEVICE_SIGNATURE, PT_VERSION) has our value, it names no
device of a kind this one is not (a CUDA_DEVICE read on a CPU), it has at least one validator this build knows,
and its format line, when it has one, says 1.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from farm._version import __version__
from farm.errors import InputError
from farm.fsutil import PathLock, atomic_write_text, move_aside, read_text_file
from farm.model import dtypes
from farm.model.knobs import KnobSettings, value_from_text
from farm.model.op_catalog import OPS
from farm.model.tunableop_gemms import TYPE_NAMES, gemm_tensors
from farm.store.overrides.files import lock_path, merge_entries
from farm.store.overrides.entries import OVERRIDE_VERSION, OverrideEntry, OverrideFile, TensorRule

log = logging.getLogger("farm.store.overrides.tunableop_csv")

DEFAULT_KERNEL = "Default"  # TunableOp's name for the library's own (heuristic) choice
VALIDATORS = "tunableop_validators"  # OverrideFile.extra keys: what is kept for the rewrite
FOREIGN = "tunableop_lines"
_LINE = "tunableop_line"  # OverrideEntry.extra: the line an entry was read from
# the runtime tuner's own GEMM line: its dtype names (storage, compute), and its params
_SEED_TYPES = {"Float32": ("fp32", "fp32"), "Tf32": ("fp32", "tf32"), "Float64": ("fp64", "fp64"),
               "Float16": ("fp16", "fp32"), "Half": ("fp16", "fp32"), "BFloat16": ("bf16", "fp32")}
_SEED_NAMES = {v: k for k, v in _SEED_TYPES.items() if k != "Half"}
_SEED_OP = re.compile(r"GemmTunableOp_(" + "|".join(_SEED_TYPES) + ")")
_SEED_PARAMS = re.compile(r"ta([NT])_m(\d+)_n(\d+)_k(\d+)_bias([01])_dev(\d+)")
# its cuBLASLt kernel names: lt_<field><value>_..., our cublaslt engine's knobs
LT_ENGINE = "cublaslt"
_LT_FIELDS = (("id", "algo"), ("tile", "tile"), ("stages", "stages"), ("splitk", "split_k"), ("red", "reduction"),
              ("swizzle", "swizzle"), ("custom", "custom"), ("inner", "inner_shape"), ("cluster", "cluster"))
_LT_KERNEL = re.compile("lt_" + "_".join(rf"{field}(-?\d+)" for field, _ in _LT_FIELDS))


def is_tunableop_csv(path: str | Path) -> bool:
    return str(path).lower().endswith(".csv")


# -- reading -------------------------------------------------------------------------------------
def load_tunableop_csv(path: str | Path, *, ordinal: int | None = None) -> OverrideFile:
    return parse_tunableop_csv(read_text_file(path, "TunableOp results file"), source=str(path), ordinal=ordinal)


def parse_tunableop_csv(text: str, *, source: str = "<tunableop>", ordinal: int | None = None) -> OverrideFile:
    """Entries for the lines this build maps; validators and the other lines kept in ``extra``. With ``ordinal``,
    the runtime tuner's lines of another device ordinal (``_dev1``) are kept, not replayed, as the tuner does."""
    validators: list[list[str]] = []
    foreign: list[list[str]] = []
    entries: list[OverrideEntry] = []
    text = text[1:] if text.startswith("\ufeff") else text  # a spreadsheet's save starts with a byte-order mark
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise InputError(f"not a TunableOp results file: {exc}", source=source) from None
    for lineno, row in enumerate(rows, 1):
        if not row or not "".join(row).strip():
            continue
        if row[0] == "Validator":
            if len(row) < 3:
                raise InputError("a Validator line needs a name and a value", field=f"line {lineno}", value=",".join(row),
                                 source=source)
            validators.append(row[:3])
            continue
        if len(row) < 4:  # a hand edit gone wrong: that line is not replayed, the others are (and it is kept)
            log.warning("tunableop: %s line %d: expected op,params,kernel,time, got %r; kept as it is, not replayed",
                        source, lineno, ",".join(row))
            foreign.append(list(row))
            continue
        try:
            entry = _entry(row, ordinal)
        except (InputError, ValueError) as exc:
            log.info("tunableop: %s line %d kept as it is (%s)", source, lineno, str(exc).splitlines()[0])
            entry = None
        if entry is None:
            foreign.append(row[:4])
        else:  # written back as it was read, unless replaced
            entries.append(dataclasses.replace(entry, extra={_LINE: list(row[:4])}))
    device = {"signature": v} if (v := dict((k, val) for _, k, val in validators).get("DEVICE_SIGNATURE")) else None
    return OverrideFile(OVERRIDE_VERSION, entries, device, {VALIDATORS: validators, FOREIGN: foreign}, source)


def _entry(row: Sequence[str], ordinal: int | None = None) -> OverrideEntry | None:
    op_name, params, kernel, time_text = (c.strip() for c in row[:4])
    time_ms = float(time_text) if time_text else 0.0
    if not math.isfinite(time_ms) or time_ms < 0:
        raise ValueError(f"time {time_text!r} is not a finite number of milliseconds")
    meta = {"min_time_ms": time_ms, "median_time_ms": time_ms, "source": "tunableop"}
    engine, knobs = _parse_kernel(kernel)
    seed = _SEED_OP.fullmatch(op_name)
    if seed is not None:
        p = _SEED_PARAMS.fullmatch(params)
        if p is None or (ordinal is not None and int(p.group(6)) != ordinal):
            return None
        dtype, compute = _SEED_TYPES[seed.group(1)]
        m, n, k = (int(x) for x in p.group(2, 3, 4))
        tensors = [TensorRule("A", (m, k), (k, 1) if p.group(1) == "N" else (1, m), dtype),
                   TensorRule("B", (k, n), (n, 1), dtype), TensorRule("C", (m, n), (n, 1), dtype)]
        if p.group(5) == "1":
            tensors.append(TensorRule("bias", (n,), (1,), dtype))
        return OverrideEntry("matmul", engine, tuple(tensors), (), knobs, compute, {**meta, "device_ordinal":
                                                                                      int(p.group(6))})
    if op_name.startswith("GemmTunableOp_"):
        got = gemm_tensors(op_name, params)
        if got is None:
            return None
        dtype, spec = got
        tensors = tuple(TensorRule(t, tuple(spec[t]["dims"]), tuple(spec[t]["strides"]), dtype) for t in ("A", "B", "C"))
        return OverrideEntry("matmul", engine, tensors, (), knobs, dtypes.default_compute_dtype(dtype), meta)
    if op_name not in OPS:
        return None
    tensors_l, criteria, compute = [], [], None
    for token in params.split(";"):
        if token.startswith("compute="):
            compute = token.split("=", 1)[1]
        elif "=" in token:
            name, value = token.split("=", 1)
            criteria.append((name, int(value)))
        else:
            tid, dims, strides, dtype = token.split(":")
            tensors_l.append(TensorRule(tid, _ints(dims), _ints(strides), dtype or None))
    return OverrideEntry(op_name, engine, tuple(tensors_l), tuple(sorted(criteria)), knobs, compute, meta)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x")) if text else ()


def _parse_kernel(kernel: str) -> tuple[str, KnobSettings]:
    """``engine[k=v;k2=v2]`` -> (engine, knobs); a value is an int, else a float, else a string. The runtime
    tuner's ``lt_id7_tile12_...`` is a cuBLASLt algorithm: our cublaslt engine with those knobs."""
    lt = _LT_KERNEL.fullmatch(kernel)
    if lt is not None:
        return LT_ENGINE, tuple(sorted((knob, int(v)) for (_, knob), v in zip(_LT_FIELDS, lt.groups())))
    m = re.fullmatch(r"([^\[\]]+)(?:\[(.*)\])?", kernel)
    if m is None or not m.group(1):
        raise InputError("expected engine[knob=value;...]", field="kernel", value=kernel)
    knobs = []
    for part in filter(None, (m.group(2) or "").split(";")):
        name, _, value = part.partition("=")
        knobs.append((name, value_from_text(value)))
    return m.group(1), tuple(sorted(knobs))


# -- writing -------------------------------------------------------------------------------------
def gemm_signature(e: OverrideEntry) -> tuple[str, str] | None:
    """TunableOp's (op, params) for a dense 2-D matmul entry; None for anything it has no GEMM line for."""
    by_id = {t.tensor_id: t for t in e.tensors}
    a, b, c = by_id.get("A"), by_id.get("B"), by_id.get("C")
    if e.op != "matmul" or set(by_id) - {"A", "B", "C"} or e.criteria or a is None or b is None:
        return None
    dtype = a.data_type
    if dtype not in TYPE_NAMES or b.data_type != dtype or (c is not None and c.data_type not in (None, dtype)):
        return None
    if e.compute_data_type not in (None, dtypes.default_compute_dtype(dtype)):
        return None
    if len(a.dims) != 2 or len(b.dims) != 2 or -1 in a.dims + b.dims:
        return None
    (mm, kk), (_, nn) = a.dims, b.dims
    ta, lda = _blas_operand(b.strides, nn, kk)
    tb, ldb = _blas_operand(a.strides, kk, mm)
    ldc = nn
    if c is not None and c.strides:
        if len(c.strides) != 2 or c.strides[1] != 1:
            return None
        ldc = c.strides[0]
    if ta is None or tb is None:
        return None
    return (f"GemmTunableOp_{TYPE_NAMES[dtype]}_{ta.upper()}{tb.upper()}",
            f"{ta}{tb}_{nn}_{mm}_{kk}_ld_{lda}_{ldb}_{ldc}")


def seed_signature(e: OverrideEntry, ordinal: int = 0) -> tuple[str, str] | None:
    """The runtime tuner's (op, params) for a 2-D matmul (A row-major or transposed, B and C row-major, an
    optional bias of N); None for anything its line cannot say."""
    by_id = {t.tensor_id: t for t in e.tensors}
    a, b, c, bias = by_id.get("A"), by_id.get("B"), by_id.get("C"), by_id.get("bias")
    if e.op != "matmul" or set(by_id) - {"A", "B", "C", "bias"} or e.criteria or a is None or b is None:
        return None
    if len(a.dims) != 2 or len(b.dims) != 2 or -1 in a.dims + b.dims:
        return None
    dtype = a.data_type
    compute = e.compute_data_type or dtypes.default_compute_dtype(dtype or "fp32")
    name = _SEED_NAMES.get((dtype, compute))
    if name is None or any(t is not None and t.data_type not in (None, dtype) for t in (b, c, bias)):
        return None
    (m, k), (_, n) = a.dims, b.dims
    if a.strides in ((), (k, 1)):
        ta = "N"
    elif a.strides == (1, m):
        ta = "T"
    else:
        return None
    if b.strides not in ((), (n, 1)) or (c is not None and c.strides not in ((), (n, 1))):
        return None
    if bias is not None and (bias.dims not in ((n,), (1, n)) or bias.strides not in ((), (1,), (n, 1))):
        return None
    return f"GemmTunableOp_{name}", f"ta{ta}_m{m}_n{n}_k{k}_bias{int(bias is not None)}_dev{ordinal}"


def _kernel_text(e: OverrideEntry) -> str:
    """The kernel field: ``lt_id7_tile12_...`` for a cuBLASLt algorithm with every field set (the runtime
    tuner's name), else ``engine[knob=value;...]``."""
    knobs = dict(e.knobs)
    if e.engine_name == LT_ENGINE and all(knob in knobs for _, knob in _LT_FIELDS) and len(knobs) == len(_LT_FIELDS):
        return "lt_" + "_".join(f"{field}{int(knobs[knob])}" for field, knob in _LT_FIELDS)
    return e.engine_name + ("[" + ";".join(f"{k}={v}" for k, v in e.knobs) + "]" if e.knobs else "")


def _blas_operand(strides: Sequence[int], cols: int, rows: int) -> tuple[str | None, int]:
    """('n' | 't', leading dimension) of a row-major-view operand with these strides, (None, 0) if neither."""
    if not strides:
        return "n", cols
    if len(strides) == 2 and strides[1] == 1 and strides[0] >= max(cols, 1):
        return "n", strides[0]
    if len(strides) == 2 and strides[0] == 1 and strides[1] >= max(rows, 1):
        return "t", strides[1]
    return None, 0


def result_line(e: OverrideEntry, *, ordinal: int = 0, dialect: str = "seed") -> list[str]:
    """A result line's fields for an entry: op, params, kernel (the engine, knobs in brackets), time in ms.
    ``dialect``: ``seed`` (the runtime tuner's GEMM line first) or ``pytorch`` (PyTorch's GEMM line first)."""
    if isinstance(e.extra.get(_LINE), list):
        return list(e.extra[_LINE])
    sig = seed_signature(e, ordinal) if dialect == "seed" else None
    sig = sig or gemm_signature(e)
    if sig is None:
        tokens = [f"{t.tensor_id}:{'x'.join(map(str, t.dims))}:{'x'.join(map(str, t.strides))}:{t.data_type or ''}"
                  for t in e.tensors]
        tokens += [f"{k}={v}" for k, v in e.criteria]
        if e.compute_data_type:
            tokens.append(f"compute={e.compute_data_type}")
        sig = (e.op, ";".join(tokens))
    kernel = _kernel_text(e)
    meta = e.metadata or {}
    time_ms = meta.get("median_time_ms") or meta.get("min_time_ms")
    return [sig[0], sig[1], kernel, f"{time_ms:.6f}" if isinstance(time_ms, (int, float)) else "0"]


FORMAT_VALIDATOR = ("TP_TUNABLEOP_FORMAT", "1")  # the runtime tuner's document's format line, written first
_NOT_COMPARED = {"FARM_VERSION", FORMAT_VALIDATOR[0]}  # our own build, and the format (checked on its own)


def device_validators(device: Mapping[str, Any] | None) -> list[list[str]]:
    """Our Validator lines for a device (``{"signature", "properties"}``): the document's format line, then the
    device and library lines."""
    props = (device or {}).get("properties") or {}
    out = [["Validator", *FORMAT_VALIDATOR], ["Validator", "FARM_VERSION", __version__]]
    if (device or {}).get("signature"):
        out.append(["Validator", "DEVICE_SIGNATURE", device["signature"]])
    for key, name in (("name", "DEVICE_NAME"), ("arch", "ARCH"), ("driver_version", "DRIVER_VERSION"),
                      ("runtime_version", "RUNTIME_VERSION")):
        if props.get(key):
            out.append(["Validator", name, str(props[key])])
    cuda = _cuda_device(props)
    if cuda:  # the runtime tuner's device and cuBLASLt lines
        out.append(["Validator", "CUDA_DEVICE", cuda])
        # the loaded library's number where the caller knows it (the runtime tuner), else the cuBLAS release's
        lt = str((device or {}).get("cublaslt_version") or "") or \
            _cublaslt_version((props.get("libraries") or {}).get("cublas", ""))
        if lt:
            out.append(["Validator", "CUBLASLT_VERSION", lt])
    if props.get("vendor") == "amd" and props.get("arch"):
        out.append(["Validator", "GCN_ARCH_NAME", str(props["arch"])])  # PyTorch TunableOp's name on ROCm
    for lib, version in sorted((props.get("libraries") or {}).items()):
        out.append(["Validator", f"{lib.upper()}_VERSION", str(version)])
        if lib == "torch":
            out.append(["Validator", "PT_VERSION", str(version)])  # the name TunableOp checks
    return out


def _cuda_device(props: Mapping[str, Any]) -> str:
    """The runtime tuner's CUDA_DEVICE: ``<major>.<minor>:<name>`` (``9.0:NVIDIA H200``); "" off NVIDIA."""
    m = re.fullmatch(r"sm_(\d+)(\d)[a-z]?", str(props.get("arch", "")))
    if props.get("vendor") != "nvidia" or m is None:
        return ""
    return f"{int(m.group(1))}.{m.group(2)}:{props.get('name', '')}"


def _cublaslt_version(version: str) -> str:
    """cublasLtGetVersion()'s number for a cuBLAS release (12.8.4.1 -> 120804), "" when unknown."""
    parts = re.findall(r"\d+", version)[:3]
    if len(parts) < 2:
        return ""
    major, minor, patch = (int(x) for x in (parts + ["0"])[:3])
    return str(major * 10000 + minor * 100 + patch)


# validators that name the device itself: a file naming one that this device has not is another device's
_DEVICE_VALIDATORS = ("CUDA_DEVICE", "GCN_ARCH_NAME", "DEVICE_SIGNATURE")
# every validator name this build knows (a file naming none of them is judged on nothing: refused)
_KNOWN_VALIDATORS = {FORMAT_VALIDATOR[0], "FARM_VERSION", "DEVICE_SIGNATURE", "DEVICE_NAME", "ARCH", "DRIVER_VERSION",
                     "RUNTIME_VERSION", "PT_VERSION", "CUDA_DEVICE", "CUBLASLT_VERSION", "GCN_ARCH_NAME", "ROCM_VERSION",
                     "HIPBLASLT_VERSION", "ROCBLAS_VERSION", "CUDA_VERSION", "CUBLAS_VERSION"}


def validator_mismatch(doc: OverrideFile, device: Mapping[str, Any]) -> str:
    """Why a results file read from CSV is not for this device and build ("" when it is): an unknown format
    version, or a validator both sides give with different values (one the file lacks is not compared, so a
    PyTorch user's file with only PT_VERSION is judged on that)."""
    given = {row[1]: row[2] for row in doc.extra.get(VALIDATORS, []) if isinstance(row, list) and len(row) >= 3}
    fmt = given.get(FORMAT_VALIDATOR[0])
    if fmt is not None and fmt.strip() != FORMAT_VALIDATOR[1]:
        return f"validator {FORMAT_VALIDATOR[0]} {fmt} (this build reads format {FORMAT_VALIDATOR[1]})"
    ours = {row[1]: row[2] for row in device_validators(device)}
    if not any(name in _KNOWN_VALIDATORS or name.endswith("_VERSION") for name in given):
        return (f"no validator this build knows ({', '.join(sorted(given)) or 'none'}): nothing says which device "
                "and build it is for")
    foreign = [f"{name} {given[name]}" for name in _DEVICE_VALIDATORS if name in given and name not in ours]
    if foreign:
        return f"another kind of device: {', '.join(foreign)} (this is {(device.get('properties') or {}).get('name')})"
    differ = [f"{name} {given[name]} vs {value}" for name, value in ours.items()
              if name not in _NOT_COMPARED and name in given and given[name].strip() != value]
    return "validators differ: " + ", ".join(differ) if differ else ""


def render_tunableop_csv(doc: OverrideFile) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    kept = [v for v in doc.extra.get(VALIDATORS, []) if isinstance(v, list)]
    ours = device_validators(doc.device)
    names = {v[1] for v in ours}
    for v in ours + [v for v in kept if v[1] not in names]:  # ours first; a TunableOp user's others kept
        w.writerow(v)
    # a PyTorch user's file (validators of its own, none of the runtime tuner's format) keeps PyTorch's GEMM lines
    dialect = "pytorch" if kept and not any(v[1] == FORMAT_VALIDATOR[0] for v in kept) else "seed"
    ordinal = int(((doc.device or {}).get("properties") or {}).get("index") or 0)
    for e in doc.entries:
        w.writerow(result_line(e, ordinal=ordinal, dialect=dialect))
    for row in doc.extra.get(FOREIGN, []):
        w.writerow(row)
    return buf.getvalue()


def write_tunableop_csv(path: str | Path, entries: Iterable[OverrideEntry], *, device: Mapping[str, Any] | None,
                        mode: str = "append", extra: Mapping[str, Any] | None = None, lock_timeout: float = 120.0) -> None:
    """Write entries as TunableOp's CSV: ``append`` merges into an existing file (same problem replaced; its
    validators and other lines kept), ``replace`` writes only these (with the validators and foreign lines of
    ``extra``, what a parse kept). An unreadable file is moved aside."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with PathLock(lock_path(path), timeout=lock_timeout):
        old = OverrideFile(OVERRIDE_VERSION, [], None, dict(extra or {}), str(path))
        if mode == "append" and path.exists():
            try:
                old = load_tunableop_csv(path)
            except InputError as exc:
                moved = move_aside(path)
                log.error("tunableop: %s unreadable (%s); moved aside to %s, writing a fresh file", path, exc, moved)
        merged = merge_entries(old.entries, entries)[0]
        doc = OverrideFile(OVERRIDE_VERSION, merged, dict(device) if device is not None else old.device, old.extra, str(path))
        atomic_write_text(path, render_tunableop_csv(doc))
