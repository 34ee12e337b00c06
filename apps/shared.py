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

ROOT = Path(__file__).resolve().parents[1]

# Figures are inline SVG drawn at 1 user unit = 1 CSS px, so these sizes are the on-screen text sizes in px.
STYLE = {"font.size": 12, "axes.titlesize": 13, "axes.labelsize": 12, "xtick.labelsize": 11, "ytick.labelsize": 11,
         "legend.fontsize": 11, "svg.fonttype": "none", "axes.grid": True, "grid.alpha": 0.3}
PX_PER_INCH = 72  # matplotlib writes SVG in points; the figure is shown with 1 pt = 1 px
matplotlib.rcParams.update(STYLE)  # every artist, legends and annotations made later included

# Student t quantiles (two-sided 95%) by degrees of freedom; beyond 30 the normal 1.96 is within 2%.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
       25: 2.060, 30: 2.042}


def figure(width_px: int, height_px: int, rows: int = 1, cols: int = 1):
    """A matplotlib figure of the given on-screen size (px) in the apps' style, and its axes."""
    fig, axes = plt.subplots(rows, cols, figsize=(width_px / PX_PER_INCH, height_px / PX_PER_INCH), squeeze=False)
    return fig, axes


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


def t95(n: int) -> float:
    """The two-sided 95% t quantile for the mean of n values (at a df between table rows, the smaller df's)."""
    df = max(n - 1, 1)
    return 1.96 if df > 30 else T95[max(k for k in T95 if k <= df)]


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t; 0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t95(n) * sd / math.sqrt(n)


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


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet waited for, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def run_status(folder: str | Path, finished: bool, activity: list[Path], quiet_s: float = 180) -> str:
    """finished, running, failed or stopped: from the summary, the launcher's pid file, the run's log and when its
    files last changed."""
    folder = Path(folder)
    if finished:
        return "finished"
    pid_file = folder / "run.pid"
    if pid_file.exists() and pid_alive(int(pid_file.read_text().strip() or 0)):
        return "running"
    log = folder / "run.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    if "Traceback (most recent call last)" in tail:
        return "failed: " + tail.strip().splitlines()[-1][:200]
    times = [p.stat().st_mtime for p in activity if p.exists()]
    if times and time.time() - max(times) < quiet_s:
        return "running"
    return "stopped" + (f" (last write {utc(max(times))} UTC)" if times else "")


def progress_html(done: int, total: int, unit: str) -> str:
    pct = 100 * done / total if total else 0
    return (f"<progress value='{done}' max='{max(total, 1)}' style='width: 14em; vertical-align: middle'></progress>"
            f" <b>{done} of {total} {unit}</b> ({pct:.0f}%)")
