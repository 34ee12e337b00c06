"""A loopback double of SGLang's native HTTP API (sglang 0.5.23's wire format, read from its source), for tests.

SGLang needs CUDA, so reef_lab's SGLang engine (reef_lab/engines/sglang.py) is tested against this instead. The
double generates with reef_lab's embedded engine on a local model, so token ids and logprobs are real; what it
reproduces is the wire format: `/generate` with `input_ids`, `sampling_params` (unknown keys refused as sglang's
contract gate does), `return_logprob` (`meta_info.output_token_logprobs` as `[logprob, token_id, null]`),
cumulative streaming chunks ending in `data: [DONE]`, `finish_reason` objects and `weight_version`;
`/update_weights_from_disk`, `/pause_generation` (new requests wait while paused) and `/continue_generation`;
`/load_lora_adapter` and `/unload_lora_adapter` (a request names an adapter by `lora_path`); `/model_info`,
`/health_generate`, `/flush_cache`.

Shortcut, stated: an "adapter" here is served by loading the merged weights of the release folder that holds it
(`<release>/adapter` -> `<release>`), which are the base plus that adapter; the LoRA arithmetic is not redone.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import orjson
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from reef_lab.engines.base import ChatRequest, SamplingParams

SAMPLING_KEYS = {"max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                 "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
                 "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                 "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
                 "custom_params", "beam_width", "watermark", "choice"}


def _json(obj, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status=status, content_type="application/json")


class SGLangDouble:
    """The WSGI app. `engine` is an EmbeddedEngine on the model at `model_dir` (its release 'base')."""

    def __init__(self, engine, model_dir: str | Path, weight_version: str = "default"):
        self.engine, self.model_dir = engine, str(model_dir)
        self.weights = "base"  # the engine release that serves requests naming no adapter
        self.weight_version = weight_version
        self.adapters: dict[str, str] = {}  # lora name -> path
        self._resume = threading.Event()
        self._resume.set()
        self.calls: list[str] = []  # paths called, in order (tests read it)
        self.healthy = True

    def __call__(self, environ, start_response):
        req = Request(environ)
        self.calls.append(req.path)
        try:
            body = orjson.loads(req.get_data()) if req.method == "POST" and req.get_data() else {}
        except orjson.JSONDecodeError:
            resp = _json({"object": "error", "message": "invalid JSON", "type": "Bad Request", "param": None,
                          "code": 400}, 400)
            return resp(environ, start_response)
        route = {("GET", "/model_info"): self.model_info, ("POST", "/generate"): self.generate,
                 ("POST", "/update_weights_from_disk"): self.update_weights,
                 ("POST", "/pause_generation"): self.pause, ("POST", "/continue_generation"): self.resume,
                 ("POST", "/load_lora_adapter"): self.load_lora, ("POST", "/unload_lora_adapter"): self.unload_lora,
                 ("GET", "/health_generate"): self.health, ("GET", "/health"): self.health,
                 ("POST", "/flush_cache"): self.flush}.get((req.method, req.path))
        resp = route(body) if route else _json({"detail": "Not Found"}, 404)
        return resp(environ, start_response)

    def model_info(self, body) -> Response:
        return _json({"model_path": self.model_dir, "served_model_name": self.model_dir,
                      "tokenizer_path": self.model_dir, "is_generation": True, "preferred_sampling_params": None,
                      "weight_version": self.weight_version, "load_format": "auto"})

    def health(self, body) -> Response:
        return Response(b"", status=200 if self.healthy else 503)

    def flush(self, body) -> Response:
        return Response(b"Cache flushed.\n", content_type="text/plain")

    def pause(self, body) -> Response:
        self._resume.clear()
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    def resume(self, body) -> Response:
        self._resume.set()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    def update_weights(self, body) -> Response:
        path = body.get("model_path")
        if not isinstance(path, str):
            return _json({"object": "error", "message": "model_path: Field required", "type": "Bad Request",
                          "param": None, "code": 400}, 400)
        version = str(body.get("weight_version") or self.weight_version)
        try:
            if Path(path).resolve() == Path(self.model_dir).resolve():
                name = "base"
            else:
                name = f"weights:{version}"
                self.engine.load_release(name, path)
        except Exception as e:  # noqa: BLE001 - sglang answers a failed load as a 400 with its reason
            return _json({"success": False, "message": f"Failed to update weights: {e}.", "num_paused_requests": 0},
                         400)
        self.weights, self.weight_version = name, version
        return _json({"success": True, "message": "Succeeded to update model weights. Weight version updated to "
                                                  f"{version}.", "num_paused_requests": 0})

    def load_lora(self, body) -> Response:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            return _json({"object": "error", "message": "lora_name, lora_path: Field required",
                          "type": "Bad Request", "param": None, "code": 400}, 400)
        out = {"rid": None, "http_worker_ipc": None, "success": True, "error_message": "", "loaded_adapters": {}}
        if name in self.adapters:
            out.update(success=False, error_message=f"Failed to load LoRA adapter {name} because it is already "
                                                    "loaded")
        else:
            try:
                self.engine.load_release(f"lora:{name}", Path(path).parent)  # see the module docstring
                self.adapters[name] = path
            except Exception as e:  # noqa: BLE001
                out.update(success=False, error_message=f"Failed to load LoRA adapter {name}: {e}")
        out["loaded_adapters"] = dict(self.adapters)
        return _json(out, 200 if out["success"] else 400)

    def unload_lora(self, body) -> Response:
        name = body.get("lora_name")
        out = {"rid": None, "http_worker_ipc": None, "success": True, "error_message": "", "loaded_adapters": {}}
        if name not in self.adapters:
            out.update(success=False, error_message=f"LoRA with name {name} does not exist. Loaded LoRAs: "
                                                    f"{list(self.adapters)}")
        else:
            del self.adapters[name]
            self.engine.unload(f"lora:{name}")
        out["loaded_adapters"] = dict(self.adapters)
        return _json(out, 200 if out["success"] else 400)

    def generate(self, body) -> Response:
        sp = body.get("sampling_params") or {}
        unknown = sorted(set(sp) - SAMPLING_KEYS)
        if unknown:
            return _json({"error": f"unknown field `{unknown[0]}`, expected one of {sorted(SAMPLING_KEYS)}"}, 400)
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            return _json({"error": {"message": "the double takes input_ids (a non-empty list of token ids)"}}, 400)
        lora = body.get("lora_path")
        if lora is not None and lora not in self.adapters:
            return _json({"error": {"message": f"The following requested LoRA adapters are not loaded: {lora}"}}, 400)
        self._resume.wait()  # paused: new requests wait for continue, as sglang's do
        release = f"lora:{lora}" if lora is not None else self.weights
        version = self.weight_version
        params = SamplingParams(max_tokens=int(sp.get("max_new_tokens", 128)),
                                temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                                stop=list(sp["stop"]) if isinstance(sp.get("stop"), list) else
                                ([sp["stop"]] if sp.get("stop") else []), seed=sp.get("sampling_seed"))
        try:
            handle = self.engine.submit(ChatRequest([], params, release=release, prompt_ids=ids))
        except ValueError as e:
            return _json({"error": {"message": str(e)}}, 400)
        rid, t0 = body.get("rid") or uuid.uuid4().hex, time.time()

        def chunk(text: str, gen=None) -> dict:
            meta = {"id": rid, "finish_reason": None, "prompt_tokens": len(ids), "weight_version": version,
                    "num_retractions": 0, "reasoning_tokens": 0, "cached_tokens": 0}
            if gen is not None:
                fin = ({"type": "length", "length": len(gen.token_ids)} if gen.finish_reason == "length" else
                       {"type": "stop", "matched": gen.stop_sequence if gen.stop_sequence else
                        (gen.token_ids[-1] if gen.token_ids else None)})
                meta.update(finish_reason=fin, completion_tokens=len(gen.token_ids), e2e_latency=time.time() - t0,
                            weight_versions=[{"version": version, "start": 0, "end": len(gen.token_ids)}])
                if body.get("return_logprob"):
                    meta["input_token_logprobs"] = []
                    meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(gen.logprobs, gen.token_ids)]
                    meta["output_token_logprobs_length"] = len(gen.token_ids)
                return {"text": gen.text, "output_ids": list(gen.token_ids), "meta_info": meta}
            meta["completion_tokens"] = None
            return {"text": text, "output_ids": [], "meta_info": meta}

        if not body.get("stream"):
            return _json(chunk("", handle.result()))

        def events():
            text = ""
            try:
                for delta in handle:
                    text += delta
                    yield b"data: " + orjson.dumps(chunk(text)) + b"\n\n"  # cumulative, as sglang's default
                yield b"data: " + orjson.dumps(chunk(text, handle.result())) + b"\n\n"
            except Exception as e:  # noqa: BLE001 - sglang sends stream errors as an event, still HTTP 200
                yield b"data: " + orjson.dumps({"error": {"message": str(e), "type": "invalid_request_error",
                                                          "code": 400, "retryable": False}}) + b"\n\n"
            yield b"data: [DONE]\n\n"
        return Response(events(), content_type="text/event-stream")


class SGLangDoubleServer:
    """The double on 127.0.0.1, a thread per request."""

    def __init__(self, app: SGLangDouble, port: int = 0):
        self.app = app
        self.server = make_server("127.0.0.1", port, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self.server.shutdown()
