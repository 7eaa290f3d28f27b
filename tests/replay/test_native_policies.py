"""Heuristic plugins as shared libraries (policies.native): a small C plugin built with the system compiler is
loaded through the RFC's C ABI, selected through the policy order and farm.ops, and fails every load check in
its broken variants."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from farm.devices.device import cpu_device
from farm.model.ids import engine_name_to_id, policy_name_to_id
from farm.replay.selection import PolicyRegistry, Selector

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc, gcc or clang) to build the test plugin")
SOURCE = Path(__file__).resolve().parents[1] / "data" / "heuristic_plugin.c"
REVERSE = policy_name_to_id("Test::Reverse")
A, B, C = (engine_name_to_id(n) for n in ("cpu.matmul.blas", "cpu.matmul.einsum", "cpu.matmul.blocked"))


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in ("FARM_HEUR_PLUGIN_PATH", "HIPDNN_HEURISTIC_PLUGIN_DIR", "FARM_HEUR_POLICY_ORDER",
                 "HIPDNN_HEUR_POLICY_ORDER", "FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)


def build(tmp_path: Path, name: str, *defines: str) -> Path:
    out = tmp_path / f"lib{name}.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(out), str(SOURCE), *defines], check=True,
                   capture_output=True)
    return out


def registry_with(paths) -> PolicyRegistry:
    reg = PolicyRegistry.default(entry_points=False)  # the built-ins, then FARM_HEUR_PLUGIN_PATH...
    from policies.native import load_plugins

    load_plugins(reg, [str(p) for p in paths])
    return reg


def test_the_plugin_is_loaded_and_selected_through_the_policy_order(tmp_path, caplog):
    lib = build(tmp_path, "reverse")
    with caplog.at_level(logging.INFO, logger="farm"):
        reg = registry_with([lib])
    info = {i.name: i for i in reg.info()}
    assert info["Test::Reverse"].id == REVERSE and info["Test::Reverse"].origin == f"library {lib}"
    assert "logging callback installed" in caplog.text  # the plugin's own log line, through our logger
    sel = Selector(cpu_device().properties, order=["Test::Reverse", "SelectionHeuristic::StaticOrdering"], registry=reg)
    from farm.model.problem import Problem

    p = Problem.create("matmul", {"A": [8, 8], "B": [8, 8]})
    got = sel.select(p, [A, B, C])
    assert got.order == (C, B, A) and got.policy == "Test::Reverse"
    # by id too, as the RFC's policy order allows
    assert Selector(cpu_device().properties, order=[REVERSE], registry=reg).select(p, [A, B]).order == (B, A)


def test_a_plugin_that_does_not_apply_leaves_the_answer_to_the_next_policy(tmp_path):
    reg = registry_with([build(tmp_path, "decline", "-DDECLINE")])
    from farm.model.problem import Problem

    p = Problem.create("matmul", {"A": [8, 8], "B": [8, 8]})
    got = Selector(cpu_device().properties, order=["Test::Reverse", "SelectionHeuristic::StaticOrdering"],
                   registry=reg).select(p, [C, A])
    assert got.policy == "SelectionHeuristic::StaticOrdering"


def test_sorted_ids_come_as_a_prefix_of_the_capacity(tmp_path):
    import ctypes

    from policies.native import SUCCESS, load_library

    policy = load_library(str(build(tmp_path, "reverse")))
    session = policy.session(b"\x01\x02\x03\x04")
    lib = policy.lib
    desc = ctypes.c_void_p()
    assert lib.call("PolicyDescriptorCreate", ctypes.c_void_p(session.handle), ctypes.byref(desc)) == SUCCESS
    ids = (ctypes.c_int64 * 3)(A, B, C)
    lib.call("PolicySetEngineIds", desc, ids, 3)
    from policies.native import _const

    graph, keep = _const(b"graph")
    lib.call("PolicySetSerializedGraph", desc, ctypes.byref(graph))
    applied = ctypes.c_int32()
    assert lib.call("PolicyFinalize", desc, ctypes.byref(applied)) == SUCCESS and applied.value == 1
    out, count = (ctypes.c_int64 * 2)(), ctypes.c_size_t()
    assert lib.call("PolicyGetSortedEngineIds", desc, out, 2, ctypes.byref(count)) == SUCCESS
    assert count.value == 2 and list(out) == [C, B]  # a short buffer gets the first ids, and no error
    lib.call("PolicyDescriptorDestroy", desc)


@pytest.mark.parametrize("defines, reason", [
    (['-DAPI_VERSION="2.0.0"'], "has major 2; this host speaks 1.x"),
    (['-DPOLICY_NAME="Test::Other"'], "is not policyNameToId('Test::Other')"),
    (["-DNO_FINALIZE"], "missing required symbol hipdnnHeuristicPolicyFinalize"),
])
def test_every_load_check_rejects_with_one_line_and_loading_goes_on(tmp_path, caplog, defines, reason):
    bad = build(tmp_path, "bad", *defines)
    good = build(tmp_path, "good", "-DNO_NAME")  # loaded after the bad one: the bad one stops nothing
    with caplog.at_level(logging.WARNING, logger="farm"):
        reg = registry_with([bad, good])
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 1 and str(bad) in lines[0] and reason in lines[0]
    assert any(i.id == REVERSE and i.origin == f"library {good}" for i in reg.info())
    assert any(where == f"library {bad}" for where, _ in reg.rejected)


def test_a_second_library_with_the_same_policy_id_is_rejected(tmp_path, caplog):
    first, second = build(tmp_path, "first"), build(tmp_path, "second")
    with caplog.at_level(logging.WARNING, logger="farm"):
        reg = registry_with([first, second])
    assert [i.origin for i in reg.info() if i.id == REVERSE] == [f"library {first}"]
    assert "duplicate id" in caplog.text and str(second) in caplog.text


def test_a_file_that_is_no_library_is_rejected_cleanly(tmp_path, caplog):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an ELF file")
    with caplog.at_level(logging.WARNING, logger="farm"):
        reg = registry_with([tmp_path])  # a folder: every library in it
    assert "cannot be loaded" in caplog.text and not any(i.id == REVERSE for i in reg.info())


def test_farm_ops_replays_through_a_plugin_found_by_the_environment(tmp_path):
    """A fresh process, as production runs: the plugin folder and the policy order from the environment."""
    folder = tmp_path / "heuristics"
    folder.mkdir()
    build(folder, "reverse")
    code = (
        "import json, numpy as np, farm.ops as ops\n"
        "a = np.ones((16, 8), np.float32); b = np.ones((8, 4), np.float32)\n"
        "c = ops.matmul(a, b)\n"
        "assert float(c[0, 0]) == 8.0\n"
        "print(json.dumps(ops.choices()))\n"
    )
    env = {**os.environ, "HIPDNN_HEURISTIC_PLUGIN_DIR": str(folder), "HIPDNN_HEUR_POLICY_ORDER": "Test::Reverse",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [choice] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert choice["source"] == "Test::Reverse"
