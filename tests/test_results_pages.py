"""A results page's commands run as printed on a fresh clone (issue 39): no page names a machine's own folders (a
run's temporary folders, a checkout's absolute path, root's home), whether in a `Command:` line, a command block, a
bullet or prose; run folders go under runs/ (git ignores it), and a program's output that named a temporary folder
shows a placeholder (`<agent home>`, results/harness-install.md). The scripts that write pages build their command
lines with scripts/command_line.py and default their run folders under runs/, never /tmp."""

from __future__ import annotations

import ast
from pathlib import Path

from scripts.command_line import ROOTS, command_line, repo_path, shell_words

ROOT = Path(__file__).resolve().parents[1]
MACHINE = ("/tmp/", "/root/", "/work/")


def machine_paths(root: Path) -> list[str]:
    """`page:line: text` of every results page line that names a machine path."""
    return [f"{page.relative_to(root)}:{n}: {line.strip()[:160]}"
            for page in sorted((root / "results").glob("*.md"))
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
    for path in sorted((root / "scripts").glob("*.py")):
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
    writers = [p for p in sorted((ROOT / "scripts").glob("*.py"))
               if p.name != "command_line.py" and "Command" in p.read_text(encoding="utf-8")]
    assert len(writers) >= 15
    assert [p.name for p in writers if "scripts.command_line import" not in p.read_text(encoding="utf-8")] == []


def test_command_line_writes_paths_inside_the_repository_from_its_root(tmp_path, monkeypatch):
    root = ROOTS[0]
    assert command_line([f"{root}/scripts/bench_gateway.py", "--out", f"{root}/runs/b", f"--results={root}/results/x",
                         "--seconds", "5"]) == \
        "python scripts/bench_gateway.py --out runs/b --results=results/x --seconds 5"
    # outside the repository: kept (it is what ran); a word a shell would split: quoted
    assert shell_words(["scripts/serve.py", "--data-dir", str(tmp_path), "--engine-options", '{"port": 1}']) == \
        f"scripts/serve.py --data-dir {tmp_path} --engine-options '{{\"port\": 1}}'"
    assert repo_path(f"{root}/.venv/bin/python") == ".venv/bin/python" and repo_path(root) == "."
    assert repo_path(root + "-other/x") == root + "-other/x"
    monkeypatch.chdir(Path(root) / "scripts")  # started from another folder: the script is still named from the root
    assert command_line(["soak.py", "--minutes", "1"], program=".venv/bin/python") == \
        ".venv/bin/python scripts/soak.py --minutes 1"
