"""The GPU GEMM engines' layout rules, checked without a GPU: what the Triton kernel is told and
which buffers the padded engines allocate."""

from engines.gpu.matmul import TorchMatmulPadded, _padded_shapes
from engines.gpu.triton_gemm import GemmLayout, TritonGemm, TritonGemmPadded
from farm import Problem

KNOBS = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)


def test_layout_of_a_problem_and_the_vector_load_hint():
    p = Problem.create("matmul", {"A": [3, 64, 96], "B": [96, 256]}, dtype="fp16")
    lay = GemmLayout.of(p)
    assert (lay.m, lay.n, lay.k, lay.batch) == (64, 256, 96, 3)
    assert lay.a == (64 * 96, 96, 1) and lay.b == (0, 256, 1) and lay.c == (64 * 256, 256, 1)  # B shared: batch stride 0
    assert lay.contig_n(128) and lay.contig_n(256)  # N divides: the hint is exactly true
    odd = GemmLayout.of(Problem.create("matmul", {"A": [4095, 511], "B": [511, 4097]}, dtype="fp16"))
    assert not odd.contig_n(128)  # the last tile wraps around to column 0: not one aligned run
    col_major_b = GemmLayout.of(Problem.create("matmul", {"A": [64, 64], "B": {"dims": [64, 128], "strides": [1, 64]}},
                                               dtype="fp16"))
    assert not col_major_b.contig_n(128)  # B's rows are not contiguous


def test_triton_meta_flags_follow_the_configuration():
    odd = Problem.create("matmul", {"A": [4095, 511], "B": [511, 4097]}, dtype="fp16")
    grid, meta, scalars = TritonGemm()._call(odd, KNOBS)
    assert grid == (32 * 33, 1, 1)
    assert meta["EVEN_K"] is False and meta["CONTIG_N"] is False
    assert scalars == (4095, 4097, 511, 4097, 0, 511, 1, 0, 4097, 1, 0, 4097, 1)
    aligned = Problem.create("matmul", {"A": [256, 512], "B": [512, 384]}, dtype="bf16")
    assert TritonGemm()._call(aligned, KNOBS)[1]["EVEN_K"] is True
    assert TritonGemm()._call(aligned, {**KNOBS, "BLOCK_N": 256})[1]["CONTIG_N"] is False  # 384 % 256


def test_padded_triton_engine_reads_aligned_copies_and_writes_c_in_place():
    ldc = Problem.create("matmul", {"A": [4095, 511], "B": [511, 4097], "C": {"dims": [4095, 4097], "strides": [4104, 1]}},
                         dtype="fp16")
    engine = TritonGemmPadded()
    lay = engine.layout(ldc)
    assert (lay.m, lay.n, lay.k) == (4095, 4097, 512)  # K to a multiple of 128: no K masks
    assert lay.a == (0, 512, 1) and lay.b == (0, 4352, 1)  # N to a multiple of 256: room for any BLOCK_N
    assert lay.c == (0, 4104, 1)  # C stays where the problem puts it
    assert lay.scalars()[:4] == (4095, 4097, 512, 4352)  # tiles read the padded width, write N columns
    _, meta, _ = engine._call(ldc, {**KNOBS, "BLOCK_N": 256})
    assert meta["EVEN_K"] and meta["CONTIG_N"]
    assert engine.estimate_workspace(ldc, KNOBS) == (4095 * 512 + 512 * 4352) * 2
    batched = Problem.create("matmul", {"A": [4, 129, 255], "B": [255, 97], "bias": [97]}, dtype="fp16")
    assert engine._shapes(batched) == ((4, 129, 256), (256, 256))
    assert engine.layout(batched).a == (129 * 256, 256, 1) and engine.layout(batched).b == (0, 256, 1)


def test_padded_torch_engine_buffer_shapes():
    p = Problem.create("matmul", {"A": [2, 4095, 511], "B": [2, 511, 4097]}, dtype="fp16")
    assert _padded_shapes(p, 64, "direct") == ((2, 4095, 512), (2, 512, 4160), ())
    assert _padded_shapes(p, 8, "padded") == ((2, 4096, 512), (2, 512, 4104), (2, 4096, 4104))
    assert _padded_shapes(p, 64, "split") == ((2, 4095, 512), (2, 512, 4096), ())  # B's aligned columns only


def test_split_output_applies_only_where_c_can_take_aligned_columns_in_place():
    engine, dev = TorchMatmulPadded(), None
    split = {"multiple": 64, "output": "split"}
    ldc = Problem.create("matmul", {"A": [4095, 511], "B": [511, 4097], "C": {"dims": [4095, 4097], "strides": [4104, 1]}},
                         dtype="fp16")
    assert engine.knob_support(ldc, dev, split)
    assert engine.knob_support(ldc, dev, {**split, "output": "direct"})
    contiguous = Problem.create("matmul", {"A": [4095, 511], "B": [511, 4097]}, dtype="fp16")
    no = engine.knob_support(contiguous, dev, split)
    assert not no and "[4097, 1]" in no.reason  # row stride 4097: rows are not 16-byte aligned
    fp32 = Problem.create("matmul", {"A": [95, 51], "B": [51, 97], "C": {"dims": [95, 97], "strides": [100, 1]}})
    assert engine.knob_support(fp32, dev, {**split, "multiple": 16})  # 4 fp32 elements are 16 bytes
    assert not engine.knob_support(fp32, dev, {**split, "multiple": 128})  # N < multiple: no aligned part
    aligned_n = Problem.create("matmul", {"A": [95, 51], "B": [51, 128]}, dtype="fp16")
    assert "no aligned part and tail" in engine.knob_support(aligned_n, dev, split).reason
    batched = Problem.create("matmul", {"A": [2, 95, 51], "B": [51, 97]}, dtype="fp16")
    assert "2-D problems only" in engine.knob_support(batched, dev, split).reason
    assert engine.estimate_workspace(ldc, split) == (4095 * 512 + 512 * 4096) * 2


def test_split_k_slices_and_scratch_follow_the_knobs():
    from engines.gpu.triton_splitk import StreamScratch, TritonSplitK

    engine = TritonSplitK()
    odd = Problem.create("matmul", {"A": [16, 1000], "B": [1000, 333]}, dtype="fp16")
    knobs = {"SPLIT_K": 8, "BLOCK_K": 128}
    # 1000 / 8 = 125 rounds up to one BLOCK_K: slices of 128, the last one short, 8 of them
    assert engine._plan_shape(odd, knobs) == (16, 333, 1000, 128, 8)
    assert engine._plan_shape(odd, {"SPLIT_K": 32, "BLOCK_K": 128})[3:] == (128, 8)  # no empty slices
    tiles = 1 * 6  # 16 rows in one BLOCK_M=16 tile, 333 columns in six of 64
    partials = 8 * 16 * 333 * 4
    serial = {**knobs, "BLOCK_M": 16, "BLOCK_N": 64, "REDUCTION": "serial"}
    assert engine.estimate_workspace(odd, serial) == partials + StreamScratch.SLOTS * tiles * 4  # counters per stream
    assert engine.estimate_workspace(odd, {**serial, "REDUCTION": "parallel"}) == partials
    assert engine.estimate_workspace(odd, {"SPLIT_K": 8}) == partials + StreamScratch.SLOTS * tiles * 4  # defaults
