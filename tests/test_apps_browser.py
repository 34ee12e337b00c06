"""The three marimo apps in headless Chromium, used the way a researcher uses them, on real runs made here.

Each app runs as `marimo run apps/<app>.py --headless` in a subprocess and is driven with Playwright through
Debian's `chromium` (never a downloaded browser). The data are real: SAO and GRPO experiments on the tiny Llama
(rollouts through the gateway, releases pushed to the loopback Hub, offline W&B runs), a GEPA experiment on the
loopback stub, and reports appended to a run's data dir with the record store while the app is open. Every test
also checks that no cell shows an error and that the browser console logged none.

    bash scripts/setup.sh --browser        # playwright into .venv, chromium through apt-get when it is missing
    .venv/bin/python -m pytest -m browser tests/test_apps_browser.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from tests.test_apps_views import episode_data  # noqa: F401  (a fixture: a data dir of a real tool loop)

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("REEF_LAB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.browser


# ---- the browser, the app servers and what a page shows -------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium, or bash scripts/setup.sh --browser)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[browser]', or bash scripts/setup.sh --browser)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def marimo_app(name: str, log_dir: Path, **env):
    """`marimo run apps/<name>.py` on a free loopback port, with tracebacks shown in the cells; yields its URL."""
    port = free_port()
    log = open(log_dir / f"marimo-{name}-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "marimo", "run", f"apps/{name}.py", "--headless", "--port", str(port),
         "--show-tracebacks", "--no-token"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **{k: str(v) for k, v in env.items()}})
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"marimo did not start: {(log_dir / log.name).read_text()[-2000:]}")
                time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


# Records every output area that marimo greys out (it adds these classes while a cell is queued or running).
WATCH_DIM = """() => { window.__dimmed = [];
  const seen = (el) => { const c = typeof el.className === 'string' ? el.className : '';
    if (/marimo-output-stale|marimo-output-loading/.test(c) && (el.innerText || '').trim())
      window.__dimmed.push(el.id + ': ' + el.innerText.trim().slice(0, 60)); };
  new MutationObserver((ms) => { for (const m of ms) { if (m.type === 'attributes') seen(m.target);
      else for (const n of m.addedNodes) if (n.nodeType === 1) seen(n); } })
    .observe(document.body, {subtree: true, attributes: true, attributeFilter: ['class'], childList: true}); }"""


class AppPage:
    """One open app: the page, the console errors it logged, and helpers to read and drive marimo's widgets."""

    def __init__(self, browser, url: str, ready_text: str):
        self.page = browser.new_page(viewport={"width": 1440, "height": 1000})
        self.console: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text[:500]}")
                     if m.type == "error" or "[STDERR]" in m.text else None)
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        started = time.time()
        self.page.goto(url)
        self.page.get_by_text(ready_text).first.wait_for(timeout=120_000)
        self.settle()
        self.load_s = time.time() - started

    def settle(self, quiet: float = 1.5, timeout: float = 120) -> None:
        """Wait until no output is queued or running for `quiet` seconds."""
        deadline, calm_since = time.time() + timeout, None
        while time.time() < deadline:
            busy = self.page.locator(".marimo-output-loading, .marimo-output-stale").count()
            if busy:
                calm_since = None
            elif calm_since is None:
                calm_since = time.time()
            elif time.time() - calm_since >= quiet:
                return
            time.sleep(0.2)
        raise TimeoutError("the app kept running cells")

    def errors(self) -> list[str]:
        """Cells that show an error, marimo's error toasts, and console errors."""
        cells = self.page.locator(".marimo-cell.has-error").all_inner_texts()
        toasts = [t for t in self.page.locator("li[role=status], [data-sonner-toast], li.destructive").all_inner_texts()
                  if "error" in t.lower()]
        return [f"cell: {c[:800]}" for c in cells] + [f"toast: {t[:300]}" for t in toasts] + self.console

    def text(self) -> str:
        return self.page.locator("body").inner_text()

    def widget(self, tag: str, label: str):
        return self.page.locator(f"marimo-{tag}").filter(has=self.page.locator("label", has_text=label)).first

    def select(self, label: str, value: str) -> None:
        self.widget("dropdown", label).locator("select").select_option(value)
        self.settle()

    def fill(self, tag: str, label: str, value) -> None:
        box = self.widget(tag, label).locator("input").first
        box.fill(str(value))
        box.press("Enter")
        self.settle()

    def click(self, text: str) -> None:
        self.page.locator("marimo-button button", has_text=text).first.click()
        self.settle()

    def table_rows(self, table) -> list[dict]:
        """The shown page of a marimo table as {column: text} rows (cells carry data-cell-id '<row>_<column>')."""
        cells = table.locator("tbody td[data-cell-id]").evaluate_all(
            "els => els.map(e => [e.getAttribute('data-cell-id'), e.innerText.trim()])")
        rows: dict[str, dict] = {}
        for cid, text in cells:
            row, _, col = cid.partition("_")
            rows.setdefault(row, {})[col] = text
        return list(rows.values())

    def table_with(self, column: str):
        """The first marimo table that has `column`."""
        for k in range(self.page.locator("marimo-table").count()):
            t = self.page.locator("marimo-table").nth(k)
            if t.locator(f"td[data-cell-id$='_{column}']").count():
                return t
        raise AssertionError(f"no table with a {column!r} column; the page reads:\n{self.text()[:3000]}")

    def watch_dimming(self) -> None:
        self.page.evaluate(WATCH_DIM)

    def dimmed(self) -> list[str]:
        return self.page.evaluate("() => window.__dimmed")

    def shot(self, path: Path) -> None:
        self.page.screenshot(path=str(path), full_page=True)


def readable_figure(app: AppPage, selector: str) -> dict:
    """Rendered size of a figure and the on-screen size of every text in it (inline SVG: the text is text)."""
    fig = app.page.locator(selector).first
    if not fig.count():
        imgs = app.page.locator("img[src^='data:image/png']").evaluate_all(
            "els => els.map(e => [e.getBoundingClientRect().width, e.getBoundingClientRect().height])")
        raise AssertionError(f"no figure {selector}: the page has bitmap figures only, rendered (w, h) px {imgs}; "
                             "their text size cannot be read")
    return fig.evaluate("""svg => { const r = svg.getBoundingClientRect();
      const texts = Array.from(svg.querySelectorAll('text')).map(t => { const m = t.getScreenCTM();
        return [t.textContent, parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b)]; });
      return {width: r.width, height: r.height, texts: texts}; }""")


def tick_labels(app: AppPage, selector: str, axis: str = "x") -> list[list[str]]:
    """Each axes' tick labels of an inline-SVG figure (matplotlib groups them as <g id="xtick_N">), per axes."""
    return app.page.locator(selector).first.evaluate(f"""svg => Array.from(svg.querySelectorAll('g[id^="axes_"]'))
      .map(ax => Array.from(ax.querySelectorAll('g[id^="{axis}tick_"] text')).map(t => t.textContent.trim()))""")


def integer_labels(labels: list[str]) -> bool:
    return bool(labels) and all(re.fullmatch(r"[−-]?\d+", t) for t in labels)


# ---- real data --------------------------------------------------------------------------------------------------
def sao_config(out: Path, recipe: str, seed: int, **kw):
    from reef_lab.experiments.weights import ExperimentConfig

    rc = {"sao": {"batch_size": 8, "critic_warmup_steps": 1, "steps_per_candidate": 1, "critic_lr": 1e-3},
          "grpo": {"group_size": 4, "batch_size": 8, "steps_per_candidate": 1}}[recipe]
    return ExperimentConfig(name=f"tiny-{recipe}", recipe=recipe, rollouts=32 if recipe == "sao" else 16,
                            concurrency=4, max_pool=8, max_tokens=4, seed=seed, out_dir=str(out),
                            recipe_config={**rc, "eval_task": {"name": "arithmetic"}, "eval_size": 8,
                                           "eval_max_tokens": 4, "trainer": {"lr": 1e-3, "micro_batch_size": 8}},
                            **kw)


@pytest.fixture(scope="module")
def hub_url(tmp_path_factory):
    """A loopback Hub (reef_lab.testing.hub_server) that releases are pushed to."""
    from huggingface_hub import constants

    from reef_lab.testing.hub_server import serve_in_thread

    server, url = serve_in_thread(tmp_path_factory.mktemp("hub"))
    offline = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False  # conftest sets HF_HUB_OFFLINE for downloads; pushes go to the loopback Hub
    yield url
    constants.HF_HUB_OFFLINE = offline
    server.stop()


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory, hub_url):
    """Two SAO seeds and a GRPO run on the tiny Llama, each an offline W&B run; SAO seed 0 pushes its releases
    to the loopback Hub. Returns the runs folder and the runs by name."""
    from reef_lab.engines.embedded import EmbeddedEngine
    from reef_lab.experiments.weights import run_experiment

    root = tmp_path_factory.mktemp("runs")
    saved = {k: os.environ.pop(k, None) for k in ("WANDB_MODE", "WANDB_API_KEY")}
    out = {}
    try:
        for recipe, seed in (("sao", 0), ("sao", 1), ("grpo", 0)):
            hub_cfg = {"repo": "me/reef-{scenario}-seed0", "endpoint": hub_url} if (recipe, seed) == ("sao", 0) else {}
            cfg = sao_config(root / f"tiny-{recipe}-seed{seed}", recipe, seed, hub=hub_cfg)
            run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
            out[f"tiny-{recipe}-seed{seed}"] = Path(cfg.out_dir)
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    return root, out


@pytest.fixture(scope="module")
def gepa_run(tmp_path_factory, stub_url, hub_url):
    """A GEPA experiment on the loopback stub (the seed harness has one long line): an offline W&B run, its
    harness releases pushed to the loopback Hub, its test answers saved."""
    from recipes.gepa.experiment import GEPAExperimentConfig, run_gepa_experiment

    out = tmp_path_factory.mktemp("gepa") / "calc-seed0"
    lm = {"kind": "openai", "base_url": stub_url, "model": "stub-model"}
    long_line = "You are a careful assistant who reads every question twice before answering it, " * 4
    cfg = GEPAExperimentConfig(name="calc", task={"name": "arithmetic"}, train_size=6, val_size=4, test_size=8,
                               task_lm=lm, reflection_lm=lm, out_dir=str(out), wandb={"mode": "offline"},
                               hub={"repo": "me/gepa-{scenario}", "endpoint": hub_url},
                               search={"max_metric_calls": 40, "minibatch_size": 3},
                               seed_harness={"system_prompt.md": long_line.strip(), "rules.md": "Be accurate."})
    run_gepa_experiment(cfg, progress=False)
    return out


# ---- apps/gepa.py -----------------------------------------------------------------------------------------------
def test_gepa_app_keeps_the_picked_candidate_and_shows_what_the_search_saved(browser, gepa_run, tmp_path):
    answers = [json.loads(x) for x in (gepa_run / "test_answers.jsonl").read_text().splitlines()]
    with marimo_app("gepa", tmp_path, REEF_LAB_RUN=gepa_run) as url:
        app = AppPage(browser, url, "Candidate tree")
        assert app.errors() == []
        app.select("candidate", "0")
        assert "Candidate 0 (seed" in app.text()
        # a finished search: the auto-refresh (every 10 s) neither resets the pick nor greys out the page
        app.watch_dimming()
        time.sleep(12)
        app.settle()
        assert app.widget("dropdown", "candidate").locator("select").input_value() == "0"
        assert "Candidate 0 (seed" in app.text()
        assert app.dimmed() == []
        app.page.locator("marimo-refresh button").first.click()  # a manual refresh keeps it too
        app.settle()
        assert app.widget("dropdown", "candidate").locator("select").input_value() == "0"

        # long prompt lines wrap inside the page
        pre = app.page.locator("pre", has_text="reads every question twice").first
        overflow = pre.evaluate("e => [e.scrollWidth, e.clientWidth, getComputedStyle(e).whiteSpace]")
        assert overflow[0] <= overflow[1] + 1 and overflow[2] in ("pre-wrap", "break-spaces"), overflow
        # the diff to its parent is coloured: the child's added line is green, its removed line red
        app.select("candidate", "1")
        added = app.page.locator(".diff-add", has_text="REEF-SOLVE").first
        removed = app.page.locator(".diff-del", has_text="Be accurate.").first
        green, red = (loc.evaluate("e => getComputedStyle(e).backgroundColor") for loc in (added, removed))
        g, r = ([int(v) for v in re.findall(r"\d+", c)[:3]] for c in (green, red))
        assert g[1] > g[0] and r[0] > r[1], (green, red)

        # the Pareto view: every validation item's score under every candidate, the front's winners marked
        items = app.page.locator("#gepa-pareto-items")
        assert items.count() == 1, "no per-item scores table in the Pareto view"
        rows = items.locator("tbody tr").all_inner_texts()
        assert [r.split()[0] for r in rows] == ["val-0", "val-1", "val-2", "val-3"]
        assert all(r.split()[1:3] == ["0", "1"] for r in rows), rows  # seed 0 everywhere, child 1 everywhere
        # marked as an item's front: only the search's own front candidates, and never a score of 0
        state = json.loads((gepa_run / "state.json").read_text())
        from recipes.gepa.pareto import item_fronts
        fronts = item_fronts({c["id"]: c["scores"] for c in state["cands"]})
        marked = items.locator("tbody tr").evaluate_all("""rows => rows.map(r => Array.from(r.querySelectorAll('td'))
          .slice(1).map((td, k) => getComputedStyle(td).fontWeight === '700' ? [k, td.innerText] : null)
          .filter(x => x))""")
        ids = sorted(c["id"] for c in state["cands"])
        assert [{ids[k] for k, _ in row} for row in marked] == fronts, (marked, fronts)
        assert all(float(score) > 0 for row in marked for _, score in row)
        # the picked candidate's answers on the validation items, with their scores
        cand_rows = app.page.locator("#gepa-candidate-answers table.sample-answers tbody tr")
        assert cand_rows.count() == 4
        cached = {r["example_id"]: r for _, r in state["cache"]}
        first = cached[state["val_ids"][0]]
        row0 = cand_rows.first.inner_text()
        assert first["output"].strip().splitlines()[0][:30] in row0 and format(first["score"], "g") in row0
        # the validation-score chart and the front chart: integer ticks on their count axes
        assert all(integer_labels(t) for t in tick_labels(app, "svg#gepa-figure")), tick_labels(app, "svg#gepa-figure")

        # saved test answers: seed and best side by side
        shown = app.page.locator("#gepa-test-answers").inner_text()
        for a in answers[:3] + answers[-3:]:
            assert a["example"] in shown and a["output"].strip().splitlines()[0][:40] in shown
        # links: the W&B run folder and its sync command; the Hub revision of each harness release
        wandb_dir = next((gepa_run / "wandb").glob("offline-run-*"))
        assert f"wandb sync {wandb_dir}" in app.text()
        index = json.loads((gepa_run / "data" / "releases" / "calc" / "index.json").read_text())
        assert len(index["releases"]) == 2
        for rel in index["releases"]:
            assert rel["hub"]["state"] == "pushed"
            assert app.page.locator(f"a[href='{rel['hub']['url']}']").count() >= 1
        assert app.errors() == []
        app.shot(tmp_path / "gepa.png")

        # a search outside the repository's folders opens from a typed path, without a restart
        elsewhere = tmp_path / "elsewhere" / "calc-copy"
        shutil.copytree(gepa_run, elsewhere, ignore=shutil.ignore_patterns("wandb", "data"))
        app.fill("text", "open a path", elsewhere.parent)  # a folder holding searches: offered
        options = app.widget("dropdown", "search folder").locator("option").all_inner_texts()
        assert str(elsewhere) in options, options
        app.fill("text", "open a path", elsewhere)  # the search itself: shown at once
        app.page.get_by_text(f"{elsewhere}: ").first.wait_for(timeout=60_000)
        app.settle()
        assert app.widget("dropdown", "search folder").locator("select").input_value() == str(elsewhere)
        assert app.page.locator("#gepa-pareto-items").count() == 1
        app.fill("text", "open a path", tmp_path / "no-such-folder")
        app.page.get_by_text("No GEPA search at or under").first.wait_for(timeout=30_000)
        assert app.errors() == []


# ---- apps/records.py --------------------------------------------------------------------------------------------
def test_records_app_joins_scores_shows_feedback_filters_by_release_and_refreshes(browser, runs, tmp_path):
    from reef_lab.records.record import Record
    from reef_lab.records.store import RecordStore, scan_records

    run = runs[1]["tiny-sao-seed0"]
    data = run / "data"
    recs = scan_records(data).sort("created_at").collect()
    inf = recs.filter(kind="inference").row(-1, named=True)  # the newest inference: on the table's first page
    old = [r["score"] for r in recs.filter(kind="report").iter_rows(named=True) if inf["id"] in r["references"]]
    assert len(old) == 1
    store = RecordStore(data)
    try:
        store.append([Record(id="rec_feedback_1", scenario="tiny-sao", kind="report", created_at=time.time(),
                             score=1.0, references=[inf["id"]], feedback="answer with the number only")])
        with marimo_app("records", tmp_path, REEF_LAB_DATA_DIR=data) as url:
            app = AppPage(browser, url, "Score histogram")
            assert app.errors() == []
            table = app.table_with("kind")
            rows = {r["id"]: r for r in app.table_rows(table)}
            # an inference row shows the mean score of the reports on it
            assert rows[inf["id"]]["score"] not in ("", "None"), rows[inf["id"]]
            assert float(rows[inf["id"]]["score"]) == pytest.approx((old[0] + 1.0) / 2), rows[inf["id"]]
            # a report row shows its feedback
            assert "answer with the number only" in rows["rec_feedback_1"]["feedback"]

            # select a record: the inspect panel shows it
            row_k = next(k for k, r in enumerate(app.table_rows(table)) if r["id"] == inf["id"])
            table.locator("tbody tr").nth(row_k).locator("button[role=checkbox]").click()
            app.settle()
            assert f"{inf['id']} · inference" in app.text()

            # records by release: reward and held-out accuracy per release of the scenario, with the lineage
            index = json.loads((data / "releases" / "tiny-sao" / "index.json").read_text())
            by_rel = app.page.locator("#records-by-release")
            assert by_rel.count() == 1, "no records-by-release view"
            shown = by_rel.inner_text()
            # each release's answers next to its reward: what it served with the reports' scores, its held-out ones
            per_release = app.page.locator("#records-release-answers details")
            assert per_release.count() == len(index["releases"]) + 1  # and the base model
            v1 = per_release.nth(1)
            assert v1.locator("summary").inner_text().startswith("v1:")
            v1.locator("summary").click()
            rows = v1.locator("table.sample-answers tbody tr").all_inner_texts()
            served = recs.filter(kind="inference", release_id="tiny-sao:v1")["id"].to_list()
            assert not served or any(r.split("\t")[0] in served for r in rows), rows
            assert any(r.startswith("held-out") for r in rows), rows
            for rel in index["releases"]:
                assert rel["version"] in shown and rel["parent"].split(":")[-1] in shown
                assert app.page.locator(f"a[href='{rel['hub']['url']}']").count() >= 1  # its Hub revision
            fig = readable_figure(app, "svg#records-release-figure")
            assert min(size for _, size in fig["texts"]) >= 11, fig["texts"]

            # filter by release: only records served by (or reporting on) tiny-sao:v1
            app.select("Release", "tiny-sao:v1")
            shown_rows = app.table_rows(app.table_with("kind"))
            assert shown_rows and {r["release_id"] for r in shown_rows} == {"tiny-sao:v1"}
            app.select("Release", "(all)")

            # auto-refresh: while nothing is written it greys nothing out; a report posted while the page is open
            # shows up by itself, and the inspected record stays
            app.watch_dimming()
            time.sleep(12)
            app.settle()
            assert app.dimmed() == []
            store.append([Record(id="rec_feedback_2", scenario="tiny-sao", kind="report", created_at=time.time(),
                                 score=0.0, references=[inf["id"]], feedback="arrived while the page was open")])
            app.page.get_by_text("arrived while the page was open").first.wait_for(timeout=20_000)
            app.settle()
            assert f"{inf['id']} · inference" in app.text()
            assert app.errors() == []
            app.shot(tmp_path / "records.png")
    finally:
        store.close()


def test_records_app_renders_an_episode_as_a_conversation(browser, episode_data, tmp_path):
    """A real two-turn tool loop: inspecting one of its calls, or picking it, shows its turns, tool call, tool
    result, which tokens were trained (green) and which were given (grey), and the report on it."""
    from tests.test_episodes import TOOL_RESULT

    data, (first, second), report_id, alone = episode_data
    with marimo_app("records", tmp_path, REEF_LAB_DATA_DIR=data) as url:
        app = AppPage(browser, url, "Score histogram")
        assert app.errors() == []
        assert "belongs to no episode" in app.text()
        app.fill("text", "Inspect record id", second["id"])  # a call of the episode: its conversation
        ep = app.page.locator("#records-episode")
        ep.wait_for(timeout=60_000)
        turns = ep.locator(".episode-turn")
        assert turns.count() == 2
        one, two = turns.nth(0).inner_text(), turns.nth(1).inner_text()
        assert "turn 1" in one and "Weather in Paris?" in one and 'get_weather({"city":"Paris"})' in one
        assert "turn 2" in two and TOOL_RESULT in two and "Weather in Paris?" not in two
        trained = turns.nth(0).locator(".episode-trained")
        assert f"generated, trained ({len(first['token_ids'])} tokens)" in trained.inner_text()
        colours = {cls: ep.locator(f".{cls}").first.evaluate("e => getComputedStyle(e).backgroundColor")
                   for cls in ("episode-given", "episode-trained")}
        assert colours == {"episode-given": "rgb(243, 244, 246)", "episode-trained": "rgb(218, 251, 225)"}
        reports = ep.locator("table.episode-reports tbody tr").all_inner_texts()
        assert len(reports) == 1 and report_id in reports[0] and "0.75" in reports[0]
        # a call of no episode, then the episode picked
        app.fill("text", "Inspect record id", alone)
        assert app.page.locator("#records-episode").count() == 0 and "belongs to no episode" in app.text()
        app.select("Episode", "run-1 (agent, 2 calls)")
        assert app.page.locator("#records-episode .episode-turn").count() == 2
        assert app.errors() == []
        app.page.locator("#records-episode").scroll_into_view_if_needed()
        app.page.screenshot(path=str(tmp_path / "records-episode.png"))


# ---- apps/sao.py ------------------------------------------------------------------------------------------------
def published_command() -> tuple[str, list[int]]:
    """The example config and seeds of the command behind results/sao-arithmetic.md."""
    page = (ROOT / "results" / "sao-arithmetic.md").read_text()
    m = re.search(r"scripts/studies/compare_recipes\.py (\S+\.yaml).*?--seeds ([\d ]+)", page)
    return m.group(1), [int(s) for s in m.group(2).split()]


def alive(pid: int) -> bool:
    """Whether a process runs (a child that exited but was not waited for is a zombie: not alive)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def launched(app: AppPage, folder: Path, timeout: float = 180) -> dict:
    """Wait for the run the app just launched to write its config; stop it (its pid is on the page)."""
    pid = int(re.search(r"Started pid (\d+)", app.text()).group(1))
    deadline = time.time() + timeout
    try:
        while not list(folder.glob("*/config.json")):
            logs = "\n".join(p.read_text()[-1500:] for p in folder.glob("*/run.log"))
            assert alive(pid), f"the launched run exited without writing its config:\n{logs}"
            assert time.time() < deadline, f"no config.json under {folder}:\n{logs}"
            time.sleep(0.5)
        time.sleep(0.5)
        found = list(folder.glob("*/config.json"))
        assert len(found) == 1, found
        return json.loads(found[0].read_text())
    finally:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def test_sao_app_plots_compares_links_and_launches_the_published_config(browser, runs, tmp_path):
    from reef_lab.experiments.weights import ExperimentConfig

    root, by_name = runs
    seed0 = by_name["tiny-sao-seed0"]
    with marimo_app("sao", tmp_path, REEF_LAB_RUN=seed0, REEF_LAB_RUNS=root) as url:
        app = AppPage(browser, url, "Launch a run")
        app.page.get_by_text("Candidates").first.wait_for(timeout=60_000)
        app.settle()
        assert app.errors() == []

        # one run: a readable figure, every panel against policy step, accuracy with 95% error bars
        fig = readable_figure(app, "svg#sao-run-figure")
        assert fig["width"] >= 900 and fig["height"] >= 450, fig
        assert min(size for _, size in fig["texts"]) >= 11, sorted(fig["texts"], key=lambda t: t[1])[:5]
        xlabels = [t for t, _ in fig["texts"] if t in ("policy step", "training batch")]
        assert xlabels and set(xlabels) == {"policy step"}, xlabels
        assert app.page.locator("svg#sao-run-figure [id^='accuracy-ci']").count() == 1
        text = app.text()
        assert "finished" in text and "32 of 32 rollouts" in text
        # links: the W&B run folder and `wandb sync`; each release's Hub revision
        wandb_dir = next((seed0 / "data" / "wandb").glob("offline-run-*"))
        assert f"wandb sync {wandb_dir}" in text
        index = json.loads((seed0 / "data" / "releases" / "tiny-sao" / "index.json").read_text())
        for rel in index["releases"]:
            assert rel["hub"]["state"] == "pushed"
            assert app.page.locator(f"a[href='{rel['hub']['url']}']").count() >= 1
        # tables: times as dates, numbers rounded (no epoch seconds, no 20-digit floats)
        tables = " ".join(app.page.locator("marimo-table").all_inner_texts())
        assert not re.search(r"\b1[7-9]\d{8}\.\d+", tables), "raw timestamps in a table"
        assert not re.search(r"\d\.\d{7,}", tables), "unrounded floats in a table"
        # every panel's policy-step axis ticks whole steps
        assert all(integer_labels(t) for t in tick_labels(app, "svg#sao-run-figure")), \
            tick_labels(app, "svg#sao-run-figure")
        # each candidate's held-out answers next to its accuracy (and the release it became)
        answers = app.page.locator("#sao-answers details")
        assert answers.count() == len(index["candidates"]) + 1  # and the base model
        newest = index["candidates"][-1]
        summary = answers.first.locator("summary").inner_text()
        assert f"candidate {newest['id']}" in summary and f"{newest['eval']['accuracy']:.3f}" in summary
        answers.first.locator("summary").click()
        shown = answers.first.locator("table.sample-answers").inner_text()
        assert all(e["text"].strip()[:20] in shown for e in newest["eval"]["examples"] if e["text"].strip())

        # compare: tick both SAO seeds and the GRPO run; curves overlaid with mean and 95% band per group, the
        # config differences in a panel, status and progress per run
        runs_table = app.table_with("progress")
        names = [r["name"] for r in app.table_rows(runs_table)]
        for k, name in enumerate(names):
            box = runs_table.locator("tbody tr").nth(k).locator("button[role=checkbox]")
            if box.get_attribute("aria-checked") != "true":
                box.click()
                app.settle()
        compare = readable_figure(app, "svg#sao-compare-figure")
        assert min(size for _, size in compare["texts"]) >= 11
        assert app.page.locator("svg#sao-compare-figure [id^='band-tiny-sao']").count() >= 1
        assert app.page.locator("svg#sao-compare-figure [id^='mean-tiny-sao']").count() >= 1
        diff = {r["field"]: r for r in app.table_rows(app.table_with("field"))}
        assert "seed" in diff and "recipe" in diff and "out_dir" not in diff, list(diff)
        assert {r["status"] for r in app.table_rows(runs_table)} == {"finished"}
        # finished runs: the auto-refresh (every 10 s) greys nothing out and keeps the ticked runs
        app.watch_dimming()
        time.sleep(12)
        app.settle()
        assert app.dimmed() == []
        ticks = runs_table.locator("tbody tr button[role=checkbox]").evaluate_all(
            "els => els.map(e => e.getAttribute('aria-checked'))")
        assert ticks == ["true"] * len(names)
        assert app.errors() == []
        app.shot(tmp_path / "sao.png")

        # launch with the form's defaults: the run's config is the published one's
        example, seeds = published_command()
        out = tmp_path / "launched"
        app.fill("text", "runs folder", out)
        app.click("launch")
        got = launched(app, out)
        data = yaml.safe_load((ROOT / example).read_text())
        want = asdict(ExperimentConfig(**{**data, "seed": seeds[0], "out_dir": got["out_dir"]}))
        assert got == want
        # values typed into the form reach the run's config
        out2 = tmp_path / "launched2"
        app.fill("text", "runs folder", out2)
        app.fill("number", "seed", 5)
        app.fill("text", "learning rate", "5e-5")
        app.fill("number", "rollouts", 64)
        app.click("launch")
        got = launched(app, out2)
        assert (got["seed"], got["rollouts"], got["recipe_config"]["trainer"]["lr"]) == (5, 64, 5e-5)
        assert app.errors() == []


HOLD = """import sys, time
from reef_lab.learning.heartbeat import Heartbeat
with Heartbeat(sys.argv[1], interval_s=1):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_sao_app_shows_a_quiet_live_run_as_running_until_it_is_killed(browser, runs, tmp_path):
    """A run started from the command line that has written nothing for 10 minutes: running while its process
    lives (its heartbeat), stopped after a kill -9, without reloading the page."""
    quiet = tmp_path / "quiet" / "tiny-sao-seed1"
    shutil.copytree(runs[1]["tiny-sao-seed1"], quiet, ignore=shutil.ignore_patterns("summary.json", "heartbeat.json"))
    old = time.time() - 600
    for p in quiet.rglob("*"):
        os.utime(p, (old, old))
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(quiet)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "holding"
        with marimo_app("sao", tmp_path, REEF_LAB_RUNS=quiet.parent) as url:
            app = AppPage(browser, url, "Launch a run")
            app.page.get_by_text("Candidates").first.wait_for(timeout=60_000)
            app.settle()
            runs_table = app.table_with("progress")
            assert [r["status"] for r in app.table_rows(runs_table)] == ["running"]
            assert "tiny-sao (sao, seed 1): running" in app.text()
            proc.kill()
            proc.wait(timeout=30)
            deadline = time.time() + 60  # the next auto-refresh tick (10 s) redraws it
            while not app.table_rows(app.table_with("progress"))[0]["status"].startswith("stopped"):
                assert time.time() < deadline, app.table_rows(app.table_with("progress"))
                time.sleep(1)
            app.settle()
            assert "tiny-sao (sao, seed 1): stopped (last heartbeat" in app.text()
            assert app.errors() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


# ---- apps/ttt.py ------------------------------------------------------------------------------------------------
def hashed_packing():
    """Circle packing whose verifier scores a packing drawn from the reply's hash (the tiny model writes no program):
    real programs, run and checked by the real sandbox and verifier, with rewards that vary."""
    import random

    from recipes.tttd.problems import CirclePacking, program_for

    class Hashed(CirclePacking):
        def verify(self, text):
            rng = random.Random(text)
            cells = [((i % 3 + 0.5) / 3, (i // 3 + 0.5) / 3) for i in range(self.n)]
            prog = program_for([(x, y, rng.uniform(0.03, 0.16)) for x, y in cells])
            return super().verify(f"```python\n{prog}```")
    return Hashed(6)


def ttt_experiment(out: Path, steps: int):
    from recipes.tttd.experiment import TTTDExperimentConfig

    return TTTDExperimentConfig(name="ttt-tiny", out_dir=str(out), wandb={"mode": "offline"}, config={
        "groups": 2, "rollouts_per_group": 4, "steps": steps, "max_tokens": 6, "concurrency": 8,
        "trainer": {"lora_rank": 4, "lr": 1e-3, "micro_batch_size": 8}})


def test_ttt_app_draws_a_finished_and_a_running_run(browser, tiny_model_dir, tmp_path, monkeypatch):
    import threading

    from recipes.tttd import discover
    from recipes.tttd.experiment import run_tttd_experiment
    from reef_lab.engines.embedded import EmbeddedEngine

    monkeypatch.setattr(discover, "make_problem", lambda cfg: hashed_packing())
    root = tmp_path / "runs"
    summary = run_tttd_experiment(ttt_experiment(root / "done", 3),
                                  engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["steps"] == 3 and summary["release"] == "ttt-tiny:v1"
    with marimo_app("ttt", tmp_path, REEF_LAB_RUN=root / "done", REEF_LAB_RUNS=root) as url:
        app = AppPage(browser, url, "Reward and beta per step")
        assert app.errors() == []
        text = app.text()
        assert "finished" in text and "3 of 3 steps" in text and f"{summary['best_reward']:.6f}" in text
        assert "ttt-tiny:v1" in text and "wandb sync" in text
        for fig in ("#ttt-progress", "#ttt-tree", "#ttt-best"):
            shown = readable_figure(app, fig)
            assert shown["width"] >= 400 and shown["texts"] and min(size for _, size in shown["texts"]) >= 11, (fig, shown)
        assert app.page.locator("#ttt-best circle, #ttt-best path").count() >= 6  # the square and six circles
        # both charts number steps as the metrics rows do: whole steps, 1..3 (and 0 for the initial states)
        progress, tree = tick_labels(app, "svg#ttt-progress"), tick_labels(app, "svg#ttt-tree")
        assert all(integer_labels(t) for t in progress) and integer_labels(tree[0]), (progress, tree)
        steps = {int(t) for t in progress[0]}
        assert {1, 3} <= steps and min(int(t) for t in tree[0]) >= 0 and max(int(t) for t in tree[0]) <= 3, \
            (progress, tree)
        assert app.table_with("PUCT")
        app.shot(tmp_path / "ttt-finished.png")

    # a run still going: the page shows it as running and draws what it has so far
    engine = EmbeddedEngine.from_path(str(tiny_model_dir))
    from reef_lab.gateway.gateway import Gateway

    cfg = ttt_experiment(root / "going", 200)
    gw = Gateway(Path(cfg.out_dir) / "data", engine, allowed_recipes=["tttd"])
    from dataclasses import asdict
    gw.create_scenario({"name": cfg.name, "recipe": "tttd", "config": asdict(cfg.recipe_config())}, operator=True)
    (Path(cfg.out_dir) / "config.json").write_bytes(json.dumps(asdict(cfg)).encode())
    stop = threading.Event()
    worker = threading.Thread(target=gw.learner(cfg.name).discovery.run, kwargs={"stop": stop}, daemon=True)
    worker.start()
    try:
        with marimo_app("ttt", tmp_path, REEF_LAB_RUN=root / "going", REEF_LAB_RUNS=root) as url:
            app = AppPage(browser, url, "Best solution")
            assert app.errors() == []
            assert "running" in app.text() and "of 200 steps" in app.text()
            time.sleep(12)  # an auto-refresh tick with new steps
            app.settle()
            assert app.errors() == []
    finally:
        stop.set()
        worker.join(120)
        gw.close()


# ---- apps/harness.py --------------------------------------------------------------------------------------------
def test_harness_app_shows_the_chain_a_diff_and_a_request_arriving(browser, tmp_path):
    """Releases made by change requests (the scripted provider proposes), one rejected, then a new request while
    the page is open: it appears under the requests in flight by itself."""
    from reef_lab.harness.change_requests import RequestStore
    from tests.test_apps_harness import harness_data

    data = tmp_path / "data"
    ids = harness_data(data)
    with marimo_app("harness", tmp_path, REEF_LAB_DATA_DIR=data) as url:
        app = AppPage(browser, url, "Release chain of")
        assert app.errors() == []
        chain = app.page.locator("#harness-chain")
        rows = chain.locator("tr.harness-release").all_inner_texts()
        assert [r.split()[0] for r in rows] == ["v3", "v2", "v1"] and "serving" in rows[0]
        assert "request: Name the tests you ran" in rows[0] and "review: scripted review" in rows[0]
        assert "seed harness" in rows[2]
        # the picked release (the newest) shows its request and its diff, added lines marked
        assert app.page.locator(f"#request-{ids[2]}").count() == 1
        added = app.page.locator(".harness-diff .diff-add").all_inner_texts()
        assert "+- Name the tests you ran" in added, added
        app.select("Release", "v2")
        assert app.page.locator(f"#request-{ids[0]}").count() == 1
        assert "+- Always write a CHANGELOG entry" in app.page.locator(".harness-diff .diff-add").all_inner_texts()
        every = app.table_rows(app.table_with("why"))
        assert [r["state"] for r in every] == ["released", "rejected", "released"]
        assert "Requests in flight (0)" in app.text()
        # a request accepted while the page is open (its file written as POST /reef/train writes it), not yet taken
        # up by a proposer: it shows up in flight by itself
        RequestStore(data).create("s", {"text": "Prefer small commits", "session": None, "release_id": None})
        app.page.get_by_text("Requests in flight (1)").first.wait_for(timeout=30_000)
        app.settle()
        flight = app.table_rows(app.table_with("why"))
        assert flight[0]["state"] == "queued" and "Prefer small commits" in flight[0]["text"]
        assert app.page.locator("marimo-dropdown select").first.input_value() == "s"  # selections kept
        assert app.errors() == []
        app.shot(tmp_path / "harness.png")
