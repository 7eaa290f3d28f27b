"""Everything an engine or policy plugin may import from tunefarm, in one place.

    from farm.plugin import Device, Knob, Problem, Support

The built-in engines (engines/) and policies (policies/) import only this module;
tests/test_architecture.py pins its names and checks that. Anything else inside
``farm`` may move between releases; these names stay.
"""

from farm.devices.device import Device, graph_pool_active
from farm.devices.fb.verify import FlatBufferError
from farm.devices.fb import decode_device_properties, decode_problem
from farm.devices.properties import DeviceProperties
from farm.devices.sim import unit_hash
from farm.devices.timing import gil_heavy_section
from farm.errors import FarmError, InputError
from farm.model.dtypes import itemsize
from farm.model.engine import (
    CompileKeyed,
    DirectCall,
    DirectCallable,
    Engine,
    KnobAware,
    Plan,
    PlanListing,
    Preparable,
    Prioritized,
    Support,
    default_engine_registry,
    engine_id,
    engine_priority,
    file_knobs,
    known_file_knobs,
)
from farm.model.ids import engine_name_to_id, policy_name_to_id
from farm.model.knobs import Knob, KnobType, KnobValue
from farm.model.hand_norms import module_rmsnorm
from farm.model.op_catalog import norm_eps
from farm.model.problem import Problem, TensorDesc, contiguous_strides
from farm.replay.selection import CONFIG, POLICY_API_VERSION, STATIC_ORDERING, Choice
from farm.store.overrides.parsing import call_choice, load_overrides
from farm.store.overrides.entries import OverrideFile
from farm.store.publish.published import find_published
from farm.tuner.reference import EPS

__all__ = [
    # the engine contract and its optional capabilities
    "Engine", "Plan", "Support", "Knob", "KnobType", "KnobValue", "KnobAware", "CompileKeyed", "Preparable",
    "PlanListing", "Prioritized", "DirectCall", "DirectCallable", "engine_id", "engine_priority", "engine_name_to_id", "default_engine_registry", "file_knobs", "known_file_knobs",
    # what an engine is given
    "Problem", "TensorDesc", "contiguous_strides", "itemsize", "Device", "DeviceProperties",
    # helpers engines use
    "gil_heavy_section", "graph_pool_active", "unit_hash", "EPS", "norm_eps", "module_rmsnorm",
    # the policy contract and what a policy reads
    "Choice", "POLICY_API_VERSION", "CONFIG", "STATIC_ORDERING", "policy_name_to_id", "OverrideFile",
    "load_overrides", "call_choice", "find_published", "FlatBufferError", "decode_device_properties", "decode_problem",
    # errors
    "FarmError", "InputError",
]
