"""Every command in README.md and docs/ runs as written after the Quick start.

The bash and python blocks of the Markdown are extracted and run, in order, in a checkout-like folder
where the Quick start has run (`.venv`, `runs/quick`). A block that cannot run here says why on the line
before its fence (``<!-- not run by tests: ... -->``); the README's cluster sequence is run by
tests/end_to_end/test_ray_job.py, against a real ``ray start`` head (``<!-- run by tests/end_to_end/test_ray_job.py -->``).
"""

from __future__ import annotations

import os
import shutil
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an end-to-end test of the farm: Ray, a cluster, the docs run whole

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "deploy" / "README.md"]
NOT_RUN = "<!-- not run by tests:"
RAY_JOB = "<!-- run by tests/end_to_end/test_ray_job.py -->"
NEEDS = "<!-- needs "  # <!-- needs torch, transformers -->: run where the venv has them, skipped (saying so) where not
OUTPUT = "<!-- output of the block above -->"  # a text block quoting what the command block before it prints
QUICK_OUTPUT = "<!-- output of the Quick start -->"  # ... what the Quick start's farm tune prints
VENV = Path(sys.executable).parents[1]
LINKED = ("examples", "engines", "farm", "policies", "jobs", "pyproject.toml", "deploy", "benchmarks")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str
    marker: str  # the comment line before the fence ('' when none)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        out.append(Block(path, start + 1, m.group(1), "\n".join(body) + "\n", before if before.startswith("<!--") else ""))
        i += 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]
COMMANDS = [b for b in ALL if b.lang in ("bash", "python")]


def _quoted_outputs() -> dict[tuple[Path, int], Block]:
    """(file, line of a command block) -> the text block quoting its output."""
    out = {}
    for path in DOCS:
        bs = blocks(path)
        for prev, b in zip(bs, bs[1:]):
            if b.marker == OUTPUT:
                assert prev.lang in ("bash", "python"), f"{b.where}: an output quote must follow a command block"
                out[(prev.path, prev.line)] = b
    return out


QUOTED = _quoted_outputs()


def check_quoted(quote: Block, printed: str) -> None:
    """Each quoted line (but '...') is printed, in order; '...' inside a line stands for anything; runs of
    spaces count as one (a table's padding depends on the terminal)."""
    lines = [" ".join(line.split()) for line in printed.splitlines()]
    at = 0
    for want in quote.text.splitlines():
        want = " ".join(want.split())
        if not want or want == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part.strip()) for part in want.split("...")))
        hit = next((i for i in range(at, len(lines)) if pattern.search(lines[i])), None)
        assert hit is not None, f"{quote.where}: {want!r} is not printed (after line {at}):\n{printed[-4000:]}"
        at = hit + 1


def test_every_command_block_runs_or_says_why_not():
    """No command block is silently left out: each one runs here, or its marker names a reason or its test."""
    for b in COMMANDS:
        if b.marker.startswith(NOT_RUN):
            assert len(b.marker[len(NOT_RUN):].strip(" ->")) > 10, f"{b.where}: say why it is not run"
        elif b.marker.startswith(NEEDS):
            assert _needs(b), f"{b.where}: name the modules it needs"
        else:
            assert b.marker in ("", RAY_JOB), f"{b.where}: unknown marker {b.marker!r}"
    for b in ALL:
        if b.marker in (OUTPUT, QUICK_OUTPUT):
            assert b.lang == "text", f"{b.where}: quote an output in a text block"
    for b in ALL:  # shell commands are in bash blocks (so they are run), not in unlabelled ones
        if b.lang == "":
            assert not re.match(r"^\s*(\.venv/bin/|farm |ray |python3? )", b.text), f"{b.where}: label it bash"
    assert sum(1 for b in COMMANDS if not b.marker) >= 10


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A folder laid out as the checkout is after the Quick start (its .venv, its runs/quick)."""
    if not (VENV / "bin" / "farm").exists():
        pytest.skip(f"not running from the Quick start's venv ({VENV} has no bin/farm)")
    work = tmp_path_factory.mktemp("checkout")
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    (work / ".venv").symlink_to(VENV)
    env = {**_env(work), "COLUMNS": "100"}  # a 100-column terminal (or log: COLUMNS is honoured off a terminal)
    quick = subprocess.run([str(VENV / "bin" / "farm"), "tune", "examples/cpu-quick.yaml", "--out", "runs/quick"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert quick.returncode == 0, quick.stdout[-2000:] + quick.stderr[-2000:]
    (work / "quick.out").write_text(quick.stdout + quick.stderr)
    # the override file as the Quick start left it: the docs' blocks run the same command again, and a rerun
    # confirms the undecided problems again (the advice it prints), which may change the file
    [file] = (work / "runs" / "quick" / "overrides").glob("*.json")
    shutil.copy(file, work / "quick-overrides.json")
    return work


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "RAY_", "PYTORCH_TUNABLEOP"))}
    env.pop("PYTHONPATH", None)  # as a user's shell: the venv's own install finds the code
    env.update(HOME=str(work / "home"), COLUMNS="120")
    (work / "home").mkdir(exist_ok=True)
    return env


def _needs(block: Block) -> list[str]:
    """The modules a block's ``<!-- needs a, b -->`` marker names (the optional extras its commands use)."""
    return [m.strip() for m in block.marker[len(NEEDS):].strip(" ->").split(",") if m.strip()]


@pytest.mark.parametrize("block", [b for b in COMMANDS if not b.marker or b.marker.startswith(NEEDS)],
                         ids=lambda b: b.where)
def test_the_block_runs_as_written(block, checkout):
    env = _env(checkout)
    for module in _needs(block) if block.marker.startswith(NEEDS) else ():
        found = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-c", f"import {module}"], env=env,
                               capture_output=True, text=True, timeout=300)
        if found.returncode != 0:
            pytest.skip(f"{block.where} needs {module}, which the venv has not (an optional extra: see README)")
    if block.lang == "bash":
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    else:
        cmd = [str(checkout / ".venv" / "bin" / "python"), "-c", block.text]
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{block.where}\n{block.text}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n" \
                                 f"{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    quote = QUOTED.get((block.path, block.line))
    if quote is not None:
        check_quoted(quote, proc.stdout + proc.stderr)


def test_the_quick_start_prints_what_the_readme_quotes(checkout):
    quotes = [b for b in ALL if b.marker == QUICK_OUTPUT]
    assert quotes, "README.md quotes the Quick start's output"
    for quote in quotes:
        check_quoted(quote, (checkout / "quick.out").read_text())


def test_the_quick_starts_summary_fits_40_lines_at_100_columns_with_every_winner_whole(checkout):
    printed = (checkout / "quick.out").read_text()
    lines = printed.splitlines()
    assert len(lines) <= 40, f"{len(lines)} lines:\n{printed}"
    assert max(len(line) for line in lines) <= 100, printed
    from farm.store.overrides.parsing import load_overrides
    from farm.store.publish.root import entry_desc

    labels = [entry_desc(e) for e in load_overrides(checkout / "quick-overrides.json").entries]
    assert len(labels) == 8
    for label in labels:  # each on one line, as written in the override file
        assert any(label in line for line in lines), f"{label} not shown whole:\n{printed}"


def test_a_quote_that_is_not_printed_fails():
    quote = Block(REPO / "README.md", 1, "text", "Summary: 8 problem(s) ...\nnever printed\n", OUTPUT)
    check_quoted(Block(REPO / "README.md", 1, "text", "Summary: 8 ...\n...\nb ... c\n", OUTPUT),
                 "x\nSummary: 8 problem(s) in 3 s\na\nb   x   c\n")
    with pytest.raises(AssertionError, match="never printed"):
        check_quoted(quote, "Summary: 8 problem(s) in 3 s\n")
