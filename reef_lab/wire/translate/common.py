"""Helpers the three dialect modules share: checks that name the field at fault, images, arguments, errors."""

from __future__ import annotations

import json
import math
import re
import uuid

import orjson

from reef_lab.errors import BadRequest
from reef_lab.wire.translate.ir import Image, Text

_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+);base64,(.*)$", re.S)


def need(cond: bool, message: str) -> None:
    if not cond:
        raise BadRequest(message)


def as_list(v, where: str) -> list:
    need(isinstance(v, list), f"{where} must be a list")
    return v


def as_dict(v, where: str) -> dict:
    need(isinstance(v, dict), f"{where} must be an object")
    return v


def number(body: dict, key: str, integer: bool = False):
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    need(ok and not isinstance(v, bool) and math.isfinite(v),
         f"'{key}' must be {'an integer' if integer else 'a number'}, got {v!r}"[:200])
    return v


def bounded(body: dict, key: str, lo: float, hi: float, integer: bool = False, value=None):
    """A sampling field an engine serves, checked against the engines' limits (None when absent). `value`: the
    field's value when it is not `body[key]` (chat's max_completion_tokens, checked as max_tokens)."""
    v = body.get(key) if value is None else value
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    need(ok and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi,
         f"'{key}' must be {'an integer' if integer else 'a number'} between {lo} and {hi}, got {v!r}"[:200])
    return v


def engine_stops(v, key: str) -> list[str]:
    """Stop sequences an engine takes: at most 16."""
    stops = stop_list(v, key) if isinstance(v, (str, list)) or v is None else None
    need(stops is not None and len(stops) <= 16, f"'{key}' must be a string or a list of at most 16 strings")
    return stops


def engine_text(content, where: str) -> Text:
    """Message content as an engine's model reads it: a string, or a list of text parts joined (an image or any other
    part is refused: the models served here read text)."""
    if isinstance(content, str):
        return Text(content)
    if content is None:
        return Text("")
    need(isinstance(content, list), f"{where}: content must be a string or a list of text parts")
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        need(kind in ("text", "input_text", "output_text"),
             f"{where}: content part of type {kind!r} is not supported by this model (text only); send text parts "
             "or serve a multimodal upstream with --upstream-url")
        need(isinstance(part.get("text"), str), f"{where}: a text part needs a string 'text'")
        out.append(part["text"])
    return Text("".join(out))


def stop_list(v, key: str) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    need(isinstance(v, list) and all(isinstance(s, str) for s in v), f"'{key}' must be a string or a list of strings")
    return list(v)


def split_data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a data: URL, None for any other URL."""
    m = _DATA_URL.match(url)
    return (m.group(1), m.group(2)) if m else None


def image_url(url, where: str) -> Image:
    need(isinstance(url, str) and (url.startswith(("http://", "https://")) or split_data_url(url) is not None),
         f"{where}: an image must be an http(s) URL or a base64 data: URL")
    return Image(url)


def arguments_object(text: str) -> dict:
    """A tool call's arguments as the object Anthropic's `tool_use.input` must be. Text that is not a JSON object
    (a provider's model can generate that) is kept whole under `_raw_arguments`, so the client's own validation
    reports it to the model instead of the relay failing the call."""
    if not text.strip():
        return {}
    try:
        v = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"_raw_arguments": text}
    return v if isinstance(v, dict) else {"_raw_arguments": text}


def json_text(v) -> str:
    """A JSON value as compact text (json, not orjson: an integer past 64 bits is valid JSON a client may send)."""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def texts_only(parts: list, where: str) -> str:
    """Text of a tool result for a dialect whose tool results hold text only (OpenAI chat)."""
    out = []
    for p in parts:
        need(isinstance(p, Text), f"{where}: an image in a tool result cannot be sent to an OpenAI chat provider; "
                                  "describe it in text or use a provider that takes images there")
        out.append(p.text)
    return "\n".join(out)


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


# The status of an error and the name each dialect gives it.
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                         403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                         413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}
OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                      404: "not_found_error", 408: "timeout", 413: "invalid_request_error", 429: "rate_limit_error"}


def error_message(body: bytes) -> tuple[str, str | None]:
    """(message, code) from any provider's error body: OpenAI's and Anthropic's `error` objects, FastAPI's `detail`
    (vLLM, SGLang), a bare string."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:2000].decode(errors="replace").strip() or "(empty body)", None
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or obj.get("detail") or orjson.dumps(err).decode()
            code = err.get("code")
            return (msg if isinstance(msg, str) else orjson.dumps(msg).decode()), (str(code) if code else None)
        if isinstance(err, str):
            return err, None
    return orjson.dumps(obj).decode()[:2000], None
