"""Long prompts through HTTP on the embedded engine (issue 30): the real SDKs get a 400 naming the counts for a
prompt past the context, streaming or not, before any 200; a streaming client that hangs up stops its generation,
during a chunked prefill too, under reef_lab's own HTTP server (server/httpd.py watches the connection).

The tiny Llama of conftest.py, each forward pass slowed a little by a hook so a generation lasts long enough to
hang up in the middle of it on any machine.
"""

from __future__ import annotations

import re
import threading
import time

import anthropic
import openai
import pytest

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway
from server.app import create_app
from server.httpd import Server, listen
from tests.test_embedded_long_prompts import long_chat

CHUNK = 64
H = {"x-reef-scenario": "long"}


@pytest.fixture
def engine(tiny_model, tokenizer):
    with EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", max_batch=8, prefill_chunk=CHUNK) as engine:
        yield engine


@pytest.fixture
def httpd(tmp_path, engine):
    """The gateway behind reef_lab's own HTTP server (the one scripts/serve.py runs) on loopback."""
    gateway = Gateway(tmp_path / "data", engine)
    sock = listen("127.0.0.1", 0)
    server = Server(create_app(gateway), sock)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield gateway, f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.stop(grace=5)
    sock.close()
    gateway.close(close_engine=False)


@pytest.fixture
def slowed(tiny_model):
    """Each forward pass of the tiny model takes at least `delay[0]` s more; `passes` records (batch, tokens,
    first position) of each."""
    delay, passes = [0.0], []

    def pre(module, args, kwargs):
        ids = kwargs["input_ids"]
        passes.append((ids.shape[0], ids.shape[1], int(kwargs["position_ids"][0, 0])))
        time.sleep(delay[0])
    hook = tiny_model.register_forward_pre_hook(pre, with_kwargs=True)
    yield delay, passes
    hook.remove()


def over_the_context(engine) -> str:
    return long_chat(engine, 2100).messages[0]["content"]


def test_the_sdks_get_a_400_naming_the_counts_before_any_stream(serve, engine):
    url = serve(engine).url
    content = over_the_context(engine)
    tokens = engine.count_tokens([{"role": "user", "content": content}])
    oai = openai.OpenAI(base_url=url + "/v1", api_key="unused", default_headers=H, max_retries=0)
    ant = anthropic.Anthropic(base_url=url, api_key="unused", default_headers=H, max_retries=0)
    messages = [{"role": "user", "content": content}]
    calls = {
        "chat": lambda: oai.chat.completions.create(model="m", messages=messages, max_tokens=64),
        "chat stream": lambda: oai.chat.completions.create(model="m", messages=messages, max_tokens=64, stream=True),
        "responses stream": lambda: oai.responses.create(model="m", input=content, max_output_tokens=64,
                                                         stream=True),
        "messages": lambda: ant.messages.create(model="m", messages=messages, max_tokens=64),
        "messages stream": lambda: ant.messages.stream(model="m", messages=messages, max_tokens=64).__enter__(),
    }
    for name, call in calls.items():
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as refused:
            call()
        assert refused.value.status_code == 400, name
        message = str(refused.value)
        assert f"{tokens} tokens" in message and "max_tokens asks for 64" in message, (name, message)
        assert "at most 2048 tokens" in message, (name, message)
    assert engine.info()["requests_completed"] == 0 and engine.info()["active_rows"] == 0


def wait_for(condition, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"{what} did not happen within {timeout:.0f} s")


def cancelled_record(gateway) -> dict:
    records = gateway.list_records("long", kind="inference")["records"]
    return next((r for r in records if "cancelled by its caller" in (r.get("error") or "")), None)


def test_a_client_that_hangs_up_during_a_chunked_prefill_stops_it(httpd, engine, slowed):
    gateway, url = httpd
    delay, passes = slowed
    delay[0] = 0.2  # about 24 chunks of 64 tokens: some 5 s of prefill
    oai = openai.OpenAI(base_url=url + "/v1", api_key="unused", default_headers=H, max_retries=0)
    content = long_chat(engine, 1500).messages[0]["content"]
    stream = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                         max_tokens=16, stream=True)
    first = next(iter(stream))  # the role chunk goes out at once; the prompt is being prefilled now
    assert first.choices[0].delta.role == "assistant"
    wait_for(lambda: engine.info()["prefill_chunks"] >= 1, what="the first chunk")
    stream.close()  # the client hangs up; nothing is written to it while the prompt is prefilled
    wait_for(lambda: engine.info()["active_rows"] == 0, what="the row leaving")
    record = wait_for(lambda: cancelled_record(gateway), what="the cancelled generation's record")
    done = int(re.search(r"during its prompt's prefill, (\d+) of (\d+) tokens done", record["error"]).group(1))
    assert done < 1500 - 3 * CHUNK, f"the prefill ran on to {done} of 1500 tokens"
    chunks = engine.info()["prefill_chunks"]
    time.sleep(3 * delay[0])
    assert engine.info()["prefill_chunks"] == chunks and engine.info()["requests_cancelled"] == 1
    assert record["status"] == "cancelled" and record["metadata"] == {"generated_text": ""}


def test_a_client_that_hangs_up_while_tokens_stream_stops_within_a_step(httpd, engine, slowed):
    gateway, url = httpd
    delay, passes = slowed
    delay[0] = 0.02
    ant = anthropic.Anthropic(base_url=url, api_key="unused", default_headers=H, max_retries=0)
    with ant.messages.stream(model="m", max_tokens=1000,
                             messages=[{"role": "user", "content": "Tell me about the sea"}]) as stream:
        deltas = 0
        for event in stream:
            if event.type == "content_block_delta":
                deltas += 1
                if deltas == 3:
                    break
    wait_for(lambda: engine.info()["active_rows"] == 0, what="the row leaving")
    record = wait_for(lambda: cancelled_record(gateway), what="the cancelled generation's record")
    generated = int(re.search(r"after (\d+) generated tokens", record["error"]).group(1))
    assert generated < 200, f"{generated} tokens were generated for a client that had left"
    assert record["status"] == "cancelled" and record["metadata"]["generated_text"]  # what the client was sent
    assert len([p for p in passes if p[1] == 1]) < 250


def test_a_streaming_client_that_stays_is_served_to_the_end(httpd, engine, slowed):
    """The hang-up watch must not mistake a client that waits through a long prefill for one that left."""
    gateway, url = httpd
    delay, _ = slowed
    delay[0] = 0.05
    oai = openai.OpenAI(base_url=url + "/v1", api_key="unused", default_headers=H, max_retries=0)
    content = long_chat(engine, 1500).messages[0]["content"]
    chunks = list(oai.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                              max_tokens=16, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and engine.info()["prefill_chunks"] >= 1500 // CHUNK
    assert engine.info()["requests_cancelled"] == 0 and engine.info()["requests_completed"] == 1
    records = gateway.list_records("long", kind="inference")["records"]
    assert [r["status"] for r in records] == ["ok"]
