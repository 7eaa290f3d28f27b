"""A write killed between its temp file and the rename leaves the temp file behind (tens of MB for a winners table);
the next write of that file removes it, and never one a write in progress holds."""

import os
import subprocess
import sys
import time

from farm.fsutil import STALE_TEMP_S, atomic_write_text, temp_path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process of that id now (ids are not reused this fast)


def test_the_next_write_removes_a_killed_writes_temp_file_and_keeps_live_ones(tmp_path):
    target = tmp_path / "sig.json"
    old = time.time() - 2 * STALE_TEMP_S
    killed = tmp_path / f".sig.json.{_dead_pid()}.tmp"
    shaped = tmp_path / f".sig.json.{_dead_pid()}.tmp.bak"  # another name shape: never touched
    live = tmp_path / f".sig.json.{os.getppid()}.tmp"  # a process that runs: a write in progress, however old
    young = tmp_path / f".sig.json.{_dead_pid()}.tmp"  # a dead id but too fresh to judge (another host's write)
    for f in (killed, shaped, live):
        f.write_text("x" * 1000)
        os.utime(f, (old, old))
    young.write_text("y")
    other = tmp_path / f".other.json.{_dead_pid()}.tmp"  # another file's temp: not this write's business
    other.write_text("z")
    os.utime(other, (old, old))
    atomic_write_text(target, "{}")
    assert target.read_text() == "{}" and not temp_path(target).exists()
    assert not killed.exists() and shaped.exists() and live.exists() and young.exists() and other.exists()
