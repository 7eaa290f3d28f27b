"""An applied 7-8B-shaped transformers decoder as a serving process runs it (issue 69), on a CUDA GPU.

    python benchmarks/serving_gpu.py                      # Llama-3.1-8B's shape, M = 1 and 8, all 32 layers
    python benchmarks/serving_gpu.py --size qwen2.5-7b --batches 8 --layers 4

For each batch size: the decode step over a static KV cache is captured, every captured problem is decided for an
engine of another kind than its default (the linear layers in turn: cuDNN graphs, split-K with a serial and a
parallel sum, cuBLASLt, Triton GEMM and GEMV; attention: torch's efficient backend), the model is applied and
compiled with ``mode="reduce-overhead"`` (cudagraph trees), and its logits are compared with torch's own eager
step. Then a left-padded prefill of the same model through each attention backend that takes a mask. Prints a
table: what was decided, whether compile(apply) compiled, ran and gave torch's logits, its compile time and step.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import library_models  # noqa: E402

import farm  # noqa: E402
from farm.devices.open import open_device  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402
from tests.gpu.forced import forced, runs  # noqa: E402


def write(path: Path, entries) -> str:
    d = open_device("cuda", 0)
    write_overrides(str(path), entries, device={"signature": d.signature, "properties": d.properties.to_dict()},
                    mode="replace")
    return str(path)


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float("nan") if not torch.isfinite(a).all() else float((a - b).norm() / b.norm())


def decode_row(size: str, batch: int, layers: int, context: int, out: Path) -> list[str]:
    model, args, kwargs = library_models.llama(batch=batch, context=context, size=size, layers=layers,
                                               dtype="bfloat16") if "llama" in size else \
        library_models.qwen2(batch=batch, context=context, size=size, layers=layers, dtype="bfloat16")
    step = lambda m=model: m(*args, **kwargs).logits  # noqa: E731
    with torch.no_grad():
        ref = step().clone()
        with farm.capture(model) as c:
            step()
    # torch's own compiled step beside its eager one: the error every compiled step of this model has (bf16)
    torch._dynamo.reset()
    plain = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        base = max(rel_err(plain(*args, **kwargs).logits.clone(), ref) for _ in range(3))
    del plain
    entries, _ = forced([p.problem for p in c.workload().problems], "efficient")
    kinds = sorted({f"{e.engine_name}" + (f"[{','.join(f'{k}={v}' for k, v in e.knobs)}]" if e.knobs else "")
                    for e in entries})
    farm.apply(model, write(out / f"decode-{batch}.json", entries))
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            outs = [compiled(*args, **kwargs).logits.clone() for _ in range(3)]
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.no_grad():
            start.record()
            for _ in range(20):
                compiled(*args, **kwargs)
            end.record()
        torch.cuda.synchronize()
        result = ["ran", f"{max(rel_err(o, ref) for o in outs):.2e} (torch compiled: {base:.2e})",
                  f"{compile_s:.0f} s", f"{start.elapsed_time(end) / 20:.3f} ms"]
    except Exception as exc:  # the row says what failed: the point of the table
        result = [f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", "-", "-", "-"]
    finally:
        torch._dynamo.reset()
        farm.unapply(model)
    del model, args, kwargs, compiled
    gc.collect()
    torch.cuda.empty_cache()
    return [f"decode M={batch}", f"{len(entries)}: " + ", ".join(kinds), *result]


def padded_rows(size: str, layers: int, out: Path) -> list[list[str]]:
    model, _, _ = library_models.llama(batch=1, context=64, size=size, layers=layers, dtype="bfloat16") \
        if "llama" in size else library_models.qwen2(batch=1, context=64, size=size, layers=layers, dtype="bfloat16")
    ids = torch.randint(0, 1000, (3, 48), device="cuda")
    mask = torch.ones(3, 48, dtype=torch.long, device="cuda")
    mask[1, :17] = 0
    mask[2, :47] = 0
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits.clone()
        with farm.capture(model) as c:
            model(ids, attention_mask=mask)
    sdpa = [p.problem for p in c.workload().problems if p.problem.op == "sdpa_fwd"]
    rows = []
    for backend in ("math", "efficient", "cudnn"):
        choice = ("torch.sdpa", (("backend", backend),))
        if not all(runs(*choice, p) for p in sdpa):
            rows.append([f"left-padded prefill, {backend}", "-", "not taken here", "-", "-", "-"])
            continue
        farm.apply(model, write(out / f"padded-{backend}.json", [OverrideEntry.for_problem(p, *choice) for p in sdpa]))
        with torch.no_grad():
            model(ids, attention_mask=mask)
            got = model(ids, attention_mask=mask).logits
        farm.unapply(model)
        real = mask.bool()  # a padding query's row is whatever a backend gives a row masked whole
        err = rel_err(got[real], ref[real])
        rows.append([f"left-padded prefill, {backend}", f"{len(sdpa)} attention",
                     "ran, no NaN" if bool(torch.isfinite(got).all()) else "NaN", f"{err:.2e} (real tokens)", "-",
                     "-"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="llama3.1-8b", choices=[k for k in library_models.DECODERS if "b" in k])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--layers", type=int, default=0, help="fewer layers than the size has (0: all)")
    p.add_argument("--context", type=int, default=1032)
    p.add_argument("--out", default="runs/serving-gpu")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t = Table(title=f"compile(apply) and padding, {a.size} ({a.layers or 'all'} layers), {torch.cuda.get_device_name()}")
    for col in ("case", "decisions", "result", "rel. error vs torch", "compile", "step"):
        t.add_column(col)
    for batch in a.batches:
        t.add_row(*decode_row(a.size, batch, a.layers, a.context, out))
        Console().print(f"M={batch} done")
    for row in padded_rows(a.size, a.layers or 2, out):
        t.add_row(*row)
    Console(width=200).print(t)


if __name__ == "__main__":
    main()
