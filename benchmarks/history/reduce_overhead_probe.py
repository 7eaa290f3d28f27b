"""Probe (H200, 2026-12-03): torch.compile(farm.apply(model, call="graph"), mode="reduce-overhead") on the
Qwen2.5-7B-shaped decoder at M = 1, beside one CUDA graph of the torch step. Run from the repository root after
benchmarks/model_step.py has tuned runs/h200/dec."""
import sys, time, json, os
sys.path[:0] = [os.getcwd(), os.getcwd() + "/examples", os.getcwd() + "/benchmarks"]
import torch, models, farm
from model_step import graph_of, measure, summary
torch.set_grad_enabled(False)
base, ins = models.decoder(batch=1, size="qwen2.5-7b", dtype="bfloat16")
app, ins2 = models.decoder(batch=1, size="qwen2.5-7b", dtype="bfloat16")
farm.apply(app, "runs/h200/dec", call="graph")
app(*ins2)  # eager first: plan state outside the graphs' pool
torch._dynamo.utils.counters.clear()
fn = torch.compile(app, mode="reduce-overhead")
t0 = time.perf_counter(); fn(*ins2); torch.cuda.synchronize(); c = time.perf_counter() - t0
for _ in range(3): fn(*ins2)
breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
ref = base(*ins).float(); out = fn(*ins2).float()
err = ((out - ref).norm() / ref.norm()).item()
s = measure({"graph torch": graph_of(lambda: base(*ins)), "compile(apply(model)) reduce-overhead": lambda: fn(*ins2)}, 9, 40)
print(json.dumps({"compile_s": c, "graph_breaks": breaks, "rel_err": err, **summary(s, [("compile(apply(model)) reduce-overhead", "graph torch")])}))
