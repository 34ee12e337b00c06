"""What the three marimo apps share: readable figures, confidence intervals, links to a run's W&B folder and Hub
revisions, tidy tables, run status, and the change check that lets auto-refresh redraw only what changed.

Not an app: apps/sao.py, apps/gepa.py and apps/records.py import it (`from apps.shared import ...`; the repository
root is on the path of the venv that scripts/setup.sh makes). Presentation only; what a run, a search or a record is stays in reef_lab and recipes.
"""

from __future__ import annotations

import html
import io
import math
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path

from reef_lab.extras import need

need("apps")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.ticker import Formatter, MaxNLocator  # noqa: E402

from reef_lab.experiments import stats  # noqa: E402
from reef_lab.learning import heartbeat  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def shown(path: str | Path) -> str:
    """A folder as a page shows it: relative to the repository root when inside it (a command copied from the app
    runs on any clone; a screenshot names no machine's folders), else as it is."""
    p = Path(path).expanduser().resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)

# Figures are inline SVG drawn at 1 user unit = 1 CSS px, so these sizes are the on-screen text sizes in px.
STYLE = {"font.size": 12, "axes.titlesize": 13, "axes.labelsize": 12, "xtick.labelsize": 11, "ytick.labelsize": 11,
         "legend.fontsize": 11, "svg.fonttype": "none", "axes.grid": True, "grid.alpha": 0.3}
PX_PER_INCH = 72  # matplotlib writes SVG in points; the figure is shown with 1 pt = 1 px
matplotlib.rcParams.update(STYLE)  # every artist, legends and annotations made later included

def figure(width_px: int, height_px: int, rows: int = 1, cols: int = 1):
    """A matplotlib figure of the given on-screen size (px) in the apps' style, and its axes."""
    fig, axes = plt.subplots(rows, cols, figsize=(width_px / PX_PER_INCH, height_px / PX_PER_INCH), squeeze=False)
    return fig, axes


# Every chart's x axis that counts steps is the policy step as the runs' metrics rows number it: a weight run's
# `trainer_step` (the base model at 0), a TTT-Discover row's `step` (1 after the first policy update; the archive's
# initial states at 0, a state sampled during row k's step at k).
STEP = "policy step"


class PlainFormatter(Formatter):
    """Each tick labelled with its own value (6 significant digits, an exponent only where the value needs one):
    no shared offset or multiplier text at the axis's end ("1e-7+3e-1")."""

    def __call__(self, x, pos=None) -> str:
        lo, hi = self.axis.get_view_interval()
        if abs(x) < 1e-9 * max(abs(lo), abs(hi)):  # 0 up to the tick arithmetic's rounding
            x = 0.0
        return f"{x:.6g}".replace("-", "\u2212")


def fit_axes(ax, xs=None, ys=None, *, integer_x: bool = True, integer_y: bool = False) -> None:
    """The one axis set-up every chart uses, after its data are drawn: integer ticks on a step (or count) axis, no
    offset labels ("1e-7+3e-1"), and a readable range around a single point or a constant series (matplotlib would
    zoom into rounding noise, or tick a single step from -0.045 to 0.045). `xs`, `ys`: the values drawn (None:
    leave that axis alone); `integer_x`, `integer_y`: that axis counts (steps, calls, ids)."""
    for axis, values, integer in ((ax.xaxis, xs, integer_x), (ax.yaxis, ys, integer_y)):
        if values is None:
            continue
        if integer:
            axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        if axis.get_scale() != "linear":
            continue
        axis.set_major_formatter(PlainFormatter())
        vals = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not vals:
            continue
        lo, hi = min(vals), max(vals)
        if hi - lo > 1e-3 * max(abs(lo), abs(hi)):
            continue  # a real spread: matplotlib's own margins
        mid = (lo + hi) / 2
        pad = 0.5 if integer else (0.1 * abs(mid) if mid else 0.5)
        (ax.set_xlim if axis is ax.xaxis else ax.set_ylim)(mid - pad, mid + pad)


def svg(fig, fig_id: str):
    """The figure as inline SVG with id `fig_id`: text stays text (searchable, crisp, sized in px), artists given a
    gid keep it as their element id. Shown at its own size, scrolled sideways on a narrower screen."""
    import marimo as mo

    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    w, h = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', text).groups()
    text = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"',
                  lambda m: f'<svg{m.group(1)} id="{fig_id}" width="{float(w):.0f}px" height="{float(h):.0f}px"',
                  text, count=1)
    return mo.Html(f"<div style='overflow-x: auto; max-width: 100%'>{text}</div>")


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (reef_lab.experiments.stats; 0 for a single value,
    so a bar of one seed draws no whisker)."""
    return stats.mean_ci(values, single=0.0)


def wilson(k: float, n: int) -> tuple[float, float]:
    """95% Wilson interval of a proportion k/n (held-out accuracy on n items)."""
    if n <= 0:
        return 0.0, 1.0
    z, p = 1.96, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def utc(ts) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def tidy(df: pl.DataFrame, digits: int = 4) -> pl.DataFrame:
    """A frame as a table shows it: epoch-second columns (`time`, `*_at`) as UTC dates, floats to `digits`
    significant digits."""
    out = []
    for name, dtype in df.schema.items():
        col = pl.col(name)
        if (name == "time" or name.endswith("_at")) and dtype.is_numeric():
            out.append(pl.from_epoch((col * 1e6).cast(pl.Int64), time_unit="us").dt.strftime("%Y-%m-%d %H:%M:%S")
                       .alias(name))
        elif dtype.is_float():
            out.append(col.round_sig_figs(digits))
        else:
            out.append(col)
    return df.select(out)


def link(url: str, text: str) -> str:
    return f"<a href='{html.escape(url, quote=True)}' target='_blank' rel='noopener'>{html.escape(text)}</a>"


def hub_cell(release: dict) -> str:
    """A release's Hub revision as HTML: a link to the pushed tag, or the push's state."""
    hub = release.get("hub") or {}
    if hub.get("state") == "pushed":
        return link(hub["url"], f"{hub['repo']}@{hub.get('tag') or hub['commit'][:10]}")
    if hub.get("state") == "failed":
        return f"push failed: {html.escape(str(hub.get('error'))[:120])}"
    return html.escape(hub.get("state", "not pushed"))


def wandb_runs(*folders: str | Path) -> list[dict]:
    """The W&B run folders (`<folder>/wandb/offline-run-*` or `run-*`) under each folder, newest last."""
    found = []
    for folder in folders:
        for p in sorted(Path(folder).glob("wandb/*run-*")):
            if p.is_dir():
                found.append({"path": str(p.resolve()), "offline": p.name.startswith("offline-"),
                              "id": p.name.rsplit("-", 1)[-1]})
    return found


def wandb_md(runs: list[dict]) -> str:
    """Markdown: where each W&B run lives and how to upload an offline one."""
    if not runs:
        return "W&B: no run folder (tracking was off)."
    lines = []
    for r in runs:
        if r["offline"]:
            lines.append(f"W&B offline run `{r['id']}`: `{r['path']}`; upload it with `wandb sync {r['path']}`")
        else:
            lines.append(f"W&B run `{r['id']}` (synced online): `{r['path']}`")
    return "  \n".join(lines)


def signature(root: str | Path | None, names: tuple[str, ...], max_depth: int = 6) -> tuple:
    """(path, size, mtime) of every file under `root` whose name is in `names` (`*.ext`: any name ending so;
    W&B folders and releases' weight folders are not entered): it changes exactly when one of them is written."""
    suffixes = tuple(n[1:] for n in names if n.startswith("*"))
    if not root or not Path(root).exists():
        return ()
    out = []
    base = str(root).rstrip("/").count("/")
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath.count("/") - base >= max_depth:
            dirnames[:] = []
        dirnames[:] = [d for d in dirnames if d not in ("wandb", "candidates", "__pycache__")
                       and not re.fullmatch(r"v\d+", d)]
        for f in filenames:
            if f in names or (suffixes and f.endswith(suffixes)):
                st = os.stat(os.path.join(dirpath, f))
                out.append((os.path.join(dirpath, f), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def pid_file_alive(pid_file: Path) -> bool:
    """Whether the process a launcher's pid file names runs, and is the one it started: a process that started after
    the file was written has only been given the same pid."""
    try:
        pid = int(pid_file.read_text().strip() or 0)
        written = pid_file.stat().st_mtime
        ticks = heartbeat.process_start(pid) if pid > 0 else None
        btime = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
    except (OSError, ValueError, StopIteration):
        return False
    return ticks is not None and btime + ticks / os.sysconf("SC_CLK_TCK") <= written + 2


def run_status(folder: str | Path, finished: bool, activity: list[Path], quiet_s: float = 180) -> str:
    """running, finished, failed (with the error) or stopped (with its last sign of life), from the run's heartbeat
    (reef_lab.learning.heartbeat: every experiment writes one), its summary (`finished`), the launcher's pid file
    (an app-launched run before its heartbeat starts) and its log. A folder without a heartbeat (a run from before
    heartbeats) is judged by when its `activity` files last changed."""
    folder = Path(folder)
    beat = heartbeat.read(folder)
    if beat is not None and heartbeat.alive(beat):
        return "running"
    if finished:
        return "finished"
    if beat is not None and beat.get("state") == "failed":
        return "failed: " + str(beat.get("error"))[:200]
    if pid_file_alive(folder / "run.pid"):
        return "running"
    log = folder / "run.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    if "Traceback (most recent call last)" in tail:
        return "failed: " + tail.strip().splitlines()[-1][:200]
    if beat is not None:
        return f"stopped (last heartbeat {utc(beat.get('beat_at'))} UTC)"
    times = [p.stat().st_mtime for p in activity if p.exists()]
    if times and time.time() - max(times) < quiet_s:
        return "running"
    return "stopped" + (f" (last write {utc(max(times))} UTC)" if times else "")


def progress_html(done: int, total: int, unit: str) -> str:
    pct = 100 * done / total if total else 0
    return (f"<progress value='{done}' max='{max(total, 1)}' style='width: 14em; vertical-align: middle'></progress>"
            f" <b>{done} of {total} {unit}</b> ({pct:.0f}%)")


def answers_html(summary: str, answers: list[dict], open_: bool = False) -> str:
    """A collapsible block of sample answers with their scores: `summary` (one line, HTML) over a table of `answers`
    (dicts of item, question, expected, answer, score, feedback; the columns any of them has), wrapped."""
    cols = [c for c in ("item", "question", "expected", "answer", "score", "feedback") if any(c in a for a in answers)]
    cell = "padding: 2px 10px; vertical-align: top; white-space: pre-wrap; overflow-wrap: anywhere"
    width = {"question": "max-width: 26em", "answer": "max-width: 30em", "feedback": "max-width: 24em"}

    def shown(a: dict, c: str) -> str:
        v = a.get(c)
        if v is None:
            return ""
        if c == "score":
            ok = "background: #dafbe1" if isinstance(v, (int, float)) and v > 0 else "background: #ffebe9"
            return f"<td style='{cell}; text-align: right; {ok}'>{format(v, 'g')}</td>"
        return f"<td style='{cell}; {width.get(c, '')}'>{html.escape(str(v))}</td>"

    head = "".join(f"<th style='text-align: left; padding: 2px 10px'>{c}</th>" for c in cols)
    rows = "".join("<tr style='border-bottom: 1px solid #e5e7eb'>" + "".join(shown(a, c) or f"<td style='{cell}'></td>"
                                                                            for c in cols) + "</tr>"
                   for a in answers)
    table = (f"<table class='sample-answers' style='width: auto'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>"
             "</table>" if answers else "<p><i>No answers saved.</i></p>")
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{table}</details>"


def eval_answers(ev: dict | None) -> list[dict]:
    """The sample held-out answers an evaluation kept (reef_lab.learning.evaluation: the first 8 items)."""
    return [{"item": e.get("id"), "expected": e.get("answer"), "answer": e.get("text"), "score": e.get("score")}
            for e in (ev or {}).get("examples") or []]
