"""Host-wide compile claims: two processes tuning on one host compile each shared artifact once."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from farm.tuner.autotuner import Autotuner
from farm.model.records import AutotuneConfig
from farm.tuner.compile_claims import CLAIMS_DIR_ENV, CompileQueue

from fakes import TILE, FakeEngine, fake_device, matmul_problem, registry_of

TILES = (16, 32, 64, 128)


class DiskCacheEngine(FakeEngine):
    """Compiles like a JIT with a host-wide disk cache: slow the first time, a load afterwards."""

    def __init__(self, cache: Path) -> None:
        super().__init__("jit", knobs=(TILE,))
        self.cache = cache

    def compile_key(self, problem, knobs, device):
        return f"jit|tile={knobs['tile']}"  # the same kernel for every shape, as Triton's are

    def compile(self, problem, knobs, device):
        binary = self.cache / f"tile{knobs['tile']}.bin"
        if not binary.exists():
            time.sleep(0.3)
            tmp = binary.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text("kernel")
            tmp.rename(binary)
            with open(self.cache / "compiles.log", "a") as log:
                log.write(f"{os.getpid()} {knobs['tile']}\n")
        return super().compile(problem, knobs, device)


def _tune_in_child(cache: str, claims: str, m: int, out: multiprocessing.Queue, start: multiprocessing.Barrier) -> None:
    os.environ[CLAIMS_DIR_ENV] = claims
    engine = DiskCacheEngine(Path(cache))
    tuner = Autotuner(matmul_problem(m=m), fake_device(), registry=registry_of(engine))
    for tile in TILES:
        tuner.add_engine("jit", {"tile": tile})
    start.wait(30)  # both workers start tuning together, as two device actors do
    results = tuner.autotune(config=AutotuneConfig(strategy="single_shot", compile_workers=2))
    out.put((m, sorted(r.candidate for r in results), all(r.succeeded for r in results)))


def test_two_processes_compile_each_shared_kernel_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    out, start = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_tune_in_child, args=(str(tmp_path), str(tmp_path / "claims"), m, out, start))
             for m in (8, 16)]  # two problems of one dtype: the same kernels
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    done = sorted(out.get(timeout=5) for _ in procs)
    assert done == [(8, [0, 1, 2, 3], True), (16, [0, 1, 2, 3], True)]
    compiled = (tmp_path / "compiles.log").read_text().split("\n")[:-1]
    assert sorted(int(line.split()[1]) for line in compiled) == list(TILES)  # each kernel once, not twice
    assert len({line.split()[0] for line in compiled}) == 2  # and the two processes shared the work


def test_a_claim_held_elsewhere_goes_to_the_back_and_is_waited_for(tmp_path):
    keys = {"a": None, "b": "kernel-b", "c": "kernel-c"}
    q = CompileQueue(["a", "b", "c"], keys.get, directory=tmp_path, wait_s=5)
    # hold kernel-b's claim through another descriptor, as another process would
    held = q._lock("kernel-b")
    held.acquire(timeout=0)
    first = [q.take(), q.take()]
    assert [item for item, _ in first] == ["a", "c"]
    assert q.deferred == 1
    for _, claim in first:
        claim.release()
    released = []

    def release_later():
        time.sleep(0.3)
        released.append(True)  # before the release: a take that returns now came after it
        held.release()

    threading.Thread(target=release_later).start()
    item, claim = q.take()  # waits for the holder
    assert item == "b" and released == [True]
    claim.release()
    assert q.take() is None


def test_a_claim_never_released_is_compiled_anyway_after_the_wait(tmp_path, caplog):
    q = CompileQueue(["b"], lambda item: "kernel-b", directory=tmp_path, wait_s=0.2)
    held = q._lock("kernel-b")
    held.acquire(timeout=0)
    with caplog.at_level("WARNING", logger="farm.tuner.compile_claims"):
        item, claim = q.take()
    assert item == "b" and "still held" in caplog.text
    claim.release()
    held.release()


def test_claims_directory_that_cannot_be_created_turns_claims_off(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    q = CompileQueue(["x", "y"], lambda item: f"k-{item}", directory=blocker / "claims")
    assert [q.take()[0], q.take()[0]] == ["x", "y"]


@pytest.mark.parametrize("workers", [0, 3])
def test_tuning_with_keyed_engine_gives_one_result_per_candidate(tmp_path, monkeypatch, workers):
    monkeypatch.setenv(CLAIMS_DIR_ENV, str(tmp_path / "claims"))
    engine = DiskCacheEngine(tmp_path)
    tuner = Autotuner(matmul_problem(), fake_device(), registry=registry_of(engine))
    for tile in TILES:
        tuner.add_engine("jit", {"tile": tile})
    results = tuner.autotune(config=AutotuneConfig(strategy="single_shot", compile_workers=workers))
    assert sorted(r.candidate for r in results) == [0, 1, 2, 3] and all(r.succeeded for r in results)
