"""One figure per row, from one named round (issue 46): where a confirmation stage decided, the winner's time, its
noise, the plotted samples and the override file's ``top_k`` are all the stage's, and every surface names the round;
where no stage ran, they are all the main round's."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from farm.analysis.report import build_report
from farm.cli import main
from farm.cli.tables.runs import round_cells
from farm.store.deciding.rule import decide_results
from farm.store.overrides.parsing import load_overrides
from farm.store.reduce import reduce_results
from farm.tuner.judging.winner import noise_sigma
from tests.fakes import fake_props, fake_result, matmul_problem, write_results

P = matmul_problem(8, 8, 8)
GPU = fake_props()


def _stage_samples(seed: int, *true_ms: float) -> list[tuple[float, ...]]:
    """24 paired rounds of each candidate: a shared drift per round, 1 % of each one's own."""
    rng = np.random.default_rng(seed)
    drift = rng.lognormal(0.0, 0.2, 24)
    return [tuple(ms * drift * rng.lognormal(0.0, 0.01, 24)) for ms in true_ms]


def _results(root, stage: bool = True):
    # the main round (a busy machine): the default looks 20 ms, tuned.b leads at 0.80 ms, tuned.slow trails
    write_results(root, {GPU: [(P, "p", [
        fake_result(P, "lib.default", (20.0, 1.2, 30.0), candidate=0),
        fake_result(P, "tuned.a", (0.84, 0.85, 0.83), knobs=(("tile", 64),), candidate=1),
        fake_result(P, "tuned.b", (0.80, 0.80, 0.81), candidate=2),
        fake_result(P, "tuned.slow", (2.0, 2.1, 2.0), candidate=3)])]})
    if stage:  # the stage (quiet): tuned.a is the fastest, tuned.b slower than it, the default 1.1 ms
        d, a, b = _stage_samples(0, 1.1, 0.84, 0.95)
        write_results(root, {GPU: [(P, "p", [
            fake_result(P, "lib.default", d, candidate=0, started_at="2026-11-30T02:00:00.000Z"),
            fake_result(P, "tuned.a", a, knobs=(("tile", 64),), candidate=1, started_at="2026-11-30T02:00:00.000Z"),
            fake_result(P, "tuned.b", b, candidate=2, started_at="2026-11-30T02:00:00.000Z")])]},
            round="confirm", call="eager")
        return {"lib.default[default]": d, "tuned.a[tile=64]": a, "tuned.b[default]": b}
    return None


def test_a_stage_decision_has_the_stage_figures_everywhere(tmp_path, capsys, monkeypatch):
    samples = _results(tmp_path / "r")
    w = decide_results(tmp_path / "r").winners[(GPU.signature, P.key)]
    assert (w.label, w.round) == ("tuned.a[tile=64]", "confirm")
    stage_median = {k: float(np.median(v)) for k, v in samples.items()}
    assert w.median_ms == stage_median["tuned.a[tile=64]"] and w.default_ms == stage_median["lib.default[default]"]

    report = reduce_results(tmp_path / "r", tmp_path / "o", top_k=4)
    entry = load_overrides(report.signatures[0].write.path).match(P)
    meta = entry.metadata
    assert meta["selection"]["round"] == "confirm" and meta["median_time_ms"] == w.median_ms
    top = meta["top_k"]
    # the stage's ranking, winner first (not the main round's, whose leader was tuned.b), then what only the main
    # round measured, labelled as such
    assert [(t["engine_name"], t["round"]) for t in top] == [("tuned.a", "confirm"), ("tuned.b", "confirm"),
                                                             ("lib.default", "confirm"), ("tuned.slow", "main")]
    assert (top[0]["engine_name"], top[0]["knobs"]) == (entry.engine_name, dict(entry.knobs))
    assert [t["median_time_ms"] for t in top[:3]] == [stage_median["tuned.a[tile=64]"], stage_median["tuned.b[default]"],
                                                      stage_median["lib.default[default]"]]
    assert top[3]["median_time_ms"] == 2.0
    table = pq.read_table(report.signatures[0].winners_path).to_pylist()
    assert [(r["label"], r["round"], r["median_ms"]) for r in table] == [("tuned.a[tile=64]", "confirm", w.median_ms)]

    # farm report: the time, the noise and the plotted samples are the stage's
    [p] = build_report(tmp_path / "r").signatures[0].problems
    assert p.round == "confirm" and p.winner_ms == w.median_ms
    assert p.noise == float(noise_sigma([w.mad_ms])[0]) / w.median_ms
    assert set(p.samples) == set(samples) and all(list(samples[k]) == p.samples[k] for k in samples)
    assert p.near == len(w.confirmed.ties)
    assert main(["report", str(tmp_path / "r"), "--json"]) == 0
    [per] = json.loads(capsys.readouterr().out)["signatures"][0]["per_problem"]
    assert (per["round"], per["winner_ms"], per["noise"]) == ("confirm", w.median_ms, p.noise)
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["report", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "stage ms" in text and "(main round)" not in text  # the device spread is -v's
    assert main(["report", str(tmp_path / "r"), "-v"]) == 0  # -v after the command, as before it
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "device spread 1.000 (main round)" in text


def test_without_a_stage_every_figure_is_the_main_rounds(tmp_path, capsys, monkeypatch):
    _results(tmp_path / "r", stage=False)
    w = decide_results(tmp_path / "r").winners[(GPU.signature, P.key)]
    assert (w.label, w.round, w.median_ms) == ("tuned.b[default]", "main", 0.80)
    report = reduce_results(tmp_path / "r", tmp_path / "o")
    meta = load_overrides(report.signatures[0].write.path).match(P).metadata
    assert meta["selection"]["round"] == "main"
    assert [(t["engine_name"], t["round"]) for t in meta["top_k"]] == [("tuned.b", "main"), ("tuned.a", "main"),
                                                                       ("tuned.slow", "main")]
    [p] = build_report(tmp_path / "r").signatures[0].problems
    assert p.round == "main" and p.samples["tuned.b[default]"] == [0.80, 0.80, 0.81]
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["report", str(tmp_path / "r")]) == 0
    assert "main ms" in capsys.readouterr().out


def test_rows_of_several_rounds_name_their_round_in_each_cell():
    head, cells = round_cells([1.5, 0.25, None], ["confirm", "main", None])
    assert head == "ms" and cells == ["1.500 stage", "0.2500 main", "-"]
    head, cells = round_cells([1.5, None], ["confirm", None])
    assert head == "stage ms" and cells == ["1.500", "-"]


def test_the_html_plots_the_decisions_round_and_names_it(tmp_path):
    pytest.importorskip("matplotlib", reason="--html needs matplotlib (the report extra)")
    _results(tmp_path / "r")
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "r"), "--html", str(out)]) == 0
    html = out.read_text()
    # the distribution drawn is the stage's (its alt text and the winners table name the round)
    assert "time per run of its fastest candidates in the confirmation stage (paired rounds)" in html
    assert "<td>confirmation stage (paired rounds)</td>" in html
    assert "Per-device noise in the main round" in html
