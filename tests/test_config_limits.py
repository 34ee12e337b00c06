"""Configs that are too deep or too large are refused at parse time, fast, with a message naming the limit, never a
traceback (issue 28: 10,000 levels in -c, --recipe-config or inline were a ~3,000-line RecursionError; 300 levels
in -c an orjson TypeError; a 100 MB string in -c parsed for 180 s, then the workers could not start, E2BIG)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from reef_lab.config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, parse_serve_config

ROOT = Path(__file__).resolve().parents[1]


def deep(levels: int) -> str:
    return "{require_score: " + "[" * levels + "1" + "]" * levels + "}"


def refused(argv: list[str], capsys) -> str:
    """parse_serve_config's error for `argv`, which must be refused within 30 s (a busy machine)."""
    started = time.monotonic()
    with pytest.raises(SystemExit) as e:
        parse_serve_config(argv)
    assert e.value.code == 2 and time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err) < 5000, err[-2000:]
    return err


@pytest.mark.parametrize("where", ["-c", "--recipe-config file", "--recipe-config inline"])
@pytest.mark.parametrize("levels", [MAX_CONFIG_DEPTH + 1, 300, 10_000])
def test_deep_configs_are_refused_naming_the_depth(tmp_path, capsys, where, levels):
    f = tmp_path / "c.yaml"
    if where == "-c":
        f.write_text(f"recipe_config: {deep(levels)}\n")
        argv = ["-c", str(f)]
    elif where == "--recipe-config file":
        f.write_text(deep(levels))
        argv = ["--recipe-config", str(f)]
    else:
        argv = ["--recipe-config", deep(levels)]
    err = refused(argv + ["--data-dir", str(tmp_path / "d")], capsys)
    assert f"nested deeper than {MAX_CONFIG_DEPTH} levels" in err, err


def test_the_deepest_allowed_config_reaches_the_recipe(tmp_path, capsys):
    """64 levels parse; the recipe then judges the value (a list is not a bool)."""
    err = refused(["--recipe-config", deep(MAX_CONFIG_DEPTH - 1), "--data-dir", str(tmp_path)], capsys)
    assert "require_score must be true or false" in err, err


@pytest.mark.parametrize("where", ["-c", "--recipe-config file", "--recipe-config inline"])
def test_large_configs_are_refused_naming_the_size_before_parsing(tmp_path, capsys, where):
    text = "recipe_config: {require_score: '" + "x" * (MAX_CONFIG_BYTES + 10) + "'}\n"
    f = tmp_path / "c.yaml"
    f.write_text(text)
    argv = {"-c": ["-c", str(f)], "--recipe-config file": ["--recipe-config", str(f)],
            "--recipe-config inline": ["--recipe-config", text.split(": ", 1)[1]]}[where]
    err = refused(argv + ["--data-dir", str(tmp_path / "d")], capsys)
    assert f"a config may be at most {MAX_CONFIG_BYTES:,} bytes" in err, err


def test_yaml_aliases_are_refused(tmp_path, capsys):
    """An alias repeats a subtree: nine levels of nine would be 387 million values once passed on as JSON."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, 9)]
    f = tmp_path / "r.yaml"
    f.write_text("\n".join(lines) + "\n")
    err = refused(["--recipe-config", str(f), "--data-dir", str(tmp_path / "d")], capsys)
    assert "YAML aliases (*a0) are not supported" in err, err


def test_a_missing_config_file_is_an_error_not_a_traceback(tmp_path, capsys):
    err = refused(["-c", str(tmp_path / "nope.yaml")], capsys)
    assert "nope.yaml" in err and "cannot be read" in err, err


def test_serve_py_stops_at_once_on_a_10000_level_config(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(f"recipe_config: {deep(10_000)}\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py"), "-c", str(f), "--data-dir",
                          str(tmp_path / "d")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and time.monotonic() - started < 60
    assert f"nested deeper than {MAX_CONFIG_DEPTH} levels" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()) < 40, out.stderr[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_config_larger_than_an_environment_variable_reaches_the_workers(tmp_path, stub_url):
    """A config under the 1 MB limit but over the 128 KB one environment string may hold: the workers read it from
    the data dir (serve-config.json), so the server starts and serves."""
    f = tmp_path / "c.yaml"
    f.write_text("wandb_group: " + "g" * 300_000 + "\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve.py"), "-c", str(f), "--port", str(port),
                             "--data-dir", str(tmp_path / "d"), "--upstream-url", stub_url, "--workers", "1"],
                            cwd=ROOT, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/reef/status", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stderr.close()
    assert (tmp_path / "d" / "serve-config.json").stat().st_size > 300_000
