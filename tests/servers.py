"""Servers the tests and the benchmarks start for real: moto's S3 server in a subprocess on a free local port."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from typing import Iterator


def start_moto() -> tuple[subprocess.Popen, str]:
    """moto's S3 server on a free port of this machine, once it answers: (its process, ``host:port``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, f"127.0.0.1:{port}"


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """``with moto_server() as endpoint:`` an S3 endpoint (``host:port``) for the block's length."""
    proc, endpoint = start_moto()
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def s3_query(endpoint: str) -> str:
    """The pyarrow.fs URI query that reaches ``endpoint`` (``s3://bucket/path?<query>``)."""
    return f"endpoint_override={endpoint}&scheme=http&region=us-east-1"
