"""farm model train / eval: a cost model from results datasets, and how well pruning with it would do."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from farm.cli.args import nonnegative_int, positive_int, fraction
from farm.cli.console import make_console, print_json


def cmd_model_train(args: argparse.Namespace) -> int:
    from farm.costmodel.examples import load_training_set
    from farm.costmodel.model import CostModel, require_lightgbm

    require_lightgbm()  # before reading anything
    console = make_console(stderr=True)
    data = load_training_set(args.datasets)
    if not args.json:
        console.print(f"training on {len(data.problems)} problem(s), "
                      f"{sum(len(p.candidates) for p in data.problems)} candidates, from {len(data.runs)} run(s) "
                      f"of {len(args.datasets)} dataset(s)")
    model = CostModel.train(data, rounds=args.rounds, seed=args.seed)
    path = model.save(args.out)
    t = model.training
    if args.json:
        print_json({"model": str(path), "training": t, "features": len(model.schema.names),
                     "coverage": model.coverage.to_json()})
        return 0
    table = Table(title=f"cost model written to {escape(str(path))}", title_justify="left", show_header=False)
    table.add_column("")
    table.add_column("")
    table.add_row("problems", f"{t['problems']} ({t['candidates']} candidates, {t['rows']} main-round rows)")
    table.add_row("families", Text(", ".join(t["families"])))
    table.add_row("signatures", Text("\n".join(f"{s}: {v['problems']} problem(s)" for s, v in t["signatures"].items())))
    table.add_row("runs", str(len(t["runs"])))
    table.add_row("features", f"{len(model.schema.numeric)} numeric, {len(model.schema.categorical)} categorical")
    table.add_row("ops covered", Text(", ".join(f"{op} ({', '.join(v['dtypes'])})" for op, v in model.coverage.ops.items())))
    make_console().print(table)
    return 0


def cmd_model_eval(args: argparse.Namespace) -> int:
    from farm.costmodel.evaluation import GOOD_REGRET, evaluate
    from farm.costmodel.examples import load_training_set
    from farm.costmodel.model import require_lightgbm
    from farm.model.records import PruneSettings

    require_lightgbm()
    settings = PruneSettings(model="(trained per fold)", top_k=args.top_k, explore=args.explore, seed=args.seed)
    data = load_training_set(args.datasets)
    err = make_console(stderr=True)

    def progress(group: str, n: int, total: int) -> None:
        if not args.json:
            err.print(f"[{n}/{total}] holding out {escape(group)}", highlight=False)

    result = evaluate(data, args.holdout, settings, rounds=args.rounds, progress=progress)
    if args.json:
        print_json(result.to_json())
        return 0
    table = Table(title=f"pruned tunes of held-out problems (--holdout {args.holdout}, top-k {args.top_k}, "
                        f"explore {args.explore:g}, seed {args.seed})", title_justify="left")
    for col, justify in (("held out", "left"), ("problem", "left"), ("candidates", "right"), ("measured", "right"),
                         ("regret", "right"), ("winner (published)", "left"), ("picked (pruned)", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]  # labels whole
    for p in result.problems:
        style = "red" if p.regret > GOOD_REGRET else None
        table.add_row(Text(p.group), Text(p.name), str(p.candidates),
                      f"{p.measured}" + (" (full)" if p.full else ""), Text(f"{p.regret:.3f}", style=style),
                      Text(p.winner), Text(p.picked if p.picked != p.winner else "same"))
    full = sum(bool(p.full) for p in result.problems)
    if full:
        table.caption = Text(f"(full): {full} problem(s) outside the training data, measured in full", style="dim")
    console = make_console()
    console.print(table)
    console.print(Text(result.summary()), soft_wrap=True)
    return 0


def add_model_parser(sub: Any) -> None:
    """farm model train | eval."""
    p = sub.add_parser("model", help="a cost model learned from results: train it, evaluate pruning with it")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="{train,eval}")
    t = msub.add_parser("train", help="learn to rank candidates from results datasets (needs tunefarm[model])")
    t.add_argument("datasets", nargs="+", metavar="DATASET",
                   help="run folders, results folders or pyarrow.fs URIs (s3://...); one signature or many")
    t.add_argument("--out", required=True, help="the model file to write (JSON)")
    t.add_argument("--rounds", type=positive_int, default=600, help="boosting rounds (default 600)")
    t.add_argument("--seed", type=nonnegative_int, default=0, help="the trainer's seed (default 0)")
    t.add_argument("--json", action="store_true", help="machine-readable output")
    t.set_defaults(func=cmd_model_train)
    e = msub.add_parser("eval", help="leave-a-group-out validation: measurements and regret of pruned tunes")
    e.add_argument("datasets", nargs="+", metavar="DATASET", help="exhaustively tuned results (as for train)")
    e.add_argument("--holdout", choices=("family", "op", "signature"), default="family",
                   help="what is held out in turn: a model family (the problem name before '/', else the "
                        "workload), an op, or a device signature (default family)")
    add_prune_options(e)
    e.add_argument("--seed", type=nonnegative_int, default=0, help="the exploration draw's and the trainer's seed (default 0)")
    e.add_argument("--rounds", type=positive_int, default=600, help="boosting rounds (default 600)")
    e.add_argument("--json", action="store_true", help="machine-readable output")
    e.set_defaults(func=cmd_model_eval)


def add_prune_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--top-k", "--prune-top-k", dest="top_k", type=positive_int, default=7,
                   help="candidates measured by predicted rank, besides the default and the incumbent (default 7)")
    p.add_argument("--explore", "--prune-explore", dest="explore", type=fraction, default=0.05,
                   help="share of the other candidates measured at random (default 0.05)")
