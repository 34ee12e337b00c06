"""Full-page screenshots of the three marimo apps on real runs, in headless Chromium (the README's apps section).

    python scripts/studies/screenshot_apps.py --runs runs/demo --sao-run runs/demo/sao-arithmetic-seed0 \
        --gepa-run runs/demo/gepa-arithmetic-seed0 --data-dir runs/demo/sao-arithmetic-seed0/data --out apps/screenshots

Each app runs as `marimo run apps/<app>.py --headless` and is opened with playwright in the system's chromium
(`bash scripts/setup.sh --browser`); the SAO page has every run under --runs ticked for comparison, the GEPA page
shows its newest candidate, the records page has its newest inference picked, the TTT page shows --ttt-run. Writes
sao.png, gepa.png, records.png, ttt.png (each for the runs given).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from reef_lab import procs
from reef_lab.testing import free_port, wait_http
from scripts.common import ROOT


@contextmanager
def app_server(name: str, env: dict):
    port = free_port()
    proc = procs.Popen([sys.executable, "-m", "marimo", "run", f"apps/{name}.py", "--headless", "--port",
                        str(port), "--no-token"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_http(url, timeout=120)
        yield url
    finally:
        proc.stop(30)


def settle(page, quiet: float = 2.0, timeout: float = 180) -> None:
    deadline, calm = time.time() + timeout, None
    while time.time() < deadline:
        if page.locator(".marimo-output-loading, .marimo-output-stale").count():
            calm = None
        elif calm is None:
            calm = time.time()
        elif time.time() - calm >= quiet:
            return
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", help="folder of SAO / GRPO runs (all ticked for comparison; with --sao-run)")
    p.add_argument("--sao-run", help="the run shown in detail")
    p.add_argument("--gepa-run", help="a GEPA experiment's run folder")
    p.add_argument("--data-dir", help="a data dir for the records app")
    p.add_argument("--ttt-run", help="a TTT-Discover run folder (apps/ttt.py)")
    p.add_argument("--out", default="apps/screenshots")
    p.add_argument("--width", type=int, default=1440)
    args = p.parse_args()
    from PIL import Image
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        shots = []  # each app whose run was given
        if args.sao_run and args.runs:
            shots.append(("sao", {"REEF_LAB_RUNS": str(Path(args.runs).resolve()),
                                  "REEF_LAB_RUN": str(Path(args.sao_run).resolve())}, "Candidates"))
        if args.gepa_run:
            shots.append(("gepa", {"REEF_LAB_RUN": str(Path(args.gepa_run).resolve())}, "Candidate tree"))
        if args.data_dir:
            shots.append(("records", {"REEF_LAB_DATA_DIR": str(Path(args.data_dir).resolve())}, "Score histogram"))
        if args.ttt_run:
            shots.append(("ttt", {"REEF_LAB_RUN": str(Path(args.ttt_run).resolve()),
                                  "REEF_LAB_RUNS": str(Path(args.ttt_run).resolve().parent)}, "Archive"))
        for name, env, ready in shots:
            with app_server(name, env) as url:
                page = browser.new_page(viewport={"width": args.width, "height": 1000})
                page.goto(url)
                page.get_by_text(ready).first.wait_for(timeout=180_000)
                settle(page)
                if name == "sao":  # tick every run for the comparison
                    table = next(t for t in page.locator("marimo-table").all()
                                 if t.locator("td[data-cell-id$='_progress']").count())
                    for box in table.locator("tbody tr button[role=checkbox]").all():
                        if box.get_attribute("aria-checked") != "true":
                            box.click()
                            settle(page)
                elif name == "records":  # inspect the newest inference
                    table = next(t for t in page.locator("marimo-table").all()
                                 if t.locator("td[data-cell-id$='_kind']").count())
                    kinds = table.locator("td[data-cell-id$='_kind']").all_inner_texts()
                    table.locator("tbody tr").nth(kinds.index("inference")).locator("button[role=checkbox]").click()
                    settle(page)
                # marimo scrolls inside its own container: the page is as tall as the tallest scrolling element
                height = page.evaluate(
                    "() => Math.max(...Array.from(document.querySelectorAll('*'), e => e.scrollHeight))")
                page.set_viewport_size({"width": args.width, "height": min(height + 50, 12000)})
                settle(page)
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
                # 256 colours are plenty for a page of text and line plots; a third of the bytes
                Image.open(out / f"{name}.png").convert("RGB").quantize(256).save(out / f"{name}.png", optimize=True)
                print(out / f"{name}.png")
        browser.close()


if __name__ == "__main__":
    main()
