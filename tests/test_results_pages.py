"""A results page's commands run as printed on a fresh clone (issue 39): no page names a machine's own folders (a
run's temporary folders, a checkout's absolute path, root's home), whether in a `Command:` line, a command block, a
bullet or prose; run folders go under runs/ (git ignores it), and a program's output that named a temporary folder
shows a placeholder (`<agent home>`, results/harness-install.md). The scripts that write pages build their command
lines with scripts/command_line.py and default their run folders under runs/, never /tmp.

Issue 51: results/ is navigable. Claim pages (a measured result with its command) are in results/ and each is linked
from results/README.md's tables; merge checks and notes are in results/log/, linked from its Log section; every JSON
is in results/data/ (scripts write it there through scripts/command_line.py `data_file`). No page, README.md or doc
names a module or file that does not exist (a log keeps an old name followed by `[now <the current name>]`), and
every relative link resolves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from scripts.command_line import ROOTS, command_line, data_file, data_link, repo_path, shell_words

ROOT = Path(__file__).resolve().parents[1]
MACHINE = ("/tmp/", "/root/", "/work/")


def machine_paths(root: Path) -> list[str]:
    """`page:line: text` of every results page line that names a machine path."""
    return [f"{page.relative_to(root)}:{n}: {line.strip()[:160]}"
            for page in sorted((root / "results").rglob("*.md"))
            for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if any(m in line for m in MACHINE)]


def test_no_results_page_names_a_machine_path():
    assert machine_paths(ROOT) == [], "write run folders as runs/<name> (see scripts/command_line.py)"


def test_the_page_check_fails_on_a_temporary_folder(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.md").write_text(
        "# A\n\nCommand: `python scripts/x.py --out runs/a`\n\n    python scripts/y.py --out /tmp/s35/y\n\n"
        "- `python scripts/serve.py --data-dir /root/data`\n| x | in `<agent home>/reef-harness` |\n")
    assert machine_paths(tmp_path) == ["results/a.md:5: python scripts/y.py --out /tmp/s35/y",
                                       "results/a.md:7: - `python scripts/serve.py --data-dir /root/data`"]


def tmp_defaults(root: Path) -> list[str]:
    """`script:line` of every argparse default in scripts/ that is a temporary folder."""
    found = []
    for path in sorted((root / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "add_argument":
                for kw in node.keywords:
                    if kw.arg == "default" and isinstance(kw.value, ast.Constant) and \
                            isinstance(kw.value.value, str) and kw.value.value.startswith("/tmp"):
                        found.append(f"{path.relative_to(root)}:{node.lineno} default {kw.value.value}")
    return found


def test_no_script_defaults_to_a_temporary_folder():
    assert tmp_defaults(ROOT) == [], "default run folders to runs/<name>"


def test_the_scripts_that_write_a_command_build_it_from_the_repository_root():
    writers = [p for p in sorted((ROOT / "scripts").rglob("*.py"))
               if p.name != "command_line.py" and "Command" in p.read_text(encoding="utf-8")]
    assert len(writers) >= 15
    assert [p.name for p in writers if "scripts.command_line import" not in p.read_text(encoding="utf-8")] == []


def test_command_line_writes_paths_inside_the_repository_from_its_root(tmp_path, monkeypatch):
    root = ROOTS[0]
    assert command_line([f"{root}/scripts/bench/bench_gateway.py", "--out", f"{root}/runs/b", f"--results={root}/results/x",
                         "--seconds", "5"]) == \
        "python scripts/bench/bench_gateway.py --out runs/b --results=results/x --seconds 5"
    # outside the repository: kept (it is what ran); a word a shell would split: quoted
    assert shell_words(["scripts/serve.py", "--data-dir", str(tmp_path), "--engine-options", '{"port": 1}']) == \
        f"scripts/serve.py --data-dir {tmp_path} --engine-options '{{\"port\": 1}}'"
    assert repo_path(f"{root}/.venv/bin/python") == ".venv/bin/python" and repo_path(root) == "."
    assert repo_path(root + "-other/x") == root + "-other/x"
    monkeypatch.chdir(Path(root) / "scripts" / "bench")  # started from another folder: the script is still named from the root
    assert command_line(["soak.py", "--minutes", "1"], program=".venv/bin/python") == \
        ".venv/bin/python scripts/bench/soak.py --minutes 1"


# --- issue 51: an index, logs apart, JSON in results/data/, names that exist ---------------------------------------

PACKAGES = ("reef_lab", "recipes", "scripts", "apps", "server", "tests")
# a dotted module path (`reef_lab.trainers.losses.dis_token_loss`), not inside a longer word or path
DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))
# a file or folder path from the repository root (`scripts/bench/soak.py`, `../recipes/sao/`, `results/x.{md,json}`)
FILE = re.compile(r"(?<![\w./~-])(?:\.\./)*((?:%s|results|docs)/(?:[\w.*<>-]|/|\{[\w.,-]*\})*)" % "|".join(PACKAGES))
EXTENSIONS = {"md", "py", "yaml", "yml", "json", "jsonl", "png", "sh", "txt", "toml", "gguf"}
NOW = re.compile(r"[^\[\]]{0,80}\[now\b")  # what follows an old name on a log page: `[now <current name>]`
# names that are not this repository's, each with why
ELSEWHERE = {
    "recipes/closeness": "docs/extending.md's worked example of a recipe a reader writes",
    "recipes.closeness": "docs/extending.md's worked example of a recipe a reader writes",
    "scripts/models": "slime's folder of model descriptions (docs/slime.md), in slime's repository",
}
LINK = re.compile(r"\]\(([^)\s]+)\)")


def named_pages(root: Path) -> list[Path]:
    """The pages whose names are checked: results (claims, logs, data notes), the README, docs, recipes' READMEs."""
    return sorted((root / "results").rglob("*.md")) + [root / "README.md"] + sorted((root / "docs").glob("*.md")) + \
        sorted((root / "recipes").glob("*/README.md"))


def _module_file(root: Path, parts: list[str]) -> Path | None:
    path = root.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return path if path.is_dir() else None


def dotted_exists(root: Path, name: str) -> bool:
    """`a.b.c` is a module (a file or package) or an attribute of one: the longest prefix that is a module file, and
    each remaining part (at most two: `Class.method`) appears in that file as a word. Nothing is imported."""
    parts = name.split(".")
    if parts[-1] in EXTENSIONS or any(re.fullmatch(r"[A-Z]", p) for p in parts):  # `apps.md`; `reef_lab.X`
        return True
    for k in range(len(parts), 0, -1):
        found = _module_file(root, parts[:k])
        if found is not None:
            rest = parts[k:]
            if not rest:
                return True
            if found.is_dir() or len(rest) > 2:
                return False
            text = found.read_text(encoding="utf-8")
            return all(re.search(rf"\b{re.escape(r)}\b", text) for r in rest)
    return False


def path_exists(root: Path, path: str) -> bool:
    """A path from the root names a file or folder, or a page's stem (`--out results/x` writes results/x.md); `*`,
    `<name>` and `{a,b}` are patterns. A last part that is not a file's or a folder's name (`reef_lab/TRL`) is prose."""
    path = path.rstrip("/.")
    last = path.rsplit("/", 1)[-1]
    if not re.search(r"[.*<{]", last) and not re.fullmatch(r"[a-z0-9_-]+", last):
        return True
    for alternative in _braces(path):
        pattern = re.sub(r"<[^>]*>", "*", alternative)
        if "*" in pattern:
            if not any(root.glob(pattern)):
                return False
        elif not ((root / pattern).exists() or any((root / pattern).parent.glob((root / pattern).name + ".*"))):
            return False
    return True


def _braces(path: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in _braces(path[:m.start()] + alt + path[m.end():])]


def missing_names(root: Path) -> list[str]:
    """`page:line: name` of every module or file a page names that does not exist (nor is marked `[now ...]`)."""
    found = []
    for page in named_pages(root):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            names = [(m, dotted_exists) for m in DOTTED.finditer(line)] + [(m, path_exists) for m in FILE.finditer(line)]
            for m, exists in names:
                name = m.group(1)
                if any(name.startswith(k) for k in ELSEWHERE) or NOW.match(line, m.end()):
                    continue
                if not exists(root, name):
                    found.append(f"{page.relative_to(root)}:{n}: {name}")
    return found


def test_no_page_names_a_module_or_file_that_does_not_exist():
    assert missing_names(ROOT) == [], \
        "name the current module (on a log page: keep the old name and add `[now <current name>]`)"


def test_the_name_check_fails_on_a_module_gone_and_accepts_a_marked_old_name(tmp_path):
    (tmp_path / "reef_lab" / "trainers").mkdir(parents=True)
    (tmp_path / "reef_lab" / "__init__.py").write_text("")
    (tmp_path / "reef_lab" / "trainers" / "losses.py").write_text("def dis_token_loss(low, high): ...\n")
    (tmp_path / "results" / "log").mkdir(parents=True)
    (tmp_path / "README.md").write_text("See `reef_lab/trainers/losses.py` and reef_lab.trainers.losses.dis_token_loss.\n")
    (tmp_path / "results" / "a.md").write_text(
        "# A\n\nStub: `reef_lab.testing.stub_provider`; loss `reef_lab.trainers.losses.kl_loss`; "
        "`reef_lab/harness_learner.py`; `recipes/x/README.md`.\n")
    (tmp_path / "results" / "log" / "b.md").write_text(
        "Stub: `reef_lab.testing.stub_provider` [now `reef_lab.trainers.losses`] (the run before).\n")
    assert missing_names(tmp_path) == ["results/a.md:3: reef_lab.testing.stub_provider",
                                       "results/a.md:3: reef_lab.trainers.losses.kl_loss",
                                       "results/a.md:3: reef_lab/harness_learner.py", "results/a.md:3: recipes/x/README.md"]


def broken_links(root: Path) -> list[str]:
    """`page:line: target` of every relative markdown link that resolves to nothing."""
    found = []
    for page in named_pages(root):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in LINK.finditer(line):
                target = m.group(1).split("#")[0]
                if target and not re.match(r"[a-z]+:", target) and not (page.parent / target).exists():
                    found.append(f"{page.relative_to(root)}:{n}: {target}")
    return found


def test_every_relative_link_of_the_pages_resolves():
    assert broken_links(ROOT) == []


def _index_sections(root: Path) -> tuple[str, str]:
    text = (root / "results" / "README.md").read_text(encoding="utf-8")
    tables, _, log = text.partition("\n## Log\n")
    return tables, log


def test_the_results_index_links_every_claim_page_and_every_log():
    tables, log = _index_sections(ROOT)
    assert log, "results/README.md has a `## Log` section"
    in_tables = {t for t in LINK.findall(tables)}
    claims = sorted(p.name for p in (ROOT / "results").glob("*.md") if p.name != "README.md")
    assert [c for c in claims if c not in in_tables] == [], "each claim page has its row in a table of results/README.md"
    logs = sorted(f"log/{p.name}" for p in (ROOT / "results" / "log").glob("*.md"))
    assert [x for x in logs if x not in set(LINK.findall(log))] == [], "each log page has its line in the Log section"
    # a claim page's row: page | claim | date | command
    rows = [line for line in tables.splitlines() if line.startswith("| [")]
    assert len(rows) == len(claims)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[2]), row
        assert re.search(r"\d", cells[1]), f"a claim states its number: {row}"


def test_raw_json_is_in_results_data_and_logs_in_results_log():
    results = ROOT / "results"
    assert [str(p.relative_to(results)) for p in results.rglob("*.json") if p.parts[len(results.parts)] != "data"] \
        == []
    assert sorted(p.name for p in results.iterdir() if p.is_dir()) == ["data", "log"]
    # merge checks, reruns of an issue and notes are logs, not claims
    assert [p.name for p in results.glob("*.md") if re.search(r"-(notes|\d\d)(-|\.md$)|reproduction|merge|suite-",
                                                              p.name)] == []


def test_data_file_puts_a_results_pages_json_in_results_data(tmp_path):
    root = Path(ROOTS[0])
    assert data_file(root / "results" / "agents") == root / "results" / "data" / "agents.json"
    assert data_file(f"{root}/results/reproducibility.md") == root / "results" / "data" / "reproducibility.json"
    assert data_file(root / "results" / "log" / "gateway-bench-29-after") == \
        root / "results" / "data" / "log" / "gateway-bench-29-after.json"
    assert data_file(root / "results" / "data" / "agents-learn-seeds" / "s0") == \
        root / "results" / "data" / "agents-learn-seeds" / "s0.json"  # already in data/: as given
    assert data_file(tmp_path / "runs" / "s0") == tmp_path / "runs" / "s0.json"  # a run folder: beside the page
    assert data_link(root / "results" / "agents") == "data/agents.json"
    assert data_link(root / "results" / "log" / "gateway-bench-29-after") == "../data/log/gateway-bench-29-after.json"
    assert data_link(tmp_path / "soak") == "soak.json"


# compare_recipes.py writes a per-run evaluation cache into each run folder; its page has no JSON
NO_PAGE_JSON = {"compare_recipes.py"}


def test_the_scripts_that_write_a_pages_json_write_it_with_data_file():
    writers = [p for p in sorted((ROOT / "scripts").rglob("*.py"))
               if re.search(r"\.(write_text|write_bytes)\((or)?json\.dumps", p.read_text(encoding="utf-8"))
               and re.search(r"\"results[\"/]", p.read_text(encoding="utf-8")) and p.name not in NO_PAGE_JSON]
    assert len(writers) >= 19
    assert [p.name for p in writers if "data_file(" not in p.read_text(encoding="utf-8")] == []
    assert [f"{p.name}: {m.group(0)}" for p in writers
            for m in re.finditer(r'with_suffix\("\.json"\)|\+ "\.json"|\{(args\.out|path)\}\.json',
                                 p.read_text(encoding="utf-8"))] == []
