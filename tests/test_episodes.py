"""Episodes: an agent's calls grouped by its session, read back in turn order, and assembled into one training sample
with loss only on the tokens the model generated; refused and cancelled calls recorded and never trained.

The two-turn tool loops run through the official SDKs against the embedded engine serving the tiny tool model of
tests/tool_model.py (real generations, the engine's own templating), as tests/test_tool_calls.py does.
"""

from __future__ import annotations

import logging
from collections import Counter

import anthropic
import openai
import pytest
import requests

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway import episodes as sessions
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.episodes import EpisodeConfig, samples_for_report
from reef_lab.learning.learner import read_metrics
from reef_lab.wire.dialects import engine_request
from reef_lab.errors import BadRequest
from tests.conftest import Running
from tests.test_tool_calls import Client

TOOL_RESULT = "sunny, 21 C"


@pytest.fixture(scope="module")
def server(tool_model, tokenizer, tmp_path_factory):
    r = Running(Gateway(tmp_path_factory.mktemp("episodes"), EmbeddedEngine(tool_model, tokenizer, "tiny",
                                                                           max_batch=8)))
    yield r
    r.stop()


def session_client(url: str, dialect: str, scenario: str, session: str) -> Client:
    c = Client(url, dialect, scenario)
    h = {"x-reef-scenario": scenario, "x-reef-session": session}
    c.oai = openai.OpenAI(base_url=url + "/v1", api_key="x", default_headers=h, max_retries=0)
    c.an = anthropic.Anthropic(base_url=url, api_key="x", default_headers=h, max_retries=0)
    return c


def tool_loop(c: Client, stream: bool, history_edit=None) -> None:
    """Call -> tool result -> answer; `history_edit` may rewrite the history before the second call."""
    history = [c.user("Weather in Paris?")]
    text, calls, _ = c.ask(history, stream)
    assert [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Paris"})]
    history += c.answered(calls, text, [TOOL_RESULT])
    if history_edit is not None:
        history_edit(history)
    c.ask(history, stream)


def get_episode(url: str, scenario: str, episode: str) -> dict:
    r = requests.get(f"{url}/reef/episodes/{episode}", headers={"x-reef-scenario": scenario}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def report_on_episode(url: str, scenario: str, episode: str, score: float = 1.0, metadata: dict | None = None) -> dict:
    r = requests.post(f"{url}/reef/report", headers={"x-reef-scenario": scenario},
                      json={"score": score, "episode": episode, **({"metadata": metadata} if metadata else {})},
                      timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
def test_a_tool_loop_is_one_episode_and_one_masked_sample(server, dialect, stream):
    scenario, session = f"ep-{dialect}-{stream}", f"run-{dialect}-{stream}"
    tool_loop(session_client(server.url, dialect, scenario, session), stream)
    ep = get_episode(server.url, scenario, session)
    first, second = ep["records"]
    assert ep["turns"] == 2 and [r["turn"] for r in ep["records"]] == [1, 2]
    assert all(r["episode"] == session and r["status"] == "ok" for r in ep["records"])
    assert first["metadata"]["tool_calls"][0]["arguments"] == {"city": "Paris"}
    assert second["metadata"] == {"tool_calls": []}
    # the scenario-scoped route answers the same
    again = requests.get(f"{server.url}/reef/scenarios/{scenario}/episodes/{session}", timeout=30).json()
    assert [r["id"] for r in again["records"]] == [first["id"], second["id"]]

    rid = report_on_episode(server.url, scenario, session)["agent_record_id"]
    report = server.gateway.store.get(rid)
    assert report["episode"] == session and report["references"] == [first["id"], second["id"]]
    counts = Counter()
    [sample] = samples_for_report(report, server.gateway.store.get_many(report["references"]), EpisodeConfig(),
                                  counts)
    assert counts == Counter(episodes=1, episode_samples=1)
    # one sequence: turn 1's prompt, then everything after it as the completion
    assert sample.prompt_ids == first["prompt_token_ids"]
    assert sample.prompt_ids + sample.completion_ids == second["prompt_token_ids"] + second["token_ids"]
    assert sample.extra["records"] == [first["id"], second["id"]] and sample.record_ids == sample.extra["records"]
    # loss only on the generated tokens: turn 1's call, turn 2's answer
    tok = server.gateway.engine.tokenizer
    given = [t for t, m in zip(sample.completion_ids, sample.loss_mask) if not m]
    trained = [t for t, m in zip(sample.completion_ids, sample.loss_mask) if m]
    assert trained == first["token_ids"] + second["token_ids"]
    assert sample.trained_tokens == len(first["token_ids"]) + len(second["token_ids"])
    assert TOOL_RESULT in tok.decode(given) and "<|im_start|>tool" in tok.decode(given)
    assert TOOL_RESULT not in tok.decode(trained)
    lp = [x for x, m in zip(sample.logprobs, sample.loss_mask) if m]
    assert lp == first["logprobs"] + second["logprobs"]


def test_a_rewritten_history_splits_the_episode_into_calls(server):
    """The client changed the assistant turn it sends back (drift): never one misaligned sample."""
    scenario = session = "drift"

    def rewrite(history):
        history[1]["content"] = "Let me look that up."  # the model wrote no such text
    tool_loop(session_client(server.url, "chat", scenario, session), False, rewrite)
    first, second = get_episode(server.url, scenario, session)["records"]
    report = server.gateway.store.get(report_on_episode(server.url, scenario, session)["agent_record_id"])
    counts = Counter()
    samples = samples_for_report(report, server.gateway.store.get_many(report["references"]), EpisodeConfig(),
                                 counts)
    assert counts == Counter(episodes=1, split_drift=1, per_call_samples=2)
    assert [s.record_id for s in samples] == [first["id"], second["id"]]
    assert all(s.loss_mask is None and s.extra["episode"] == session for s in samples)
    assert samples[1].prompt_ids == second["prompt_token_ids"] and samples[1].completion_ids == second["token_ids"]


def test_an_episode_across_releases_follows_the_policy(server):
    scenario = session = "releases"
    tool_loop(session_client(server.url, "anthropic", scenario, session), False)
    report = server.gateway.store.get(report_on_episode(server.url, scenario, session)["agent_record_id"])
    first, same = server.gateway.store.get_many(report["references"])
    second = {**same, "release_id": f"{scenario}:v1"}  # the scenario moved to a new release between the calls
    counts = Counter()
    split = samples_for_report(report, [first, second], EpisodeConfig(mixed_release="split"), counts)
    assert [(s.record_id, s.release_id) for s in split] == [(first["id"], "base"), (second["id"], f"{scenario}:v1")]
    assert counts["split_release"] == 1
    counts = Counter()
    assert samples_for_report(report, [first, second], EpisodeConfig(mixed_release="drop"), counts) == []
    assert counts == Counter(episodes=1, dropped_release=1)
    # per_call: each call with the state after it (the tool result its call caused)
    counts = Counter()
    calls = samples_for_report(report, [first, same], EpisodeConfig(samples="per_call"), counts)
    tok = server.gateway.engine.tokenizer
    assert len(calls) == 2 and TOOL_RESULT in tok.decode(calls[0].extra["next_state_ids"])
    assert "next_state_ids" not in calls[1].extra and counts["per_call_samples"] == 2


def test_refused_and_cancelled_calls_are_recorded_and_never_trained(server, caplog):
    scenario = session = "unanswered"
    c = session_client(server.url, "chat", scenario, session)
    with caplog.at_level(logging.INFO, logger="reef_lab.gateway.unanswered"):
        with pytest.raises(openai.BadRequestError, match="temperature"):  # refused by the engine
            c.oai.chat.completions.create(model="m", messages=[c.user("Weather in Paris?")], temperature=-1)
        with pytest.raises(openai.BadRequestError, match="'tool_choice' names function 'nope'"):  # by the parser
            c.ask([c.user("x")], False, tool_choice={"type": "function", "function": {"name": "nope"}})
        tool_loop(c, True)
        # a client that leaves a stream after its first event (what the HTTP server does when it hangs up)
        reply = server.gateway.infer("openai.chat", {"model": "m", "messages": [c.user("Weather in Paris?")],
                                                     "tools": c.oai and [_weather()], "stream": True},
                                     scenario, {}, {"x-reef-session": session})
        next(reply.events)
        reply.events.close()
    ep = get_episode(server.url, scenario, session)
    statuses = [r["status"] for r in ep["records"]]
    assert statuses == ["refused", "refused", "ok", "ok", "cancelled"], statuses
    refused, cancelled = ep["records"][0], ep["records"][-1]
    assert "temperature" in refused["error"] and refused["request"]["temperature"] == -1
    assert refused["metadata"] == {"refused_status": 400} and refused["token_ids"] is None
    assert "closed the stream" in cancelled["error"] and cancelled["metadata"]["generated_text"] is not None
    lines = [r.getMessage() for r in caplog.records]
    assert sum("refused openai.chat call in scenario unanswered" in m for m in lines) == 2
    assert sum(m.startswith("cancelled openai.chat stream in scenario unanswered") for m in lines) == 1
    # the report on the whole episode trains on the two answered calls only
    report = server.gateway.store.get(report_on_episode(server.url, scenario, session)["agent_record_id"])
    assert len(report["references"]) == 5
    counts = Counter()
    [sample] = samples_for_report(report, server.gateway.store.get_many(report["references"]), EpisodeConfig(),
                                  counts)
    assert counts == Counter(episodes=1, episode_samples=1, excluded=3)
    assert sample.extra["records"] == [r["id"] for r in ep["records"][2:4]]


def test_an_invalid_session_header_is_refused_and_recorded(server):
    r = requests.post(server.url + "/v1/chat/completions", headers={"x-reef-scenario": "bad-session",
                                                                   "x-reef-session": "a b"},
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 400 and "x-reef-session header 'a b' is invalid" in r.json()["error"]["message"]
    [rec] = server.gateway.list_records("bad-session")["records"]
    assert rec["status"] == "refused" and rec["episode"] is None


def test_reports_name_an_episode_or_receipts_not_both(server):
    scenario = session = "report-rules"
    c = session_client(server.url, "chat", scenario, session)
    c.ask([c.user("Weather in Paris?")], False)
    [rec] = get_episode(server.url, scenario, session)["records"]
    h = {"x-reef-scenario": scenario}
    r = requests.post(server.url + "/reef/report", headers=h,
                      json={"score": 1, "episode": session, "references": [rec["id"]]})
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"]
    r = requests.post(server.url + "/reef/report", headers=h, json={"score": 1, "episode": "nobody"})
    assert r.status_code == 400 and "episode 'nobody' has no calls" in r.json()["error"]["message"]
    r = requests.get(server.url + "/reef/episodes/nobody", headers=h)
    assert r.status_code == 404
    # receipts of one episode (not the episode itself) make one sample too
    c.ask([c.user("Weather in Paris?")], False)
    ids = [x["id"] for x in get_episode(server.url, scenario, session)["records"]]
    r = requests.post(server.url + "/reef/report", headers=h, json={"score": 1, "references": ids})
    report = server.gateway.store.get(r.json()["agent_record_id"])
    counts = Counter()
    samples_for_report(report, server.gateway.store.get_many(ids), EpisodeConfig(), counts)
    # two independent asks of one session: the second prompt does not continue the first, so they split
    assert counts == Counter(episodes=1, split_drift=1, per_call_samples=2)


def _weather() -> dict:
    from tests.tool_model import WEATHER
    return WEATHER


# ---- session detection: what each client sends (measured against the real CLIs in tests/test_agents.py) ----------
CLAUDE_USER_ID = ('{"device_id":"3f73239421bd5201cd7c39569d01d54f830b28d1d9c4f0fa690fa861cfc31758",'
                  '"account_uuid":"","session_id":"3e4b03c7-93a6-4623-ad23-aca368164191"}')


@pytest.mark.parametrize("headers,body,expected", [
    ({"x-reef-session": "mine", "x-claude-code-session-id": "cc"}, {}, "mine"),
    ({"x-claude-code-session-id": "3e4b03c7-93a6-4623-ad23-aca368164191"}, {}, "3e4b03c7-93a6-4623-ad23-aca368164191"),
    ({}, {"metadata": {"user_id": CLAUDE_USER_ID}}, "3e4b03c7-93a6-4623-ad23-aca368164191"),
    ({}, {"metadata": {"user_id": "user_ab12_account_x_session_3e4b03c7-93a6-4623"}}, "3e4b03c7-93a6-4623"),
    ({}, {"metadata": {"user_id": "alice"}}, None),  # a user, not a session
    ({"session-id": "01a23bdd-974a-7022-b4ec-ce23ad035836"}, {"prompt_cache_key": "x"},
     "01a23bdd-974a-7022-b4ec-ce23ad035836"),
    ({"x-session-id": "ses_dc4226095ffeDE0CckB2oWoDsr"}, {}, "ses_dc4226095ffeDE0CckB2oWoDsr"),
    ({}, {"prompt_cache_key": "shared-cache"}, None),
    ({}, [], None),
])
def test_session_detection(headers, body, expected):
    assert sessions.detect(headers, body) == expected


def test_a_client_session_id_outside_the_id_rules_is_kept_as_its_hash():
    a = sessions.detect({"x-session-id": "päth/with spaces"}, {})
    assert a.startswith("sha-") and len(a) == 36 and a == sessions.detect({"x-session-id": "päth/with spaces"}, {})
    with pytest.raises(BadRequest, match="x-reef-session"):
        sessions.detect({"x-reef-session": "päth"}, {})


# ---- the learner trains on episode samples ------------------------------------------------------------------------
def test_sao_learns_from_reports_on_episodes(tool_model_dir, tmp_path):
    """Reports on four tool-loop episodes: SAO's pool holds four two-turn samples (not eight calls), its critic
    warm-up and policy step train on them, each step's row averages the numbers the reports carry (what the app
    plots per step), and the release's lineage names every call."""
    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tool_model_dir), max_batch=8))
    srv = Running(gw)
    try:
        gw.create_scenario({"name": "sao-ep", "recipe": "sao", "config": {
            "batch_size": 2, "critic_warmup_steps": 1, "critic_lr": 1e-3,
            "trainer": {"lr": 1e-3, "micro_batch_size": 2}}})
        for i in range(4):
            tool_loop(session_client(srv.url, "chat", "sao-ep", f"s{i}"), False)
            report_on_episode(srv.url, "sao-ep", f"s{i}", score=float(i % 2), metadata={
                "correct": bool(i % 2), "valid_call_fraction": i / 4, "item": f"q{i}", "note": None})
        ln = gw.learner("sao-ep")
        assert ln.wait_idle(300), ln.status()
        assert ln.last_error is None, ln.last_error
        steps = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
        assert [m["phase"] for m in steps] == ["critic_warmup", "policy"]
        assert all(m["episode_samples"] == 2 and m["samples"] == 2 for m in steps[:1])
        assert steps[-1]["episodes_episode_samples"] == 4 and steps[-1]["episodes_episodes"] == 4
        # two batches of two episodes: together they average every report once (booleans as 0/1)
        assert sum(m["report_correct"] for m in steps) * 2 == pytest.approx(2)
        assert sum(m["report_valid_call_fraction"] for m in steps) * 2 == pytest.approx(0 + 0.25 + 0.5 + 0.75)
        assert all(not {"report_item", "report_note"} & set(m) for m in steps)
        assert ln.status()["episodes"] == {"episodes": 4, "episode_samples": 4}
        [rel] = gw.list_releases("sao-ep")["releases"]
        calls = gw.list_records("sao-ep", "inference")["records"]
        assert len(calls) == 8 and sorted(rel["records"]) == sorted(r["id"] for r in calls)
    finally:
        srv.stop()


def test_refusals_with_nothing_to_record_in_get_one_log_line(server, caplog):
    """No valid scenario (nowhere to record it) and a body that is not JSON (before the gateway): a line each."""
    with caplog.at_level(logging.INFO, logger="reef_lab.gateway.unanswered"):
        r = requests.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 400
        r = requests.post(server.url + "/v1/chat/completions", data=b"{not json",
                          headers={"x-reef-scenario": "unlogged", "Content-Type": "application/json"})
        assert r.status_code == 400
    lines = [r.getMessage() for r in caplog.records]
    assert sum("(not recorded: no valid scenario) with HTTP 400" in m for m in lines) == 1, lines
    assert sum("(not recorded: refused before the gateway) with HTTP 400" in m for m in lines) == 1, lines
    assert "unlogged" not in [s.name for s in server.gateway.scenarios.list()]


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
def test_ctxd_distils_a_harness_into_tool_episodes(tool_model_dir, tmp_path, dialect):
    """Context distillation on agent episodes: tool-loop episodes served with a harness (tools offered, a call, its
    result, the answer) become whole-episode samples whose prompt is re-made without the harness, tools included,
    token for token as serving made it with the harness; none is skipped, and the release serves without it."""
    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tool_model_dir), max_batch=8))
    srv = Running(gw)
    try:
        gw.create_scenario({"name": "cd", "recipe": "ctxd", "config": {
            "batch_size": 2, "steps_per_candidate": 1, "top_k": 4, "trainer": {"lr": 1e-3, "micro_batch_size": 2}}})
        harness = "Call the weather tool, then answer in one line."
        assert gw.publish_harness("cd", {"files": {"system_prompt.md": harness}})["release_id"] == "cd:v1"
        for i in range(2):  # two turns with the tools offered (the harness may keep the model from calling one)
            c = session_client(srv.url, dialect, "cd", f"s{i}")
            history = [c.user("Weather in Paris?")]
            text, calls, _ = c.ask(history, False)
            history += c.answered(calls, text, [TOOL_RESULT]) if calls else [
                {"role": "assistant", "content": text}, c.user("And in Rome?")]
            c.ask(history, False)
            report_on_episode(srv.url, "cd", f"s{i}")
        ln = gw.learner("cd")
        assert ln.wait_idle(300), ln.status()
        assert ln.last_error is None, ln.last_error
        steps = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
        # whole episodes, or (a history the client rewrote) one sample per call: every one re-made, none skipped
        assert all(m["ctxd_skipped"] == 0 for m in steps)
        assert sum(m["samples"] for m in steps) == 2 * steps[-1]["episodes_episodes"] - steps[-1]["episode_samples"]
        first = gw.list_records("cd", "inference")["records"]
        first = min((r for r in first if r["episode"] == "s0"), key=lambda r: r["created_at"])
        served = gw.engine.request_ids(engine_request(first["dialect"], first["request"]))
        assert first["request"]["tools"] and steps[0]["prompt_tokens_saved"] == len(first["prompt_token_ids"]) - \
            len(served) > 0  # the tools stay in both prompts; only the harness goes
        assert gw.list_releases("cd")["serving"] != "cd:v1"
    finally:
        srv.stop()
