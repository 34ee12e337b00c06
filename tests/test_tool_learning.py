"""Learning a tool task: demonstrations templated exactly as the engine serves them, imported as `train` records
with token ids, and the SFT recipe training a release from them that then writes the demonstrated tool call.

The tiny random Llama of conftest.py learns one calculator call from imported demonstration turns through the real
gateway (import, POST-train equivalent, candidate, release routed), and the release answers the demonstrated item
with a `tool_calls` reply that the task's verifier accepts as valid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.engines.remote import ChatTokenizer
from reef_lab.engines.tools import ToolUse, parse_turn
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.learner import read_metrics
from reef_lab.tasks.base import make_task
from reef_lab.tasks.demos import calculator_episode, turn_records

FORMS = ["a + b", "a * b", "(a + b) * c", "a * b + c"]


@pytest.fixture(scope="module")
def calc():
    return make_task({"name": "calculator", "options": {"forms": FORMS}})


def test_calculator_demonstrations_are_correct_episodes(calc):
    items = calc.items(24, seed=3)
    assert {it["expression"].count(" ") for it in items} >= {2, 4}  # one- and two-operation forms drawn
    for item in items:
        transcript = calculator_episode(item)
        verdict = calc.score_episode(item, transcript)
        assert verdict.score == 1.0 and verdict.invalid_calls == 0, (item["expression"], verdict.feedback)
        assert verdict.valid_calls == (2 if "(" in item["expression"] or item["expression"].count(" ") == 4 else 1)


def test_demonstration_turns_are_the_served_tokens(calc, tokenizer):
    """Each turn's prompt is the engine's prompt for that history (tools included), its completion parses back into
    the demonstrated call, and prompt + completion is a prefix of the next turn's prompt: the tokens SFT trains on
    are the tokens the served conversation holds."""
    chat = ChatTokenizer(tokenizer, tokenizer.eos_token_id)
    item = next(it for it in calc.items(40, seed=4) if it["expression"].startswith("("))
    transcript = calculator_episode(item)
    records = turn_records(chat, item, transcript, "s")
    assert [r["kind"] for r in records] == ["train"] * 3 and all(r["scenario"] == "s" for r in records)
    assert "<tools>" in tokenizer.decode(records[0]["prompt_token_ids"])  # the tool template, not the plain one
    assert records[0]["prompt_token_ids"] == chat.prompt_ids(item["messages"], item["tools"])
    for r, turn in zip(records, [m for m in transcript if m["role"] == "assistant"]):
        assert r["token_ids"][-1] == tokenizer.eos_token_id
        text = tokenizer.decode(r["token_ids"][:-1])
        parsed = _parse(text, item["tools"])
        want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn.get("tool_calls", [])]
        assert parsed["calls"] == want and (parsed["text"] == (turn.get("content") or "")), (text, parsed)
    for a, b in zip(records, records[1:]):
        joined = a["prompt_token_ids"] + a["token_ids"]
        assert b["prompt_token_ids"][:len(joined)] == joined


def _parse(text: str, tools: list[dict]) -> dict:
    turn = parse_turn(ToolUse(tools), text)
    return {"calls": [(c.name, c.arguments) for c in turn.calls], "text": "".join(turn.texts).strip(),
            "errors": turn.errors}


def test_sft_release_writes_the_demonstrated_call(tiny_model_dir, tokenizer, tmp_path):
    """Imported demonstration turns (token ids as given) train release v1 in manual mode; the release answers the
    item through the gateway with a tool call the verifier accepts, where the base model wrote none."""
    calc = make_task({"name": "calculator", "options": {"min_digits": 1, "max_digits": 2, "forms": ["a + b"]}})
    item = calc.items(1, seed=7)[0]
    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=4))
    try:
        steps = 25
        gw.create_scenario({"name": "s", "recipe": "sft", "config": {
            "mode": "manual", "batch_size": 4, "steps_per_candidate": steps,
            "trainer": {"lr": 3e-3, "micro_batch_size": 4}}})
        body = {"model": "tiny", "messages": item["messages"], "tools": item["tools"], "max_tokens": 40,
                "temperature": 0}
        before = json.loads(gw.infer("openai.chat", body, "s").body)["choices"][0]["message"]
        assert not before.get("tool_calls")
        chat = ChatTokenizer(tokenizer, tokenizer.eos_token_id)
        call_turn = turn_records(chat, item, calculator_episode(item), "s")[0]
        gw.import_records({"records": [{**call_turn, "tags": {"copy": str(i)}} for i in range(4 * steps)]})
        for _ in range(steps):
            gw.train("s")
        ln = gw.learner("s")
        assert ln.wait_idle(600) and ln.last_error is None, ln.status()
        assert gw.list_releases("s")["serving"] == "s:v1"
        losses = [m["loss"] for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
        assert len(losses) == steps and losses[-1] < losses[0] / 4, losses
        reply = gw.infer("openai.chat", body, "s")
        assert reply.headers["x-reef-release-id"] == "s:v1"
        msg = json.loads(reply.body)["choices"][0]["message"]
        transcript = [{"role": "assistant", "content": msg.get("content"), "tool_calls": msg.get("tool_calls")}]
        verdict = calc.score_episode(item, transcript)
        assert verdict.valid_calls == 1 and verdict.invalid_calls == 0, (msg, verdict.feedback)
        a, b = map(int, item["expression"].split(" + "))
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
            ("add", {"a": a, "b": b})]
    finally:
        gw.close()


def test_a_tool_demonstration_without_token_ids_is_not_trained(tiny_model_dir, tmp_path):
    """A `train` record with tools but no token ids would be templated without its tools (the learner cannot see
    the dialect's tool form): it becomes no sample, rather than a sample whose prompt the model is never served."""
    calc = make_task({"name": "calculator"})
    item = calc.items(1, seed=1)[0]
    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=4))
    try:
        gw.create_scenario({"name": "s", "recipe": "sft", "config": {"mode": "manual", "batch_size": 1}})
        gw.import_records({"records": [{"kind": "train", "scenario": "s", "request": {
            "messages": item["messages"], "tools": item["tools"]}, "response": {"content": item["answer"]}},
            {"kind": "train", "scenario": "s", "request": {"messages": item["messages"]},
             "response": {"content": item["answer"]}}]})
        ln = gw.learner("s")
        assert ln.wait_idle(60)
        assert ln.status()["pool"] == 1  # the plain demonstration only
    finally:
        gw.close()


def run_learn_script(tmp_path, sft_lr: str, grpo: str, *args: str) -> tuple[dict, Path]:
    """scripts/studies/learn_tool_task.py, seed 0, 2 held-out items per task, 8 demonstration turns in 2 SFT steps, the
    GRPO config `grpo` (a YAML mapping's lines); returns the result file's content and the pages' path."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    config = tmp_path / "sft.yaml"
    config.write_text("mode: manual\nbatch_size: 4\nsteps_per_candidate: 2\nselection: always\n"
                      f"trainer: {{lr: {sft_lr}, micro_batch_size: 4}}\n")
    (tmp_path / "grpo.yaml").write_text(grpo)
    out = tmp_path / "learn"
    subprocess.run([sys.executable, str(root / "scripts" / "studies" / "learn_tool_task.py"), "--seeds", "0", "--n", "2",
                    "--demos", "6", "--samples", "8", "--recipe-config", str(config), "--data-dir",
                    str(tmp_path / "data"), "--out", str(out), "--policy", "grpo", "--policy-config",
                    str(tmp_path / "grpo.yaml"), "--concurrency", "8", "--max-tokens", "24", *args],
                   cwd=root, check=True, timeout=1800)
    return json.loads(Path(f"{out}.json").read_text()), out


@pytest.mark.heavy
@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_learn_tool_task_script_end_to_end(tiny_model_dir, tmp_path, client):
    """scripts/studies/learn_tool_task.py on the tiny model: serve.py children, base episodes, demonstrations imported and
    trained into v1 over HTTP, the release's episodes served by v1 and reported on their receipts (the script stops on
    a refused report); then the GRPO stage from that release in two rounds, the second sampled from the release the
    first made: sampled episodes reported per episode, trained as episode samples into releases, the last of which
    serves the held-out episodes, a run folder the SAO app opens with the
    reports' numbers per step; the pages written. Every episode runs through the OpenAI SDK's tool loop or the
    Anthropic SDK's (/v1/messages, tool_use and tool_result blocks: the records say which dialect served them)."""
    result, out = run_learn_script(
        tmp_path, "1.0e-3", "group_size: 4\nbatch_size: 8\nsteps_per_candidate: 1\nmax_staleness: 8\n"
        "selection: always\ntrainer: {lr: 1.0e-3, micro_batch_size: 4}\n", "--model-path", str(tiny_model_dir),
        "--rollouts", "8", "--rounds", "2", "--client", client)
    run = result["runs"]["tools-sft-s0"]
    assert run["release"] == "tools-sft-s0:v1" and run["demo_turns"] == 8 and len(run["losses"]) == 2
    for task in ("calculator", "calculator-unseen", "bfcl", "colors"):
        assert result["runs"]["base"]["eval"][task]["n"] == 2
        episodes = run["eval"][task]["episodes"]
        assert all(e["releases"] == ["tools-sft-s0:v1"] and e["receipts"] for e in episodes)
    policy = result["runs"]["tools-grpo-s0"]
    assert policy["release"] == "tools-grpo-s0:v2" and policy["from"].endswith("tools-sft-s0/v1")
    assert policy["reported"] == 16 == policy["rollouts"]
    assert len(policy["steps"]) == 2 and all(st["report_correct"] is not None for st in policy["steps"])
    for task in ("calculator", "calculator-unseen", "bfcl", "colors"):
        assert all(e["releases"] == ["tools-grpo-s0:v2"] for e in policy["eval"][task]["episodes"])
    assert "calculator" in result["summary"]["tools-grpo/calculator"]["task"]
    assert "gain_over_sft" in result["summary"]["tools-grpo/calculator"]
    rollouts = [json.loads(line) for line in (Path(policy["run_dir"]) / "rollouts.jsonl").read_text().splitlines()]
    # two rounds of 8: the second sampled from the release the first made (on-policy)
    assert sorted(r["k"] for r in rollouts) == list(range(16))
    assert {r["release"] for r in rollouts if r["k"] < 8} == {"base"}
    assert {r["release"] for r in rollouts if r["k"] >= 8} == {"tools-grpo-s0:v1"}
    from tests.test_apps import load_module

    shown = load_module("sao").load_run(policy["run_dir"])
    assert shown["rollouts_done"] == 16 and shown["steps"].height == 2 and "report_correct" in shown["reported"]
    assert shown["status"] == "finished" and shown["releases"].height == 2
    from reef_lab.records.store import RecordStore

    store = RecordStore(Path(policy["run_dir"]) / "data")
    try:
        dialects = {r["dialect"] for r in store.get_many(store.ids("tools-grpo-s0", "inference"))}
    finally:
        store.close()
    assert dialects == {ANTHROPIC if client == "anthropic" else OPENAI_CHAT}, dialects
    assert "<!-- tables" in Path(f"{out}.md").read_text() and Path(f"{out}.png").is_file()


@pytest.mark.heavy
def test_the_sft_stage_gives_the_same_losses_twice(tiny_model_dir, tmp_path):
    """Issue 39: the SFT stage of learn_tool_task.py at the same seed, twice: the same step losses (before, the
    imported demonstrations reached the learner in a different order each run)."""
    sft = "mode: manual\nbatch_size: 4\nsteps_per_candidate: 2\nselection: always\n"
    losses = []
    for k in range(2):
        (tmp_path / f"run{k}").mkdir()
        result, _ = run_learn_script(tmp_path / f"run{k}", "1.0e-3", sft, "--model-path", str(tiny_model_dir),
                                     "--policy", "none", "--no-base", "--tasks", "calculator")
        losses.append(result["runs"]["tools-sft-s0"]["losses"])
    assert len(losses[0]) == 2 and losses[0] == losses[1], losses


@pytest.mark.heavy
@pytest.mark.vllm
def test_learn_tool_task_policy_stage_on_vllm(tmp_path):
    """The policy stage with `--policy-engine vllm`: a vLLM CPU server on the SFT release's folder samples the
    rollouts, the learner trains a LoRA release that vLLM reloads in place, and that release runs the held-out
    episodes; before the rollouts the SFT weights run them on vLLM too (run tools-sft-vllm-s0), the policy's
    start on its own engine. On the real SmolLM2 (vLLM's CPU attention has no kernel for the tiny Llama's head
    size 16)."""
    from reef_lab.engines.vllm import DEFAULT_PYTHON

    if not DEFAULT_PYTHON.is_file():
        pytest.skip("vLLM is not installed: bash scripts/setup.sh --vllm")
    result, _ = run_learn_script(
        tmp_path, "1.0e-4", "group_size: 4\nbatch_size: 8\nsteps_per_candidate: 2\nmax_staleness: 8\n"
        "selection: always\ntrainer: {lr: 3.0e-4, micro_batch_size: 4, lora_rank: 4}\n", "--policy-engine", "vllm",
        "--rollouts", "16")
    start, policy = result["runs"]["tools-sft-vllm-s0"], result["runs"]["tools-grpo-vllm-s0"]
    assert start["engine"] == policy["engine"] == "vllm" and policy["from"].endswith("tools-sft-s0/v1")
    assert policy["release"] == "tools-grpo-vllm-s0:v1" and policy["reported"] == 16 == policy["rollouts"]
    assert len(policy["steps"]) == 2
    for task in ("calculator", "bfcl"):
        assert all(e["releases"] == ["base"] and e["receipts"] for e in start["eval"][task]["episodes"])
        assert all(e["releases"] == ["tools-grpo-vllm-s0:v1"] for e in policy["eval"][task]["episodes"])
    # the policy paired with its start on vLLM; the start with the same SFT release on the embedded engine
    summary = result["summary"]
    assert "gain_over_sft" in summary["tools-grpo-vllm/calculator"] and "gain_over_sft" in summary[
        "tools-sft-vllm/calculator"]
    # vLLM served them, holding the LoRA release's merged weights at the end (the weights transport)
    assert policy["served_by"]["engine"] == "vllm" and policy["served_by"]["weights_serving"] == policy["release"]


def test_a_run_refuses_a_data_dir_with_an_earlier_runs_records(tmp_path):
    """Rerunning a seed into the data dir of an earlier (say, killed) run would start the server on that run's
    records and train on them too: the learning scripts refuse such a folder and say what to do."""
    from scripts.studies.learn_tool_task import fresh_dir

    run = tmp_path / "seed-0" / "grpo"
    assert fresh_dir(run) == run and run.is_dir()
    (run / "records").mkdir()
    assert fresh_dir(run) == run  # an empty records folder: nothing learned from yet
    (run / "records" / "grpo-s0.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit, match="holds an earlier run's records: remove that folder"):
        fresh_dir(run)
