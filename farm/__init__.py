"""tunefarm: a distributed autotuning farm for GPU kernels.

The public API is what ``__all__`` lists (pinned by tests/test_public_api.py), plus the
``farm.ops`` module production code calls (matmul, sdpa, conv2d and the replay switches).
"""

__version__ = "0.1.0"

from .autotune import (
    AutotuneConfig,
    AutotuneResult,
    Autotuner,
    Disposition,
    PrimingFailurePolicy,
    ResultCheck,
    TuneMode,
)
from .device import Device, DeviceProperties, cpu_device
from .engine import Engine, EngineConfig, EngineRegistry, Plan, Support, default_engine_registry
from .errors import AutotuneError, FarmError, InputError, UnknownNameError, UsageError
from .ids import engine_name_to_id, policy_name_to_id
from .knobs import Knob, KnobType
from .operations import OpCategory, core_op
from .plans import EngineSweep, EngineVariant, PlanSpec
from .problem import Problem, TensorDesc
from .selection import POLICY_API_VERSION, Choice, NoSelection, PolicyRegistry, Selector
from .timing import Strategy
from .tunable import TunableRuntime, TunableSettings
from .workload import Workload, load_workload

__all__ = [
    "AutotuneConfig",
    "AutotuneError",
    "AutotuneResult",
    "Autotuner",
    "Choice",
    "Device",
    "DeviceProperties",
    "Disposition",
    "Engine",
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
    "core_op",
    "cpu_device",
    "default_engine_registry",
    "engine_name_to_id",
    "load_workload",
    "policy_name_to_id",
]
