"""A cost model: gradient-boosted trees (LightGBM) that predict each candidate's time over its problem's best.

Why LightGBM: it splits on categories natively (engine, op, arch, string knobs need no one-hot columns),
handles missing values (a knob another engine does not have), trains in seconds on a CPU, and saves its
trees as text, so a model file is plain JSON that loading never executes (a pickle would).

The model file (JSON) holds the trees, the feature schema, what the model was trained on (datasets, run
ids, signatures, row counts) and the range it covers, which :meth:`CostModel.outside` checks a problem
against before its prediction is trusted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from farm._version import __version__
from farm.costmodel.examples import TARGET_CAP, ProblemTimes, TrainingSet, stack
from farm.costmodel.features import (
    FEATURE_VERSION,
    FeatureSchema,
    candidate_rows,
    device_features,
    problem_features,
    unknown_columns,
)
from farm.costmodel.trees_text import booster_text_problem
from farm.errors import InputError
from farm.fsutil import atomic_write_text, read_text_file
from farm.model.knobs import KnobSettings
from farm.model.problem import Problem

MODEL_FORMAT = "tunefarm-cost-model"
MODEL_VERSION = 1
# every model reads these; a schema without one of them was not made by this feature code
BASE_FEATURES = ("op", "dtype", "engine", "log2_flops", "log2_bytes", "arch", "compute_units")
FLOPS_MARGIN = 2.0  # log2: a problem up to 4x smaller or larger than any trained on of its op is inside


def require_lightgbm() -> Any:
    try:
        import lightgbm
    except ImportError:
        raise InputError("the cost model needs LightGBM: pip install 'tunefarm[model]'", field="model") from None
    return lightgbm


@dataclass(frozen=True)
class Coverage:
    """What the training data held: a problem outside it is measured in full."""

    ops: Mapping[str, Mapping[str, Any]]  # op -> {"dtypes": [...], "log2_flops": [lo, hi]}
    archs: tuple[str, ...]
    engines: tuple[str, ...]

    @staticmethod
    def of(problems: Sequence[ProblemTimes]) -> "Coverage":
        ops: dict[str, dict[str, Any]] = {}
        for p in problems:
            o = ops.setdefault(p.problem.op, {"dtypes": set(), "log2_flops": [math.inf, -math.inf]})
            o["dtypes"].add(p.problem.dtype)
            if p.problem.flops:
                f = math.log2(p.problem.flops)
                o["log2_flops"] = [min(o["log2_flops"][0], f), max(o["log2_flops"][1], f)]
        return Coverage({op: {"dtypes": sorted(o["dtypes"]),
                              "log2_flops": [None if math.isinf(x) else round(x, 3) for x in o["log2_flops"]]}
                         for op, o in sorted(ops.items())},
                        tuple(sorted({str(p.device.get("arch", "")) for p in problems})),
                        tuple(sorted({c.engine for p in problems for c in p.candidates})))

    def to_json(self) -> dict[str, Any]:
        return {"ops": {k: dict(v) for k, v in self.ops.items()}, "archs": list(self.archs),
                "engines": list(self.engines)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Coverage":
        return Coverage(dict(data["ops"]), tuple(data["archs"]), tuple(data["engines"]))

    def outside(self, problem: Problem, arch: str, engines: Sequence[str]) -> str:
        """Why ``problem`` on a device of ``arch`` with candidates of ``engines`` lies outside; '' when inside."""
        seen = self.ops.get(problem.op)
        if seen is None:
            return f"op {problem.op} is not in the training data"
        if problem.dtype not in seen["dtypes"]:
            return f"{problem.op} in {problem.dtype} is not in the training data ({', '.join(seen['dtypes'])})"
        if arch not in self.archs:
            return f"arch {arch} is not in the training data ({', '.join(self.archs)})"
        lo, hi = seen["log2_flops"]
        if problem.flops and lo is not None and not (lo - FLOPS_MARGIN <= math.log2(problem.flops) <= hi + FLOPS_MARGIN):
            return (f"{problem.flops:.3g} flops is outside the trained range of {problem.op} "
                    f"({2 ** lo:.3g} to {2 ** hi:.3g}, 4x margin)")
        unknown = sorted({e for e in engines if e not in self.engines})
        if engines and sum(e in unknown for e in engines) * 2 > len(engines):
            return f"most candidates are of engines the model never saw ({', '.join(unknown[:4])})"
        return ""


@dataclass(frozen=True)
class CostModel:
    schema: FeatureSchema
    booster: Any  # lightgbm.Booster
    coverage: Coverage
    training: Mapping[str, Any]
    params: Mapping[str, Any]

    # -- use --------------------------------------------------------------------------------------
    def predict(self, problem: Problem, device: Mapping[str, Any],
                candidates: Sequence[tuple[str, KnobSettings]]) -> np.ndarray:
        """Each candidate's predicted time over the problem's best (>= 1)."""
        if not candidates:
            return np.zeros(0)
        rows = candidate_rows(problem_features(problem), device_features(device), candidates)
        return self.predict_rows(rows)

    def predict_rows(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        log2_rel = self.booster.predict(self.schema.matrix(rows), num_threads=1)
        return np.exp2(np.clip(log2_rel, 0.0, TARGET_CAP))

    def outside(self, problem: Problem, device: Mapping[str, Any], engines: Sequence[str]) -> str:
        return self.coverage.outside(problem, str(device.get("arch", "")), engines)

    # -- make -------------------------------------------------------------------------------------
    @staticmethod
    def train(data: TrainingSet | Sequence[ProblemTimes], *, rounds: int = 600, seed: int = 0,
              training: Mapping[str, Any] | None = None) -> "CostModel":
        """Fit a model to ``data``'s problems (a TrainingSet records itself in the model file)."""
        lgb = require_lightgbm()
        problems = list(data.problems if isinstance(data, TrainingSet) else data)
        if not problems:
            raise InputError("no problem with two or more successful candidates to learn from", field="datasets")
        rows, targets, _ = stack(problems)
        schema = FeatureSchema.infer(rows)
        # deep trees, small leaves: a problem family is a few dozen rows of each engine (chosen on held-out families
        # of the H200 training set, benchmarks/RESULTS.md)
        params = {"objective": "regression", "learning_rate": 0.05, "num_leaves": 63, "min_data_in_leaf": 3,
                  "feature_fraction": 0.9, "bagging_fraction": 0.9, "bagging_freq": 1, "lambda_l2": 1.0,
                  "max_cat_to_onehot": 8, "min_data_per_group": 5, "cat_smooth": 5.0, "seed": seed,
                  "deterministic": True, "force_row_wise": True, "num_threads": 2, "verbosity": -1}
        dataset = lgb.Dataset(schema.matrix(rows), label=np.asarray(targets), feature_name=list(_safe(schema.names)),
                              categorical_feature=schema.categorical_indices, free_raw_data=True)
        booster = lgb.train(params, dataset, num_boost_round=rounds)
        described = dict(training or (data.describe() if isinstance(data, TrainingSet) else
                                      {"problems": len(problems), "rows": len(rows)}))
        return CostModel(schema, booster, Coverage.of(problems), described, {**params, "rounds": rounds})

    # -- the file ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        lgb = require_lightgbm()
        return {"format": MODEL_FORMAT, "version": MODEL_VERSION, "farm_version": __version__,
                "library": {"name": "lightgbm", "version": lgb.__version__},
                "target": f"log2(time / the problem's best), capped at {TARGET_CAP:g}",
                "features": self.schema.to_json(), "coverage": self.coverage.to_json(),
                "training": dict(self.training), "params": dict(self.params),
                "booster": self.booster.model_to_string()}

    def save(self, path: str | Path) -> Path:
        """Write the model file (a temp file renamed into place)."""
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @staticmethod
    def load(path: str | Path) -> "CostModel":
        """Read a model file; one that is not a model, or whose feature schema does not fit, is refused."""
        source = str(path)
        text = read_text_file(Path(path), "model file", max_bytes=512 * 2**20)
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"not a model file (not JSON: {exc})", source=source) from None
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            raise InputError(f"not a tunefarm cost model (format {data.get('format') if isinstance(data, dict) else None!r})",
                             field="format", source=source)
        if data.get("version") != MODEL_VERSION:
            raise InputError(f"model file version {data.get('version')!r}; this tunefarm reads {MODEL_VERSION}",
                             field="version", value=data.get("version"), source=source)
        schema = FeatureSchema.from_json(data.get("features"), source)
        missing = [f for f in BASE_FEATURES if f not in schema.names]
        unknown = unknown_columns(schema.names)
        if missing or unknown:
            what = "; ".join(x for x in (f"it lacks {', '.join(missing)}" if missing else "",
                                         f"this tunefarm makes no column {', '.join(unknown[:5])}" if unknown else "") if x)
            raise InputError(f"the model's feature schema does not fit this tunefarm's (feature version "
                             f"{FEATURE_VERSION}): {what}", field="features", source=source)
        lgb = require_lightgbm()
        malformed = booster_text_problem(data.get("booster"))
        if malformed:  # LightGBM's loader would end the process on some of these (SIGABRT), not raise
            raise InputError(f"the trees are malformed: {malformed}", field="booster", source=source)
        try:
            booster = lgb.Booster(model_str=data["booster"])
        except Exception as exc:  # LightGBM's own error on malformed trees
            raise InputError(f"the trees do not load ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                             field="booster", source=source) from None
        if booster.num_feature() != len(schema.names):
            raise InputError(f"the feature schema does not fit the trees: {len(schema.names)} features listed, "
                             f"the trees read {booster.num_feature()}", field="features", source=source)
        try:
            coverage = Coverage.from_json(data["coverage"])
        except (KeyError, TypeError) as exc:
            raise InputError(f"malformed coverage ({exc})", field="coverage", source=source) from None
        return CostModel(schema, booster, coverage, data.get("training") or {}, data.get("params") or {})


def _safe(names: Sequence[str]) -> list[str]:
    """Feature names as LightGBM accepts them (no JSON special characters)."""
    return ["".join(ch if ch.isalnum() or ch in "_." else "_" for ch in n) for n in names]
