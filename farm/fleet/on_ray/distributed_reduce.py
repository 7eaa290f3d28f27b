"""The reducer on a Ray cluster: one task per device signature, each reading only its partition.

A signature's winners depend on that signature's rows alone, so the reduce splits by the dataset's
``device_signature=`` partitions. Each task runs the single-process reducer (farm.store.reduce) on
its partition into a scratch folder, starting from the current override file the driver hands it
(``append`` mode merges with it), and returns the files it wrote; the driver writes them into the
output folder. The files are therefore byte for byte those of ``reduce_results`` on the same data.
The results must be readable from the cluster's nodes (a ``pyarrow.fs`` URI, or a folder every node
mounts); on an embedded local instance any local folder is.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

from farm.errors import FarmError
from farm.fsutil import atomic_write_bytes, copy_aside, move_aside
from farm.store.dataset import partition_signatures
from farm.store.location import Location
from farm.store.reduce import ReduceReport, SignatureReport, reduce_results, relocated

log = logging.getLogger("farm.fleet.reduce")


def reduce_signature(results: str, signature: str, current: bytes | None, top_k: int, mode: str,
                     tunableop_csv: bool, incumbents: str | None, unreadable: str = "refuse"
                     ) -> tuple[SignatureReport | None, dict[str, bytes], int, list[tuple[str, str]]]:
    """One signature's reduce (a Ray task's body): its report, the files it wrote by name, rows read, files skipped."""
    with tempfile.TemporaryDirectory(prefix="tunefarm-reduce-") as scratch:
        if current is not None:
            (Path(scratch) / f"{signature}.json").write_bytes(current)
        report = reduce_results(results, scratch, top_k=top_k, mode=mode, tunableop_csv=tunableop_csv,
                                incumbents=incumbents, signatures=[signature], unreadable=unreadable)
        [rep] = report.signatures or [None]
        # a corrupt current file the reducer set aside stays here: the driver sets the original aside itself
        aside = Path(rep.write.moved_aside).name if rep and rep.write and rep.write.moved_aside else None
        files = {p.name: p.read_bytes() for p in Path(scratch).iterdir()
                 if p.is_file() and not p.name.startswith((".", "_")) and not p.name.endswith(".lock")
                 and p.name != aside}
    return rep, files, report.rows, report.skipped_files


def reduce_on_ray(results: str | Path, out_dir: str | Path, *, top_k: int = 3, mode: str = "append",
                  tunableop_csv: bool = False, incumbents: str | Path | None = None,
                  num_cpus: float = 1.0, unreadable: str = "refuse") -> ReduceReport:
    """``reduce_results`` as one Ray task per signature (Ray must be initialised: a cluster or a local instance)."""
    import ray

    location = str(Location.of(results)) if not isinstance(results, Path) else str(results.absolute())
    out = Path(out_dir)
    signatures = partition_signatures(results)
    task = ray.remote(num_cpus=num_cpus)(reduce_signature)
    refs = []
    for sig in signatures:
        current = out / f"{sig}.json"
        existing = current.read_bytes() if mode == "append" and current.is_file() else None
        refs.append(task.remote(location, sig, existing, top_k, mode, tunableop_csv,
                                str(incumbents) if incumbents else None, unreadable))
    log.info("reduce: %d signature(s) of %s on the cluster", len(refs), results)
    reports: list[SignatureReport] = []
    skipped: list[tuple[str, str]] = []
    rows = 0
    try:
        done = ray.get(refs)
    except ray.exceptions.RayTaskError as exc:  # a user's file refused in a task: its own message, no traceback
        if isinstance(exc.cause, FarmError):
            raise exc.cause from None
        raise
    for sig, (rep, files, n, skips) in zip(signatures, done):
        rows += n
        skipped.extend(skips)
        if rep is None:
            continue
        out.mkdir(parents=True, exist_ok=True)
        if rep.write is not None and rep.write.moved_aside:  # the task set aside its copy: the original goes too
            original = out / f"{sig}.json"
            aside = copy_aside(original, "unreadable") if rep.write.set_aside else move_aside(original)
            rep = dataclasses.replace(rep, write=dataclasses.replace(rep.write, moved_aside=str(aside)))
        for name, data in sorted(files.items()):
            atomic_write_bytes(out / name, data)
        reports.append(relocated(rep, lambda name: str(out / name)))
    return ReduceReport(reports, skipped, rows)

