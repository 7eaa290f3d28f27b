"""The policy framework (heuristics RFC §17, translated): registration, order, the loop, validation, plugins."""

import logging
import sys
import textwrap

import pytest

from farm.devices.device import cpu_device
from farm.model.ids import policy_name_to_id
from farm.replay.selection import (
    CONFIG,
    DEFAULT_ORDER,
    ORDER_ENV,
    POLICY_API_VERSION,
    STATIC_ORDERING,
    Choice,
    NoSelection,
    PolicyRegistry,
    Selector,
    resolve_order,
)
from tests.fakes import matmul_problem

CANDIDATES = (11, 22, 33, 44)


class Scripted:
    """A policy whose sessions answer from a function of (candidates, problem bytes); records what it saw."""

    api_version = POLICY_API_VERSION

    def __init__(self, name, answer, api_version=None, id=None):
        self.name = name
        self.id = policy_name_to_id(name) if id is None else id
        if api_version is not None:
            self.api_version = api_version
        self.answer = answer
        self.seen = []
        self.sessions = []

    def session(self, device_properties):
        self.sessions.append(device_properties)
        policy = self

        class S:
            def order(self, candidates, problem):
                policy.seen.append(tuple(candidates))
                return policy.answer(candidates, problem)

        return S()


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in (ORDER_ENV, "FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)


def registry_with(*policies):
    reg = PolicyRegistry.default(entry_points=False)
    for p in policies:
        reg.register(p, origin="test")
    return reg


def selector(reg, order=None, preferred=None):
    return Selector(cpu_device().properties, order=order, registry=reg, preferred_engine_id=preferred)


# -- registration and ids ------------------------------------------------------------------
def test_builtins_are_registered_with_hashed_ids():
    reg = PolicyRegistry.default(entry_points=False)
    infos = {i.name: i for i in reg.info()}
    assert set(infos) == {CONFIG, STATIC_ORDERING}
    for name, info in infos.items():
        assert info.id == policy_name_to_id(name)
        assert info.origin == "built-in"
        assert info.api_version[0] == POLICY_API_VERSION[0]
    assert reg.find(CONFIG).name == CONFIG
    assert reg.find(str(policy_name_to_id(STATIC_ORDERING))).name == STATIC_ORDERING
    assert reg.find(policy_name_to_id(CONFIG)).name == CONFIG


def test_policy_ids_are_fnv1a_64_signed():
    # the published FNV-1a 64 test vector for "a" is 0xaf63dc4c8601ec8c, read here as a signed int64
    assert policy_name_to_id("a") == 0xAF63DC4C8601EC8C - (1 << 64)
    with pytest.raises(ValueError):
        policy_name_to_id("")
    ids = {policy_name_to_id(n) for n in (CONFIG, STATIC_ORDERING, "a", "b")}
    assert len(ids) == 4 and all(-(1 << 63) <= i < (1 << 63) for i in ids)


# -- order resolution ----------------------------------------------------------------------
def test_default_order():
    assert [p.name for p in resolve_order(registry_with())] == list(DEFAULT_ORDER)


def test_env_beats_caller_beats_default(monkeypatch):
    a, b = Scripted("Test::A", lambda c, p: None), Scripted("Test::B", lambda c, p: None)
    reg = registry_with(a, b)
    assert [p.name for p in resolve_order(reg, ["Test::B", CONFIG])] == ["Test::B", CONFIG]
    monkeypatch.setenv(ORDER_ENV, f" Test::A , {policy_name_to_id(STATIC_ORDERING)} ")
    assert [p.name for p in resolve_order(reg, ["Test::B"])] == ["Test::A", STATIC_ORDERING]


def test_a_token_is_an_id_only_when_it_parses_whole(monkeypatch):
    weird = Scripted("123abc", lambda c, p: None)  # a name that starts with digits
    reg = registry_with(weird)
    monkeypatch.setenv(ORDER_ENV, "123abc")
    assert [p.name for p in resolve_order(reg)] == ["123abc"]
    monkeypatch.setenv(ORDER_ENV, str(weird.id))
    assert [p.name for p in resolve_order(reg)] == ["123abc"]


@pytest.mark.parametrize("name", ["1_0", "0x10", "١٢", "+", "1e3", "99999999999999999999"])
def test_only_a_whole_signed_decimal_int64_is_an_id(monkeypatch, name):
    """Python's int() takes '1_0' and Arabic-Indic digits; the RFC's id does not: those are names."""
    named = Scripted(name, lambda c, p: None)
    reg = registry_with(named, Scripted("Test::Ten", lambda c, p: None))
    monkeypatch.setenv(ORDER_ENV, name)
    assert [p.name for p in resolve_order(reg)] == [name]
    monkeypatch.setenv(ORDER_ENV, f"+{named.id}" if named.id >= 0 else str(named.id))
    assert [p.name for p in resolve_order(reg)] == [name]  # a signed id still is one


@pytest.mark.parametrize("value", [",", " , ,", "\t", " "])
def test_an_order_of_blanks_and_separators_falls_through(monkeypatch, value):
    reg = registry_with(Scripted("Test::B", lambda c, p: None))
    monkeypatch.setenv(ORDER_ENV, value)
    assert [p.name for p in resolve_order(reg, ["Test::B"])] == ["Test::B"]
    assert [p.name for p in resolve_order(reg)] == list(DEFAULT_ORDER)


def test_a_policy_named_twice_in_an_order_is_asked_once(monkeypatch):
    reg = registry_with(Scripted("Test::A", lambda c, p: None))
    monkeypatch.setenv(ORDER_ENV, f"Test::A,{STATIC_ORDERING},Test::A")
    assert [p.name for p in resolve_order(reg)] == ["Test::A", STATIC_ORDERING]


def test_unknown_names_and_ids_are_skipped_with_a_log_line(monkeypatch, caplog):
    reg = registry_with()
    monkeypatch.setenv(ORDER_ENV, f"Nope::Missing,42,{STATIC_ORDERING}")
    with caplog.at_level(logging.WARNING, logger="farm.replay.selection"):
        order = resolve_order(reg)
    assert [p.name for p in order] == [STATIC_ORDERING]
    assert "Nope::Missing" in caplog.text and "'42'" in caplog.text


# -- the loop ------------------------------------------------------------------------------
def test_first_success_wins_and_every_policy_sees_the_original_candidates():
    first = Scripted("Test::Decliner", lambda c, p: None)
    second = Scripted("Test::Reverse", lambda c, p: list(reversed(c)))
    third = Scripted("Test::Never", lambda c, p: [c[0]])
    sel = selector(registry_with(first, second, third), order=[first.name, second.name, third.name])
    out = sel.select(matmul_problem(), CANDIDATES)
    assert out.order == tuple(reversed(CANDIDATES)) and out.policy == "Test::Reverse"
    assert first.seen == [CANDIDATES] and second.seen == [CANDIDATES] and third.seen == []


def test_sessions_are_per_device_and_made_once():
    p = Scripted("Test::Id", lambda c, pb: list(c))
    sel = selector(registry_with(p), order=[p.name])
    for _ in range(3):
        sel.select(matmul_problem(), CANDIDATES)
    assert len(p.sessions) == 1 and isinstance(p.sessions[0], bytes) and len(p.sessions[0]) > 32


def test_the_problem_arrives_as_flatbuffer_bytes():
    from farm.devices.fb import decode_problem

    got = []
    p = Scripted("Test::Peek", lambda c, pb: got.append(pb) or list(c))
    problem = matmul_problem(7, 5, 3)
    selector(registry_with(p), order=[p.name]).select(problem, CANDIDATES)
    assert decode_problem(got[0]).key == problem.key


def test_a_subset_is_a_valid_answer():
    p = Scripted("Test::Subset", lambda c, pb: [c[2]])
    out = selector(registry_with(p), order=[p.name]).select(matmul_problem(), CANDIDATES)
    assert out.order == (33,)


def test_all_decline_is_a_clear_error_naming_each_policy():
    a, b = Scripted("Test::A", lambda c, p: None), Scripted("Test::B", lambda c, p: None)
    with pytest.raises(NoSelection) as err:
        selector(registry_with(a, b), order=[a.name, b.name]).select(matmul_problem(), CANDIDATES)
    assert "Test::A: declined" in str(err.value) and "Test::B: declined" in str(err.value)


def test_no_hidden_fallback_when_the_order_names_nothing_loaded(monkeypatch):
    monkeypatch.setenv(ORDER_ENV, "Nope::Missing")
    with pytest.raises(NoSelection, match="no selection policy is loaded"):
        selector(registry_with()).select(matmul_problem(), CANDIDATES)


def test_a_raising_policy_counts_as_declining():
    boom = Scripted("Test::Boom", lambda c, p: 1 / 0)
    static = Scripted("Test::Static", lambda c, p: list(c))
    out = selector(registry_with(boom, static), order=[boom.name, static.name]).select(matmul_problem(), CANDIDATES)
    assert out.policy == "Test::Static"


@pytest.mark.parametrize("bad", [[99], [11, 11], [], [11, 22, 33, 44, 55]])
def test_output_that_is_not_a_permutation_or_subset_is_rejected(bad, caplog):
    liar = Scripted("Test::Liar", lambda c, p: bad)
    honest = Scripted("Test::Honest", lambda c, p: list(c))
    with caplog.at_level(logging.ERROR, logger="farm.replay.selection"):
        out = selector(registry_with(liar, honest), order=[liar.name, honest.name]).select(matmul_problem(), CANDIDATES)
    assert out.policy == "Test::Honest" and out.order == CANDIDATES
    assert "Test::Liar" in caplog.text and "output rejected" in caplog.text


def test_preferred_engine_moves_first_after_the_loop():
    p = Scripted("Test::Id", lambda c, pb: list(c))
    out = selector(registry_with(p), order=[p.name], preferred=33).select(matmul_problem(), CANDIDATES)
    assert out.order == (33, 11, 22, 44)
    # a preferred engine the policy left out is not put back
    q = Scripted("Test::Two", lambda c, pb: [c[0], c[1]])
    out = selector(registry_with(q), order=[q.name], preferred=44).select(matmul_problem(), CANDIDATES)
    assert out.order == (11, 22)


def test_choice_carries_knobs():
    p = Scripted("Test::Knobs", lambda c, pb: Choice((c[1], c[0]), {c[1]: (("tile", 32),)}))
    out = selector(registry_with(p), order=[p.name]).select(matmul_problem(), CANDIDATES)
    assert out.engine_id == 22 and out.knobs[22] == (("tile", 32),)


def test_static_ordering_ranks_known_engines_by_priority_and_keeps_unknown_ones_after():
    from farm.model.engine import default_engine_registry, engine_id

    reg = default_engine_registry()
    ids = {e.name: engine_id(e) for e in reg}
    given = [ids["cpu.matmul.blocked"], 999, ids["cpu.matmul.einsum"], ids["cpu.matmul.blas"]]
    out = selector(registry_with(), order=[STATIC_ORDERING]).select(matmul_problem(), given)
    # priorities: blas 10, einsum 50, blocked 60
    assert out.order == (ids["cpu.matmul.blas"], ids["cpu.matmul.einsum"], ids["cpu.matmul.blocked"], 999)


# -- plugins ---------------------------------------------------------------------------------
def make_plugin(tmp_path, dist, body, entry_points):
    """An installed-looking distribution on sys.path: a module and a dist-info with entry_points.txt."""
    (tmp_path / f"{dist}.py").write_text(textwrap.dedent(body))
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[farm.policies]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))


PLUGIN = """
from farm.model.ids import policy_name_to_id

class P:
    def __init__(self, name, id=None, api=(1, 0)):
        self.name, self.id, self.api_version = name, policy_name_to_id(name) if id is None else id, api
    def session(self, props):
        return self
    def order(self, candidates, problem):
        return list(reversed(candidates))

GOOD = P("Plugin::Reverse")
WRONG_MAJOR = P("Plugin::Future", api=(2, 0))
MISMATCH = P("Plugin::Liar", id=12345)
DUPLICATE = [P("Plugin::Reverse")]
BROKEN = None
def __getattr__(name):
    if name == "RAISES":
        raise RuntimeError("import-time failure")
    raise AttributeError(name)
"""


def test_plugins_load_and_bad_ones_are_rejected_with_reasons(tmp_path, monkeypatch, caplog):
    make_plugin(tmp_path, "farmplug", PLUGIN, {
        "good": "farmplug:GOOD", "future": "farmplug:WRONG_MAJOR", "liar": "farmplug:MISMATCH",
        "dup": "farmplug:DUPLICATE", "raises": "farmplug:RAISES",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("farmplug", None)
    with caplog.at_level(logging.WARNING, logger="farm.replay.selection"):
        reg = PolicyRegistry.default()
    loaded = {i.name: i.origin for i in reg.info()}
    assert loaded["Plugin::Reverse"].startswith("plugin good (farmplug:GOOD)")
    assert "Plugin::Future" not in loaded and "Plugin::Liar" not in loaded
    reasons = dict(reg.rejected)
    assert any("major 2" in r for r in reasons.values())
    assert any("is not policy_name_to_id('Plugin::Liar')" in r for r in reasons.values())
    assert any("duplicate id" in r for r in reasons.values())
    assert any("import-time failure" in r for r in reasons.values())
    assert "rejected" in caplog.text
    # the loaded plugin takes part in selection by name
    out = Selector(cpu_device().properties, order=["Plugin::Reverse"], registry=reg).select(matmul_problem(), CANDIDATES)
    assert out.order == tuple(reversed(CANDIDATES))


def test_farm_policies_lists_builtins_plugins_and_rejections(tmp_path, monkeypatch, capsys):
    import json

    from farm.cli import main

    make_plugin(tmp_path, "farmplug2", PLUGIN.replace("farmplug", "farmplug2"),
                {"good": "farmplug2:GOOD", "liar": "farmplug2:MISMATCH"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["policies", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {p["name"]: p for p in data["policies"]}
    assert names[CONFIG]["origin"] == "built-in" and names[CONFIG]["id"] == policy_name_to_id(CONFIG)
    assert names["Plugin::Reverse"]["origin"].startswith("plugin good")
    assert data["order"] == list(DEFAULT_ORDER) and data["order_from"] == "default"
    assert any("Plugin::Liar" in r["where"] for r in data["rejected"])
    monkeypatch.setenv(ORDER_ENV, "Plugin::Reverse")
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "Plugin::Reverse" in out and "rejected" in out and "order in force: Plugin::Reverse" in out
