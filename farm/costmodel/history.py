"""A tune's history (farm tune --history): the cost model it prunes with, trained on earlier results, and the
published root whose decisions it only checks.

A source is a run folder, a results folder, a pyarrow.fs URI of either, or a published root (``farm publish``'s
layout: ``index.json`` at the top). A published root's results are its ``history/`` folder (``farm publish
--history`` puts a run's results there); its override files hold the decisions already made. The model is
trained once per history and kept in the run folder (``history-model.json``): a resume reuses it while the
history's files are the same, so it makes the same choices; another run folder tuned from the same history
copies it from the cache (``cache_folder``) instead of training again.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from farm.errors import InputError
from farm.fsutil import atomic_write_bytes, atomic_write_text
from farm.store.location import Location
from farm.store.publish.published import INDEX
from farm.store.publish.history import HISTORY_FOLDER, history_files_within

log = logging.getLogger("farm.costmodel")

MODEL_FILE = "history-model.json"


@dataclass(frozen=True)
class History:
    """What ``--history`` named: results to learn from, and the first published root among them."""

    datasets: tuple[str, ...]
    published: str | None = None

    def fingerprint(self) -> str:
        """Changes when a results file is added, removed or rewritten (names and sizes)."""
        from farm.store.dataset import ResultsDataset, results_folder

        h = hashlib.sha256()
        for source in self.datasets:
            data = ResultsDataset(results_folder(source))
            h.update(source.encode())
            for f in sorted(data.files):
                h.update(f.encode())
                h.update(str(data.location.fs.get_file_info(f).size).encode())
        return h.hexdigest()[:16]


def is_published_root(source: str | Path) -> bool:
    return Location.of(source).join(INDEX).exists()


def read_history(sources: Sequence[str | Path]) -> History:
    """Sort ``sources`` into results and a published root; one that is not there is an error naming it."""
    datasets: list[str] = []
    published = None
    for source in sources:
        where = Location.of(source)
        if not where.exists():
            raise InputError("results folder not found (a run folder, a results folder or a published root)",
                             field="--history", value=str(source))
        if is_published_root(source):
            published = published or str(source)
            history = where.join(HISTORY_FOLDER)
            if where.local:
                history_files_within(where.path)  # a link in it out of the root is refused, never followed
            if history.is_dir():
                datasets.append(history.uri)
            else:
                log.info("history: published root %s has no %s/ folder: its decisions only", source, HISTORY_FOLDER)
        elif where.is_dir():
            datasets.append(str(source))
        else:
            raise InputError("is neither a run folder, a results folder nor a published root", field="--history",
                             value=str(source))
    return History(tuple(datasets), published)


@dataclass(frozen=True)
class HistoryModel:
    """The model a tune prunes with: its file, what it learned from, and how a pruned tune did on the history's
    own families held out (None where the history has one family or none)."""

    path: Path
    problems: int
    held_out: dict[str, Any] | None


def model_for(history: History, out: Path, *, top_k: int, explore: float, seed: int,
              progress: Callable[[str], None] | None = None) -> HistoryModel | None:
    """Train (or reuse, where the history is unchanged) the run folder's model; None when the history holds no
    problem to learn from (every candidate is then measured)."""
    from farm.costmodel.evaluation import evaluate
    from farm.costmodel.examples import load_training_set
    from farm.costmodel.model import CostModel
    from farm.model.records import PruneSettings

    if not history.datasets:
        return None
    path = out / MODEL_FILE
    fingerprint = history.fingerprint()
    settings = {"top_k": top_k, "explore": explore, "seed": seed}
    found = _reusable(path, fingerprint, settings)
    if found is not None:
        return found
    # another tune of the same history (the next model, the next batch size) trained it already: copied, not trained
    cached = cache_folder() / f"{fingerprint}-k{top_k}-e{explore:g}-s{seed}.json"
    if _reusable(cached, fingerprint, settings, quiet=True) is not None:
        out.mkdir(parents=True, exist_ok=True)
        _write_checked(path, cached.read_bytes())
        return _reusable(path, fingerprint, settings)
    data = load_training_set(history.datasets)
    if not data.problems:
        log.warning("history: no problem in %s has two measured candidates: every candidate is measured",
                    ", ".join(history.datasets))
        return None
    if progress is not None:
        progress(f"training the cost model on {len(data.problems)} problem(s) of the history")
    held_out = None
    if len({p.family for p in data.problems}) >= 2:
        if progress is not None:
            progress("holding out each family of the history in turn: how a pruned tune would have done")
        ev = evaluate(data, "family", PruneSettings(model="(per fold)", **settings))
        s = ev.to_json()["summary"]
        held_out = {"families": ev.groups, "problems": s["problems"], "within_1_02": s["within_1_02"],
                    "geomean_regret": s["geomean_regret"], "worst": s["worst"], "fewer": s["fewer"]}
    model = CostModel.train(data, seed=seed, training={**data.describe(), "history_fingerprint": fingerprint,
                                                       "held_out": held_out, "held_out_settings": settings})
    out.mkdir(parents=True, exist_ok=True)
    model.save(path)
    _write_checked(path, path.read_bytes())
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        _write_checked(cached, path.read_bytes())
    except OSError as exc:  # a cache only saves time
        log.warning("history: could not keep the model in %s (%s)", cached.parent, exc)
    return HistoryModel(path, len(data.problems), held_out)


def cache_folder() -> Path:
    """Where trained history models are kept across run folders: $FARM_HISTORY_CACHE, else
    ~/.cache/tunefarm/history-models (named by the history's fingerprint and the pruning settings)."""
    return Path(os.environ.get("FARM_HISTORY_CACHE") or Path.home() / ".cache" / "tunefarm" / "history-models")


def _reusable(path: Path, fingerprint: str, settings: dict[str, Any], quiet: bool = False) -> HistoryModel | None:
    """The model at ``path`` when it was trained on this history with these settings; None otherwise (one that
    cannot be read is set aside, with a warning, unless ``quiet``)."""
    from farm.costmodel.model import CostModel

    if not path.exists():
        return None
    try:
        _check_sum(path)  # its own bytes, as written: a damaged or altered model is never read, let alone trusted
        t = CostModel.load(path).training
    except InputError as exc:  # a model of other feature code, or damaged: trained again, the old one set aside
        if not quiet:
            log.warning("history: %s is not reusable (%s); training again", path, exc)
            path.replace(path.with_name(path.name + ".unusable"))
        else:
            log.info("history: the cached %s is not reusable (%s)", path, exc)
        return None
    if t.get("history_fingerprint") != fingerprint or t.get("held_out_settings") != settings:
        return None
    return HistoryModel(path, int(t.get("problems") or 0), t.get("held_out"))


def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_checked(path: Path, data: bytes) -> None:
    """``data`` at ``path`` and its SHA-256 beside it (``<name>.sha256``), each written whole."""
    atomic_write_bytes(path, data)
    atomic_write_text(_sum_path(path), f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")


def _check_sum(path: Path) -> None:
    """Refuse a model whose bytes are not the ones its checksum file was written for."""
    try:
        want = _sum_path(path).read_text().split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        raise InputError("no checksum beside it (written by another tunefarm, or damaged)", source=str(path)) from None
    if hashlib.sha256(path.read_bytes()).hexdigest() != want:
        raise InputError("its bytes are not the ones written (damaged or altered since)", source=str(path))


def bound_line(held_out: dict[str, Any] | None, top_k: int) -> str:
    """What a pruned tune assumes, in one line for its summary."""
    assume = f"the winner is the default, the incumbent or among the top {top_k} by predicted time"
    if not held_out:
        return f"assumes {assume}; not checked (the history has fewer than two families to hold out)"
    worst = held_out.get("worst") or {}
    return (f"assumes {assume}; on the history's {held_out['families']} families held out in turn, such a tune "
            f"published within 1.02 of the best on {100 * held_out['within_1_02']:.0f} % of "
            f"{held_out['problems']} problems (worst {worst.get('regret', float('nan')):.3f}, "
            f"{worst.get('problem', '-')})")


@dataclass(frozen=True)
class HistorySetup:
    """What ``--history`` gives a tune: the cost model it prunes with (None: nothing to learn from, every candidate
    is measured), the incumbents (the published root among the sources, unless others were named) and whether a
    problem they decide is only checked; ``learned`` says what the model learned (a line for a person)."""

    prune: Any  # farm.model.records.PruneSettings | None
    incumbents: str | None
    check_decided: bool
    learned: str = ""


def set_up_history(sources: Sequence[str], folder: Path, *, incumbents: str | None = None, retune_decided: bool = False,
                   top_k: int | None = None, explore: float | None = None, seed: int | None = None,
                   progress: Callable[[str], None] | None = None) -> HistorySetup:
    """Read ``sources``, train (or reuse) the model kept in ``folder`` with the given pruning settings (None: the
    defaults), and say what the tune does with it (farm tune --history)."""
    from farm.costmodel.model import require_lightgbm
    from farm.model.records import PruneSettings

    history = read_history(sources)
    check_decided = history.published is not None and not retune_decided
    incumbents = incumbents if incumbents is not None else history.published
    if not history.datasets:
        return HistorySetup(None, incumbents, check_decided)
    require_lightgbm()  # before any training: one line naming the extra to install
    defaults = PruneSettings(model="-")
    top_k = top_k or defaults.top_k
    explore = defaults.explore if explore is None else explore
    seed = defaults.seed if seed is None else seed
    trained = model_for(history, folder, top_k=top_k, explore=explore, seed=seed, progress=progress)
    if trained is None:
        return HistorySetup(None, incumbents, check_decided)
    learned = (f"{trained.problems} problem(s) learned ({trained.path}); {bound_line(trained.held_out, top_k)}")
    return HistorySetup(PruneSettings(model=str(trained.path), top_k=top_k, explore=explore, seed=seed), incumbents,
                        check_decided, learned)
