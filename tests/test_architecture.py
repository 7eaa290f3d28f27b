"""The layout holds: stages depend one way (the import-linter contract in pyproject.toml), no import cycle
(imports inside functions included), and plugins import only farm.plugin."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_contract_holds():
    pytest.importorskip("importlinter", reason="import-linter is in the dev extra")
    # in a process of its own: import-linter reconfigures logging
    code = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(config_filename='pyproject.toml'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles_even_through_imports_inside_functions():
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (dev extra)")
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("farm", exclude_type_checking_imports=True)
    # the package's __init__ re-exports the public names: importing "farm" from inside is not a cycle
    # we care about, so the container is left out
    graph.remove_module("farm")
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (dev extra)")
    g = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.e", "p.d")):
        g.add_import(importer=a, imported=b)
    assert _cycles(g) == [["p.a", "p.b", "p.c"]]


PLUGIN_NAMES = {
    "Engine", "Plan", "Support", "Knob", "KnobType", "KnobValue", "KnobAware", "CompileKeyed", "Preparable",
    "PlanListing", "Prioritized", "DirectCall", "DirectCallable", "engine_id", "engine_priority", "engine_name_to_id",
    "default_engine_registry", "file_knobs", "known_file_knobs",
    "Problem", "TensorDesc", "contiguous_strides", "itemsize", "Device", "DeviceProperties",
    "gil_heavy_section", "graph_pool_active", "unit_hash", "EPS", "norm_eps", "module_rmsnorm",
    "Choice", "POLICY_API_VERSION", "CONFIG", "STATIC_ORDERING", "policy_name_to_id", "OverrideFile",
    "load_overrides", "call_choice", "find_published", "FlatBufferError", "decode_device_properties", "decode_problem",
    "FarmError", "InputError",
}


def test_the_plugin_facade_names_are_pinned():
    import farm.plugin

    assert set(farm.plugin.__all__) == PLUGIN_NAMES  # removing or renaming one breaks plugins: a major change
    assert all(hasattr(farm.plugin, n) for n in PLUGIN_NAMES)


def _farm_imports(path):
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                (node.module == "farm" or node.module.startswith("farm.")):
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "farm" or alias.name.startswith("farm."):
                    yield node.lineno, alias.name


def test_built_in_engines_and_policies_import_only_the_plugin_facade():
    files = sorted((ROOT / "engines").rglob("*.py")) + sorted((ROOT / "policies").rglob("*.py"))
    assert len(files) > 5
    outside = [f"{f.relative_to(ROOT)}:{line} imports {mod}" for f in files for line, mod in _farm_imports(f)
               if mod != "farm.plugin"]
    assert outside == []


def test_optional_engine_capabilities_are_protocols_the_built_ins_satisfy():
    from farm.model.engine import default_engine_registry
    from farm.plugin import CompileKeyed, Engine, KnobAware, PlanListing, Preparable, Prioritized

    engines = list(default_engine_registry())
    assert all(isinstance(e, Engine) for e in engines)
    names = {cap.__name__: {e.name for e in engines if isinstance(e, cap)}
             for cap in (KnobAware, CompileKeyed, Preparable, PlanListing, Prioritized)}
    assert "torch.sdpa" in names["KnobAware"] and "triton.gemm" in names["CompileKeyed"]
    assert names["PlanListing"] == {"cudnn.graph", "cublaslt", "triton.gemm", "triton.gemm_padded", "triton.conv",
                                    "cuda.decode_gemm", "triton.decode_attention", "triton.gemv"}
    assert {"triton.gemm", "triton.conv"} <= names["Preparable"] and names["Prioritized"]


@pytest.mark.slow
def test_every_import_of_farm_in_the_repository_resolves():
    """GPU tests and benchmarks do not run in CI: their imports of farm names are checked here."""
    import ast
    import importlib
    import importlib.util

    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "runs", ".devicepkgs") or "generated" in rel.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "farm":
                module = importlib.import_module(node.module)
                missing += [f"{rel}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert missing == []


def test_no_module_imports_another_modules_private_names():
    """What a module keeps to itself (a leading underscore) stays there: farm, engines, policies and jobs import
    only public names of one another (issue 55 found 45 such imports)."""
    import ast

    private = []
    for package in ("farm", "engines", "policies", "jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "generated" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                    private += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module or '.'}.{a.name}"
                                for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == []


# packages whose __init__ is their public API (farm: farm.apply, farm.capture; farm.plugin: what engines import)
FACADES = {"farm", "farm.plugin", "farm.nn", "farm.costmodel", "farm.store.deciding", "farm.devices.runtimes",
           "farm.devices.fb", "farm.cli", "farm.ops"}


def _top_level_names(path: Path) -> set[str]:
    """What a module defines itself: functions, classes and assigned names at its top level (under if/try too)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        for sub in [node, *(ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else ())]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, ast.Assign):
                names |= {x.id for t in sub.targets for x in ast.walk(t) if isinstance(x, ast.Name)}
            elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                names.add(sub.target.id)
    return names


def test_an_import_names_the_module_that_defines_the_name():
    """``from farm.x import name`` names the file where ``name`` is defined, not one that imports it from elsewhere
    (a re-export): a newcomer following an import lands on the definition. The packages' public faces are the
    exception (FACADES)."""
    import ast

    def module_file(module: str) -> Path | None:
        base = ROOT / Path(*module.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)

    through = []
    for package in ("farm", "engines", "policies", "jobs", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "generated" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("farm.")
                        and node.module not in FACADES):
                    continue
                target = module_file(node.module)
                if target is None:
                    continue
                defined = _top_level_names(target)
                through += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                            if a.name not in defined and module_file(f"{node.module}.{a.name}") is None]
    assert through == []
