"""SelectionHeuristic::Config: every decline path, exact/wildcard/stride/criteria matching, reloads, published roots."""

import json
import logging
import os
import random

import pytest

from farm.devices.device import cpu_device
from farm.devices.fb import encode_device_properties, encode_problem
from farm.model.ids import engine_name_to_id
from farm.store.overrides.entries import OverrideEntry, OverrideFile, TensorRule
from farm.store.overrides.files import write_overrides
from farm.model.problem import Problem
from policies.config import ConfigPolicy
from tests.fakes import fake_props, matmul_problem

BLAS, EINSUM, BLOCKED = (engine_name_to_id(n) for n in ("cpu.matmul.blas", "cpu.matmul.einsum", "cpu.matmul.blocked"))
CANDIDATES = (BLAS, EINSUM, BLOCKED)


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in ("FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def device():
    return cpu_device()


@pytest.fixture()
def session(device):
    return ConfigPolicy().session(encode_device_properties(device.properties))


def dev_obj(props):
    return {"signature": props.signature, "properties": props.to_dict()}


def write(path, entries, props):
    write_overrides(path, entries, device=dev_obj(props), mode="replace")
    return str(path)


def entry(problem, engine, knobs=()):
    return OverrideEntry.for_problem(problem, engine, knobs, {"rank": 0})


def ask(session, problem, candidates=CANDIDATES):
    return session.order(candidates, encode_problem(problem))


# -- decline paths -----------------------------------------------------------------------------
def test_declines_when_the_variable_is_unset(session):
    assert ask(session, matmul_problem()) is None


def test_declines_on_a_missing_file(session, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(tmp_path / "nope.json"))
    with caplog.at_level(logging.INFO, logger="farm.policies.config"):
        assert ask(session, matmul_problem()) is None
    assert "No such file or directory" in caplog.text and "no tuned winner from it is used" in caplog.text


def test_declines_on_an_unparsable_file(session, monkeypatch, tmp_path, caplog):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(bad))
    with caplog.at_level(logging.INFO, logger="farm.policies.config"):
        assert ask(session, matmul_problem()) is None
        assert ask(session, matmul_problem()) is None
    assert caplog.text.count("not valid JSON") == 1  # said once, not per call


def test_declines_on_malformed_problem_bytes(session, device, monkeypatch, tmp_path):
    p = matmul_problem()
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [entry(p, "cpu.matmul.einsum")], device.properties))
    assert session.order(CANDIDATES, b"\x00\x01garbage") is None
    assert ask(session, p).order[0] == EINSUM  # and the session still works


def test_declines_when_nothing_matches(session, device, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH",
                       write(tmp_path / "o.json", [entry(matmul_problem(8, 6, 5), "cpu.matmul.einsum")], device.properties))
    assert ask(session, matmul_problem(9, 6, 5)) is None


def test_declines_when_the_engine_is_not_a_candidate(session, device, monkeypatch, tmp_path):
    p = matmul_problem()
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [entry(p, "cpu.matmul.einsum")], device.properties))
    assert ask(session, p, (BLAS, BLOCKED)) is None


def test_declines_for_another_device_signature(session, monkeypatch, tmp_path, caplog):
    p = matmul_problem()
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [entry(p, "cpu.matmul.einsum")], fake_props()))
    with caplog.at_level(logging.INFO, logger="farm.policies.config"):
        assert ask(session, p) is None
    assert "is for device" in caplog.text and fake_props().signature in caplog.text


def test_a_declining_config_falls_through_to_static_ordering(device, monkeypatch, tmp_path):
    from farm.replay.selection import Selector

    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(tmp_path / "missing.json"))
    sel = Selector(device.properties).select(matmul_problem(), (BLOCKED, EINSUM, BLAS))
    assert sel.policy == "SelectionHeuristic::StaticOrdering" and sel.order == (BLAS, EINSUM, BLOCKED)


# -- matching --------------------------------------------------------------------------------
def test_exact_hit_moves_the_engine_first_and_keeps_the_others_in_order(session, device, monkeypatch, tmp_path):
    p = matmul_problem()
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH",
                       write(tmp_path / "o.json", [entry(p, "cpu.matmul.blocked", (("block_k", 128),))], device.properties))
    choice = ask(session, p)
    assert choice.order == (BLOCKED, BLAS, EINSUM)
    assert choice.knobs[BLOCKED] == (("block_k", 128),)


def test_hipdnn_variable_is_accepted(session, device, monkeypatch, tmp_path):
    p = matmul_problem()
    monkeypatch.setenv("HIPDNN_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [entry(p, "cpu.matmul.einsum")], device.properties))
    assert ask(session, p).order[0] == EINSUM


@pytest.mark.parametrize("pad", [" {} ", "{}\n", "\t{}", "  \n"])
def test_the_path_is_trimmed_and_a_blank_farm_variable_gives_way(session, device, monkeypatch, tmp_path, pad):
    p = matmul_problem()
    path = write(tmp_path / "o.json", [entry(p, "cpu.matmul.einsum")], device.properties)
    if "{}" in pad:
        monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", pad.format(path))
    else:  # blank: the hipDNN variable answers
        monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", pad)
        monkeypatch.setenv("HIPDNN_HEUR_CONFIG_PATH", f" {path}")
    assert ask(session, p).order[0] == EINSUM


def rule(tid, dims, strides=(), dtype="fp32"):
    return TensorRule(tid, tuple(dims), tuple(strides), dtype)


def test_wildcard_dims_match_any_size(session, device, monkeypatch, tmp_path):
    wild = OverrideEntry("matmul", "cpu.matmul.einsum", (rule("A", (-1, 5)), rule("B", (5, 6)), rule("C", (-1, 6))),
                         compute_data_type="fp32", metadata={"rank": 0})
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [wild], device.properties))
    assert ask(session, matmul_problem(8, 6, 5)).order[0] == EINSUM
    assert ask(session, matmul_problem(1000, 6, 5)).order[0] == EINSUM
    assert ask(session, matmul_problem(8, 7, 5)) is None  # n is fixed at 6


def test_stride_rules_tell_layouts_apart(session, device, monkeypatch, tmp_path):
    # A given column-major ([1, m] strides) must not take the row-major rule
    row_major = OverrideEntry("matmul", "cpu.matmul.einsum",
                              (rule("A", (8, 5), (-1, 1)), rule("B", (5, 6)), rule("C", (8, 6))),
                              compute_data_type="fp32", metadata={"rank": 0})
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [row_major], device.properties))
    contiguous = Problem.create("matmul", {"A": {"dims": [8, 5]}, "B": {"dims": [5, 6]}})
    transposed = Problem.create("matmul", {"A": {"dims": [8, 5], "strides": [1, 8]}, "B": {"dims": [5, 6]}})
    assert ask(session, contiguous).order[0] == EINSUM
    assert ask(session, transposed) is None


def test_criteria_must_match(device, monkeypatch, tmp_path):
    from farm.model.engine import default_engine_registry

    def conv(pad):
        return Problem.create("conv_fprop", {"X": [1, 3, 8, 8], "W": [4, 3, 3, 3]}, criteria={"pad_h": pad, "pad_w": pad})

    padded = conv(1)
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [entry(padded, "cpu.conv.fft")], device.properties))
    cands = tuple(c.engine_id for c in default_engine_registry().discover(padded, device))
    s = ConfigPolicy().session(encode_device_properties(device.properties))
    assert s.order(cands, encode_problem(padded)).order[0] == engine_name_to_id("cpu.conv.fft")
    assert s.order(cands, encode_problem(conv(0))) is None


def test_dtype_separates_rules_of_one_shape(session, device, monkeypatch, tmp_path):
    fp32 = matmul_problem()
    fp16 = Problem.create("matmul", {"A": [8, 5], "B": [5, 6]}, dtype="fp16")
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH",
                       write(tmp_path / "o.json", [entry(fp32, "cpu.matmul.einsum"), entry(fp16, "cpu.matmul.blocked")],
                             device.properties))
    assert ask(session, fp32).order[0] == EINSUM
    assert ask(session, fp16).order[0] == BLOCKED


# -- reloads and published roots ------------------------------------------------------------
def test_a_changed_file_is_picked_up_without_a_restart(session, device, monkeypatch, tmp_path):
    p = matmul_problem()
    path = write(tmp_path / "o.json", [entry(p, "cpu.matmul.einsum")], device.properties)
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", path)
    assert ask(session, p).order[0] == EINSUM
    write(tmp_path / "o.json", [entry(p, "cpu.matmul.blocked", (("block_k", 512),))], device.properties)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse clocks: make the change visible
    assert ask(session, p).order[0] == BLOCKED
    os.unlink(path)
    assert ask(session, p) is None


def test_unchanged_file_is_not_read_again(session, device, monkeypatch, tmp_path):
    import policies.config as config

    p = matmul_problem()
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", write(tmp_path / "o.json", [entry(p, "cpu.matmul.einsum")], device.properties))
    reads = []
    real = config.load_overrides
    monkeypatch.setattr(config, "load_overrides", lambda path, **kw: reads.append(path) or real(path, **kw))
    for _ in range(50):
        ask(session, p)
    assert len(reads) == 1


def test_a_published_root_is_a_valid_config_path(session, device, monkeypatch, tmp_path):
    from farm.store.publish.root import publish

    p = matmul_problem()
    src = tmp_path / "overrides"
    src.mkdir()
    write(src / f"{device.signature}.json", [entry(p, "cpu.matmul.einsum")], device.properties)
    root = tmp_path / "published"
    publish(src, str(root))
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(root))
    assert ask(session, p).order[0] == EINSUM
    # a new publish over the root is seen by the running session
    write(src / f"{device.signature}.json", [entry(p, "cpu.matmul.blocked")], device.properties)
    publish(src, str(root), force=True)
    assert ask(session, p).order[0] == BLOCKED


def test_a_published_root_falls_back_to_the_same_arch_with_a_note(device, monkeypatch, tmp_path, caplog):
    import dataclasses

    from farm.store.publish.root import publish

    other = dataclasses.replace(device.properties, driver_version="999.1", name=device.properties.name)
    assert other.signature != device.signature and other.arch == device.properties.arch
    src = tmp_path / "overrides"
    src.mkdir()
    p = matmul_problem()
    write(src / f"{other.signature}.json", [entry(p, "cpu.matmul.einsum")], other)
    root = tmp_path / "published"
    publish(src, str(root))
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(root))
    s = ConfigPolicy().session(encode_device_properties(device.properties))
    with caplog.at_level(logging.INFO):
        assert s.order(CANDIDATES, encode_problem(p)).order[0] == EINSUM
    assert "same arch" in caplog.text and "driver" in caplog.text


# -- the index agrees with the definition of a match -----------------------------------------------
def test_indexed_matching_agrees_with_a_linear_scan():
    rng = random.Random(7)
    entries = []
    for _ in range(400):
        m, k, n = rng.choice([4, 8]), rng.choice([3, 5]), rng.choice([6, 7])
        wild = lambda v: -1 if rng.random() < 0.3 else v  # noqa: E731
        strides = (wild(k), 1) if rng.random() < 0.5 else ()
        crit = ()
        entries.append(OverrideEntry(
            "matmul", rng.choice(["cpu.matmul.blas", "cpu.matmul.einsum", "cpu.matmul.blocked"]),
            (rule("A", (wild(m), wild(k)), strides, rng.choice(["fp32", None])), rule("B", (wild(k), wild(n))),
             rule("C", (wild(m), wild(n)))),
            criteria=crit, compute_data_type=rng.choice(["fp32", None]), metadata={"rank": 0}))
    f = OverrideFile(2, entries)
    for m in (4, 8, 9):
        for k in (3, 5):
            for n in (6, 7):
                for dtype in ("fp32", "fp16"):
                    p = Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype=dtype)
                    expected = next((e for e in entries if e.exact and e.matches(p)), None) \
                        or next((e for e in entries if e.matches(p)), None)
                    assert f.match(p) is expected, p.label()
                    assert f.match(p) is expected  # memoised answer is the same


@pytest.mark.parametrize("bad", [
    {"tensor_id": "A", "dim": [48, 40], "stride": [40]},  # a stride list shorter than its dims
    {"tensor_id": "A", "dim": [48, -2]},  # a dim below -1
])
def test_a_rule_the_reader_cannot_use_is_skipped_and_the_rest_loads(session, device, monkeypatch, tmp_path, caplog, bad):
    p = matmul_problem()
    good = entry(p, "cpu.matmul.einsum").to_json()
    broken = {"op": "matmul", "engine_name": "cpu.matmul.blocked", "tensors": [bad, {"tensor_id": "B", "dim": [-1, -1]}]}
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 2, "device": {"signature": device.signature},
                                "engine_overrides": [broken, good]}))
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(path))
    with caplog.at_level(logging.WARNING):
        assert ask(session, p).order[0] == EINSUM
    assert "that rule is skipped" in caplog.text and "engine_overrides[0]" in caplog.text


def test_a_run_folder_of_override_files_is_read_as_farm_tune_wrote_it(session, device, monkeypatch, tmp_path):
    """FARM_HEUR_CONFIG_PATH at RUN/overrides (files named by signature, no published layout) finds this
    device's file there."""
    p = matmul_problem()
    folder = tmp_path / "run" / "overrides"
    folder.mkdir(parents=True)
    write(folder / f"{device.signature}.json", [entry(p, "cpu.matmul.einsum")], device.properties)
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(folder))
    assert ask(session, p).order[0] == EINSUM
