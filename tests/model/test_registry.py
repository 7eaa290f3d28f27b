"""Engine discovery: built-ins without an install, plugins through entry points."""

import logging
import textwrap

import pytest

from fakes import FakeEngine
from farm.model.engine import EngineRegistry, engine_id
from farm.errors import UnknownNameError


def make_plugin(root, dist, module, body, group="farm.engines", value=None):
    pkg = root / module
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{dist} = {value or module + ':ENGINES'}\n")


PLUGIN = """
from farm.model.engine import Support
from farm.model.knobs import Knob

class Tiled:
    name = "acme.matmul.tiled"
    ops = frozenset({"matmul"})
    knobs = (Knob.int("tile", 32, choices=(16, 32)),)
    supports_exhaustive = False
    def applicable(self, problem, device): return Support.yes()
    def estimate_workspace(self, problem, knobs): return 0
    def compile(self, problem, knobs, device): raise RuntimeError("not needed here")

ENGINES = [Tiled()]
"""


def test_builtins_are_found_without_entry_points():
    reg = EngineRegistry.default(entry_points=False)
    names = {e.name for e in reg}
    assert {"cpu.matmul.blas", "cpu.conv.fft", "cpu.sdpa.online", "cpu.rmsnorm.einsum"} <= names
    assert reg.origin(reg.get("cpu.matmul.blas")) == "built-in"


def test_plugins_register_through_entry_points(tmp_path, monkeypatch):
    make_plugin(tmp_path, "acme_engines", "acme_engines", PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = EngineRegistry.default()
    engine = reg.get("acme.matmul.tiled")
    assert reg.get(engine_id(engine)) is engine
    assert reg.origin(engine).startswith("plugin acme_engines")
    # built-ins reached both ways (checkout and this project's own entry point) are not duplicated
    assert len([e for e in reg if e.name == "cpu.matmul.blas"]) == 1


def test_broken_and_clashing_plugins_are_skipped_with_a_reason(tmp_path, monkeypatch, caplog):
    make_plugin(tmp_path, "broken_plug", "broken_plug", "import not_a_module_anywhere\n")
    clash = PLUGIN.replace("acme.matmul.tiled", "cpu.matmul.blas").replace("class Tiled", "class Impostor").replace("[Tiled()]", "[Impostor()]")
    make_plugin(tmp_path, "clash_plug", "clash_plug", clash)
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="farm.model.engine"):
        reg = EngineRegistry.default()
    messages = " ".join(r.message for r in caplog.records)
    assert "broken_plug" in messages and "ModuleNotFoundError" in messages
    assert "clash_plug" in messages and "has the id of 'cpu.matmul.blas'" in messages
    assert type(reg.get("cpu.matmul.blas")).__name__ == "BlasMatmul"


def test_lookup_errors_and_registration_checks():
    reg = EngineRegistry([FakeEngine("x")])
    with pytest.raises(UnknownNameError, match="unknown engine 'y'"):
        reg.get("y")
    with pytest.raises(UnknownNameError):
        reg.get(12345)
    assert "x" in reg and "y" not in reg
    with pytest.raises(TypeError, match="missing"):
        reg.register(object())
    other = type("Other", (FakeEngine,), {})("x")  # another class claiming the same name
    with pytest.raises(ValueError, match="unique"):
        reg.register(other)
    reg.register(reg.get("x"))  # the same object again is a no-op
    assert len(reg) == 1
