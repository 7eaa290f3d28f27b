"""Route an unmodified model's operations to the published decisions: ``model = farm.apply(model, "runs/x")``.

Only what a decision changes is touched, and only in this model. A module (``nn.Linear``, ``nn.Conv2d``,
``nn.LayerNorm``, ``nn.RMSNorm``) is routed only when the file holds a decision for its weight that is not the
default (farm.nn.module_sites: its class becomes a routed subclass of its own; ``farm.unapply`` gives it back).
Attention and a module's own matmuls (transformers' ``Conv1D``) are function calls: with a non-default decision
for one, the model's first eager call of each input shape finds the modules making them, and those modules'
forwards route them (farm.nn.function_scope). Nothing outside the model is patched: any number of models can be
applied at once, each routes its own calls, and unapplying them in any order restores each exactly.

A routed call binds each input layout once (the decision of each calling mode, from the file, as production
chooses: farm.nn.decided) and runs it only on the weights it was bound to; anything else (another weight, dtype,
layout or device, autocast, autograd) runs the model's own call. A call inside a CUDA graph capture runs the
graph decision (``call="auto"``, farm.ops' rule; ``"eager"`` or ``"graph"`` binds one mode's decisions only).
Under ``torch.compile`` the routed calls are farm custom ops (farm.nn.compiled): no graph break. Run a shape
once eagerly before capturing a graph of it (binding compiles plans, which a capture forbids). Copies of an
applied model (``copy.deepcopy``, ``pickle``, ``torch.save``) are plain models.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable

from farm.devices.open import open_device
from farm.errors import UsageError
from farm.model.problem import Problem
from farm.nn.decided import Decisions, Route
from farm.nn.function_scope import FunctionScope
from farm.nn.hand_written import HandNormSite, rmsnorm_shaped
from farm.nn.module_sites import SITE_ATTR, ConvSite, LinearSite, ModuleSite, NormSite, Site, install, routable_norm
from farm.nn.torch_calls import graph_capturing, layout, torch_module
from farm.store.targets import resolve

log = logging.getLogger("farm.nn.routing")
CONFIG_ENV = "FARM_HEUR_CONFIG_PATH"
CALL_CHOICES = ("auto", "eager", "graph")
FUNCTION_OPS = ("sdpa_fwd", "matmul")  # ops a model may call as functions (attention; a module's own matmul)


@dataclass
class Routed:
    """A problem the model's calls met, what each calling mode runs for it, and the sites that call it."""

    problem: Problem
    route: Route
    sites: list[str] = field(default_factory=list)


class Applied:
    """The routing of one model (what ``farm.apply`` made): its sites, the problems they met, and a switch
    (``only``) that routes a subset of those problems (the model check's variants)."""

    def __init__(self, model: Any, decisions: Decisions, call: str) -> None:
        self._model = weakref.ref(model)
        self.decisions = decisions
        self.call = call
        self.routed: dict[str, Routed] = {}
        self.enabled: frozenset[str] | None = None  # None: every routed problem
        self.sites: list[Site] = []
        self.scope: FunctionScope | None = None
        self._lock = threading.Lock()
        self.eager_ops = self._eager_ops()  # what a call out of any graph may route (read on every routed call)

    @property
    def model(self) -> Any:
        return self._model()

    def route(self, problem: Problem, site: str) -> Route | None:
        """The route of ``problem`` (bound once per problem), or None where this call stays the library's (its
        decisions are the default, or ``only`` leaves it out)."""
        with self._lock:
            r = self.routed.get(problem.key)
            if r is None:
                r = self.routed[problem.key] = Routed(problem, self.decisions.route(problem, self.call))
            if site not in r.sites:
                r.sites.append(site)
        if not r.route.routed or (self.enabled is not None and problem.key not in self.enabled):
            return None
        return r.route

    def only(self, keys: Iterable[str] | None) -> None:
        """Route only these problems (None: all); every site binds its calls again (cheap: routes are kept)."""
        self.enabled = None if keys is None else frozenset(keys)
        self.eager_ops = self._eager_ops()
        for s in self.all_sites():
            s.forget()

    def _eager_ops(self) -> frozenset[str]:
        """The ops whose calls may run a decision in eager now: a module site of another op runs its module's own
        call there at once (conservative: an op is in unless no decision of it can be routed)."""
        if self.call == "graph":
            return frozenset()
        ops = frozenset(self.decisions.ops_by_call.get("eager", ()))
        if self.enabled is None or not ops:
            return ops
        if all(key in self.routed for key in self.enabled):
            return ops & {self.routed[key].problem.op for key in self.enabled}
        return ops

    def all_sites(self) -> list[Site]:
        return [*self.sites, *([self.scope, *self.scope.sites, self.scope.root] if self.scope else [])]

    def functions_live(self) -> bool:
        """Whether a function decision (attention, a module's matmul) is routed in the calling mode now."""
        ops = self.decisions.ops_by_call
        if not any(op in FUNCTION_OPS for call in ops for op in ops[call]):
            return False
        if self.enabled is not None and not any(r.problem.op in FUNCTION_OPS for key, r in self.routed.items()
                                                if key in self.enabled):
            # the model check's variants without a function decision: no scope's mode either, so the untouched
            # step pays nothing of what routing a function costs (every torch call in a scoped forward)
            return False
        eager = any(op in FUNCTION_OPS for op in ops.get("eager", ()))
        if eager and self.call != "graph":
            return True
        return graph_capturing()

    def remove(self) -> None:
        for s in self.sites:
            s.restore()
        if self.scope is not None:
            self.scope.restore()
        self.sites.clear()
        self.scope = None


class AppliedModels:
    """The registry of applied models (a weak mapping: a model dropped by its owner is forgotten)."""

    def __init__(self) -> None:
        self._by_model: "weakref.WeakKeyDictionary[Any, Applied]" = weakref.WeakKeyDictionary()

    def get(self, model: Any) -> Applied | None:
        return self._by_model.get(model)

    def add(self, model: Any, applied: Applied) -> None:
        self._by_model[model] = applied

    def pop(self, model: Any) -> Applied | None:
        return self._by_model.pop(model, None)


APPLIED = AppliedModels()


def apply(model: Any, overrides: str | None = None, *, call: str = "auto") -> Any:
    """Route ``model``'s operations to the decisions of ``overrides`` (a ``farm tune --out`` folder, a published
    root, or an override file; default ``$FARM_HEUR_CONFIG_PATH``) for the device its parameters are on. Returns
    the model itself (``torch.compile(farm.apply(model))``); ``farm.unapply(model)`` undoes it."""
    if call not in CALL_CHOICES:
        raise UsageError(f"call: expected one of {', '.join(CALL_CHOICES)}, got {call!r}")
    torch = torch_module()
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"farm.apply takes a torch.nn.Module, not {type(model).__name__}")
    if APPLIED.get(model) is not None:
        unapply(model)
    decisions = decisions_for(model, overrides, call)
    applied = Applied(model, decisions, call)
    names = {id(m): n for n, m in model.named_modules()}
    for module in model.modules():
        site = _site_for(applied, module, names.get(id(module), type(module).__name__))
        if site is None:
            continue
        if install(module, site):
            applied.sites.append(site)
        else:
            site.restore()
            log.warning("farm.apply: %s is routed by another applied model already; left as it is", site.name)
    linears = [layout(s.module().weight) for s in applied.sites if isinstance(s, LinearSite)]
    covered = [((d[1], d[0]), (st[1], st[0]), dt) for d, st, dt in linears]  # B = W.T
    if (decisions.may_route("sdpa_fwd") or decisions.uncovered("matmul", covered)) and \
            not isinstance(model.__dict__.get(SITE_ATTR), ModuleSite):
        if SITE_ATTR in model.__dict__:
            log.warning("farm.apply: the model is routed by another applied model already; its function calls "
                        "are left as they are")
        else:
            applied.scope = FunctionScope(applied, model, applied.functions_live)
    APPLIED.add(model, applied)
    log.info("farm.apply: %d module(s) routed%s from %s", len(applied.sites),
             ", function calls found on its first call" if applied.scope else "", decisions.path)
    return model


def unapply(model: Any) -> Any:
    """Undo ``farm.apply``: every routed module its own class again. Returns the model."""
    applied = APPLIED.pop(model)
    if applied is not None:
        applied.remove()
    return model


def applied_to(model: Any) -> Applied | None:
    """The routing ``farm.apply`` made of ``model`` (None when it is not applied)."""
    return APPLIED.get(model)


def decisions_for(model: Any, overrides: str | None, call: str = "auto") -> Decisions:
    """The decisions production would read on the device ``model``'s weights are on (of calling mode ``call``)."""
    given = overrides or os.environ.get(CONFIG_ENV)
    if not given:
        raise UsageError(f"no override file: give one (a run folder, a published root or a file) or set {CONFIG_ENV}")
    tensor = next(iter(model.parameters()), None)
    if tensor is None:
        tensor = next(iter(model.buffers()), None)
    if tensor is None:
        raise UsageError("the model has no parameters or buffers: farm.apply reads the device a model runs on from "
                         "its weights")
    where = tensor.device
    if where.type == "meta":
        raise UsageError("the model's parameters must be on the device that runs it (not meta) to apply decisions")
    if where.type not in ("cpu", "cuda"):
        raise UsageError(f"the model is on {where.type}: farm.apply routes models on a CPU or a CUDA/ROCm GPU")
    device = open_device("cpu" if where.type == "cpu" else "cuda", where.index or 0)
    return Decisions(resolve(str(given), device).path, device, ("eager", "graph") if call == "auto" else (call,))


def _site_for(applied: Applied, module: Any, name: str) -> ModuleSite | None:
    torch = torch_module()
    nn, d = torch.nn, applied.decisions
    weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    if weight is None:
        return None
    if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward:
        w = layout(weight)
        return LinearSite(applied, module, name) if d.may_route("matmul", ((w[0][1], w[0][0]), (w[1][1], w[1][0]),
                                                                            w[2])) else None
    if isinstance(module, nn.Conv2d) and type(module).forward is nn.Conv2d.forward and module.padding_mode == "zeros":
        return ConvSite(applied, module, name) if d.may_route("conv_fprop", layout(weight)) else None
    if routable_norm(module) and getattr(module, "eps", None) is not None:
        op, kind = ("layernorm", "layer_norm") if isinstance(module, nn.LayerNorm) else ("rmsnorm", "rms_norm")
        if d.may_route(op, layout(weight)):
            return NormSite(applied, module, name, kind)
        return None
    shaped = rmsnorm_shaped(module)  # a hand-written RMSNorm: checked against its own output on its first call
    if shaped is not None and d.may_route("rmsnorm", layout(shaped[0])):
        return HandNormSite(applied, module, name, shaped[1])
    return None
