"""Imports flow one way (docs/architecture.md): the core imports no server, recipe, app or script; recipes import the core only,
and never one another; the server, apps and scripts sit on top; nothing outside tests/ imports tests/ (the doubles
are reef_lab.testing). Checked on every module's import statements."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("reef_lab", "server", "recipes", "apps", "scripts")
FORBIDDEN = {  # importer -> top-level names it may not import
    "reef_lab": {"server", "recipes", "apps", "scripts"},
    "recipes": {"server", "apps", "scripts"},
    "server": {"recipes", "apps", "scripts"},
    "apps": {"server", "scripts"},
}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every absolute import in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def violations(root: Path) -> list[str]:
    found = []
    for top in TOP:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            for line, module in imports(path):
                head = module.split(".")[0]
                if head in FORBIDDEN.get(top, set()):
                    found.append(f"{rel}:{line} imports {module} ({top} must not import {head})")
                if top == "recipes" and head == "recipes":
                    own, other = rel.parts[1], module.split(".")[1] if "." in module else ""
                    if other != own:
                        found.append(f"{rel}:{line} imports {module} (a recipe must not import another recipe)")
    return found


def test_imports_flow_one_way():
    assert violations(ROOT) == []


def imports_of_tests(root: Path) -> list[str]:
    """`file:line imports module` of every import of the `tests` package outside tests/: the doubles the scripts,
    apps and plug-ins share are reef_lab.testing; a helper of one test file is not another folder's to import
    (issue 51: twelve scripts imported tests/, one of them a test module)."""
    return [f"{path.relative_to(root)}:{line} imports {module}" for top in TOP
            for path in sorted((root / top).rglob("*.py")) for line, module in imports(path)
            if module == "tests" or module.startswith("tests.")]


def test_nothing_outside_tests_imports_tests():
    assert imports_of_tests(ROOT) == [], "import the doubles from reef_lab.testing"


def test_the_tests_import_check_sees_a_script_that_imports_tests(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "scripts" / "bench").mkdir()
    (tmp_path / "scripts" / "bench" / "b.py").write_text("import os\nfrom tests.conftest import Running\n")
    (tmp_path / "reef_lab" / "x.py").write_text("def f():\n    import tests.test_vllm_engine\nimport testsuite\n")
    assert imports_of_tests(tmp_path) == ["reef_lab/x.py:2 imports tests.test_vllm_engine",
                                          "scripts/bench/b.py:2 imports tests.conftest"]


def test_the_doubles_import_light():
    """reef_lab.testing is part of the SDK (plug-in authors test against the same doubles): importing it, or any of
    its modules, loads no torch (vllm_scoring imports it where it runs) and none of the repository's other folders."""
    import subprocess
    import sys

    modules = sorted(p.stem for p in (ROOT / "reef_lab" / "testing").glob("*.py") if p.stem != "__init__")
    code = ("import sys, reef_lab.testing\n" + "".join(f"import reef_lab.testing.{m}\n" for m in modules) +
            "print(sorted(m for m in ('torch', 'transformers', 'server', 'scripts', 'recipes', 'tests', 'apps') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def test_the_check_fails_on_a_forbidden_import(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "reef_lab" / "core.py").write_text("import os\nfrom server.app import create_app\n")
    (tmp_path / "recipes" / "a").mkdir()
    (tmp_path / "recipes" / "a" / "recipe.py").write_text("from recipes.a.helper import x\nfrom recipes.b import y\n")
    (tmp_path / "server" / "x.py").write_text("from reef_lab import gateway\nimport recipes.sft\n")
    found = violations(tmp_path)
    assert found == ["reef_lab/core.py:2 imports server.app (reef_lab must not import server)",
                     "server/x.py:2 imports recipes.sft (server must not import recipes)",
                     "recipes/a/recipe.py:2 imports recipes.b (a recipe must not import another recipe)"]


def test_no_capability_probes_in_the_gateway_and_learners():
    """Engines and recipes are asked for what they can do by type (isinstance on the capability classes) and by
    what their protocol declares (`evolves`), never by probing attributes."""
    import re

    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("reef_lab/gateway/*.py"), *root.glob("reef_lab/learning/*.py"),
             *root.glob("recipes/*/learner.py"), root / "reef_lab/engines/lm.py", root / "reef_lab/config.py",
             root / "reef_lab/service.py"]
    probes = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"\bhasattr\(", line) or re.search(r"\bgetattr\(\s*(self\.)?_?(engine|recipe|learner|ln)\b", line):
                probes.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    assert probes == []


RELEASE_WRITERS = {"new_candidate", "update_candidate", "publish_candidate", "set_serving", "update_release",
                   "update_index"}
ROUTING = {"load_release", "route", "unload"}
RELEASE_OWNERS = {"reef_lab/publishing/releaser.py", "reef_lab/publishing/releases.py"}


def release_path_violations(root: Path) -> list[str]:
    """Calls that write the release index (a ReleaseStore writer) or change what an engine serves (load, route,
    unload a release) anywhere in the core, the recipes or the server but the releaser: a candidate becomes the
    serving release one way only. Engines implement routing, and so do the doubles that play engine servers
    (reef_lab/testing/)."""
    found = []
    for top in ("reef_lab", "recipes", "server"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in RELEASE_OWNERS or rel.startswith(("reef_lab/engines/", "reef_lab/testing/")):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in RELEASE_WRITERS | ROUTING:
                    found.append(f"{rel}:{node.lineno} calls .{node.func.attr}()")
    return found


def test_one_release_path():
    assert release_path_violations(ROOT) == []


def test_the_release_path_check_fails_on_a_second_writer(tmp_path):
    (tmp_path / "recipes" / "x").mkdir(parents=True)
    (tmp_path / "reef_lab" / "publishing").mkdir(parents=True)
    (tmp_path / "server").mkdir()
    (tmp_path / "recipes" / "x" / "learner.py").write_text(
        "def go(ctx):\n    ctx.releases.publish_candidate('s', 'c1')\n    ctx.engine.route('s', 'v1')\n")
    (tmp_path / "reef_lab" / "publishing" / "releaser.py").write_text("def ok(store):\n    store.set_serving()\n")
    assert release_path_violations(tmp_path) == ["recipes/x/learner.py:2 calls .publish_candidate()",
                                                 "recipes/x/learner.py:3 calls .route()"]


def layer_violations(root: Path) -> list[str]:
    """The rooms inside the core: learners and recipes reach the deployment through their LearnContext, never the
    gateway; the dialects' codecs are reef_lab.wire, which imports nothing above the engines; tasks import no
    learner (learning uses them);
    trainers import no learning code (Sample and the token losses are theirs); a recipe's experiment runs on the shared driver
    (reef_lab.experiments), which opens its scenario for it; the records sit under everything (neither the gateway
    nor learning); publishing is below the gateway."""
    rules = [("reef_lab/wire", ("reef_lab.gateway", "reef_lab.learning", "reef_lab.experiments", "reef_lab.publishing",
                                "reef_lab.records", "reef_lab.harness", "reef_lab.tasks", "reef_lab.trainers",
                                "reef_lab.config", "reef_lab.service", "reef_lab.tenants"), ()),
             ("reef_lab/learning", ("reef_lab.gateway", "reef_lab.experiments"), ()),
             ("reef_lab/tasks", ("reef_lab.learning", "reef_lab.gateway", "reef_lab.experiments", "reef_lab.publishing"),
              ()),
             ("reef_lab/trainers", ("reef_lab.learning", "reef_lab.gateway", "reef_lab.experiments",
                                    "reef_lab.publishing", "reef_lab.tasks"), ()),
             ("recipes", ("reef_lab.gateway", "reef_lab.experiments"), ()),
             ("reef_lab/records", ("reef_lab.gateway", "reef_lab.learning", "reef_lab.experiments"), ()),
             ("reef_lab/publishing", ("reef_lab.gateway", "reef_lab.experiments"), ())]
    found = []
    for folder, banned, allowed in rules:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            ok = (*allowed, "reef_lab.experiments.driver") if rel.endswith("/experiment.py") else allowed
            for line, module in imports(path):
                if module.startswith(banned) and not module.startswith(ok):
                    found.append(f"{rel}:{line} imports {module}")
    return found


def test_learners_and_recipes_do_not_import_the_gateway_and_records_sit_under_everything():
    assert layer_violations(ROOT) == []


def test_the_layer_check_fails_on_a_learner_that_imports_the_gateway(tmp_path):
    (tmp_path / "recipes" / "x").mkdir(parents=True)
    (tmp_path / "reef_lab" / "records").mkdir(parents=True)
    (tmp_path / "recipes" / "x" / "learner.py").write_text(
        "from reef_lab.gateway.gateway import Gateway\nfrom reef_lab.wire.dialects import response_text\n")
    (tmp_path / "reef_lab" / "wire").mkdir(parents=True)
    (tmp_path / "reef_lab" / "wire" / "x.py").write_text("from reef_lab.gateway.replies import Reply\n")
    (tmp_path / "reef_lab" / "records" / "export.py").write_text("import reef_lab.learning.learner\n")
    (tmp_path / "reef_lab" / "tasks").mkdir(parents=True)
    (tmp_path / "reef_lab" / "tasks" / "x.py").write_text("from reef_lab.learning.learner import Learner\n")
    assert layer_violations(tmp_path) == ["reef_lab/wire/x.py:1 imports reef_lab.gateway.replies",
                                          "reef_lab/tasks/x.py:1 imports reef_lab.learning.learner",
                                          "recipes/x/learner.py:1 imports reef_lab.gateway.gateway",
                                          "reef_lab/records/export.py:1 imports reef_lab.learning.learner"]


EXPERIMENT_CONTEXT = {"ExperimentContext", "open_experiment"}  # all of reef_lab.service experiment code may use


def experiment_violations(root: Path) -> list[str]:
    """Experiment drivers (reef_lab/experiments/, a recipe's experiment.py) reach their deployment through the
    ExperimentContext the driver opens (reef_lab.service.open_experiment), as learners do through their LearnContext:
    they import no reef_lab.gateway module (nor the gateway from reef_lab), take nothing but the context from
    reef_lab.service, and hold no gateway object (`gw`, `Gateway`) whose internals they could reach (issue 40)."""
    files = [*sorted((root / "reef_lab" / "experiments").rglob("*.py")),
             *sorted((root / "recipes").glob("*/experiment.py"))]
    found = []
    for path in files:
        rel, lines = path.relative_to(root).as_posix(), []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("reef_lab.gateway") or a.name == "reef_lab.service":
                        lines.append((node.lineno, f"imports {a.name}"))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {a.name for a in node.names}
                if node.module.startswith("reef_lab.gateway") or (
                        node.module == "reef_lab" and names & {"gateway", "service"}) or (
                        node.module == "reef_lab.service" and names - EXPERIMENT_CONTEXT):
                    lines.append((node.lineno, f"imports {', '.join(sorted(names))} from {node.module}"))
            elif isinstance(node, ast.Name) and node.id in ("gw", "Gateway") or \
                    isinstance(node, ast.Attribute) and node.attr == "gw":
                lines.append((node.lineno, f"holds the gateway ({ast.unparse(node)})"))
        found += [f"{rel}:{line} {what}" for line, what in sorted(set(lines))]
    return found


def test_experiment_drivers_get_a_context_not_the_gateway():
    assert experiment_violations(ROOT) == []


def test_the_experiment_check_fails_on_a_driver_that_holds_the_gateway(tmp_path):
    (tmp_path / "reef_lab" / "experiments").mkdir(parents=True)
    (tmp_path / "recipes" / "x").mkdir(parents=True)
    (tmp_path / "reef_lab" / "experiments" / "d.py").write_text(
        "def f(self):\n    from reef_lab.gateway.gateway import Gateway\n    self.gw.releaser.index('s')\n")
    (tmp_path / "recipes" / "x" / "experiment.py").write_text(
        "from reef_lab.service import ExperimentContext, build_gateway\nfrom reef_lab import service\n"
        "def loop(ctx: ExperimentContext, gw):\n    return ctx.releases()['serving'], gw.store\n")
    assert experiment_violations(tmp_path) == [
        "reef_lab/experiments/d.py:2 imports Gateway from reef_lab.gateway.gateway",
        "reef_lab/experiments/d.py:3 holds the gateway (self.gw)",
        "recipes/x/experiment.py:1 imports ExperimentContext, build_gateway from reef_lab.service",
        "recipes/x/experiment.py:2 imports service from reef_lab",
        "recipes/x/experiment.py:4 holds the gateway (gw)"]


def test_scripts_and_apps_do_not_touch_sys_path():
    """They import the repository's folders as packages: scripts/setup.sh puts the repository root on its venv's
    path (a .pth file), so no script or app edits sys.path to find them."""
    found = [f"{p.relative_to(ROOT)}:{n}" for top in ("scripts", "apps") for p in sorted((ROOT / top).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "sys.path.insert" in line or "sys.path.append" in line]
    assert found == []


def test_the_repository_folders_import_from_anywhere_in_its_venv(tmp_path):
    import subprocess
    import sys

    code = "import recipes.sft, server.app, apps.launch, scripts.run_experiment, reef_lab.testing; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Room -> the rooms it imports: a room is a package under reef_lab/ or one of its top-level modules; every
    absolute `reef_lab.X` import in any of its modules (function-level ones too) counts."""
    graph: dict[str, set[str]] = {}
    for path in sorted((root / "reef_lab").rglob("*.py")):
        parts = path.relative_to(root / "reef_lab").parts
        room = parts[0].removesuffix(".py")
        modules = [m for _, m in imports(path)] + [  # `from reef_lab import procs` names the room procs
            f"reef_lab.{a.name}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "reef_lab" for a in node.names]
        for module in modules:
            names = module.split(".")
            if names[0] == "reef_lab" and len(names) > 1 and names[1] != room and room != "__init__":
                graph.setdefault(room, set()).add(names[1])
    return graph


def documented_graph(text: str) -> dict[str, set[str]]:
    block = text.split("```imports\n", 1)[1].split("```", 1)[0]
    return {room.strip(): set(targets.split()) for room, targets in
            (line.split("->") for line in block.splitlines() if line.strip())}


def test_architecture_md_is_the_import_graph():
    """docs/architecture.md's table is the code's import graph between rooms: an arrow added or removed in the code
    is added or removed there in the same commit."""
    documented = documented_graph((ROOT / "docs" / "architecture.md").read_text())
    actual = import_graph(ROOT)
    missing = {r: sorted(t - documented.get(r, set())) for r, t in actual.items() if t - documented.get(r, set())}
    stale = {r: sorted(t - actual.get(r, set())) for r, t in documented.items() if t - actual.get(r, set())}
    assert not missing and not stale, (f"docs/architecture.md's import table is out of date: imports not listed "
                                       f"{missing}; listed but no longer imported {stale}")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles between rooms: each strongly connected set of more than one room (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_rooms():
    """Every arrow between rooms points one way (issue 51: records -> publishing -> records and config -> tenants ->
    config closed circles): a room never imports, at any depth, one that imports it."""
    assert cycles(import_graph(ROOT)) == []


def test_the_cycle_check_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_architecture_check_sees_a_new_arrow(tmp_path):
    (tmp_path / "reef_lab" / "records").mkdir(parents=True)
    (tmp_path / "reef_lab" / "records" / "store.py").write_text("def f():\n    from reef_lab.gateway import x\n")
    (tmp_path / "reef_lab" / "errors.py").write_text("import os\nfrom reef_lab import procs\n")
    assert import_graph(tmp_path) == {"records": {"gateway"}, "errors": {"procs"}}
    assert documented_graph("x\n```imports\nrecords -> errors\n```\n") == {"records": {"errors"}}


def test_one_tool_call_parser():
    """Generated text is read for tool calls in one place, reef_lab/engines/tools.py: no other module compiles a
    pattern for, or scans text by, the `<tool_call>` tag (issue 40: the tool tasks had a second parser)."""
    import re

    scans = re.compile(r"(re\.(compile|finditer|findall|search|match|split)\([^)]*tool_call)|"
                       r"(\.(find|index|split|partition)\([^)]*<tool_call>)")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "reef_lab").rglob("*.py"))
             if p != ROOT / "reef_lab" / "engines" / "tools.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if scans.search(line)]
    assert found == []
    assert scans.search('TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)")')  # what the old second parser did


def test_the_dialect_names_are_spelled_once():
    """reef_lab.wire names the dialects; the records' allowed values and the upstream engine's `--upstream-dialect`
    words map onto exactly those names, and no other module spells them as string literals (but the doubles in
    reef_lab/testing/, which write the wire as a client or provider does)."""
    import re

    from reef_lab import wire
    from reef_lab.engines.upstream import UPSTREAM_DIALECTS
    from reef_lab.records.record import DIALECTS

    assert set(UPSTREAM_DIALECTS.values()) == set(wire.DIALECTS) and set(DIALECTS) == {*wire.DIALECTS, ""}
    spelled = re.compile(r"[\"'](openai\.chat|openai\.responses|anthropic\.messages)[\"']")
    found = [f"{p.relative_to(ROOT)}:{n}" for top in ("reef_lab", "server", "recipes", "apps")
             for p in sorted((ROOT / top).rglob("*.py"))
             if p not in (ROOT / "reef_lab" / "wire" / "__init__.py", ROOT / "reef_lab" / "engines" / "upstream.py")
             and not p.is_relative_to(ROOT / "reef_lab" / "testing")
             for n, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert found == []


# The wire's own words: keys and event names that exist only in one of the client dialects. A module that spells one
# reads or writes that dialect itself instead of going through reef_lab.wire (issue 40).
DIALECT_WORDS = {"tool_use", "tool_result", "tool_use_id", "function_call", "function_call_output", "custom_tool_call",
                 "input_text", "output_text", "content_block_start", "content_block_delta", "content_block_stop",
                 "message_start", "message_delta", "message_stop", "response.created", "response.completed",
                 "response.output_text.delta", "finish_reason", "stop_reason", "chat.completion",
                 "chat.completion.chunk"}
CHAT_CHOICE = re.compile(r"""["']choices["']\]\s*\[0\]|get\(["']choices["']\)""")  # a chat answer's first choice


def dialect_readers(root: Path) -> list[str]:
    """Modules outside reef_lab/wire/ that read or write a client dialect by hand. The engines are left out: they
    speak their model servers' own APIs (vLLM's /v1/completions, SGLang's /generate), below the wire. So are the
    doubles (reef_lab/testing/): a provider double and the fuzzer write each wire format by hand from its
    documentation, so that a test against them checks reef_lab.wire against a second, independent reading."""
    found = []
    for top in ("reef_lab", "server", "recipes", "apps"):
        for p in sorted((root / top).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            if rel.startswith(("reef_lab/wire/", "reef_lab/engines/", "reef_lab/testing/")):
                continue
            src = p.read_text()
            found += [f"{rel}:{node.lineno} {node.value!r}" for node in ast.walk(ast.parse(src))
                      if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in DIALECT_WORDS]
            found += [f"{rel}:{n} choices[0]" for n, line in enumerate(src.splitlines(), 1) if CHAT_CHOICE.search(line)]
    return found


def test_no_module_outside_the_wire_reads_or_writes_a_dialect():
    """Learners, the harness, the apps and the gateway get a record's text through reef_lab.wire.text and write
    answers and events through reef_lab.wire (issue 40: apps/conversation.py, the records app, the GEPA learner,
    the releaser and the relay each read the dialects their own way)."""
    assert dialect_readers(ROOT) == []


def test_the_dialect_check_sees_a_module_that_reads_a_dialect(tmp_path):
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "view.py").write_text(
        'def answer(resp):\n    msg = resp["choices"][0]["message"]\n'
        '    return [b for b in resp["content"] if b.get("type") == "tool_use"]\n')
    (tmp_path / "reef_lab" / "engines").mkdir(parents=True)
    (tmp_path / "reef_lab" / "engines" / "vllm.py").write_text('x = chunk.get("choices") or [{}]\n')
    assert dialect_readers(tmp_path) == ["apps/view.py:3 'tool_use'", "apps/view.py:2 choices[0]"]


def test_the_embedded_engine_is_one_module_per_job():
    """Issue 40: engines/embedded.py was 951 lines (loading, GGUF cache, text, sampling, scheduler and engine in one
    class of 41 methods); the package holds one module per job, each a few hundred lines."""
    folder = ROOT / "reef_lab" / "engines" / "embedded"
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(folder.glob("*.py"))}
    assert {"loading.py", "engine.py", "scheduler.py", "sampling.py", "stream.py"} <= set(sizes), sizes
    assert max(sizes.values()) <= 400, sizes


def test_a_generation_call_is_a_class_beside_the_relay_call():
    """Issue 40: `Inference._generate` was 91 lines with five closures sharing its locals; a generation is a
    `GenerationCall` (reef_lab/gateway/generation.py), its state in fields, as a relay is a `RelayCall`."""
    gateway = ROOT / "reef_lab" / "gateway"
    nested = []
    for path in [gateway / "inference.py", gateway / "generation.py", gateway / "relay.py"]:
        functions = [f for f in ast.walk(ast.parse(path.read_text())) if isinstance(f, ast.FunctionDef)] \
            if path.is_file() else []
        nested += [f"{path.name}: {inner.name} in {outer.name}" for outer in functions for inner in ast.walk(outer)
                   if inner is not outer and isinstance(inner, ast.FunctionDef)]
    assert nested == []
    assert "class GenerationCall:" in (gateway / "generation.py").read_text()
