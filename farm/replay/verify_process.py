"""farm tune's check in a process of its own: a production process, none of the tuning process's state.

A farm worker has tuned for minutes: compile pools, primed library caches, Ray's threads contending for the
GIL, flags a plan left. A replaying process has none of that, so the decisions are replayed in a fresh Python
process on the same device (``python -m farm.replay.verify_process REQUEST RESULT``, pickles in temp files:
its stdout is the libraries' to print on). Simulated devices have no host to speak of: they are verified in
the calling process.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from farm.devices.device import Device
from farm.errors import FarmError
from farm.replay.verify import VerifyOutcome, verify_for_job
from farm.replay.verified import VerifySettings


def verify_in_new_process(device: Device, text: str, keys: Sequence[str] | None = None, *,
                          settings: VerifySettings | None = None, only_losers: bool = True) -> VerifyOutcome:
    """:func:`farm.replay.verify.verify_for_job` in a new process on ``device`` (the CPU or a GPU this process
    sees); on a simulated device, here. A replay that hangs ends its process's checks (it is fixed); what it left
    unreplayed is checked by the next new process, until nothing is left."""
    outcome = _verify_once(device, text, keys, settings=settings, only_losers=only_losers)
    while outcome.unreplayed:  # each round settles at least the decision that hung: it ends
        outcome = outcome.then(_verify_once(device, text, outcome.unreplayed, settings=settings,
                                            only_losers=only_losers))
    return outcome


def _verify_once(device: Device, text: str, keys: Sequence[str] | None, *, settings: VerifySettings | None,
                 only_losers: bool) -> VerifyOutcome:
    if device.vendor == "sim":
        return verify_for_job(device, text, keys, settings=settings, only_losers=only_losers)
    kind = "cpu" if device.vendor == "cpu" else "gpu"
    request = {"kind": kind, "index": device.index, "text": text, "keys": list(keys) if keys is not None else None,
               "settings": settings, "only_losers": only_losers, "signature": device.signature}
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the farm package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    with tempfile.TemporaryDirectory(prefix="farm-verify-") as tmp:
        ask, answer = os.path.join(tmp, "request.pickle"), os.path.join(tmp, "result.pickle")
        with open(ask, "wb") as fh:
            pickle.dump(request, fh)
        proc = subprocess.run([sys.executable, "-m", "farm.replay.verify_process", ask, answer], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not os.path.exists(answer):
            tail = "; ".join(proc.stderr.strip().splitlines()[-3:])
            raise FarmError(f"the verification process on {device.signature} failed (exit {proc.returncode}): {tail}")
        with open(answer, "rb") as fh:
            outcome = pickle.load(fh)  # written by the child of this process, from this checkout: trusted
    if isinstance(outcome, str):
        raise FarmError(outcome)
    return outcome


def _child(request_path: str, result_path: str) -> int:
    import logging

    from farm.devices.open import open_device

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    with open(request_path, "rb") as fh:
        req: dict[str, Any] = pickle.load(fh)
    device = open_device(req["kind"], req["index"])
    if device.signature != req["signature"]:
        out: Any = (f"the verification process opened {device.signature}, not {req['signature']} (another device "
                    "than the one that measured)")
    else:
        out = verify_for_job(device, req["text"], req["keys"], settings=req["settings"],
                             only_losers=req["only_losers"])
    tmp = result_path + ".tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(out, fh)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child by verify_in_new_process
    code = _child(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    # the result is written: a replay that hung (farm.replay.verify._bounded) must not keep this process alive
    os._exit(code)
