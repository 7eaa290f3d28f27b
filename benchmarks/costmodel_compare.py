"""A pruned tune beside the exhaustive tune of the same workload: measurements, regret, wall time.

    python benchmarks/costmodel_compare.py EXHAUSTIVE_RUN PRUNED_RUN [--json]

Regret per problem: the exhaustive run's main-round median of the candidate the pruned run published, over the
exhaustive run's median of the candidate it published itself (both runs' override files name them; the same
winner is 1.000). Wall time: each run's ``wall_s`` and tuning time from its job.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.store.dataset import ResultsDataset  # noqa: E402
from farm.model.knobs import candidate_label  # noqa: E402
from farm.store.deciding.rule import decide_results  # noqa: E402
from farm.store.results import knobs_from_structs  # noqa: E402


def _medians(run: Path) -> dict[tuple[str, str], float]:
    """(problem, candidate label) -> main-round median."""
    t = ResultsDataset(run / "results").table(["problem_name", "engine_name", "knobs", "round", "succeeded", "median_ms"])
    out: dict[tuple[str, str], float] = {}
    for name, engine, knobs, rnd, ok, med in zip(*(t[c].to_pylist() for c in t.column_names)):
        if rnd == "main" and ok and med:
            key = (name, candidate_label(engine, knobs_from_structs(knobs)))
            out[key] = min(med, out.get(key, math.inf))
    return out


def _rows(run: Path) -> dict[str, dict[str, int]]:
    t = ResultsDataset(run / "results").table(["problem_name", "round", "disposition"])
    out: dict[str, dict[str, int]] = {}
    for name, rnd, disp in zip(*(t[c].to_pylist() for c in t.column_names)):
        if rnd == "main":
            d = out.setdefault(name, {"measured": 0, "pruned": 0})
            d["pruned" if disp == "pruned" else "measured"] += 1
    return out


def _winners(run: Path) -> dict[str, tuple[str, str]]:
    d = decide_results(ResultsDataset(run / "results"))
    return {w.problem_name: w.label for w in d.winners.values()}


def _wall(run: Path) -> tuple[float, float]:
    job = json.loads((run / "job.json").read_text())
    last = job["runs"][-1]
    return float(last.get("wall_s", math.nan)), float(last.get("phases", {}).get("tuning_s", math.nan))


def compare(exhaustive: Path, pruned: Path) -> dict:
    med = _medians(exhaustive)
    win_e, win_p = _winners(exhaustive), _winners(pruned)
    rows = _rows(pruned)
    problems = []
    for name in sorted(win_e):
        elabel, plabel = win_e[name], win_p.get(name, "(none)")
        regret = med.get((name, plabel), math.inf) / med[(name, elabel)]
        r = rows.get(name, {"measured": 0, "pruned": 0})
        problems.append({"problem": name, "candidates": r["measured"] + r["pruned"], "measured": r["measured"],
                         "regret": regret, "winner": elabel, "pruned_winner": plabel})
    regrets = [p["regret"] for p in problems]
    (we, te), (wp, tp) = _wall(exhaustive), _wall(pruned)
    cands, measured = sum(p["candidates"] for p in problems), sum(p["measured"] for p in problems)
    return {"problems": problems, "summary": {
        "problems": len(problems), "candidates": cands, "measured": measured,
        "fewer": round(cands / measured, 3) if measured else None,
        "within_1_02": round(sum(r <= 1.02 for r in regrets) / len(regrets), 4) if regrets else None,
        "geomean_regret": round(math.exp(sum(math.log(r) for r in regrets) / len(regrets)), 5) if regrets else None,
        "worst_regret": round(max(regrets), 5) if regrets else None,
        "wall_s": {"exhaustive": we, "pruned": wp, "ratio": round(we / wp, 3)},
        "tuning_s": {"exhaustive": te, "pruned": tp, "ratio": round(te / tp, 3)}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exhaustive", type=Path)
    ap.add_argument("pruned", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = compare(args.exhaustive, args.pruned)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{'problem':32s} {'cands':>5s} {'meas':>5s} {'regret':>7s}  winner (exhaustive) | pruned run's winner")
    for p in out["problems"]:
        same = "same" if p["pruned_winner"] == p["winner"] else p["pruned_winner"]
        print(f"{p['problem']:32s} {p['candidates']:5d} {p['measured']:5d} {p['regret']:7.3f}  {p['winner']} | {same}")
    s = out["summary"]
    print(f"\n{s['problems']} problems: {s['measured']} of {s['candidates']} candidates measured ({s['fewer']}x fewer); "
          f"regret <= 1.02 on {100 * s['within_1_02']:.0f} %, geomean {s['geomean_regret']}, worst {s['worst_regret']}; "
          f"wall {s['wall_s']['exhaustive']:.1f} s -> {s['wall_s']['pruned']:.1f} s ({s['wall_s']['ratio']}x)"
          + (f", tuning {s['tuning_s']['exhaustive']:.1f} s -> {s['tuning_s']['pruned']:.1f} s ({s['tuning_s']['ratio']}x)"
             if math.isfinite(s['tuning_s']['ratio']) else ""))


if __name__ == "__main__":
    main()
