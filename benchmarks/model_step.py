"""A model's step, end to end: capture, tune, apply, and the step time against torch, CUDA graphs and Inductor.

    python benchmarks/model_step.py run --out DIR                        # a CPU at a small size (tiny decoder)
    python benchmarks/model_step.py run --out DIR --size qwen2.5-7b --batches 1,8,32 --resnet 32   # an H200
    python benchmarks/model_step.py run --out DIR --models "library_models:llama:size=llama3.2-1b,context=1024" \
        --batches 1,8 --convnet "library_models:resnet:name=resnet50,batch=32,channels_last=1,image=224"
    python benchmarks/model_step.py table DIR                            # the markdown table of DIR's results

Models: by default examples/models.py (standard torch.nn, random weights): a Qwen2.5-7B-shaped decoder's decode
step at M = batch and ResNet-50 (fp16, channels-last). ``--models`` names decoders of any factory instead
(``MODULE:FACTORY[:k=v,...]``, MODULE a file of examples/: ``library_models:qwen2`` is transformers' Qwen2 over a
static KV cache), each run at every ``--batches`` size, and ``--convnet`` a conv net (timm's). ``--parts`` runs
named steps, each leaving DIR/<part>.json:

* ``capture``  farm capture of every config (its wall time), the workload files under DIR/<run>;
* ``tune``     farm tune of each workload (``--in-process``; its wall time);
* ``apply``    farm apply: the model check of each config and calling mode (withdraws what slows a step);
* ``steps``    per config, in paired interleaved rounds: eager torch, eager applied, one CUDA graph of the
               torch step and of the applied one (GPU); step ms, ratios with their 99 % intervals, and for
               a decoder the share of the HBM floor (every weight but the embedding table and the KV cache read
               once, at the copy bandwidth measured in the same run);
* ``inductor`` per config: torch.compile(model) in mode "max-autotune" and in "reduce-overhead" (their own CUDA
               graphs; their compile times), torch.compile(farm.apply(model)) with the graph decisions on a GPU, in each ``--apply-modes`` mode
               ("reduce-overhead", "max-autotune"; ``--all-compiles`` adds max-autotune-no-cudagraphs in one CUDA
               graph and the default mode), graph breaks from the farm, beside the graphs of ``steps``;
* ``cold``     Inductor max-autotune from nothing: a fresh process per decoder config, an empty cache (the
               counterpart of capture + tune + apply);
* ``start``    a second process: the published file applied to a fresh model, to its first tuned step (and the
               graph ready), against Inductor's max-autotune compile from its warm cache.

Each part writes its JSON as soon as it has it (a lease that ends mid-run keeps what was measured).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

PARTS = ("capture", "meta", "tune", "apply", "steps", "inductor", "cold", "start")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def farm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "farm", *args]


def run_timed(cmd: list[str], **kw: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, text=True, capture_output=True, env={**os.environ, "PYTHONPATH": _pythonpath()}, **kw)
    if proc.returncode != 0:
        log(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0, proc


def _pythonpath() -> str:
    return os.pathsep.join([str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)])


def save(out: Path, name: str, data: Any) -> None:
    path = out / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def load(out: Path, name: str) -> Any:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# -- configs ----------------------------------------------------------------------------------------
def configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each model step benchmarked: its target (``MODULE:FACTORY`` of examples/), keyword arguments and the folder
    of its workload and run."""
    if args.models:
        out = []
        for spec in args.models:
            target, kwargs = _spec(spec)
            run = target.split(":")[-1]
            out += [{"name": f"{run} M={b}", "target": target, "kwargs": {**kwargs, "batch": b}, "run": run,
                     "decoder": True} for b in args.batches]
        if args.convnet:
            target, kwargs = _spec(args.convnet)
            run = target.split(":")[-1]
            out.append({"name": f"{run} N={kwargs.get('batch', '')}", "target": target, "kwargs": kwargs, "run": run,
                        "decoder": False})
        return out
    gpu = args.size == "qwen2.5-7b"  # the full size is for a GPU: bf16 (ResNet fp16); a CPU's small one fp32
    out = [{"name": f"decoder M={b}", "target": "models:decoder", "run": "dec", "decoder": True,
            "kwargs": {"size": args.size, "batch": b, "dtype": "bfloat16" if gpu else "float32"}} for b in args.batches]
    if args.resnet:
        small = {"dtype": "float16"} if gpu else {"width": 8, "image": 32, "dtype": "float32"}
        out.append({"name": f"resnet50 N={args.resnet}", "target": "models:resnet50", "decoder": False,
                    "kwargs": {"batch": args.resnet, **small}, "run": "resnet"})
    return out


def _spec(text: str) -> tuple[str, dict[str, Any]]:
    """``library_models:llama:size=tiny,context=64`` -> ("library_models:llama", {"size": "tiny", ...})."""
    from farm.nn.targets import parse_with

    module, factory, *rest = text.split(":", 2)
    return f"{module}:{factory}", parse_with(rest[0]) if rest else {}


def target_path(cfg: dict[str, Any]) -> str:
    module, factory = cfg["target"].split(":")
    return f"{ROOT}/examples/{module}.py:{factory}"


def with_arg(kwargs: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in kwargs.items())


def build(cfg: dict[str, Any]) -> Any:
    """The config's model and its step (farm.nn.targets.Built: ``.model``, ``.step``, ``.step_of(fn)``)."""
    from farm.nn.targets import build as build_target, load_factory

    return build_target(load_factory(target_path(cfg)), cfg["kwargs"])


# -- capture, tune, apply ---------------------------------------------------------------------------
def part_capture(args: argparse.Namespace, out: Path) -> None:
    result: dict[str, Any] = load(out, "capture") or {}
    for run, cfgs in _by_run(configs(args)).items():
        def cmd(file: str, *extra: str) -> list[str]:
            return farm_cmd("capture", target_path(cfgs[0]),
                            *[x for c in cfgs for x in ("--with", with_arg(c["kwargs"]))],
                            "--template", str(ROOT / "examples/model-step.yaml"), "--out", str(out / run / file),
                            "--name", f"{run}-{args.size}" if not args.models else run, "--json", *extra)

        seconds, proc = run_timed(cmd("workload.yaml"))
        meta_s, meta = run_timed(cmd("meta.yaml", "--meta"))
        same = _same_problems(out / run / "workload.yaml", out / run / "meta.yaml")
        result[run] = {"seconds": seconds, "ok": proc.returncode == 0, "meta_seconds": meta_s,
                       "meta_same_problems": same, "capture": json.loads(proc.stdout) if proc.returncode == 0 else None}
        log(f"capture {run}: {seconds:.1f} s (meta {meta_s:.1f} s, same problems as on the device: {same})")
    save(out, "capture", result)


def part_meta(args: argparse.Namespace, out: Path) -> None:
    """Capture on the meta device again and compare with the device's capture (the capture part does both)."""
    result = load(out, "capture") or {}
    for run, cfgs in _by_run(configs(args)).items():
        seconds, proc = run_timed(farm_cmd("capture", target_path(cfgs[0]),
                                           *[x for c in cfgs for x in ("--with", with_arg(c["kwargs"]))], "--meta",
                                           "--out", str(out / run / "meta.yaml"), "--json"))
        same = _same_problems(out / run / "workload.yaml", out / run / "meta.yaml")
        result.setdefault(run, {}).update(meta_seconds=seconds, meta_same_problems=same)
        log(f"meta {run}: {seconds:.1f} s, same problems as on the device: {same}")
    save(out, "capture", result)


def _same_problems(a: Path, b: Path) -> bool | None:
    import yaml

    if not a.exists() or not b.exists():
        return None
    strip = lambda p: {k: v for k, v in p.items() if k not in ("steps", "name")}  # noqa: E731  (times differ)
    pa, pb = (yaml.safe_load(x.read_text())["problems"] for x in (a, b))
    return [strip(p) for p in pa] == [strip(p) for p in pb]


def part_tune(args: argparse.Namespace, out: Path) -> None:
    result: dict[str, Any] = load(out, "tune") or {}
    for run in _by_run(configs(args)):
        devices = ["--devices", "gpu"] if _gpu() else []
        seconds, proc = run_timed(farm_cmd("tune", str(out / run / "workload.yaml"), "--out", str(out / run),
                                           "--in-process", *devices, "--json"))
        summary = _json_tail(proc.stdout)
        sigs = summary.get("signatures", {}) if isinstance(summary, dict) else {}
        result[run] = {"seconds": seconds, "ok": proc.returncode == 0, "candidates": (summary or {}).get("candidates"),
                       "winners": [{"problem": p["name"], "winner": (p.get("winner") or {}).get("label"),
                                    "rule": (p.get("winner") or {}).get("rule"),
                                    "speedup": (p.get("winner") or {}).get("speedup_over_default")}
                                   for ps in sigs.values() for p in ps]}
        log(f"tune {run}: {seconds:.1f} s (exit {proc.returncode})")
    save(out, "tune", result)


def part_apply(args: argparse.Namespace, out: Path) -> None:
    result: dict[str, Any] = load(out, "apply") or {}
    for cfg in configs(args):
        cmd = farm_cmd("apply", target_path(cfg), str(out / cfg["run"]),
                       "--with", with_arg(cfg["kwargs"]), "--rounds", str(args.rounds), "--json")
        seconds, proc = run_timed(cmd)
        result[cfg["name"]] = {"seconds": seconds, "ok": proc.returncode == 0, "checks": _json_tail(proc.stdout)}
        log(f"apply {cfg['name']}: {seconds:.1f} s (exit {proc.returncode})")
        save(out, "apply", result)


def _json_tail(text: str) -> Any:
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return None


def _by_run(cfgs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for c in cfgs:
        out.setdefault(c["run"], []).append(c)
    return out


# -- measuring --------------------------------------------------------------------------------------
def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def graph_of(fn: Callable[[], Any]) -> Callable[[], Any]:
    """One CUDA graph of ``fn()`` (warmed on a side stream first); its replay."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def measure(variants: dict[str, Callable[[], Any]], rounds: int, sample_ms: float, seed: int = 0
            ) -> dict[str, list[float]]:
    """Paired interleaved rounds: each round one sample of every variant (ms a step over enough steps to fill
    ``sample_ms``), in a fresh random order."""
    import numpy as np

    counts = {}
    for name, fn in variants.items():
        fn()
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        counts[name] = max(1, math.ceil(sample_ms / max((time.perf_counter() - t0) * 1e3, 1e-3)))
    out: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for i in rng.permutation(len(names)):
            name, fn, n = names[i], variants[names[i]], counts[names[i]]
            _sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            _sync()
            out[name].append((time.perf_counter() - t0) * 1e3 / n)
    return out


def summary(samples: dict[str, list[float]], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Each variant's median ms, and each (variant, reference) pair's paired speed-up with its 99 % interval."""
    import numpy as np

    from farm.tuner.judging.paired import paired_ratio

    out: dict[str, Any] = {"ms": {k: float(np.median(v)) for k, v in samples.items()}, "ratios": {}}
    for a, b in pairs:
        if a in samples and b in samples:
            r = paired_ratio(samples[a], samples[b])
            out["ratios"][f"{a} / {b}"] = {"speedup": r.speedup, "low": r.speedup_low, "high": r.speedup_high,
                                           "rounds": r.rounds}
    return out


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the HBM ceiling of this run)."""
    import torch

    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    _sync()
    best = math.inf
    for _ in range(10):
        t0 = time.perf_counter()
        b.copy_(a)
        _sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() / best


def step_bytes(built: Any) -> int:
    """Bytes a decode step must read at least: every parameter but the embedding table (a row each), every buffer,
    and the KV cache passed to the step (transformers' cache objects: each layer's keys and values, read whole by
    attention over a static cache)."""
    model = built.model
    total = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n)
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    for value in (built.kwargs or {}).values():
        for layer in getattr(value, "layers", None) or ():
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if hasattr(t, "element_size"):
                    total += t.numel() * t.element_size()
    return total


def _applied(cfg: dict[str, Any], out: Path, call: str) -> Any:
    """A fresh model with the run's decisions for calls of kind ``call`` routed (what a caller that knows how it
    calls its model does; ``auto`` checks for a graph capture on every routed call), built as ``build``."""
    import farm

    built = build(cfg)
    farm.apply(built.model, str(out / cfg["run"]), call=call)
    return built


def part_steps(args: argparse.Namespace, out: Path) -> None:
    import torch

    result = load(out, "steps") or {}
    bw = copy_bandwidth() if _gpu() else None
    for cfg in configs(args):
        with torch.no_grad():
            base = build(cfg)
            eager = _applied(cfg, out, "eager")
            # eager steps are the host's: noisier, so more rounds of longer samples
            samples = measure({"eager torch": base.step, "eager applied": eager.step},
                              2 * args.rounds - 1, 2 * args.sample_ms)
            routed = _routed(eager.model)
            eager = None
            graph_error = None
            if _gpu():
                try:
                    torch_graph = graph_of(base.step)
                except Exception as exc:  # e.g. transformers' sliding-window static cache: a host copy a step
                    graph_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    log(f"steps {cfg['name']}: the model's own step cannot be captured in a CUDA graph: {graph_error}")
                else:
                    graph = _applied(cfg, out, "graph")
                    samples.update(measure({"graph torch": torch_graph, "graph applied": graph_of(graph.step)},
                                           args.rounds, args.sample_ms))
                    routed += _routed(graph.model)
                    graph = None
            row = summary(samples, [("eager applied", "eager torch"), ("graph applied", "graph torch"),
                                    ("graph torch", "eager torch")])
            row["routed"] = routed
            if graph_error:
                row["graph_error"] = graph_error
            if bw is not None and cfg["decoder"]:
                floor = step_bytes(base) / bw * 1e3
                row.update(floor_ms=floor, bytes=step_bytes(base), copy_tb_s=bw / 1e12,
                           floor_share={k: floor / v for k, v in row["ms"].items()})
            result[cfg["name"]] = row
            save(out, "steps", result)
            log(f"steps {cfg['name']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row["ms"].items()))
            base = None  # the models (and their graphs) go before the next config's are built
        _free()


def _routed(model: Any) -> list[dict[str, Any]]:
    from farm.nn.routing import applied_to

    a = applied_to(model)
    return [] if a is None else [{"problem": r.problem.label(), "sites": r.sites, "decisions": dict(r.route.labels),
                                  "routed": {"eager": r.route.eager is not None, "graph": r.route.graph is not None}}
                                 for r in a.routed.values()]


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def part_inductor(args: argparse.Namespace, out: Path) -> None:
    import torch

    result = load(out, "inductor") or {}
    cache = out / "inductor-cache"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    deadline = time.monotonic() + args.budget_s
    for cfg in configs(args):
        if cfg["name"] in result and result[cfg["name"]].get("ms"):
            continue
        if time.monotonic() > deadline:
            log(f"inductor {cfg['name']}: not run (the part's budget of {args.budget_s:.0f} s is spent)")
            continue
        result[cfg["name"]] = _inductor_config(cfg, out, args)
        save(out, "inductor", result)
        _free()
        torch._dynamo.reset()


def _inductor_config(cfg: dict[str, Any], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    row: dict[str, Any] = {"compile_s": {}, "graph_breaks": {}}
    with torch.no_grad():
        base = build(cfg)
        gpu = _gpu()
        # compiled without CUDA graphs the step is called eagerly: the eager decisions; with them, the graph ones
        compiled: list[tuple[str, Any, dict[str, Any], bool]] = [("inductor max-autotune", base, {"mode": "max-autotune"},
                                                                  False)]
        graphed = None
        if gpu:  # Inductor's other CUDA-graph mode, on a model of its own (one model compiled once)
            compiled.append(("inductor reduce-overhead", build(cfg), {"mode": "reduce-overhead"}, False))
            graphed = _applied(cfg, out, "graph")
            for mode in args.apply_modes:  # the graph decisions, compiled with Inductor's CUDA graphs
                compiled.append((f"compile(apply(model)) {mode}", graphed if mode == args.apply_modes[0]
                                 else _applied(cfg, out, "graph"), {"mode": mode}, False))
        if args.all_compiles or not gpu:
            compiled.append(("compile(apply(model))", _applied(cfg, out, "eager"), {}, False))
        if args.all_compiles and gpu:
            compiled.append(("inductor max-autotune-no-cudagraphs, in a graph", base,
                             {"mode": "max-autotune-no-cudagraphs"}, True))
        variants: dict[str, Callable[[], Any]] = {}
        for name, built, kw, in_graph in compiled:
            built.step()  # one eager call first: the routed plans' state is made outside any CUDA graph's pool
            torch._dynamo.utils.counters.clear()
            call = built.step_of(torch.compile(built.model, **kw))
            t0 = time.perf_counter()
            try:
                call()
                _sync()
            except Exception as exc:  # a compile that fails is a finding, not the end of the run
                row["compile_s"][name] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
                log(f"inductor {cfg['name']}: {name} failed: {exc}")
                continue
            row["compile_s"][name] = time.perf_counter() - t0
            row["graph_breaks"][name] = sum(torch._dynamo.utils.counters["graph_break"].values())
            for _ in range(2):
                call()  # cudagraph trees record on a later call
            variants[name] = graph_of(call) if in_graph else call
            log(f"inductor {cfg['name']}: {name} compiled in {row['compile_s'][name]:.1f} s, "
                f"{row['graph_breaks'][name]} graph break(s)")
        if gpu:
            variants["graph torch"] = graph_of(base.step)
            variants["graph applied"] = graph_of(graphed.step)
        else:
            variants["eager torch"] = base.step
        samples = measure(variants, args.rounds, args.sample_ms)
        ref = "graph torch" if gpu else "eager torch"
        farm_side = ("graph applied", "compile(apply(model)) reduce-overhead", "compile(apply(model)) max-autotune",
                     "compile(apply(model))")
        row.update(summary(samples, [(k, ref) for k in variants if k != ref] +
                           [(f, i) for f in farm_side for i in ("inductor max-autotune", "inductor reduce-overhead")]))
        if gpu and cfg["decoder"]:
            floor = step_bytes(base) / copy_bandwidth() * 1e3
            row.update(floor_ms=floor, floor_share={k: floor / v for k, v in row["ms"].items()})
        log(f"inductor {cfg['name']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row["ms"].items()))
    return row


START = r"""
import os, sys, time, json
t_process = float(sys.argv[1]); mode = sys.argv[2]; out = sys.argv[3]; target = sys.argv[4]
kwargs = json.loads(sys.argv[5])
sys.path[:0] = [os.environ["FARM_ROOT"], os.path.join(os.environ["FARM_ROOT"], "examples")]
import torch
from farm.nn.targets import build, load_factory
t_imported = time.time()
with torch.no_grad():
    built = build(load_factory(target), kwargs)
    torch.cuda.synchronize()
    t0 = time.time()
    if mode == "farm":
        import farm
        farm.apply(built.model, out, call="graph")
        built.step()                                     # binds every routed call (plans from the caches)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s): built.step()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g): built.step()
        g.replay()
    else:                                                # "inductor": its warm cache; "cold": an empty one
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = out
        step = built.step_of(torch.compile(built.model, mode="max-autotune"))
        for _ in range(3): step()                        # compiled (max-autotune's search); cudagraphs recorded
    torch.cuda.synchronize()
    t1 = time.time()
print(json.dumps({"to_first_tuned_step_s": t1 - t0, "import_s": t_imported - t_process,
                  "process_s": t1 - t_process, "model_build_s": t0 - t_imported}))
"""


def part_start(args: argparse.Namespace, out: Path) -> None:
    if not _gpu():
        log("start: needs a GPU (a CUDA graph and Inductor's GPU cache); not run")
        return
    cfg = next(c for c in configs(args) if c["decoder"])
    result: dict[str, Any] = {"config": cfg["name"]}
    env = {**os.environ, "FARM_ROOT": str(ROOT), "PYTHONPATH": _pythonpath()}
    for mode, where in (("farm", str(out / cfg["run"])), ("inductor", str(out / "inductor-cache"))):
        proc = subprocess.run([sys.executable, "-c", START, repr(time.time()), mode, where, target_path(cfg),
                               json.dumps(cfg["kwargs"])], text=True, capture_output=True, env=env)
        result[mode] = _json_tail(proc.stdout) if proc.returncode == 0 else f"failed: {proc.stderr[-2000:]}"
        log(f"start {mode}: {result[mode]}")
    save(out, "start", result)


def part_cold(args: argparse.Namespace, out: Path) -> None:
    """Inductor max-autotune from nothing: a fresh process per decoder config with an empty cache (its import,
    model build, compile and first steps), the counterpart of the farm's capture + tune + apply processes."""
    if not _gpu():
        log("cold: needs a GPU (max-autotune's search); not run")
        return
    result: dict[str, Any] = load(out, "cold") or {}
    env = {**os.environ, "FARM_ROOT": str(ROOT), "PYTHONPATH": _pythonpath()}
    for cfg in configs(args):
        if not cfg["decoder"]:
            continue
        cache = out / f"inductor-cold-{cfg['run']}-{cfg['kwargs']['batch']}"
        shutil.rmtree(cache, ignore_errors=True)
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-c", START, repr(t0), "cold", str(cache), target_path(cfg),
                               json.dumps(cfg["kwargs"])], text=True, capture_output=True, env=env)
        result[cfg["name"]] = _json_tail(proc.stdout) if proc.returncode == 0 else f"failed: {proc.stderr[-2000:]}"
        log(f"cold {cfg['name']}: {result[cfg['name']]}")
        save(out, "cold", result)


# -- the table ----------------------------------------------------------------------------------------
def table(out: Path) -> str:
    steps, ind, apply_, tune, cap, start, cold = (load(out, n) or {} for n in ("steps", "inductor", "apply", "tune",
                                                                               "capture", "start", "cold"))
    lines = ["| config | eager torch ms | eager applied | graph torch ms | graph applied | Inductor max-autotune ms "
             "(compile s) | Inductor reduce-overhead ms (compile s) | compile(apply) reduce-overhead ms | "
             "compile(apply) vs the better Inductor | % of the HBM floor: torch graph / applied graph / Inductor "
             "best / compile(apply) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in steps.items():
        ms, r = row["ms"], row["ratios"]
        i = ind.get(name, {})
        ims, ir = i.get("ms", {}), i.get("ratios", {})

        def ratio(d: dict[str, Any], key: str) -> str:
            x = d.get(key)
            return f"{x['speedup']:.3f}x ({x['low']:.3f}-{x['high']:.3f})" if x else "-"

        def compiled(key: str) -> str:
            secs = i.get("compile_s", {}).get(key)
            return f"{ims[key]:.3f} ({secs:.0f} s)" if key in ims and isinstance(secs, float) else "-"

        inductors = [k for k in ("inductor max-autotune", "inductor reduce-overhead") if k in ims]
        better = min(inductors, key=lambda k: ims[k]) if inductors else None
        share = {**row.get("floor_share", {}), **i.get("floor_share", {})}
        pct = lambda k: f"{100 * share[k]:.0f}" if k in share else "-"  # noqa: E731
        lines.append("| " + " | ".join([
            name, f"{ms.get('eager torch', math.nan):.3f}", ratio(r, "eager applied / eager torch"),
            f"{ms['graph torch']:.3f}" if "graph torch" in ms else "-", ratio(r, "graph applied / graph torch"),
            compiled("inductor max-autotune"), compiled("inductor reduce-overhead"),
            f"{ims['compile(apply(model)) reduce-overhead']:.3f}"
            if "compile(apply(model)) reduce-overhead" in ims else "-",
            (ratio(ir, f"compile(apply(model)) reduce-overhead / {better}") + f" of {better.split()[-1]}")
            if better else "-",
            " / ".join([pct("graph torch"), pct("graph applied"), pct(better) if better else "-",
                        pct("compile(apply(model)) reduce-overhead")]) + " %"]) + " |")
    lines.append("")
    for name, row in steps.items():
        if row.get("graph_error"):
            lines.append(f"- {name}: no graph rows: the model's own step cannot be captured in a CUDA graph "
                         f"({row['graph_error']})")
    for run, t in tune.items():
        c = cap.get(run, {})
        applies = sum(v["seconds"] for k, v in apply_.items() if k.split(" ")[0] == run or k.startswith(run[:3]))
        lines.append(f"- {run}: capture {c.get('seconds', math.nan):.1f} s + tune {t['seconds']:.1f} s + apply (the "
                     f"model checks) {applies:.1f} s = {c.get('seconds', 0) + t['seconds'] + applies:.1f} s; "
                     f"capture on meta gives the same problems: {c.get('meta_same_problems')}")
    cold_runs = {k: v for k, v in cold.items() if isinstance(v, dict)}
    if cold_runs:
        total = sum(v["process_s"] for v in cold_runs.values())
        lines.append("- Inductor max-autotune from an empty cache, a process per config (import, build, compile, "
                     "first steps): " + ", ".join(f"{k} {v['process_s']:.1f} s (compile and first steps "
                                                    f"{v['to_first_tuned_step_s']:.1f} s)" for k, v in cold_runs.items())
                     + f"; {total:.1f} s in all")
    for name, i in ind.items():
        breaks = {k: v for k, v in i.get("graph_breaks", {}).items()}
        lines.append(f"- {name}: compile s {json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in i.get('compile_s', {}).items()})}; graph breaks {json.dumps(breaks)}")
    if start:
        lines.append(f"- a second process ({start.get('config')}): {json.dumps(start.get('farm'))} with the published "
                     f"file; Inductor from its warm cache: {json.dumps(start.get('inductor'))}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--size", default="tiny", help="decoder size: tiny, small, qwen2.5-7b (default tiny)")
    r.add_argument("--batches", default="1,8", help="decoder batch sizes (M), comma-separated")
    r.add_argument("--resnet", type=int, default=0, help="ResNet-50 batch size (0: none)")
    r.add_argument("--models", action="append", default=[], metavar="MODULE:FACTORY[:K=V,...]",
                   help="a decoder of any factory of examples/ (repeatable), run at each --batches size, in place of "
                        "examples/models.py's (e.g. library_models:qwen2:size=qwen2.5-1.5b,context=1024)")
    r.add_argument("--convnet", metavar="MODULE:FACTORY[:K=V,...]",
                   help="with --models: a conv net of any factory (e.g. library_models:resnet:batch=32,channels_last=1)")
    r.add_argument("--all-compiles", action="store_true",
                   help="inductor: also max-autotune-no-cudagraphs in a graph and compile(apply) in the default mode")
    r.add_argument("--apply-modes", default="reduce-overhead",
                   help="inductor: the modes compile(apply(model)) is compiled in on a GPU, comma-separated "
                        "(reduce-overhead: Inductor's defaults around the farm's ops; max-autotune: Inductor tunes "
                        "the rest as it tunes the plain model)")
    r.add_argument("--parts", default=",".join(p for p in PARTS if p not in ("inductor", "start")),
                   help=f"comma-separated, of {', '.join(PARTS)}")
    r.add_argument("--rounds", type=int, default=11)
    r.add_argument("--sample-ms", type=float, default=60.0)
    r.add_argument("--budget-s", type=float, default=480.0, help="the inductor part stops starting configs after this")
    t = sub.add_parser("table")
    t.add_argument("out")
    args = p.parse_args()
    if args.cmd == "table":
        print(table(Path(args.out)))
        return 0
    args.batches = [int(b) for b in str(args.batches).split(",") if b]
    args.apply_modes = [m for m in str(args.apply_modes).split(",") if m]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for part in [x for x in args.parts.split(",") if x]:
        if part not in PARTS:
            raise SystemExit(f"unknown part {part!r}; parts: {', '.join(PARTS)}")
        log(f"part {part}")
        with contextlib.suppress(KeyboardInterrupt):
            globals()[f"part_{part}"](args, out)
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
