"""No test asserts a wall time or a ratio of wall times (issue 64): machines are noisy and differ, so such figures
live in benchmarks/, and a test's waits are bounded retries on a condition. This reads every test file's syntax tree
for an ``assert`` that reads a clock (``time.time()``, ``time.perf_counter()``, ``time.monotonic()``)."""

import ast
from pathlib import Path

CLOCKS = {"time", "perf_counter", "monotonic", "perf_counter_ns", "monotonic_ns", "time_ns"}


def _reads_a_clock(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if name in CLOCKS and owner in ("time", ""):
                return True
    return False


def _timed_names(tree: ast.AST) -> set[str]:
    """Names assigned from a clock reading (``took = time.perf_counter() - t0``): a wall time by another name."""
    return {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _reads_a_clock(n.value)
            for t in n.targets if isinstance(t, ast.Name)}


def _on_a_wall_time(node: ast.Assert, timed: set[str]) -> bool:
    """An assert comparing a clock reading, or a name holding one, with something (a bound on a duration)."""
    for sub in ast.walk(node.test):
        if isinstance(sub, ast.Compare):
            sides = [sub.left, *sub.comparators]
            if any(_reads_a_clock(x) or any(isinstance(y, ast.Name) and y.id in timed for y in ast.walk(x))
                   for x in sides):
                return True
    return _reads_a_clock(node)


def test_no_assert_reads_a_clock():
    found = []
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        timed = _timed_names(tree)
        found += [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Assert) and _on_a_wall_time(n, timed)]
    assert not found, f"asserts on a wall time (move the figure to benchmarks/): {found}"


def test_the_check_finds_one():
    tree = ast.parse("t0 = time.perf_counter()\nassert time.perf_counter() - t0 < 20\n")
    assert [n for n in ast.walk(tree) if isinstance(n, ast.Assert) and _reads_a_clock(n)]


def test_the_check_finds_a_wall_time_by_another_name():
    tree = ast.parse("t0 = time.perf_counter()\nrun()\ntook = time.perf_counter() - t0\nassert ok and took < 8.0\n")
    timed = _timed_names(tree)
    assert timed == {"took", "t0"} and [n for n in ast.walk(tree) if isinstance(n, ast.Assert) and _on_a_wall_time(n, timed)]
    calm = ast.parse("t0 = time.perf_counter()\nassert result == 3\n")
    assert not [n for n in ast.walk(calm) if isinstance(n, ast.Assert) and _on_a_wall_time(n, _timed_names(calm))]
