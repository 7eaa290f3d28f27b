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


OPS_EXPECTED = {
    "matmul", "sdpa", "conv2d", "layernorm", "rmsnorm", "bind_matmul", "bind_conv2d", "bind_sdpa", "enable", "disable",
    "is_enabled", "tuning_enable", "tuning_disable", "tuning_is_enabled", "record_untuned_enable",
    "record_untuned_disable", "record_untuned_is_enabled", "set_verbose", "set_max_tuning_duration",
    "get_max_tuning_duration", "set_max_tuning_samples", "get_max_tuning_samples", "set_filename", "get_filename",
    "read_file", "write_file", "get_results", "runtime", "choices", "reset",
}


def test_farm_ops_all_is_pinned_and_each_name_is_callable():
    import farm.ops as ops

    assert set(ops.__all__) == OPS_EXPECTED and len(ops.__all__) == len(OPS_EXPECTED)
    assert all(callable(getattr(ops, name)) for name in ops.__all__)
