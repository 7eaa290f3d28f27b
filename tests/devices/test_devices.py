"""Device properties and signatures: what goes in, what stays out; farm devices."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from fakes import fake_props
from farm.devices.device import cpu_device, probe
from farm.devices.open import open_device
from farm.devices.properties import DeviceProperties
from farm.errors import InputError


def test_signature_is_readable_and_deterministic():
    p = fake_props("NVIDIA H200", units=132)
    assert p.signature.startswith("nvidia-h200-sm90-132cu-")
    assert len(p.signature.rsplit("-", 1)[1]) == 10
    assert p.signature == fake_props("NVIDIA H200", units=132).signature
    amd = DeviceProperties("amd", "AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 304, 192 << 30, 4 << 20, 2100, 64,
                           "6.8.5", "6.2.41134", (("torch", "2.5.1"),))
    assert amd.signature.startswith("amd-instinct-mi300x-gfx942-304cu-")


@pytest.mark.parametrize("change", [
    dict(index=1), dict(uuid="abcd"), dict(host="other-host"), dict(pci_bus="0000:1b:00.0"), dict(clock_mhz=345),
    dict(driver_version="580.2"),  # same driver major
    dict(libraries=(("torch", "2.11.7"),)),  # patch release
    dict(total_memory=141 * 2**30 + 12345),  # rounding to GiB
])
def test_fields_that_do_not_change_which_kernel_wins_stay_out(change):
    base = fake_props()
    assert dataclasses.replace(base, **change).signature == base.signature


@pytest.mark.parametrize("change", [
    dict(driver_version="590.1"),  # driver major
    dict(libraries=(("torch", "2.12.0"),)),  # library minor
    dict(libraries=(("torch", "2.11.0"), ("triton", "3.6.0"))),  # another library
    dict(runtime_version="13.1"),
    dict(arch="sm_100"), dict(compute_units=114), dict(name="NVIDIA H100"), dict(total_memory=80 * 2**30),
    dict(l2_bytes=50 * 2**20), dict(warp_size=64), dict(vendor="amd"),
])
def test_fields_that_change_which_kernel_wins_go_in(change):
    base = fake_props()
    assert dataclasses.replace(base, **change).signature != base.signature


def test_signature_fields_are_documented(repo_root):
    doc = open(f"{repo_root}/docs/devices.md").read()
    for name in fake_props().signature_fields():
        assert f"`{name}`" in doc, name


def test_properties_dict_round_trip():
    p = fake_props()
    d = p.to_dict()
    assert d["signature"] == p.signature and d["libraries"] == {"torch": "2.11.0"}
    assert DeviceProperties.from_dict(json.loads(json.dumps(d))) == p


def test_cpu_device_and_probe():
    dev = cpu_device()
    assert dev.vendor == "cpu" and dev.signature.startswith("cpu-")
    assert dev.properties.compute_units >= 1 and "numpy" in dev.properties.library_versions
    assert open_device("cpu").signature == dev.signature
    probes = {p.runtime: p for p in probe()}
    assert set(probes) == {"cuda", "hip", "cpu"}
    assert probes["cpu"].devices[0].signature == dev.signature
    for name in ("cuda", "hip"):
        assert probes[name].devices or probes[name].note  # a reason whenever nothing is visible
    with pytest.raises(InputError, match="device kind.*expected one of auto, gpu, cuda, hip, cpu, sim"):
        open_device("tpu")


def test_farm_devices_cli(repo_root):
    env = dict(os.environ, PYTHONPATH=repo_root, COLUMNS="200")
    table = subprocess.run([sys.executable, "-m", "farm", "devices"], cwd=repo_root, env=env, capture_output=True,
                           text=True, timeout=120, check=True).stdout
    assert "Devices" in table and cpu_device().signature in table
    data = json.loads(subprocess.run([sys.executable, "-m", "farm", "devices", "--json"], cwd=repo_root, env=env,
                                     capture_output=True, text=True, timeout=120, check=True).stdout)
    assert any(d["vendor"] == "cpu" for d in data["devices"])
    assert {r["runtime"] for r in data["runtimes"]} == {"cuda", "hip", "cpu"}
