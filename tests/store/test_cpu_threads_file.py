"""A file farm tune --cpu-threads wrote is found by farm.ops on the same CPU whatever its thread count (issue 56):
the nearest thread count's file is used, and the note says how to replay it as measured."""

import dataclasses
import logging

from farm.devices.device import cpu_device
from farm.store.overrides.files import write_overrides
from farm.store.publish.published import find_published
from farm.store.publish.root import publish
from farm.store.targets import resolve
from tests.fakes import fake_props, matmul_problem
from farm.store.overrides.entries import OverrideEntry


def write(folder, props, engine="cpu.matmul.blas"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{props.signature}.json"
    p = matmul_problem()
    write_overrides(path, [OverrideEntry.for_problem(p, engine, (), {"rank": 0, "min_time_ms": 1.0,
                                                                     "problem_name": "g", "problem_key": p.key})],
                    device={"signature": props.signature, "properties": props.to_dict()}, mode="replace")
    return path


def test_a_run_tuned_with_other_blas_threads_is_used_on_this_cpu_with_a_note(tmp_path, caplog):
    here = cpu_device().properties
    one = dataclasses.replace(here, compute_units=here.compute_units + 1)
    three = dataclasses.replace(here, compute_units=here.compute_units + 3)
    write(tmp_path / "overrides", three, "far")
    near = write(tmp_path / "overrides", one, "near")
    with caplog.at_level(logging.WARNING, logger="farm.store.publish.root"):
        path, note = find_published(str(tmp_path / "overrides"), here)
    assert path == str(near)  # the nearest thread count
    assert f"{here.compute_units + 1} BLAS thread(s)" in note and f"OMP_NUM_THREADS={here.compute_units + 1}" in note
    assert note in caplog.text
    (tmp_path / "results").mkdir()
    target = resolve(str(tmp_path), cpu_device())  # farm verify / farm apply on the run folder
    assert (target.path, target.kind, target.note) == (str(near), "file", note)
    # published: found through the index
    publish(tmp_path / "overrides", str(tmp_path / "root"))
    path, note = find_published(str(tmp_path / "root"), here)
    assert path.endswith(f"{one.signature}.json") and "OMP_NUM_THREADS" in note


def test_its_own_file_first_and_never_another_gpus(tmp_path):
    here = cpu_device().properties
    own = write(tmp_path, here)
    write(tmp_path, dataclasses.replace(here, compute_units=here.compute_units + 1))
    assert find_published(str(tmp_path), here) == (str(own), "")
    gpu = fake_props()
    write(tmp_path / "gpu", dataclasses.replace(gpu, compute_units=gpu.compute_units + 1))
    assert find_published(str(tmp_path / "gpu"), gpu) is None  # a GPU's units are its SMs: no such fallback


def test_farm_tune_cpu_threads_measures_with_them_and_farm_ops_on_this_cpu_uses_the_file(tmp_path):
    """In-process, --cpu-threads sets the threads measured with (the summary said 1 while 2 ran); a process with
    another count finds the file (issue 56: "holds no file for ..." unless OMP_NUM_THREADS matched)."""
    import os
    import subprocess
    import sys

    wl = tmp_path / "w.yaml"
    wl.write_text("name: threads\nautotune: {max_tuning_samples: 3, max_tuning_duration_ms: 20, confirm: "
                  "{budget_ms: 50}}\nengines: {include: [cpu.matmul.blas, cpu.matmul.einsum]}\nproblems:\n"
                  "  - {name: g, op: matmul, tensors: {A: {dims: [32, 32]}, B: {dims: [32, 32]}}}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    run = subprocess.run([sys.executable, "-m", "farm", "tune", str(wl), "--out", str(tmp_path / "run"),
                          "--in-process", "--cpu-threads", "1", "--no-verify"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    files = list((tmp_path / "run" / "overrides").glob("*.json"))
    assert len(files) == 1 and "-1cu-" in files[0].name
    check = ("import os; from policies.config import ConfigPolicy; from farm.devices.device import cpu_device; "
             "from farm.devices.fb import encode_device_properties as e; "
             "s = ConfigPolicy().session(e(cpu_device().properties)); st = s.status(); "
             "print(cpu_device().properties.compute_units, st['loaded'], st['detail'])")
    env["FARM_HEUR_CONFIG_PATH"] = str(tmp_path / "run" / "overrides")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    units, loaded, detail = out.stdout.split(" ", 2)
    if units != "1":  # a 1-core machine runs with one thread: its own file
        assert loaded == "True" and "OMP_NUM_THREADS=1" in detail, out.stdout
