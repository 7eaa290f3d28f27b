"""tunefarm: a distributed autotuning farm for GPU kernels.

The public API is what ``__all__`` lists (pinned by tests/test_public_api.py), plus the
``farm.ops`` module production code calls (matmul, sdpa, conv2d and the replay switches).
``farm.capture``, ``farm.apply`` and ``farm.unapply`` (farm.nn: models end to end) are loaded on first use.
"""

from farm._version import __version__
from farm.devices.device import Device, cpu_device
from farm.devices.properties import DeviceProperties
from farm.errors import AutotuneError, FarmError, InputError, UnknownNameError, UsageError
from farm.model.engine import Engine, EngineConfig, EngineRegistry, Plan, Support, default_engine_registry
from farm.model.ids import engine_name_to_id, policy_name_to_id
from farm.model.knobs import Knob, KnobType
from farm.model.measurement import Strategy
from farm.model.op_catalog import OpCategory, core_op
from farm.model.plans import EngineSweep, EngineVariant, PlanSpec
from farm.model.problem import Problem, TensorDesc
from farm.model.records import (
    AutotuneConfig,
    AutotuneResult,
    BuildPolicy,
    HeuristicMode,
    Disposition,
    PrimingFailurePolicy,
    ResultCheck,
    TuneMode,
)
from farm.model.workload import Workload, load_workload
from farm.replay.selection import POLICY_API_VERSION, Choice, NoSelection, PolicyRegistry, Selector
from farm.replay.tunable_runtime import TunableRuntime
from farm.store.autotune_storage import AutotuneStorageConfig
from farm.replay.tunable_settings import TunableSettings
from farm.tuner.autotuner import Autotuner

_MODEL_API = ("apply", "capture", "unapply")  # farm.nn's, imported on first use (a replaying process needs none)


def __getattr__(name: str) -> object:
    if name in _MODEL_API:
        import farm.nn

        return getattr(farm.nn, name)
    raise AttributeError(f"module 'farm' has no attribute {name!r}")


__all__ = [
    "AutotuneConfig",
    "AutotuneError",
    "AutotuneResult",
    "AutotuneStorageConfig",
    "Autotuner",
    "Choice",
    "Device",
    "DeviceProperties",
    "Disposition",
    "Engine",
    "BuildPolicy",
    "HeuristicMode",
    "EngineConfig",
    "EngineRegistry",
    "EngineSweep",
    "EngineVariant",
    "FarmError",
    "InputError",
    "Knob",
    "KnobType",
    "NoSelection",
    "OpCategory",
    "Plan",
    "POLICY_API_VERSION",
    "PlanSpec",
    "PolicyRegistry",
    "PrimingFailurePolicy",
    "Problem",
    "ResultCheck",
    "Selector",
    "Strategy",
    "Support",
    "TensorDesc",
    "TunableRuntime",
    "TunableSettings",
    "TuneMode",
    "UnknownNameError",
    "UsageError",
    "Workload",
    "__version__",
    "apply",
    "capture",
    "core_op",
    "cpu_device",
    "default_engine_registry",
    "engine_name_to_id",
    "load_workload",
    "policy_name_to_id",
    "unapply",
]
