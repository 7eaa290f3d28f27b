"""FlatBuffers payloads: round trips, verification, fuzzing, and the committed generated code."""

import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import flatbuffers
import pytest

from fakes import fake_props
from farm.devices.device import cpu_device
from farm.devices.fb.verify import FlatBufferError
from farm.devices.fb import decode_device_properties, decode_problem, encode_device_properties, encode_problem
from farm.devices.fb import verify as fbv
from farm.model.problem import Problem

PROBLEMS = [
    Problem.create("matmul", {"A": [4096, 4096], "B": {"dims": [4096, 11008], "strides": [1, 4096]}}, dtype="bf16"),
    Problem.create("conv_fprop", {"X": [2, 4, 8, 8], "W": [6, 4, 3, 3]}, criteria={"pad_h": 1, "stride_w": 2}),
    Problem.create("sdpa_fwd", {"Q": [1, 32, 1, 128], "K": [1, 8, 4096, 128], "V": [1, 8, 4096, 128]}, criteria={"causal": 0}),
    Problem.create("rmsnorm", {"X": [2, 3, 4096], "scale": [4096]}, dtype="fp16"),
]
FB_DIR = Path(__file__).resolve().parents[2] / "farm" / "devices" / "fb"


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.op)
def test_problem_round_trip(problem):
    buf = encode_problem(problem)
    assert buf[4:8] == b"TFPB"
    back = decode_problem(buf)
    assert back == problem and back.key == problem.key


def test_device_round_trip():
    for props in (cpu_device().properties, fake_props(), fake_props(units=1)):
        buf = encode_device_properties(props)
        assert buf[4:8] == b"TFDP"
        assert decode_device_properties(buf) == props


def test_wrong_identifier_and_derived_fields_are_checked():
    with pytest.raises(FlatBufferError, match="file identifier b'TFPB', expected b'TFDP'"):
        decode_device_properties(encode_problem(PROBLEMS[0]))
    with pytest.raises(FlatBufferError, match="identifier"):
        decode_problem(encode_device_properties(fake_props()))
    # a buffer whose stored key does not match the problem it holds
    good = encode_problem(PROBLEMS[1])
    bad = good.replace(PROBLEMS[1].key.encode(), b"0" * 16)
    with pytest.raises(FlatBufferError, match="does not match the problem"):
        decode_problem(bad)
    bad_sig = encode_device_properties(fake_props()).replace(fake_props().signature.encode(),
                                                             b"x" * len(fake_props().signature))
    with pytest.raises(FlatBufferError, match="signature"):
        decode_device_properties(bad_sig)


def test_a_valid_buffer_holding_an_invalid_problem_is_rejected():
    from farm.devices.fb.generated import Problem as P
    from farm.devices.fb.generated import Tensor as T

    b = flatbuffers.Builder(64)
    tid = b.CreateString("A")
    T.StartDimsVector(b, 2)
    b.PrependInt64(0)
    b.PrependInt64(4)
    dims = b.EndVector()
    T.Start(b)
    T.AddId(b, tid)
    T.AddDims(b, dims)
    t = T.End(b)
    P.StartTensorsVector(b, 1)
    b.PrependUOffsetTRelative(t)
    vec = b.EndVector()
    op = b.CreateString("matmul")
    P.Start(b)
    P.AddOp(b, op)
    P.AddTensors(b, vec)
    b.Finish(P.End(b), file_identifier=b"TFPB")
    with pytest.raises(FlatBufferError, match="the problem it holds is invalid"):
        decode_problem(bytes(b.Output()))


def _only_flatbuffer_errors(fn, buf):
    try:
        fn(buf)
    except FlatBufferError:
        return False
    return True


@pytest.mark.parametrize("decode, good", [
    (decode_problem, encode_problem(PROBLEMS[0])),
    (decode_device_properties, encode_device_properties(fake_props())),
])
def test_fuzz_truncated_mutated_and_random_bytes(decode, good):
    rng = random.Random(1234)
    original = decode(good)
    for n in range(len(good)):  # every truncation: rejected, or only alignment padding was cut
        try:
            assert decode(good[:n]) == original, f"truncated to {n} bytes, decoded to something else"
        except FlatBufferError:
            pass
    for _ in range(3000):  # byte mutations
        buf = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        _only_flatbuffer_errors(decode, bytes(buf))
    for _ in range(3000):  # random bytes, sometimes with a valid header
        size = rng.randint(0, 300)
        buf = bytearray(rng.getrandbits(8) for _ in range(size))
        if size >= 8 and rng.random() < 0.5:
            buf[4:8] = good[4:8]
            buf[0:4] = rng.randint(8, max(8, size - 1)).to_bytes(4, "little")
        _only_flatbuffer_errors(decode, bytes(buf))
    with pytest.raises(FlatBufferError, match="expected bytes"):
        decode("not bytes")


def test_self_referencing_tables_do_not_hang():
    # a vtable offset of 0 makes the table its own vtable; a deep chain must stop at the depth limit
    buf = bytearray(encode_problem(PROBLEMS[1]))
    root = int.from_bytes(buf[0:4], "little")
    buf[root:root + 4] = (0).to_bytes(4, "little")
    with pytest.raises(FlatBufferError):
        decode_problem(bytes(buf))


def _fbs_fields(path: Path) -> dict[str, list[str]]:
    tables: dict[str, list[str]] = {}
    for name, body in re.findall(r"table\s+(\w+)\s*\{(.*?)\}", path.read_text(), re.S):
        tables[name] = re.findall(r"^\s*(\w+)\s*:", re.sub(r"//.*", "", body), re.M)
    return tables


def test_verifier_layout_matches_the_schemas():
    schema = {**_fbs_fields(FB_DIR / "device_properties.fbs"), **_fbs_fields(FB_DIR / "problem.fbs")}
    for spec in (fbv.DEVICE_PROPERTIES, fbv.LIBRARY, fbv.PROBLEM, fbv.TENSOR, fbv.CRITERION):
        assert [name for name, _ in spec.fields] == schema[spec.name], spec.name


@pytest.mark.skipif(shutil.which("flatc") is None,
                    reason="flatc not installed (Debian: flatbuffers-compiler); CI installs it")
def test_committed_generated_code_matches_the_schemas(repo_root):
    proc = subprocess.run([sys.executable, "-m", "farm.devices.fb.generate", "--check"], cwd=repo_root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"regenerate with `python -m farm.devices.fb.generate`:\n{proc.stderr}"


def test_hostile_buffers_are_rejected_in_milliseconds():
    """Well-formed but huge payloads (long vectors, many tables, long strings) are refused before decoding."""
    import flatbuffers

    from farm.devices.fb import decode_problem, problem_buffer, tensor_table
    from farm.devices.fb.verify import FlatBufferError

    def hostile(rank=2, tensors=2, op="pointwise", name_len=1):
        b = flatbuffers.Builder(1024)
        offsets = [tensor_table(b, "A" if i == 0 else "C" if i == 1 else f"T{i}", [1] * rank, [1] * rank, "fp32")
                   for i in range(tensors)]
        return problem_buffer(b, op * name_len, offsets, [], "fp32", "")

    cases = {"rank 1000 (24 KB)": hostile(rank=700), "rank 5000 (240 KB)": hostile(rank=5000),
             "600 tensors": hostile(tensors=600), "a 20 KB op name": hostile(name_len=2000)}
    for name, buf in cases.items():
        with pytest.raises(FlatBufferError, match="at most|larger than"):  # refused by its size, not decoded
            decode_problem(buf)
