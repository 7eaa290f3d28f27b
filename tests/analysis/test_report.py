"""farm report and farm diff on synthetic result sets with known answers."""

import json
import re

import pytest

from farm.model.records import Disposition
from farm.cli import main
from tests.fakes import fake_props, fake_result, matmul_problem, write_results

P1, P2 = matmul_problem(8, 8, 8), matmul_problem(16, 16, 16)
GPU0, GPU1 = fake_props(index=0), fake_props(index=1)


LATER = "2026-11-30T01:00:00.000Z"


def results(root, p1_tuned_ms=1.0, p2_winner="tuned.fast"):
    # GPU 1 measured p1 first; GPU 0's later rows are the latest of each candidate (the reducer's numbers)
    write_results(root, {
        GPU0: [
            (P1, "p1", [fake_result(P1, "lib.default", (2.0, 2.0, 2.0), candidate=0, started_at=LATER),
                        fake_result(P1, "tuned.fast", (p1_tuned_ms,) * 3, knobs=(("tile", 64),), candidate=1,
                                    started_at=LATER),
                        fake_result(P1, "tuned.broken", candidate=2, disposition=Disposition.FAILED_COMPILE)]),
            (P2, "p2", [fake_result(P2, "lib.default", (4.0, 4.0, 4.0), candidate=0),
                        fake_result(P2, p2_winner, (1.0, 1.2, 1.0, 1.2), knobs=(("tile", 32),), candidate=1)]),
        ],
        GPU1: [
            (P1, "p1", [fake_result(P1, "lib.default", (1.5, 1.5, 1.5), candidate=0),
                        fake_result(P1, "tuned.fast", (p1_tuned_ms + 1.0,) * 3, knobs=(("tile", 64),), candidate=1)]),
        ],
    })
    return root


def test_report_summarises_failures_speedups_noise_and_disagreement(tmp_path, capsys):
    root = results(tmp_path / "r")
    assert main(["report", str(root), "--json"]) == 0
    [sig] = json.loads(capsys.readouterr().out)["signatures"]
    assert sig["signature"] == GPU0.signature and sig["problems"] == 2
    assert sig["failures"] == {"failed_compile": 1}
    per = {p["problem"]: p for p in sig["per_problem"]}
    # the reducer's numbers (each candidate's latest measurement): p1 2.0 / 1.0; p2 4.0 / median 1.1
    assert per["p1"]["winner"] == "tuned.fast[tile=64]" and per["p1"]["speedup"] == pytest.approx(2.0)
    assert per["p2"]["speedup"] == pytest.approx(4.0 / 1.1) and per["p2"]["why"] == ""
    assert sig["speedup_geomean"] == pytest.approx((2.0 * 4.0 / 1.1) ** 0.5)
    assert sig["speedup_worst_problem"] == "p1"
    # the winner rule's robust noise, 1.4826 x MAD / median: p2's winner has median 1.1 and MAD 0.1
    assert sig["noisiest"][0]["problem"] == "p2" and sig["noisiest"][0]["noise"] == pytest.approx(1.4826 * 0.1 / 1.1)
    # GPU 0 finds tuned.fast fastest for p1, GPU 1 the default: a disagreement within one signature
    [dis] = sig["disagreements"]
    assert dis["problem"] == "p1" and set(dis["device_winners"].values()) == {"tuned.fast[tile=64]", "lib.default[default]"}
    assert per["p1"]["device_spread"] == pytest.approx(2.0)

    assert main(["report", str(root)]) == 0
    text = capsys.readouterr().out
    assert "failed_compile 1" in text and "devices disagree on" in text and "p1" in text


def test_candidates_split_across_devices_are_no_disagreement(tmp_path, capsys):
    """After a node loss (or shards on several devices) each device measured other candidates of a problem: each
    one's fastest differs, yet they never ranked the same candidates, so the report says nothing disagrees."""
    a, b, c = ((("tile", t),) for t in (16, 32, 64))
    write_results(tmp_path / "r", {
        GPU0: [(P1, "p1", [fake_result(P1, "lib.default", (2.0,) * 3, candidate=0),
                           fake_result(P1, "tuned.fast", (1.0,) * 3, knobs=a, candidate=1)])],
        GPU1: [(P1, "p1", [fake_result(P1, "tuned.fast", (1.5,) * 3, knobs=b, candidate=2),
                           fake_result(P1, "tuned.fast", (1.8,) * 3, knobs=c, candidate=3)])],
    })
    assert main(["report", str(tmp_path / "r"), "--json"]) == 0
    [sig] = json.loads(capsys.readouterr().out)["signatures"]
    assert sig["disagreements"] == []
    assert main(["report", str(tmp_path / "r")]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if "devices disagree on" in line]
    assert "nothing" in row, row


def test_report_html_has_the_plots(tmp_path):
    pytest.importorskip("matplotlib", reason="--html needs matplotlib (the report extra)")
    root = results(tmp_path / "r")
    out = tmp_path / "report.html"
    assert main(["report", str(root), "--html", str(out)]) == 0
    html = out.read_text()
    assert html.count("data:image/png;base64,") == 2 + 2  # speed-ups, noise, one distribution per problem
    assert "Speed-up of the winner" in html and "Per-device noise" in html
    import base64
    png = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", html).group(1))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_reduce_and_diff_take_a_run_folder_as_well_as_its_results(tmp_path, capsys):
    """``farm tune --out RUN`` writes RUN/results: RUN itself names the same results everywhere."""
    results(tmp_path / "run" / "results")
    assert main(["report", str(tmp_path / "run" / "results"), "--json"]) == 0
    direct = json.loads(capsys.readouterr().out)["signatures"]
    assert main(["report", str(tmp_path / "run"), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["signatures"] == direct and "skipping" not in out.err
    assert main(["reduce", str(tmp_path / "run"), "--out", str(tmp_path / "reduced"), "--json"]) == 0
    assert (tmp_path / "reduced" / f"{GPU0.signature}.json").is_file()
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "run"), str(tmp_path / "run" / "results"), "--json"]) == 0
    assert {r["status"] for r in json.loads(capsys.readouterr().out)["rows"]} == {"same winner"}


def test_report_of_a_missing_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "results folder not found" in capsys.readouterr().err


def test_diff_of_two_result_sets(tmp_path, capsys):
    a = results(tmp_path / "a")
    b = results(tmp_path / "b", p1_tuned_ms=0.5, p2_winner="other.kernel")
    assert main(["diff", str(a), str(b), "--json"]) == 0
    rows = {r["problem"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    # the same winner, twice as fast: shown by default as a time change (beyond noise), not hidden as "same winner"
    assert rows["p1"]["status"] == "time changed" and rows["p1"]["ratio"] == pytest.approx(0.5 / 1.0)
    assert rows["p2"]["status"] == "near tie"  # same time, another engine
    assert rows["p2"]["new_winner"] == "other.kernel[tile=32]"


def test_diff_of_two_override_files(tmp_path, capsys):
    from farm.store.overrides.entries import OverrideEntry
    from farm.store.overrides.files import write_overrides

    dev = {"signature": GPU0.signature, "properties": GPU0.to_dict()}

    def e(p, engine, ms, name):
        return OverrideEntry.for_problem(p, engine, (), {"rank": 0, "median_time_ms": ms, "problem_name": name})

    write_overrides(tmp_path / "a.json", [e(P1, "x", 1.0, "p1"), e(P2, "y", 2.0, "p2")], device=dev, mode="replace")
    write_overrides(tmp_path / "b.json", [e(P1, "z", 0.5, "p1"), e(matmul_problem(3, 3, 3), "y", 1.0, "p3")],
                    device=dev, mode="replace")
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {"added": 1, "removed": 1, "winner changed": 1, "time changed": 0, "near tie": 0,
                              "confirmed tie": 0, "same winner": 0}
    [changed] = [r for r in data["rows"] if r["status"] == "winner changed"]
    assert (changed["problem"], changed["ratio"]) == ("p1", 0.5)
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path)]) == 2


def test_one_outlier_does_not_make_a_problem_noisy_and_untrustworthy_winners_are_flagged(tmp_path, capsys):
    """A CoV made 141 % of one outlier; the report uses the reducer's robust noise, and flags a noisy winner
    with other candidates inside its noise band ("re-run")."""
    steady = (1.0,) * 9 + (30.0,)  # one outlier: CoV ~ 2.7, MAD 0
    shaky = (1.0, 1.3, 0.8, 1.25, 0.85, 1.0)  # median 1.0, MAD 0.2: noise ~ 30 %
    write_results(tmp_path / "r", {GPU0: [
        (P1, "p1", [fake_result(P1, "lib.default", (2.0,) * 5, candidate=0),
                    fake_result(P1, "tuned.fast", steady, candidate=1)]),
        (P2, "p2", [fake_result(P2, "lib.default", (1.05, 1.3, 0.8, 1.3, 0.8, 1.05), candidate=0),
                    fake_result(P2, "tuned.shaky", shaky, candidate=1)]),
    ]})
    assert main(["report", str(tmp_path / "r"), "--json"]) == 0
    [sig] = json.loads(capsys.readouterr().out)["signatures"]
    per = {p["problem"]: p for p in sig["per_problem"]}
    assert per["p1"]["noise"] == 0.0 and not per["p1"]["untrusted"]
    assert per["p2"]["noise"] > 0.05 and per["p2"]["within_noise_of"] == 1 and per["p2"]["untrusted"]
    assert [u["problem"] for u in sig["untrusted"]] == ["p2"]
    assert sig["noisiest"][0]["problem"] == "p2"
    assert main(["report", str(tmp_path / "r")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "p2: winner within noise of 1 other(s), no confirmation stage" in text


@pytest.mark.slow
@pytest.mark.parametrize("columns", ["80", "100", "120"])
def test_report_never_cuts_a_name_short_at_common_widths(tmp_path, repo_root, columns):
    import os
    import subprocess
    import sys

    long = "vendor.matmul.splitk_streamk"
    write_results(tmp_path / "r", {GPU0: [(P1, "p1", [
        fake_result(P1, "lib.default", (2.0,) * 3, candidate=0),
        fake_result(P1, long, (1.0,) * 3, knobs=(("BLOCK_M", 128), ("num_warps", 8)), candidate=1)])]})
    env = dict(os.environ, PYTHONPATH=repo_root, COLUMNS=columns, TERM="xterm")
    out = subprocess.run([sys.executable, "-m", "farm", "report", str(tmp_path / "r")], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    assert "…" not in out  # nothing elided
    cells = "".join(ch for ch in out if ch not in "│ \n")  # a folded name reads whole once the borders go
    assert f"{long}[BLOCK_M=128,num_warps=8]" in cells and "lib.default[default]" in cells


def test_diffs_headline_counts_every_changed_winner_ties_included(tmp_path, capsys):
    """Two files selecting other kernels for three problems: the headline counts all three, saying which were a tie
    (the default published); "no change" only where both select the same for every problem."""
    from farm.store.overrides.entries import OverrideEntry
    from farm.store.overrides.files import write_overrides

    dev = {"signature": GPU0.signature, "properties": GPU0.to_dict()}
    p3, p4 = matmul_problem(3, 3, 3), matmul_problem(5, 5, 5)

    def e(p, engine, ms, name, tie=False, confirmed=None):
        conf = {"tie": tie, "settled": not tie, "ties": []}
        sel = {"rule": "default_not_beaten" if tie else "confirmed", "confirmation": conf}
        if confirmed:
            sel["speedup_over_default"] = confirmed
        return OverrideEntry.for_problem(p, engine, (), {"rank": 0, "median_time_ms": ms, "problem_name": name,
                                                         "selection": sel})

    write_overrides(tmp_path / "a.json", [e(P1, "tuned.x", 0.2, "p1", confirmed=5.6), e(P2, "tuned.y", 1.0, "p2"),
                                          e(p3, "lib.default", 1.0, "p3"), e(p4, "same", 1.0, "p4")], device=dev,
                    mode="replace")
    # the new run's stage called p1 and p2 ties (the default published), and p3 another kernel by a hair
    write_overrides(tmp_path / "b.json", [e(P1, "lib.default", 0.21, "p1", tie=True),
                                          e(P2, "lib.default", 1.01, "p2", tie=True),
                                          e(p3, "tuned.z", 1.0, "p3"), e(p4, "same", 1.0, "p4")], device=dev,
                    mode="replace")
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["winners_changed"] == 3 and data["winners_changed_to_a_tie"] == 2
    assert data["headline"] == "3 winners changed, 2 of them to a tie: the default published"
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "3 winners changed, 2 of them to a tie: the default published" in " ".join(out.split())
    assert "no change" not in out and all(f"p{i}" in out for i in (1, 2, 3)) and "p4" not in out
    assert main(["diff", str(tmp_path / "b.json"), str(tmp_path / "b.json")]) == 0
    assert "no change" in capsys.readouterr().out
