"""An agent episode as a conversation, for apps/records.py: each turn's new messages (user text, tool results), the
answer (text, tool calls with their arguments), which tokens a report on it would train, and the reports on it.

Not an app. Presentation only: the turn order is reef_lab.gateway.episodes' ((created_at, id)), and the trained
tokens are what reef_lab.learning.episodes builds from these records with the default `episodes` config (one
sample, loss on generated tokens; split when the turns do not extend each other). A recipe configured with
`episodes.samples: per_call` trains the same generated tokens, one call per sample.
"""

from __future__ import annotations

import html
from collections import Counter

import orjson

from reef_lab.learning.episodes import EpisodeConfig, extensions, samples_for_report, trainable, turn_order
from reef_lab.wire import text as wire_text

GIVEN_STYLE = "background: #f3f4f6; border-left: 4px solid #9ca3af"
TRAINED_STYLE = "background: #dafbe1; border-left: 4px solid #1a7f37"
UNTRAINED_STYLE = "background: #fff8c5; border-left: 4px solid #9a6700"


def _args(value) -> str:
    value = wire_text.json_value(value)
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def messages(record: dict) -> list[dict]:
    """A record's request (chat / responses / messages) as one list of {role, text, call}: role system, user,
    assistant or tool; `call` names a tool call (assistant) or the call a tool result answers (reef_lab.wire.text)."""
    return wire_text.lines(record.get("dialect"), record.get("request"))


def new_messages(record: dict) -> list[dict]:
    """What a turn's request adds: everything after its history's last assistant message (all of it on turn 1)."""
    msgs = messages(record)
    last = max((k for k, m in enumerate(msgs) if m["role"] == "assistant"), default=-1)
    return msgs[last + 1:]


def answer(record: dict) -> dict:
    """A record's answer: its text and its tool calls as `name(arguments)` (the gateway's parsed
    `metadata.tool_calls`, else the response's own)."""
    dialect, resp = record.get("dialect"), record.get("response")
    text, calls = wire_text.response_text(dialect, resp), wire_text.response_calls(dialect, resp)
    parsed = ((record.get("metadata") or {}).get("tool_calls"))
    if parsed:
        calls = [f"{c.get('name')}({_args(c.get('arguments'))})" for c in parsed]
    if not text and (record.get("metadata") or {}).get("generated_text"):  # a cancelled stream
        text = record["metadata"]["generated_text"]
    return {"text": text, "calls": calls}


def trained_tokens(records: list[dict]) -> dict:
    """Which tokens a report on these calls trains, as reef_lab.learning.episodes builds it (default config): per
    record id, `given` (prompt tokens added before its answer: the whole prompt on the first trained turn) and
    `generated` (its answer's tokens, loss mask 1; 0 for a call that does not train), and `how` (one sample, or why
    it is split)."""
    counts: Counter = Counter()
    samples = [s for s in samples_for_report({"id": None, "score": None}, records, EpisodeConfig(), counts) if s]
    turns = turn_order([r for r in records if trainable(r)])
    per = {r["id"]: {"given": None, "generated": 0} for r in records}
    if turns:
        added = extensions(turns) if counts["episode_samples"] else None
        per[turns[0]["id"]]["given"] = len(turns[0]["prompt_token_ids"])
        for k, t in enumerate(turns):
            per[t["id"]]["generated"] = len(t["token_ids"])
            if k:  # one sample: what this turn's prompt added; split: each call is its own sample
                per[t["id"]]["given"] = len(added[k - 1]) if added is not None else len(t["prompt_token_ids"])
    mask = [m for s in samples for m in (s.loss_mask or [1] * len(s.completion_ids))]
    if counts["episode_samples"]:
        how = f"one sample of {len(turns)} turns"
    elif counts["split_drift"]:
        how = "one sample per call (a turn's prompt does not extend the previous turns token for token)"
    elif counts["split_release"]:
        how = "one sample per call (its turns were served by different releases)"
    elif counts["split_temperature"]:
        how = "one sample per call (its turns were sampled at different temperatures)"
    else:
        how = f"{len(samples)} sample(s)"
    return {"per": per, "samples": len(samples), "trained": sum(mask), "excluded": counts["excluded"], "how": how}


def _box(style: str, label: str, body: str, cls: str) -> str:
    return (f"<div class='{cls}' style='{style}; margin: 4px 0; padding: 4px 10px'>"
            f"<div style='font-size: 0.8em; color: #57606a'>{label}</div>"
            f"<div style='white-space: pre-wrap; overflow-wrap: anywhere'>{body}</div></div>")


def turn_html(turn: int, record: dict, tokens: dict) -> str:
    """One turn: what its request added (grey: given, not trained), then its answer (green: generated, trained;
    yellow: a call that does not train)."""
    added = new_messages(record)
    ans = answer(record)
    given = "" if tokens["given"] is None else f"{tokens['given']} given tokens · "
    head = (f"<b>turn {turn}</b> · <code>{html.escape(record['id'])}</code> · {html.escape(record['status'])}"
            + (f" · release <code>{html.escape(record['release_id'])}</code>" if record.get("release_id") else "")
            + f" · {given}{tokens['generated']} generated tokens trained")
    parts = [f"<div class='episode-turn-head'>{head}</div>"]
    for m in added:
        label = m["role"] + (f" (result of {html.escape(str(m['call']))})" if m["role"] == "tool" and m["call"]
                             else "") + " · given, not trained"
        body = html.escape(m["text"]) + (f"<code>{html.escape(m['call'])}</code>" if m["role"] == "assistant"
                                         and m["call"] else "")
        parts.append(_box(GIVEN_STYLE, label, body, "episode-given"))
    calls = "".join(f"<div>tool call <code class='episode-call'>{html.escape(c)}</code></div>" for c in ans["calls"])
    if trainable(record):
        label, style, cls = f"assistant · generated, trained ({tokens['generated']} tokens)", TRAINED_STYLE, \
            "episode-trained"
    else:
        label, style, cls = (f"assistant · not trained ({html.escape(record['status'])}"
                             + (f": {html.escape(str(record.get('error'))[:200])}" if record.get("error") else "")
                             + ")"), UNTRAINED_STYLE, "episode-untrained"
    parts.append(_box(style, label, html.escape(ans["text"]) + calls, cls))
    return f"<div class='episode-turn' style='margin: 10px 0'>{''.join(parts)}</div>"


def reports_html(reports: list[dict]) -> str:
    """The reports on an episode: when, score, feedback, and whether it named the episode or some of its calls."""
    if not reports:
        return "<p><i>No report on this episode yet.</i></p>"
    rows = []
    for r in reports:
        fb = wire_text.json_value(r.get("feedback"))
        fb = "" if fb is None else fb if isinstance(fb, str) else orjson.dumps(fb).decode()
        on = "the episode" if r.get("episode") else f"{len(r.get('references') or [])} of its calls"
        pad = "padding: 2px 12px 2px 0; vertical-align: top"
        rows.append(f"<tr><td style='{pad}'><code>{html.escape(r['id'])}</code></td>"
                    f"<td style='{pad}'>{html.escape(r.get('time') or '')}</td>"
                    f"<td style='{pad}; text-align: right'>"
                    f"{'' if r.get('score') is None else format(r['score'], 'g')}</td><td style='{pad}'>{on}</td>"
                    f"<td style='{pad}; white-space: pre-wrap; max-width: 40em'>{html.escape(fb)}</td>"
                    f"<td style='{pad}; white-space: pre-wrap; max-width: 40em'>{html.escape(r.get('context') or '')}"
                    "</td></tr>")
    head = "".join(f"<th style='text-align: left; padding-right: 12px'>{h}</th>"
                   for h in ("report", "time (UTC)", "score", "on", "feedback", "context"))
    return (f"<table class='episode-reports' style='width: auto'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def episode_html(episode: str, scenario: str, records: list[dict], reports: list[dict]) -> str:
    """An episode (its inference records, any order) as a conversation, the trained-token summary and the reports."""
    records = turn_order(records)
    tokens = trained_tokens(records)
    gen = sum(v["generated"] for v in tokens["per"].values())
    summary = (f"Episode <code>{html.escape(episode)}</code> in scenario <code>{html.escape(scenario)}</code>: "
               f"{len(records)} turns. A report on it trains {tokens['how']}: <b>{tokens['trained']}</b> tokens with "
               f"loss (the {gen} generated tokens; given tokens have loss mask 0)"
               + (f"; {tokens['excluded']} calls not trained (refused, cancelled, failed or relayed)"
                  if tokens["excluded"] else "") + ".")
    turns = "".join(turn_html(k, r, tokens["per"][r["id"]]) for k, r in enumerate(records, start=1))
    return (f"<div id='records-episode'><p class='episode-summary'>{summary}</p>{turns}"
            f"<h4>Reports on it ({len(reports)})</h4>{reports_html(reports)}</div>")
