"""The command a results page prints, runnable as printed from the repository root on a fresh clone.

Not an entry point: the scripts that write a page's `Command:` line (or the commands of the children they start)
build it here. Why: pages printed `" ".join(sys.argv)`, so they carried the writer's absolute folders (a checkout
under /work/..., the interpreter's path) and words a shell splits (`--engine-options {"port": 1}`); 14 pages had
to be corrected by hand (issue 39).

- every absolute path inside the repository (also the value of `--flag=/path`) is written relative to its root;
- the script is named from the root (`scripts/x.py`, however it was started);
- words are quoted for a POSIX shell (shlex), so the line pastes as one command;
- relative words are kept as typed: the scripts run from the repository root, as their relative defaults assume.

Absolute paths outside the repository (`--out /tmp/x`) are kept: they are what ran. Put run folders under `runs/`
(git ignores it); tests/test_results_pages.py fails on a page that names a machine's temporary folders.

A page's raw numbers go where `data_file` says (issue 51): claim pages and their figures in results/, merge checks
and notes in results/log/, every JSON in results/data/ at the same place (results/x.md: results/data/x.json).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

ROOTS = tuple(dict.fromkeys((os.path.abspath(Path(__file__).parents[1]), str(Path(__file__).resolve().parents[1]))))


def repo_path(word: str | os.PathLike) -> str:
    """`word` relative to the repository root when it is an absolute path inside it, else as given."""
    word = os.fspath(word)
    if not os.path.isabs(word):
        return word
    path = os.path.normpath(word)
    for root in ROOTS:
        if path == root:
            return "."
        if path.startswith(root + os.sep):
            return path[len(root) + 1:]
    return word


def _word(word: str) -> str:
    flag, eq, value = word.partition("=")
    if eq and flag.startswith("-") and os.path.isabs(value):
        return f"{flag}={repo_path(value)}"
    return repo_path(word)


def shell_words(words: Sequence[str | os.PathLike]) -> str:
    """The words as one shell line: paths inside the repository relative to its root, each word quoted if needed."""
    return shlex.join(_word(os.fspath(w)) for w in words)


def command_line(argv: Sequence[str] | None = None, program: str = "python") -> str:
    """`program scripts/x.py ARGS` for this process (or `argv`, whose first word is the script), as a reader at the
    repository root types it. `program` is written as given (`HF_HUB_OFFLINE=1 .venv/bin/python` is fine)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.isfile(argv[0]):  # started from another folder: name the script from the root
        argv[0] = os.path.abspath(argv[0])
    return f"{program} {shell_words(argv)}".strip()


def data_file(page: str | os.PathLike, suffix: str = ".json") -> Path:
    """Where the raw numbers of the page `page` (a path with or without `.md`) go: for a page under results/, the same
    place under results/data/ (results/x -> results/data/x.json, results/log/x -> results/data/log/x.json), its
    folder created; for a page anywhere else (a run folder), beside the page (runs/a/x -> runs/a/x.json)."""
    path = os.path.abspath(os.fspath(page))
    path = path[:-3] if path.endswith(".md") else path
    for root in ROOTS:
        results = os.path.join(root, "results") + os.sep
        if path.startswith(results) and not path.startswith(os.path.join(results, "data") + os.sep):
            target = Path(results, "data", path[len(results):] + suffix)
            target.parent.mkdir(parents=True, exist_ok=True)
            return target
    return Path(path + suffix)


def data_link(page: str | os.PathLike, suffix: str = ".json") -> str:
    """The page's link to its raw numbers, from the page's folder (`data/x.json` on results/x.md)."""
    path = os.path.abspath(os.fspath(page))
    return os.path.relpath(data_file(path, suffix), os.path.dirname(path))
