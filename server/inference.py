"""The providers' own APIs: OpenAI chat completions and responses, Anthropic messages."""

from __future__ import annotations

from flask import Blueprint, g, request

from reef_lab import dialects
from server.common import json_body, scenario, tags, to_response

bp = Blueprint("inference", __name__)

_FORWARDED = ("anthropic-version", "anthropic-beta")


def _infer(dialect: str):
    headers = {h: request.headers[h] for h in _FORWARDED if h in request.headers}
    reply = g.gateway.infer(dialect, json_body(), scenario(), tags(), headers)
    return to_response(reply)


@bp.post("/v1/chat/completions")
def chat_completions():
    return _infer(dialects.OPENAI_CHAT)


@bp.post("/v1/responses")
def responses():
    return _infer(dialects.OPENAI_RESPONSES)


@bp.post("/v1/messages")
def messages():
    return _infer(dialects.ANTHROPIC)


@bp.post("/v1/messages/count_tokens")
def count_tokens():
    headers = {h: request.headers[h] for h in _FORWARDED if h in request.headers}
    return to_response(g.gateway.count_tokens(json_body(), headers))


@bp.get("/v1/models")
def models():
    return to_response(g.gateway.models())
