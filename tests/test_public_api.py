"""The public surface of ``farm`` is explicit and pinned."""

import farm

EXPECTED = {
    "AutotuneConfig", "AutotuneError", "AutotuneResult", "AutotuneStorageConfig", "Autotuner", "BuildPolicy", "HeuristicMode", "Device", "DeviceProperties",
    "Disposition", "Engine", "EngineConfig", "EngineRegistry", "EngineSweep", "EngineVariant", "FarmError",
    "InputError", "Knob", "KnobType", "OpCategory", "Plan", "PlanSpec", "PrimingFailurePolicy", "Problem",
    "ResultCheck", "Strategy", "Support", "TensorDesc", "TuneMode", "UnknownNameError", "UsageError",
    "Workload", "__version__", "core_op", "cpu_device", "default_engine_registry", "engine_name_to_id",
    "load_workload", "policy_name_to_id",
    "Choice", "NoSelection", "POLICY_API_VERSION", "PolicyRegistry", "Selector", "TunableRuntime", "TunableSettings",
    "apply", "capture", "unapply",
}


def test_all_is_pinned():
    assert set(farm.__all__) == EXPECTED
    assert len(farm.__all__) == len(set(farm.__all__))  # no name listed twice


def test_every_exported_name_exists():
    for name in farm.__all__:
        assert hasattr(farm, name), name


def test_public_objects_live_in_farm_modules():
    for name in farm.__all__:
        obj = getattr(farm, name)
        module = getattr(obj, "__module__", "farm")
        assert module.startswith("farm"), (name, module)
