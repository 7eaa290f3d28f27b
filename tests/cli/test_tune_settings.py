"""farm tune's settings are one frozen value built once from the command line (farm.fleet.options.TuneSettings):
nothing is set on the parsed arguments, and both executors read the same value."""

import ast
import copy
import dataclasses
from pathlib import Path

import pytest

from farm.cli.main import build_parser
from farm.cli.tune import tune_settings
from farm.fleet.options import KEEP, FarmOptions, TuneSettings
from farm.model.engine import default_engine_registry
from farm.model.records import PruneSettings
from farm.model.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]


def _args(*extra: str):
    return build_parser().parse_args(["tune", str(ROOT / "examples/cpu-quick.yaml"), *extra])


def test_the_settings_are_built_once_and_the_parsed_arguments_are_left_as_parsed(tmp_path):
    args = _args("--shard-size", "16", "--candidate-timeout", "30", "--top-k", "5", "--no-verify",
                 "--incumbents", str(tmp_path / "published"), "--reconfirm", "--no-prune")
    before = copy.deepcopy(vars(args))
    workload = load_workload(args.workload, default_engine_registry())
    settings = tune_settings(args, workload, str(tmp_path / "run"))
    assert vars(args) == before
    assert isinstance(settings, TuneSettings) and isinstance(settings.options, FarmOptions)
    o = settings.options
    assert (o.shard_size, o.candidate_timeout_s, o.top_k, o.incumbents, o.check_decided, o.verifier) == (
        16, 30.0, 5, str(tmp_path / "published"), False, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.reconfirm = False  # type: ignore[misc]
    tuned = settings.workload_for(workload)
    assert tuned.autotune.prune is None and tuned.autotune.confirm.redo_undecided
    assert workload.autotune.confirm.redo_undecided is False  # the workload read is not changed in place


def test_pruning_flags_become_the_settings_prune_and_keep_leaves_the_workloads_own(tmp_path):
    workload = load_workload(str(ROOT / "examples/cpu-quick.yaml"), default_engine_registry())
    kept = tune_settings(_args(), workload, str(tmp_path))
    assert kept.prune == KEEP and kept.workload_for(workload) is workload
    pruned = tune_settings(_args("--prune", str(tmp_path / "m.json"), "--prune-top-k", "2"), workload, str(tmp_path))
    assert pruned.prune == dataclasses.replace(PruneSettings(model=str(tmp_path / "m.json")), top_k=2)
    assert pruned.workload_for(workload).autotune.prune == pruned.prune


def test_no_command_sets_an_attribute_on_its_parsed_arguments():
    """Read from the CLI's source: ``args.NAME = ...`` and ``setattr(args, ...)`` nowhere."""
    found = []
    for path in sorted((ROOT / "farm/cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "args":
                    found.append(f"{path.name}:{node.lineno}: args.{t.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args and \
                    isinstance(node.args[0], ast.Name) and node.args[0].id == "args":
                found.append(f"{path.name}:{node.lineno}: setattr(args, ...)")
    assert not found, found
