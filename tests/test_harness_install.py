"""The install script (GET /reef/harness/install): each agent's layout, sh -n and shellcheck clean, reruns, dropped
files, and what a hostile release or install root cannot do (write outside the root, run anything, follow a
planted symbolic link)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from reef_lab.agents.layout import Binding, Rendered, parse_release, release_text, render
from reef_lab.agents.script import render_script
from reef_lab.harness import load

SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]
FILES = {"system_prompt.md": "You are careful.", "rules.md": "- RULE-ALPHA run the tests",
         "skills/tidy.md": "---\nname: tidy\ndescription: SKILL-BETA tidy imports\n---\nSort imports.",
         "skills/Check Style.md": "Check the style guide first.", "commands/ship.md": "COMMAND-GAMMA ship it",
         "notes/why.txt": "kept under files/"}
H = {"x-reef-scenario": "s"}


def publish(url: str, files: dict) -> str:
    r = requests.post(url + "/reef/scenarios/s/harness", json={"files": files})
    assert r.status_code == 201, r.text
    return r.json()["release_id"]


def script(url: str, adapter: str, release: str | None = None, **headers) -> str:
    q = f"?adapter={adapter}" + (f"&release_id={release}" if release else "")
    r = requests.get(url + "/reef/harness/install" + q, headers={**H, **headers})
    assert r.status_code == 200, r.text
    return r.text


def run_sh(text: str, tmp: Path, *args: str, shell: str = "sh", cwd: Path | None = None) -> subprocess.CompletedProcess:
    (tmp / "home").mkdir(exist_ok=True)
    cwd = cwd or tmp / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp / "home")}
    return subprocess.run([shell, "-s", "--", *args], input=text, text=True, capture_output=True, cwd=cwd, env=env,
                          timeout=120)


def tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_each_agent_gets_its_own_layout_and_binding():
    b = Binding("http://127.0.0.1:8900", "s", "s:v3", "m-1")
    claude = render("claude", load(FILES), b)
    assert set(claude.files) == {"CLAUDE.md", "skills/tidy/SKILL.md", "skills/check-style/SKILL.md",
                                 "commands/ship.md", "files/notes/why.txt"}
    assert "You are careful." in claude.files["CLAUDE.md"] and "## Rules\n\n- RULE-ALPHA" in claude.files["CLAUDE.md"]
    assert claude.files["skills/tidy/SKILL.md"] == (
        '---\nname: tidy\ndescription: "SKILL-BETA tidy imports"\n---\n\nSort imports.\n')
    assert claude.files["skills/check-style/SKILL.md"].startswith(  # no front matter: name from the file, first line
        '---\nname: check-style\ndescription: "Check the style guide first."\n---\n')
    env = json.loads(claude.config["settings.json"])["env"]
    assert env == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8900",
                   "ANTHROPIC_CUSTOM_HEADERS": "x-reef-scenario: s\nx-reef-harness: s:v3"}
    codex = render("codex", load(FILES), b)
    assert {"AGENTS.md", "skills/tidy/SKILL.md", "prompts/ship.md"} <= set(codex.files)
    toml = codex.config["config.toml"]
    assert 'base_url = "http://127.0.0.1:8900/v1"' in toml and 'wire_api = "responses"' in toml
    assert 'http_headers = { "x-reef-scenario" = "s", "x-reef-harness" = "s:v3" }' in toml
    assert 'env_http_headers = { "x-reef-session" = "REEF_SESSION"' in toml and 'env_key = "REEF_AGENT_KEY"' in toml
    opencode = render("opencode", load(FILES), b)
    assert {"AGENTS.md", "skill/tidy/SKILL.md", "command/ship.md"} <= set(opencode.files)
    options = json.loads(opencode.config["opencode.json"])["provider"]["reef"]["options"]
    assert options["headers"]["x-reef-session"] == "{env:REEF_SESSION}" and options["apiKey"] == "{env:REEF_AGENT_KEY}"
    pi = render("pi", load(FILES), b)
    assert {"AGENTS.md", "skills/tidy/SKILL.md", "prompts/ship.md"} <= set(pi.files)
    assert json.loads(pi.config["settings.json"]) == {"defaultProvider": "reef", "defaultModel": "m-1"}
    assert render("files", load(FILES), b).files == FILES and render("files", load(FILES), b).config == {}
    rel = parse_release(claude.release_text)
    assert rel["release"] == "s:v3" and rel["files"]["CLAUDE.md"] == hashlib.sha256(
        claude.files["CLAUDE.md"].encode()).hexdigest() and set(rel["config"]) == {"settings.json"}


def test_bad_bindings_and_name_clashes_are_refused(proxy):
    from reef_lab.errors import BadRequest, Conflict

    with pytest.raises(BadRequest, match="base_url"):
        Binding("http://x/'; rm -rf ~", "s", "s:v1", "m")
    with pytest.raises(BadRequest, match="model"):
        Binding("http://x", "s", "s:v1", "m\nx")
    with pytest.raises(Conflict, match="both become"):
        render("claude", load({"skills/a b.md": "x", "skills/a-b.md": "y"}), Binding("http://x", "s", "s:v1", "m"))
    u = proxy.url
    publish(u, FILES)
    for q, status, text in (("", 400, "adapter"), ("?adapter=vim", 400, "adapter"),
                            ("?adapter=claude&release_id=v9", 404, "no release"),
                            ("?adapter=claude&base_url=http://x/%22q", 400, "base_url"),
                            ("?adapter=claude&evil=1", 400, "unknown query")):
        r = requests.get(u + "/reef/harness/install" + q, headers=H)
        assert r.status_code == status and text in r.json()["error"]["message"], (q, r.text)


@pytest.mark.parametrize("adapter", ["claude", "codex", "opencode", "pi", "files"])
def test_the_script_is_sh_n_and_shellcheck_clean(proxy, tmp_path, adapter):
    publish(proxy.url, {**FILES, "skills/it's $(x).md": "quote ' and `tick` and $HOME"})
    path = tmp_path / "install.sh"
    path.write_text(script(proxy.url, adapter))
    for shell in SHELLS:
        done = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (Debian package shellcheck; bash scripts/setup.sh --agents)")
    done = subprocess.run(["shellcheck", "-s", "sh", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_install_rerun_update_and_dropped_files(proxy, tmp_path, shell):
    u = proxy.url
    publish(u, FILES)
    done = run_sh(script(u, "claude"), tmp_path, shell=shell)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "home" / "reef-harness" / "s" / "claude"  # the default root
    first = tree(folder)
    assert "RULE-ALPHA" in first["CLAUDE.md"] and ".reef-release" in first
    assert f"installed s:v1 for claude in {folder}" in done.stdout
    again = run_sh(script(u, "claude"), tmp_path, shell=shell)
    assert again.returncode == 0 and "already current: s:v1" in again.stdout and tree(folder) == first
    (folder / "commands" / "ship.md").write_text("tampered")  # a changed file: the same release is written again
    again = run_sh(script(u, "claude"), tmp_path, shell=shell)
    assert "installed s:v1" in again.stdout and tree(folder) == first
    v2 = {k: v for k, v in FILES.items() if k != "skills/tidy.md"} | {"rules.md": "- RULE-DELTA"}
    publish(u, v2)
    (folder / "projects").mkdir()
    (folder / "projects" / "agent-state.json").write_text("{}")  # the agent's own files stay
    done = run_sh(script(u, "claude"), tmp_path, shell=shell)
    assert done.returncode == 0, done.stderr
    assert "removed skills/tidy/SKILL.md (not in s:v2)" in done.stdout
    now = tree(folder)
    assert "skills/tidy/SKILL.md" not in now and not (folder / "skills" / "tidy").exists()
    assert "RULE-DELTA" in now["CLAUDE.md"] and "projects/agent-state.json" in now
    assert parse_release(now[".reef-release"])["release"] == "s:v2"
    assert "x-reef-harness: s:v2" in json.loads(now["settings.json"])["env"]["ANTHROPIC_CUSTOM_HEADERS"]
    done = run_sh(script(u, "claude", "v1"), tmp_path, shell=shell)  # back to v1: its files return
    assert done.returncode == 0 and tree(folder)["skills/tidy/SKILL.md"] == first["skills/tidy/SKILL.md"]


def test_hostile_contents_are_written_byte_for_byte_and_never_run(proxy, tmp_path):
    mark = tmp_path / "ran"
    nasty = {
        "system_prompt.md": f"$(touch {mark})\n`touch {mark}`\n'; touch {mark}; '\n\"$HOME\"\n",
        "rules.md": "EOF\nREEF_EOF\n'EOF'\n---\n\\\n%s %n %%\n",  # heredoc-delimiter lines, printf formats
        "skills/x.md": "no newline at the end",
        "notes/crlf.txt": "a\r\nb\r\n\u00e9\u4e2d\U0001F600\n",
        "skills/it's a \"name\" $(touch MARK).md": "odd name",
    }
    publish(proxy.url, nasty)
    done = run_sh(script(proxy.url, "files"), tmp_path)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "home" / "reef-harness" / "s" / "files"
    got = {k: v for k, v in tree(folder).items() if k != ".reef-release"}
    assert {k: (folder / k).read_bytes() for k in got} == {k: v.encode() for k, v in nasty.items()}
    assert not mark.exists() and not (tmp_path / "cwd" / "MARK").exists()


def hand_rendered(paths: dict[str, str]) -> str:
    """A script for names the server would refuse (rendered by hand): the script's own checks must stop them."""
    b = Binding("http://127.0.0.1:1", "s", "s:v1", "m")
    r = Rendered(dict(paths), {}, release_text("files", b, paths, {}))
    return render_script("files", "s", "s:v1", r)


@pytest.mark.parametrize("bad", ["../escaped", "a/../../escaped", "/tmp/escaped-abs", "a\nb", "a//b", "./a",
                                 "x/", "a\\b"])
def test_the_script_refuses_unsafe_names_itself(tmp_path, bad):
    root = tmp_path / "root"
    done = run_sh(hand_rendered({"ok.md": "fine", bad: "owned"}), tmp_path, str(root))
    assert done.returncode != 0 and "unsafe file name" in done.stderr, done.stderr
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/escaped-abs").exists()
    assert not (root / "files" / ".reef-release").exists()


def test_symbolic_links_in_the_install_root_are_refused(proxy, tmp_path):
    publish(proxy.url, FILES)
    text = script(proxy.url, "claude")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("safe")
    root = tmp_path / "root"
    (root / "claude").mkdir(parents=True)
    (root / "claude" / "skills").symlink_to(outside)  # a folder on the way
    done = run_sh(text, tmp_path, str(root))
    assert done.returncode != 0 and "symbolic link" in done.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert sorted(p.name for p in (root / "claude").iterdir()) == ["skills"]  # checked before anything is written
    (root / "claude" / "skills").unlink()
    (root / "claude" / "CLAUDE.md").symlink_to(outside / "victim")  # the file itself
    done = run_sh(text, tmp_path, str(root))
    assert done.returncode != 0 and "symbolic link" in done.stderr and (outside / "victim").read_text() == "safe"
    (root / "claude" / "CLAUDE.md").unlink()
    link = tmp_path / "linked-root"
    link.symlink_to(root)  # the root itself
    done = run_sh(text, tmp_path, str(link))
    assert done.returncode != 0 and "symbolic link" in done.stderr
    done = run_sh(text, tmp_path, str(root))  # no link left: it installs
    assert done.returncode == 0, done.stderr
    # an old release file that lists a path outside the root: the removal refuses it
    rel = root / "claude" / ".reef-release"
    rel.write_text(rel.read_text() + "file 00 ../../outside/victim\n")
    publish(proxy.url, {"rules.md": "- other"})
    done = run_sh(script(proxy.url, "claude"), tmp_path, str(root))
    assert done.returncode != 0 and "unsafe name" in done.stderr and (outside / "victim").read_text() == "safe"


def test_install_roots_inside_a_project_are_refused(proxy, tmp_path):
    publish(proxy.url, FILES)
    text = script(proxy.url, "codex")
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    done = run_sh(text, tmp_path, str(project / "sub" / "harness"), cwd=project)
    assert done.returncode != 0 and "inside the current folder" in done.stderr
    (project / ".git").mkdir()
    done = run_sh(text, tmp_path, str(project / "sub" / "harness"), cwd=tmp_path)
    assert done.returncode != 0 and "git work tree" in done.stderr
    done = run_sh(text, tmp_path, "relative/root")
    assert done.returncode != 0 and "absolute path" in done.stderr
    done = run_sh(text, tmp_path, str(tmp_path / "a" / ".." / "b"))
    assert done.returncode != 0 and "'..'" in done.stderr
    assert not (project / "sub" / "harness").exists() and not (tmp_path / "b").exists()
    home = tmp_path / "home"  # run from the home folder: the default root under it is fine
    done = run_sh(text, tmp_path, cwd=home)
    assert done.returncode == 0 and (home / "reef-harness" / "s" / "codex" / "AGENTS.md").exists(), done.stderr


def test_the_endpoint_needs_the_token(serve, stub_url):
    from reef_lab.engines.upstream import UpstreamEngine

    s = serve(UpstreamEngine(stub_url, timeout=2.0), tokens=["t0k"])
    auth = {"authorization": "Bearer t0k"}
    assert requests.post(s.url + "/reef/scenarios/s/harness", json={"files": FILES}, headers=auth).status_code == 201
    r = requests.get(s.url + "/reef/harness/install?adapter=claude", headers=H)
    assert r.status_code == 401
    r = requests.get(s.url + "/reef/harness/install?adapter=claude", headers={**H, "authorization": "Bearer no"})
    assert r.status_code == 401
    r = requests.get(s.url + "/reef/harness/install?adapter=claude", headers={**H, **auth})
    assert r.status_code == 200 and r.text.startswith("#!/bin/sh") and "t0k" not in r.text
