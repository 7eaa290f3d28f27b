"""A test suite stops only the Ray it started: another suite's bystander Ray is recognised by its owner lock being
held, never by a pid in its name (issue 64: a suite's setup stopped a running suite's bystander)."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import _own, _stop_orphaned_bystanders

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock and /tmp as on Linux")


def test_a_bystander_whose_owner_lives_is_never_stopped_and_an_orphan_is(tmp_path):
    stopped = []
    name = f"/tmp/rayb9{uuid.uuid4().int % 10**9}"  # the pid in a name tells nothing: another namespace's, reused
    # its owner: a live process holding the lock (another suite)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open('{name}.owner', os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        _stop_orphaned_bystanders(lambda temp, grace_s: stopped.append(temp))
        assert name not in stopped and Path(f"{name}.owner").exists()
        with pytest.raises(OSError):
            _own(name)  # held: this suite could not take it either
    finally:
        holder.kill()
        holder.wait()
    _stop_orphaned_bystanders(lambda temp, grace_s: stopped.append(temp))  # its owner ended: an orphan
    assert name in stopped and not Path(f"{name}.owner").exists()


def test_a_bystander_without_an_owner_file_is_not_stopped_by_its_name(tmp_path):
    stopped = []
    name = Path(f"/tmp/rayb9{uuid.uuid4().int % 10**9}")
    name.mkdir()
    try:
        _stop_orphaned_bystanders(lambda temp, grace_s: stopped.append(temp))
        assert str(name) not in stopped  # no owner file: nobody's to judge (its pid may be in another namespace)
    finally:
        os.rmdir(name)
