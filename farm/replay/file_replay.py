"""farm.ops over one override file, as a production process has it with FARM_HEUR_CONFIG_PATH naming that file:
what farm verify times, and what farm.apply routes a model's calls by."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Callable, Iterator

from farm.devices.device import Device
from farm.dispatch.binding import Bound, Binding
from farm.dispatch.calls import OpCalls
from farm.dispatch.frameworks import NUMPY, Placement, placement
from farm.model.engine import EngineRegistry
from farm.model.problem import Problem
from farm.replay.tunable_runtime import TunableRuntime
from farm.replay.tunable_settings import TunableSettings

CONFIG_ENV = "FARM_HEUR_CONFIG_PATH"


@contextlib.contextmanager
def config_path(path: str) -> Iterator[None]:
    """FARM_HEUR_CONFIG_PATH names ``path`` while the block runs (what a production process sets)."""
    old = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = old


class FileReplay:
    """farm.ops as a production process has it with FARM_HEUR_CONFIG_PATH naming one file: a replay runtime
    of its own (the runtime tuner's feature off: the selection policies choose, Config first) on a device
    marked as a replaying one, and an OpCalls over it."""

    def __init__(self, path: str, device: Device, registry: EngineRegistry | None = None) -> None:
        self.path = path
        exec_device = dataclasses.replace(device, stream=None, extras={**device.extras, "replay": True})
        self.runtime = TunableRuntime(device, exec_device, settings=TunableSettings(enabled=False),
                                      registry=registry)
        self.calls = OpCalls(self.bind_problem)

    @property
    def exec_device(self) -> Device:
        return self.runtime.exec_device

    def bind_problem(self, problem: Problem, where: Placement | None = None
                     ) -> tuple[Bound, Bound | None, Callable[[], bool] | None]:
        """What farm.ops binds ``problem`` to with the file under test (farm.dispatch's binder contract)."""
        with config_path(self.path):
            return self.runtime.bind_for_ops(problem)

    def binding_of(self, problem: Problem) -> Binding | None:
        return next((b for b in self.calls.bindings.values() if b.bound.problem.key == problem.key), None)

    def own_binding(self, problem: Problem, like: object) -> Binding:
        """The file's binding of ``problem`` itself, called with tensors like ``like`` (numpy arrays, or torch
        tensors on their device): how farm.apply runs a model's call that farm.ops never makes of its tensors (a
        torch model's CPU call, library "torch"; a hand-written layer's, library "module")."""
        bound, graph, capturing = self.bind_problem(problem)
        out = problem.output_ids[0]
        d = problem.tensor(out)
        where = placement(like)
        framework = where.framework if where.kind != "cpu" else NUMPY

        def binding(b: Bound, graph_binding: Binding | None = None) -> Binding:
            return Binding(b, out, d.dims, d.dtype, d.strides, framework, None,
                           framework.allocator(like, d.dims, d.dtype, d.strides),
                           graph=graph_binding, capturing=capturing if graph_binding is not None else None)

        return binding(bound, binding(graph) if graph is not None else None)
