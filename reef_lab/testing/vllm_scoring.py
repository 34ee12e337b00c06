"""A loopback double of the part of vLLM's OpenAI server a distillation teacher is scored through (vllm 0.32's wire
format, read from its source: entrypoints/openai/completion/protocol.py and serving.py, entrypoints/serve/tokenize):

- `GET /v1/models`: `{"data": [{"id": <model>, ...}]}`;
- `POST /tokenize` `{model, prompt, add_special_tokens}`: `{"tokens": [...], "count", "max_model_len"}`;
- `POST /v1/completions` with a token-id `prompt` and `prompt_logprobs: k`: `choices[0].prompt_logprobs`, one entry
  per prompt token, `null` for the first, else a mapping token id (a JSON string key) -> `{"logprob", "rank",
  "decoded_token"}` holding the k most likely tokens at that position and always the prompt's own token (ranks from
  1; raw logits: vLLM's default logprobs_mode `raw_logprobs`, so temperature does not change them).

The logprobs are a real forward pass of a local model (torch), so a test can compare them with the trainer's.
`shift_tokens` makes the double's tokenizer give other ids (a teacher of another tokenizer). `reference_logprobs`
is the same forward pass for a real vLLM server's answers: what transformers gives the tokens it generated. torch is
imported where it runs, so importing this module does not load it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response


def vllm_model() -> Path | None:
    """The model a real vLLM CPU server serves in the tests: the embedded SmolLM2's transformers folder (converted
    from its GGUF the first time), or None where vLLM is not installed (`bash scripts/setup.sh --vllm`)."""
    from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, EmbeddedEngine, default_cache_dir
    from reef_lab.engines.vllm import DEFAULT_PYTHON

    if not DEFAULT_PYTHON.is_file():
        return None
    model = default_cache_dir() / DEFAULT_MODEL_NAME
    if not (model / "config.json").is_file():
        EmbeddedEngine.from_path(None).close()  # converts the embedded model's GGUF once
    return model


def reference_logprobs(folder: Path, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """transformers' logprob of each completion token after `prompt`, at `temperature`, with the model in `folder`
    (fp32, CPU): what an engine that reports logprobs must agree with."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


class VLLMScoringDouble:
    def __init__(self, model, tokenizer, name: str, shift_tokens: int = 0):
        self.model, self.tokenizer, self.name, self.shift = model.eval(), tokenizer, name, shift_tokens
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        req = Request(environ)
        body = orjson.loads(req.get_data()) if req.method == "POST" else {}
        self.calls.append({"path": req.path, **body})
        if req.path == "/v1/models":
            out = {"object": "list", "data": [{"id": self.name, "object": "model", "max_model_len": 2048}]}
        elif req.path == "/tokenize":
            ids = self.tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
            out = {"tokens": [i + self.shift for i in ids], "count": len(ids), "max_model_len": 2048}
        elif req.path == "/v1/completions":
            out = self._complete(body)
        else:
            out = {"error": {"message": f"no route {req.path}"}}
            return Response(orjson.dumps(out), status=404, content_type="application/json")(environ, start_response)
        return Response(orjson.dumps(out), content_type="application/json")(environ, start_response)

    def _complete(self, body: dict) -> dict:
        import torch

        ids, k = body["prompt"], body.get("prompt_logprobs")
        with self._lock, torch.no_grad():
            logp = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        rows: list = [None]
        for pos in range(1, len(ids)):
            dist = logp[pos - 1]
            order = torch.argsort(dist, descending=True)
            rank = {int(t): r + 1 for r, t in enumerate(order[: max(k or 0, 0)].tolist())}
            own = ids[pos]
            rank.setdefault(own, int((dist > dist[own]).sum()) + 1)
            rows.append({str(t): {"logprob": float(dist[t]), "rank": r, "decoded_token": self.tokenizer.decode([t])}
                         for t, r in rank.items()})
        nxt = int(torch.argmax(logp[-1]))
        return {"id": "cmpl-double", "object": "text_completion", "model": body["model"], "choices": [{
            "index": 0, "text": self.tokenizer.decode([nxt]), "finish_reason": "length",
            "prompt_logprobs": rows if k is not None else None}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}}


class VLLMScoringServer:
    """The double on 127.0.0.1, a thread per request."""

    def __init__(self, app: VLLMScoringDouble):
        self.app = app
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self.server.shutdown()
