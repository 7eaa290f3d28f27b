"""What ``farm capture`` and ``farm apply`` run: a model factory named on the command line.

    farm capture examples/models.py:tiny_decoder --with batch=1 --with batch=8
    farm apply mypkg.models:decoder runs/dec --with batch=1

``FILE.py:NAME`` or ``package.module:NAME`` names a callable; each ``--with k=v,k2=v2`` calls it once with those
keyword arguments (ints and floats read as numbers), plus ``device=`` when ``--device`` is given and it takes
one. It returns ``(model, args)`` or ``(model, args, kwargs)``: one step is ``model(*args, **kwargs)``. The
model and its inputs are the factory's own: nothing of its code is changed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from farm.errors import InputError
from farm.model.knobs import value_from_text


@dataclass(frozen=True)
class Built:
    """One built model and its step: ``label`` names the step (``batch=8``), ``step()`` runs it."""

    label: str
    model: Any
    step: Callable[[], Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] | None = None

    def step_of(self, fn: Any) -> Callable[[], Any]:
        """The step through ``fn`` in the model's place (``torch.compile(model)``), on the same inputs."""
        args, kwargs = self.args, dict(self.kwargs or {})
        return lambda: fn(*args, **kwargs)


def load_factory(target: str) -> Callable[..., Any]:
    """The callable ``target`` names (``FILE.py:NAME`` or ``package.module:NAME``), or an InputError naming it."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise InputError("expected FILE.py:NAME or package.module:NAME (a function returning (model, args))",
                         field="target", value=target)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise InputError("no such file", source=where)
        spec = importlib.util.spec_from_file_location(f"farm_target_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise InputError(f"cannot import it: {exc}", field="target", value=where) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"{where} has no callable {name}", field="target", value=target)
    return fn


def parse_with(text: str) -> dict[str, Any]:
    """``batch=8,ctx=4096`` -> {"batch": 8, "ctx": 4096}."""
    out: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or not key.isidentifier():
            raise InputError("expected key=value[,key=value...]", field="--with", value=text)
        if key in out:
            raise InputError(f"{key} is given twice (one step each: --with {key}=A --with {key}=B)", field="--with",
                             value=text)
        out[key] = value_from_text(value)
    return out


def _name(factory: Callable[..., Any]) -> str:
    return getattr(factory, "__name__", type(factory).__name__)


def build(factory: Callable[..., Any], kwargs: Mapping[str, Any], *, device: str | None = None) -> Built:
    """Call the factory once; its model and the step over its inputs."""
    given = dict(kwargs)
    try:
        signature: inspect.Signature | None = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check ahead
        signature = None
    if device is not None:
        params = signature.parameters if signature is not None else {}
        if "device" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            given["device"] = device
        else:
            raise InputError("the factory takes no device argument: give the device inside it",
                             field="--device", value=device)
    if signature is not None:
        try:
            signature.bind(**given)
        except TypeError as exc:
            takes = ", ".join(p for p in signature.parameters) or "no arguments"
            raise InputError(f"{_name(factory)}{signature} does not take these: {exc} (it takes {takes})",
                             field="--with", value=",".join(f"{k}={v}" for k, v in kwargs.items())) from None
    made = factory(**given)
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise InputError("the factory must return (model, args) or (model, args, kwargs)", field="target",
                         value=type(made).__name__)
    model, args = made[0], made[1]
    from farm.nn.torch_calls import torch_module

    if not isinstance(model, torch_module().nn.Module):
        raise InputError("the factory must return (model, args[, kwargs]) with model a torch.nn.Module",
                         field="target", value=f"{type(model).__name__} as the model")
    if len(made) == 3 and not isinstance(made[2], Mapping):
        raise InputError("the factory's third value is the step's keyword arguments: a mapping (a dict)",
                         field="target", value=type(made[2]).__name__)
    call_kwargs = dict(made[2]) if len(made) == 3 else {}
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    label = ",".join(f"{k}={v}" for k, v in kwargs.items()) or "step"
    return Built(label, model, lambda: model(*args, **call_kwargs), args, call_kwargs)
