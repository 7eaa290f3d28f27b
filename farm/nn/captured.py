"""What a capture found in a model's step, as a workload file (docs/workload.md, "Captured from a model").

A ``CapturedWorkload`` holds the steps captured (one per batch size or input, each with its label and, where
it ran on a device, its host and wall time and whether the host or the device bounds it) and the problems,
each with how often each step calls it, its time a call and share of the step, and the call sites (module
paths, layer numbers folded to ``*``). Captures of several steps merge: one problem, its uses per step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from farm.errors import InputError
from farm.model.workload import END_LINE, END_SAID
from farm.fsutil import atomic_write_text, read_text_file
from farm.model.model_steps import StepInfo, Use
from farm.model.problem import Problem
from farm.nn.coverage import StepCoverage


@dataclass(frozen=True)
class CapturedProblem:
    """A problem a model's steps call, the torch function that made it, its call sites and calling modes."""

    problem: Problem
    kind: str
    uses: tuple[Use, ...]
    sites: tuple[str, ...] = ()
    calls: tuple[str, ...] = ("eager",)


@dataclass(frozen=True)
class SkippedCall:
    """Calls of a tunable operation the farm cannot run as written: the reason, how many, where."""

    kind: str
    reason: str
    count: int
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class CapturedWorkload:
    name: str
    steps: tuple[StepInfo, ...]
    problems: tuple[CapturedProblem, ...]
    skipped: tuple[SkippedCall, ...] = ()
    coverage: tuple[StepCoverage, ...] = ()  # each timed step's time by kind of call (farm.nn.coverage)

    def merge(self, *others: "CapturedWorkload", name: str | None = None) -> "CapturedWorkload":
        """One workload of several captures (batch sizes): each problem once, with its uses in every step."""
        return merge([self, *others], name=name)

    def to_dict(self, template: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The workload file's mapping; ``template`` gives its autotune, engines, call and seed."""
        return workload_dict(self, template)

    def write(self, path: str | Path, template: Mapping[str, Any] | None = None) -> Path:
        """Write the workload file (temp file and rename); returns its path."""
        path = Path(path)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, render(self, template))
        return path


def merge(parts: Sequence[CapturedWorkload], *, name: str | None = None) -> CapturedWorkload:
    labels = [s.label for w in parts for s in w.steps]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise InputError("two captures with the same step label (give each its own, e.g. label='batch=8')",
                         field="label", value=dup[0])
    by_key: dict[str, CapturedProblem] = {}
    for w in parts:
        for p in w.problems:
            seen = by_key.get(p.problem.key)
            if seen is None:
                by_key[p.problem.key] = p
                continue
            by_key[p.problem.key] = dataclasses.replace(
                seen, uses=seen.uses + p.uses, sites=tuple(dict.fromkeys(seen.sites + p.sites)),
                calls=tuple(dict.fromkeys(seen.calls + p.calls)))
    skipped: dict[tuple[str, str], SkippedCall] = {}
    for w in parts:
        for s in w.skipped:
            k = (s.kind, s.reason)
            old = skipped.get(k)
            skipped[k] = s if old is None else dataclasses.replace(
                old, count=old.count + s.count, sites=tuple(dict.fromkeys(old.sites + s.sites)))
    return CapturedWorkload(name or parts[0].name, tuple(s for w in parts for s in w.steps), tuple(by_key.values()),
                            tuple(skipped.values()), tuple(c for w in parts for c in w.coverage))


# -- names --------------------------------------------------------------------------------------
def short_name(kind: str, problem: Problem) -> str:
    """A readable problem name: the torch function, the sizes that decide the kernel, the dtype."""
    t = problem.tensor
    if problem.op == "matmul":
        a, b = t("A").dims, t("B").dims
        batch = "x".join(str(d) for d in a[:-2])
        name = f"{kind}-{batch + 'x' if batch else ''}{a[-2]}x{a[-1]}x{b[-1]}" + ("-bias" if problem.has_tensor("bias") else "")
    elif problem.op == "conv_fprop":
        c = problem.criteria_dict
        n, ch, h, w = t("X").dims
        k, _, r, s = t("W").dims
        name = f"{kind}-{n}x{ch}x{h}x{w}-k{k}r{r}s{s}-st{c['stride_h']}" + ("-g%d" % c["groups"] if c["groups"] != 1 else "")
    elif problem.op == "sdpa_fwd":
        q, k = t("Q").dims, t("K").dims
        name = f"{kind}-{'x'.join(map(str, q))}-kv{k[1]}x{k[2]}" + ("-causal" if problem.criteria_dict.get("causal") else "")
    else:
        name = f"{kind}-{'x'.join(map(str, t(problem.input_ids[0]).dims))}"
    return f"{name}-{problem.dtype}"


def problem_names(problems: Iterable[CapturedProblem]) -> list[str]:
    """Unique names: the short name, and the key's first characters where two problems share it (strides)."""
    items = list(problems)
    base = [short_name(p.kind, p.problem) for p in items]
    return [b if base.count(b) == 1 else f"{b}-{p.problem.key[:6]}" for b, p in zip(base, items)]


# -- the workload file --------------------------------------------------------------------------
def workload_dict(w: CapturedWorkload, template: Mapping[str, Any] | None = None) -> dict[str, Any]:
    template = dict(template or {})
    modes = [tuple(p.calls) for p in w.problems]
    common = modes[0] if modes and all(m == modes[0] for m in modes) else None
    doc: dict[str, Any] = {"version": 1, "name": w.name,
                           "description": template.get("description") or
                           f"captured from a model's steps ({', '.join(s.label for s in w.steps)}) by farm capture"}
    top = ""
    if any(p.problem.library == "torch" for p in w.problems):
        # a torch model's calls on a CPU: torch's own kernels are their default (engines.cpu.torch_ops)
        doc["library"] = top = "torch"
    for key in ("seed", "autotune", "engines"):
        if key in template:
            doc[key] = template[key]
    if "call" in template:
        doc["call"] = template["call"]
    elif common is not None:
        doc["call"] = list(common) if len(common) > 1 else common[0]
    doc["steps"] = [s.to_dict() for s in w.steps]
    problems = []
    for name, p in zip(problem_names(w.problems), w.problems):
        c = p.problem.canonical()
        entry: dict[str, Any] = {"name": name, "op": c["op"], "compute_dtype": c["compute_dtype"]}
        # outputs are derived from the inputs when contiguous; a channels-last output is written out
        entry["tensors"] = {x["id"]: {"dims": list(x["dims"]), "strides": list(x["strides"]), "dtype": x["dtype"]}
                            for x in c["tensors"]
                            if x["id"] in p.problem.input_ids or not p.problem.tensor(x["id"]).is_contiguous}
        if c["criteria"]:
            entry["criteria"] = dict(c["criteria"])
        if p.problem.library != top:  # a hand-written module's norm: its own library (its default: the module)
            entry["library"] = p.problem.library
        if common is None and "call" not in template:
            entry["call"] = list(p.calls) if len(p.calls) > 1 else p.calls[0]
        entry["steps"] = {u.step: u.to_dict() for u in p.uses}
        entry["sites"] = list(p.sites)
        problems.append(entry)
    doc["problems"] = problems
    return doc


def render(w: CapturedWorkload, template: Mapping[str, Any] | None = None) -> str:
    head = [f"# captured by farm capture: {len(w.problems)} problem(s) from {len(w.steps)} step(s), {END_SAID}"]
    for s in w.skipped:
        where = f" at {', '.join(s.sites[:3])}" if s.sites else ""
        head.append(f"# not captured: {s.count} {s.kind} call(s){where}: {s.reason}")
    for c in w.coverage:
        head.append(f"# step {c.step}: the farm's problems take {100 * c.covered:.1f} % of its {c.time} time; "
                    + ", ".join(f"{k.kind} {100 * k.share:.1f} %" for k in c.kinds))
    if not w.problems:
        if w.skipped:
            reasons = "; ".join(dict.fromkeys(f"{s.kind}: {s.reason}" for s in w.skipped))
            raise InputError(f"none of the step's calls of an operation the farm tunes can be run as called: "
                             f"{reasons}", field="capture", value=f"{sum(s.count for s in w.skipped)} call(s)")
        raise InputError("the step called no operation the farm tunes (linear, matmul, bmm, addmm, conv2d, "
                         "scaled_dot_product_attention, layer_norm, rms_norm)", field="capture", value="no call")
    body = yaml.safe_dump(workload_dict(w, template), sort_keys=False, width=120, default_flow_style=None)
    return "\n".join(head) + "\n" + body + END_LINE + "\n"


def load_template(path: str | Path) -> dict[str, Any]:
    """A workload file whose autotune, engines, call and seed a captured workload takes (its problems are not)."""
    try:
        data = yaml.safe_load(read_text_file(path, "template workload"))
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {getattr(exc, 'problem', None) or exc}", source=str(path)) from None
    if not isinstance(data, Mapping):
        raise InputError("expected a workload mapping", source=str(path), value=type(data).__name__)
    return {k: data[k] for k in ("seed", "autotune", "engines", "call", "description") if k in data}
