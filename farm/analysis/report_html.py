"""farm report --html: a self-contained page of the report (farm.analysis.report), its plots embedded as PNG."""

from __future__ import annotations

import base64
import io
import statistics
from pathlib import Path
from typing import Any

from farm.analysis.report import ProblemSummary, Report, SignatureSummary
from farm.store.deciding.records import CONFIRM, VERIFY

def write_html(report: Report, path: str | Path, *, max_problems: int = 24) -> list[str]:
    """A self-contained HTML page (PNG plots embedded); returns the figure titles."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from farm.errors import UsageError

        raise UsageError("farm report --html needs matplotlib: pip install 'tunefarm[report]'") from None
    parts = [f"<h1>tunefarm report</h1><p>results: <code>{_esc(report.root)}</code></p>"]
    titles = []
    for s in report.signatures:
        parts.append(f"<h2>{_esc(s.device_name)} <small><code>{_esc(s.signature)}</code></small></h2>")
        geo = s.geomean_speedup
        parts.append(f"<p>{len(s.problems)} problems, {sum(p.candidates for p in s.problems)} candidates, "
                     f"{len(s.devices)} device(s), {s.tuning_s:.1f} s of tuning; winner over default: "
                     f"geomean {geo:.3f}x</p>" if geo else "<p>no default candidates to compare with</p>")
        for title, fig in (("Speed-up of the winner over the default engine", _speedup_figure(plt, s)),
                           ("Per-device noise in the main round (1.4826 x MAD / median of every candidate)",
                            _noise_figure(plt, s))):
            if fig is not None:
                titles.append(title)
                parts.append(f"<h3>{title}</h3>{_png(plt, fig, title)}")
        shaky = s.untrusted()
        parts.append("<h3>Too noisy to trust</h3>" + ("<ul>" + "".join(
            f"<li class='untrusted'>{_esc(p.name)}: {_esc(p.doubt)}</li>" for p in shaky) + "</ul>" if shaky
            else "<p>nothing</p>"))
        parts.append("<h3>Winners (the override file's entries)</h3><table><tr><th>problem</th><th>winner</th>"
                     "<th>median ms</th><th>default</th><th>median ms</th><th>speed-up</th><th>round</th><th>why</th></tr>"
                     + "".join(f"<tr{' class=untrusted' if p.untrusted else ''}><td>{_esc(p.name)}</td>"
                               f"<td><code>{_esc(p.winner)}</code></td>"
                               f"<td>{p.winner_ms:.4f}</td><td><code>{_esc(p.default)}</code></td>"
                               f"<td>{'-' if p.default_ms is None else f'{p.default_ms:.4f}'}</td>"
                               f"<td>{'-' if p.speedup is None else f'{p.speedup:.3f}x'}</td>"
                               f"<td>{_esc(_ROUND_TITLES.get(p.round, p.round))}</td>"
                               f"<td>{_esc('; '.join(x for x in (p.why, f'not trusted: {p.doubt}' if p.untrusted else '') if x))}</td></tr>"
                               for p in s.problems) + "</table>")
        parts.append("<h3>Candidates' time distributions (winner in orange, default in blue)</h3>")
        titles.append("Candidates' time distributions")
        for p in s.problems[:max_problems]:
            parts.append(_png(plt, _distribution_figure(plt, p),
                              f"{p.name}: time per run of its fastest candidates in the "
                              f"{_ROUND_TITLES.get(p.round, p.round)}; winner {p.winner}, default {p.default}"))
        if len(s.problems) > max_problems:
            parts.append(f"<p>{len(s.problems) - max_problems} more problems not drawn (see --json).</p>")
    html = ("<!doctype html><html><head><meta charset='utf-8'><title>tunefarm report</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}img{max-width:100%}"
            "tr.untrusted td,li.untrusted{background:#fff3cd}</style>"
            "</head><body>" + "\n".join(parts) + "</body></html>")
    from farm.fsutil import atomic_write_text

    Path(path).parent.mkdir(parents=True, exist_ok=True)  # --html into a folder not made yet
    atomic_write_text(path, html)
    return titles


def _esc(text: str) -> str:
    import html

    return html.escape(str(text))


def _png(plt: Any, fig: Any, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return f"<img alt='{_esc(alt)}' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"


def _short(name: str, width: int = 48) -> str:
    """A tick label that stays readable: long candidate labels keep their start and end."""
    return name if len(name) <= width else f"{name[:width - 17]}...{name[-14:]}"


def _speedup_figure(plt: Any, s: SignatureSummary) -> Any:
    ps = [p for p in s.problems if p.speedup]
    if not ps:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(ps) + 1.2))
    vals = [100 * (p.speedup - 1) for p in ps]  # type: ignore[operator]
    ax.barh([_short(p.name) for p in ps], vals, color=["tab:green" if v > 0 else "tab:gray" for v in vals])
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("winner faster than the default engine by (%)")
    ax.invert_yaxis()
    for i, (v, p) in enumerate(zip(vals, ps)):
        ax.text(v, i, f" {p.speedup:.3f}x", va="center", fontsize=8)
    return fig


def _noise_figure(plt: Any, s: SignatureSummary) -> Any:
    devs = [d for d in sorted(s.device_noise) if s.device_noise[d]]
    if not devs:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(devs) + 1.2))
    ax.boxplot([[100 * c for c in s.device_noise[d]] for d in devs], orientation="horizontal", tick_labels=devs)
    ax.set_xlabel("noise of a candidate: 1.4826 x MAD / median (%)")
    return fig


_ROUND_TITLES = {"main": "main round", "finalist": "finalist round", CONFIRM: "confirmation stage (paired rounds)",
                 VERIFY: "farm verify (paired rounds)"}


def _distribution_figure(plt: Any, p: ProblemSummary) -> Any:
    names = sorted(p.samples, key=lambda c: statistics.median(p.samples[c]))[:20]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(names) + 1.3))
    box = ax.boxplot([p.samples[c] for c in names], orientation="horizontal", tick_labels=[_short(c) for c in names],
                     patch_artist=True, showfliers=False,
                     medianprops={"color": "black"})
    for name, patch in zip(names, box["boxes"]):
        patch.set_facecolor("tab:orange" if name == p.winner else ("tab:blue" if name == p.default else "lightgray"))
    ax.invert_yaxis()
    lo, hi = min(min(p.samples[c]) for c in names), max(max(p.samples[c]) for c in names)
    if lo > 0 and hi / lo > 4:  # a slow fallback would squash the interesting candidates into one pixel
        ax.set_xscale("log")
    ax.set_xlabel(f"time per run (ms), {_ROUND_TITLES.get(p.round, p.round)}")
    ax.set_title(f"{p.name}: {p.label}" + (f"  (winner {p.speedup:.2f}x the default)" if p.speedup else "")
                 + (f"\n{p.why}" if p.why else ""), fontsize=9)
    ax.tick_params(axis="y", labelsize=9)
    return fig
