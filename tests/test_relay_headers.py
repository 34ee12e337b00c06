"""Which client headers reach the provider through the relay (reef_lab/engines/headers.py), and whose key.

The scripted provider logs every header it gets; the clients are plain HTTP (to send exactly the headers under test)
and the real SDKs."""

from __future__ import annotations

import anthropic
import pytest
import requests

from reef_lab.engines.headers import upstream_headers
from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.testing.scripted_provider import ScriptedProvider
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT

CLIENT = {
    "user-agent": "claude-cli/2.1.197 (external, sdk-cli)", "x-claude-code-session-id": "sess-1",
    "session-id": "codex-sess", "x-stainless-os": "Linux", "anthropic-beta": "interleaved-thinking-2025-05-14",
    "anthropic-version": "2023-06-01", "openai-organization": "org-1", "x-app": "cli",
    "x-reef-scenario": "hdr", "x-reef-tag-user": "u1", "cookie": "c=1", "x-forwarded-for": "10.0.0.1",
    "accept-encoding": "gzip", "te": "trailers", "proxy-authorization": "Basic eA==", "keep-alive": "timeout=5",
    "authorization": "Bearer sk-client", "x-api-key": "sk-client-2",
}
PASSED = ("user-agent", "x-claude-code-session-id", "session-id", "x-stainless-os", "x-app")
NEVER = ("x-reef-scenario", "x-reef-tag-user", "cookie", "x-forwarded-for", "te", "proxy-authorization", "keep-alive",
         "authorization", "x-api-key")


@pytest.fixture
def provider():
    with ScriptedProvider() as p:
        yield p


@pytest.fixture(autouse=True)
def no_deployment_key(monkeypatch):
    monkeypatch.delenv("REEF_UPSTREAM_API_KEY", raising=False)


def post_messages(url: str, headers: dict) -> requests.Response:
    r = requests.post(url + "/v1/messages", headers={**headers, "x-reef-scenario": "hdr"}, timeout=30,
                      json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    return r


@pytest.mark.parametrize("upstream", [None, OPENAI_CHAT], ids=["same-dialect", "to-chat"])
def test_client_headers_pass_by_the_rules(serve, provider, upstream):
    p = serve(UpstreamEngine(provider.url, timeout=10, upstream_dialect=upstream))
    post_messages(p.url, CLIENT)
    got = provider.requests[-1]["headers"]
    for name in PASSED:
        assert got[name] == CLIENT[name], name
    for name in NEVER:
        assert name not in got, name
    assert got["host"] == provider.url.split("//")[1]  # this hop's own
    assert got["content-type"] == "application/json"
    assert int(got["content-length"]) > 0 and "accept-encoding" not in got  # answers come uncompressed
    if upstream is None:  # an Anthropic provider: its own headers pass, OpenAI's do not
        assert got["anthropic-beta"] == CLIENT["anthropic-beta"] and "openai-organization" not in got
    else:
        assert got["openai-organization"] == "org-1" and not any(k.startswith("anthropic-") for k in got)


@pytest.mark.parametrize("upstream,sent_as", [(None, ("x-api-key", "sk-client")),
                                              (OPENAI_CHAT, ("authorization", "Bearer sk-client"))])
def test_bring_your_own_key_goes_as_the_provider_expects(serve, provider, upstream, sent_as):
    p = serve(UpstreamEngine(provider.url, timeout=10, upstream_dialect=upstream, key_from_client=True))
    # Claude Code with ANTHROPIC_AUTH_TOKEN sends its key as a bearer token
    post_messages(p.url, {"authorization": "Bearer sk-client"})
    got = provider.requests[-1]["headers"]
    assert got[sent_as[0]] == sent_as[1]
    other = ({"x-api-key", "authorization"} - {sent_as[0]}).pop()
    assert other not in got


def test_without_the_flag_the_clients_key_stays_here(serve, provider):
    p = serve(UpstreamEngine(provider.url, timeout=10))
    post_messages(p.url, {"x-api-key": "sk-client"})
    got = provider.requests[-1]["headers"]
    assert "x-api-key" not in got and "authorization" not in got


def test_the_deployments_key_wins_over_the_clients(serve, provider):
    p = serve(UpstreamEngine(provider.url, timeout=10, api_key="sk-deploy", key_from_client=True))
    post_messages(p.url, {"x-api-key": "sk-client"})
    assert provider.requests[-1]["headers"]["x-api-key"] == "sk-deploy"


@pytest.mark.parametrize("token_in,key_in,upstream,expect", [
    ("authorization", "x-api-key", ANTHROPIC, ("x-api-key", "sk-client")),
    ("x-api-key", "authorization", OPENAI_CHAT, ("authorization", "Bearer sk-client")),
    ("authorization", None, OPENAI_CHAT, None),
])
def test_reef_labs_own_token_is_never_forwarded(serve, provider, token_in, key_in, upstream, expect):
    eng = UpstreamEngine(provider.url, timeout=10, key_from_client=True,
                         upstream_dialect=None if upstream == ANTHROPIC else upstream)
    p = serve(eng, tokens=["reef-secret"])
    headers = {token_in: "Bearer reef-secret" if token_in == "authorization" else "reef-secret"}
    if key_in:
        headers[key_in] = "Bearer sk-client" if key_in == "authorization" else "sk-client"
    post_messages(p.url, headers)
    got = provider.requests[-1]["headers"]
    assert not any("reef-secret" in v for v in got.values())
    creds = {k: v for k, v in got.items() if k in ("authorization", "x-api-key")}
    assert creds == ({expect[0]: expect[1]} if expect else {})


def test_an_sdk_client_brings_its_own_key_through_a_translating_relay(serve, provider):
    p = serve(UpstreamEngine(provider.url, timeout=10, upstream_dialect=OPENAI_CHAT, key_from_client=True))
    c = anthropic.Anthropic(base_url=p.url, api_key="sk-ant-mine", default_headers={"x-reef-scenario": "hdr"})
    c.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    got = provider.calls("/v1/chat/completions")[-1]["headers"]
    assert got["authorization"] == "Bearer sk-ant-mine" and got["user-agent"].startswith("Anthropic/Python")


def test_header_rules_directly():
    h = upstream_headers({"x-session-id": "s", "connection": "close", "transfer-encoding": "chunked",
                          "upgrade": "h2c", "sec-fetch-site": "cross-site", "x-evil": "a\r\nb", "via": "1.1 p"},
                         anthropic=True, api_key=None, key_from_client=False)
    assert h == {"x-session-id": "s", "content-type": "application/json", "anthropic-version": "2023-06-01"}
