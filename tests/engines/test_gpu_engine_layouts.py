"""The GPU GEMM engines' layout rules, checked without a GPU: what the Triton kernel is told and
which buffers the padded engines allocate."""

from engines.gpu.matmul import TorchMatmulPadded, _padded_shapes
from engines.gpu.triton_conv import TritonConv
from engines.gpu.triton_gemm import GemmLayout, TritonGemm, TritonGemmPadded, listed_tiles, pipeline_bytes
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


def test_padded_triton_engine_only_where_a_copy_aligns_something(monkeypatch):
    from engines.gpu import triton_gemm
    from farm.model.engine import Support

    monkeypatch.setattr(triton_gemm, "triton_dot_support", lambda problem: Support.yes())  # no Triton on CI
    engine = TritonGemmPadded()
    linear = Problem.create("matmul", {"A": [1, 3584], "B": {"dims": [3584, 4608], "strides": [1, 3584]}}, dtype="bf16")
    assert not engine.supports(linear, None)  # nn.Linear's B = W.T: vector loads along K already
    assert "nothing to align" in engine.supports(linear, None).reason
    assert not engine.supports(Problem.create("matmul", {"A": [64, 512], "B": [512, 384]}, dtype="bf16"), None)
    odd_k = Problem.create("matmul", {"A": [8, 300], "B": {"dims": [300, 160], "strides": [1, 300]}}, dtype="bf16")
    assert engine.supports(odd_k, None)  # K and B's leading dimension unaligned: the copy aligns them
    odd_ld = Problem.create("matmul", {"A": [8, 512], "B": {"dims": [512, 384], "strides": [1, 520]}}, dtype="bf16")
    assert engine.supports(odd_ld, None)


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
    from engines.gpu.triton_splitk import TritonSplitK

    engine = TritonSplitK()
    odd = Problem.create("matmul", {"A": [16, 1000], "B": [1000, 333]}, dtype="fp16")
    knobs = {"SPLIT_K": 8, "BLOCK_K": 128}
    # 1000 / 8 = 125 rounds up to one BLOCK_K: slices of 128, the last one short, 8 of them
    assert engine._plan_shape(odd, knobs) == (16, 333, 1000, 128, 8)
    assert engine._plan_shape(odd, {"SPLIT_K": 32, "BLOCK_K": 128})[3:] == (128, 8)  # no empty slices
    tiles = 1 * 6  # 16 rows in one BLOCK_M=16 tile, 333 columns in six of 64
    partials = 8 * 16 * 333 * 4
    serial = {**knobs, "BLOCK_M": 16, "BLOCK_N": 64, "REDUCTION": "serial"}
    assert engine.estimate_workspace(odd, serial) == partials + tiles * 4  # its counters
    assert engine.estimate_workspace(odd, {**serial, "REDUCTION": "parallel"}) == partials
    assert engine.estimate_workspace(odd, {"SPLIT_K": 8}) == partials + tiles * 4  # defaults


def nhwc(n, c, h, w):
    return {"dims": [n, c, h, w], "strides": [c * h * w, 1, w * c, c]}


def test_listed_gemm_tiles_fit_the_sizes_and_the_plan_limit(monkeypatch):
    monkeypatch.delenv("FARM_LIBRARY_PLANS", raising=False)
    decode = listed_tiles(1, 4096, 4096)
    assert {p["BLOCK_M"] for p in decode} == {16}  # one row: no taller tile
    assert len(decode) == len({tuple(sorted(p.items())) for p in decode})  # the cut made duplicates: dropped
    assert all(p["num_warps"] <= max(2, p["BLOCK_M"] * p["BLOCK_N"] // 256) for p in decode)
    big = listed_tiles(4096, 4096, 4096)
    assert len(big) == 21 and {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
                                "num_stages": 4} in big
    p = Problem.create("matmul", {"A": [4096, 4096], "B": [4096, 4096]}, dtype="bf16")
    assert TritonGemm().list_plans(p, None) == big[:16]  # FARM_LIBRARY_PLANS' default cut: the small tiles go
    monkeypatch.setenv("FARM_LIBRARY_PLANS", "3")
    assert TritonGemm().list_plans(p, None) == big[:3]


def test_listed_tiles_leave_out_pipelines_the_shared_memory_cannot_hold():
    h200 = 232448  # bytes a block may use (Triton's driver reports it where a GPU is)
    assert pipeline_bytes(64, 64, 128, 5, 4) == 327680  # Triton's "Required: 327680" for this tf32 tile
    fp32 = listed_tiles(512, 512, 4096, item_bytes=4, shared_memory=h200)
    assert fp32 and all(pipeline_bytes(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_stages"], 4) <= h200
                        for p in fp32)
    assert {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 5} not in fp32
    assert len(fp32) < len(listed_tiles(512, 512, 4096)) == len(listed_tiles(512, 512, 4096, 2, None))
    half = listed_tiles(4096, 4096, 4096, item_bytes=2, shared_memory=h200)
    assert {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4} not in half


def test_triton_conv_lists_the_flat_walk_for_few_channels_and_tiles_the_channels_need(monkeypatch):
    monkeypatch.delenv("FARM_LIBRARY_PLANS", raising=False)
    engine = TritonConv()
    stem = Problem.create("conv_fprop", {"X": nhwc(32, 3, 224, 224), "W": nhwc(64, 3, 7, 7)}, dtype="fp16",
                          criteria={"stride_h": 2, "stride_w": 2, "pad_h": 3, "pad_w": 3})
    plans = engine.list_plans(stem, None)
    # 3 channels: a tap at a time would be 13/16 zeros; a filter row of the padded copy is one 32-element span
    assert plans and {p["K_LOOP"] for p in plans} == {"flat", "rows"} and plans[0]["K_LOOP"] == "rows"
    assert {p["PAD_C"] for p in plans} == {0, 4}  # as stored, and on copies with 4 channels (8-byte pixels)
    assert {p["BLOCK_K"] for p in plans if p["K_LOOP"] == "rows"} == {32}  # 7 taps as 8, 4 channels each
    assert max(p["BLOCK_N"] for p in plans) == 64  # K = 64 output channels
    mid = Problem.create("conv_fprop", {"X": nhwc(8, 64, 56, 56), "W": nhwc(64, 64, 3, 3)}, dtype="fp16",
                         criteria={"pad_h": 1, "pad_w": 1})
    plans = engine.list_plans(mid, None)
    assert {p["K_LOOP"] for p in plans} == {"taps"} and max(p["BLOCK_K"] for p in plans) == 64
    assert len(plans) == len({tuple(sorted(p.items())) for p in plans})
    few = Problem.create("conv_fprop", {"X": nhwc(2, 24, 9, 9), "W": nhwc(16, 24, 5, 5)}, dtype="fp16")
    assert {p["K_LOOP"] for p in engine.list_plans(few, None)} == {"taps", "flat"}
    monkeypatch.setenv("FARM_LIBRARY_PLANS", "2")
    assert len(engine.list_plans(mid, None)) == 2


def test_triton_conv_launch_arguments_follow_the_problem():
    engine = TritonConv()
    p = Problem.create("conv_fprop", {"X": [2, 40, 15, 17], "W": [24, 40, 3, 3]}, dtype="fp16",
                       criteria={"stride_h": 2, "stride_w": 1, "pad_h": 1, "pad_w": 0, "dilation_h": 2})
    knobs = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
             "K_LOOP": "taps"}
    grid, meta, scalars = engine.launch_args(p, knobs)
    _, _, out_h, out_w = p.tensor("Y").dims
    assert (out_h, out_w) == (7, 15)  # (15 + 2 - 2 * 2 - 1) // 2 + 1 rows
    assert grid == (-(-2 * 7 * 15 // 64), 1, 1)  # 24 output channels: one 32-wide tile
    assert (meta["STRIDE_H"], meta["STRIDE_W"], meta["PAD_H"], meta["PAD_W"], meta["DIL_H"], meta["DIL_W"]) == \
        (2, 1, 1, 0, 2, 1)
    assert meta["EVEN_C"] is False and meta["FLAT"] is False and meta["WIDE_INDEX"] is False
    assert scalars == ()  # sizes and strides are compile-time constants
    assert tuple(meta[k] for k in ("BATCH", "C", "H", "W", "K", "P", "Q")) == (2, 40, 15, 17, 24, 7, 15)
    assert tuple(meta[k] for k in ("sxn", "sxc", "sxh", "sxw")) == p.tensor("X").strides
    assert tuple(meta[k] for k in ("swk", "swc", "swr", "sws")) == p.tensor("W").strides
    assert engine.launch_args(p, {**knobs, "BLOCK_K": 16})[1]["EVEN_C"] is False  # 40 % 16
    assert engine.launch_args(p, {**knobs, "BLOCK_K": 8 * 5})[1]["EVEN_C"] is True
    huge = Problem.create("conv_fprop", {"X": nhwc(1024, 256, 128, 128), "W": nhwc(64, 256, 1, 1)}, dtype="fp16")
    assert engine.launch_args(huge, knobs)[1]["WIDE_INDEX"] is True  # offsets past 2**31 elements


def test_triton_conv_padded_copies_are_the_same_convolution_without_padding_left_to_do():
    from engines.gpu.triton_conv import channel_padded

    engine = TritonConv()
    stem = Problem.create("conv_fprop", {"X": [32, 3, 224, 224], "W": [64, 3, 7, 7]}, dtype="fp16",
                          criteria={"stride_h": 2, "stride_w": 2, "pad_h": 3, "pad_w": 3})
    padded = channel_padded(stem, 4)
    assert padded.tensor("X").dims == (32, 4, 230, 230) and padded.tensor("X").strides == (230 * 230 * 4, 1, 230 * 4, 4)
    assert padded.tensor("W").dims == (64, 4, 7, 7) and padded.tensor("W").strides == (196, 1, 28, 4)
    assert padded.tensor("Y").dims == stem.tensor("Y").dims == (32, 64, 112, 112)
    assert (padded.criteria_dict["pad_h"], padded.criteria_dict["stride_h"]) == (0, 2)
    flat4 = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
             "K_LOOP": "flat", "PAD_C": 4}
    assert engine.estimate_workspace(stem, flat4) == (32 * 230 * 230 * 4 + 64 * 7 * 7 * 4) * 2
    assert engine.estimate_workspace(stem, {**flat4, "PAD_C": 0}) == 0
    assert engine.knob_support(stem, None, flat4)
    assert "flat and rows walks only" in engine.knob_support(stem, None, {**flat4, "K_LOOP": "taps"}).reason
    wide = Problem.create("conv_fprop", {"X": [2, 16, 8, 8], "W": [8, 16, 3, 3]}, dtype="fp16")
    assert "fewer than the input's C=16" in engine.knob_support(wide, None, {**flat4, "PAD_C": 8}).reason
    assert not any(p["PAD_C"] for p in engine.list_plans(wide, None))  # 16 channels: nothing to pad


def test_triton_conv_rows_walk_spans_a_filter_row_of_the_padded_copy():
    from engines.gpu.triton_conv import channel_padded, row_span

    assert [row_span(s, 4) for s in (1, 3, 5, 7, 8, 9)] == [4, 4, 8, 8, 8, 16]  # spans of 16, 32, 64 elements
    assert [row_span(s, 8) for s in (1, 2, 3, 7)] == [2, 2, 4, 8]
    engine = TritonConv()
    stem = Problem.create("conv_fprop", {"X": nhwc(32, 3, 224, 224), "W": nhwc(64, 3, 7, 7)}, dtype="fp16",
                          criteria={"stride_h": 2, "stride_w": 2, "pad_h": 3, "pad_w": 3})
    padded = channel_padded(stem, 4, rows=True)
    # 111 * 2 + 8 columns: the last output's span ends at the copy's edge; its rows start 16-byte aligned
    assert padded.tensor("X").dims == (32, 4, 230, 230) and padded.tensor("W").dims == (64, 4, 7, 8)
    assert padded.tensor("Y").dims == stem.tensor("Y").dims
    rows = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
            "K_LOOP": "rows", "PAD_C": 4}
    assert engine.knob_support(stem, None, rows)
    grid, meta, _ = engine.launch_args(stem, rows)
    assert meta["ROWS"] and not meta["FLAT"] and meta["LIVE_K"] == 28  # 7 real taps of the 8 in a span
    assert (meta["S"], meta["C"], meta["sxw"], meta["swr"], meta["PAD_W"]) == (8, 4, 4, 32, 0)
    assert grid == (32 * 112 * 112 // 128, 1, 1)
    assert engine.estimate_workspace(stem, rows) == (32 * 230 * 230 * 4 + 64 * 7 * 8 * 4) * 2
    assert "BLOCK_K=32" in engine.knob_support(stem, None, {**rows, "BLOCK_K": 64}).reason
    assert "needs PAD_C" in engine.knob_support(stem, None, {**rows, "PAD_C": 0}).reason
    # stride 1: an odd width stays odd (one column more would make Y one wider); only the columns spans reach
    odd = Problem.create("conv_fprop", {"X": nhwc(2, 3, 21, 24), "W": nhwc(16, 3, 5, 5)}, dtype="fp16",
                         criteria={"pad_h": 2, "pad_w": 2})
    assert channel_padded(odd, 4, rows=True).tensor("X").dims == (2, 4, 25, 23 + 8)
    dilated = Problem.create("conv_fprop", {"X": nhwc(2, 3, 21, 23), "W": nhwc(16, 3, 3, 3)}, dtype="fp16",
                             criteria={"dilation_w": 2})
    assert "dilation_w=2" in engine.knob_support(dilated, None, {**rows, "BLOCK_K": 16}).reason
    assert all(p["K_LOOP"] != "rows" for p in engine.list_plans(dilated, None))
    wide = Problem.create("conv_fprop", {"X": nhwc(2, 8, 21, 23), "W": nhwc(16, 8, 11, 11)}, dtype="fp16")
    assert all(p["K_LOOP"] != "rows" for p in engine.list_plans(wide, None))  # 16 taps x 8: a 128-wide span
